#include "membership_controller.h"

#include "elastic_controller.h"

namespace trainrun::launcher {
namespace {

// FixedMembership: the members are the start's; what ends is the supervisor's to judge.
class FixedMembership final : public MembershipController {
 public:
  explicit FixedMembership(std::optional<JobSupervisor>& supervisor) : supervisor_(supervisor) {}
  void OnRankExit(int rank, const ExitInfo& exit) override { supervisor_->OnRankExit(rank, exit); }

 private:
  std::optional<JobSupervisor>& supervisor_;
};

}  // namespace

std::unique_ptr<MembershipController> MakeMembershipController(JobParts parts) {
  if (FailureModeOf(parts.spec) == FailureMode::kElastic) {
    return std::make_unique<ElasticController>(std::move(parts));
  }
  return std::make_unique<FixedMembership>(parts.supervisor);
}

}  // namespace trainrun::launcher
