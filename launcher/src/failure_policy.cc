#include "trainrun/launcher/failure_policy.h"

#include "elastic_policy.h"

namespace trainrun::launcher {
namespace {

// FailFast: the first failure ends the job; a lost host is a failure to run its ranks.
class FailFast final : public FailurePolicy {
 public:
  explicit FailFast(FailurePolicy::Job& job) : job_(job) {}
  bool OnExit(int rank, const ExitInfo& exit) override { return !exit.ok(); }
  void OnHostLost(const std::vector<int>& ranks, const std::string& why) override {
    job_.End(StartFailed{why});
  }

 private:
  FailurePolicy::Job& job_;
};

}  // namespace

FailureMode FailureModeOf(const LaunchSpec& spec) {
  if (spec.elastic.has_value()) return FailureMode::kElastic;
  return spec.max_restarts > 0 ? FailureMode::kRestart : FailureMode::kFailFast;
}

const std::vector<MembershipChange>& FailurePolicy::MembershipChanges() const {
  static const std::vector<MembershipChange> kNone;
  return kNone;
}

std::unique_ptr<FailurePolicy> MakeFailurePolicy(const PolicyContext& context,
                                                 const std::optional<ElasticSpec>& elastic) {
  if (elastic.has_value()) return std::make_unique<ElasticPolicy>(context, *elastic);
  return std::make_unique<FailFast>(context.job);
}

}  // namespace trainrun::launcher
