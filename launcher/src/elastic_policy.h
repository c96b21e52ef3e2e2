// ElasticPolicy: the elastic FailurePolicy (--min-np). It keeps the job's members: the ranks lost
// (never blamed), the ranks the job grows by until they join (pending), the membership changes
// (generations) and, below --min-np, the wait for ranks up to the elastic timeout. Discovery,
// growth and publishing the generations are JobRun's ElasticController's (elastic_controller.h).
#pragma once

#include <boost/asio/steady_timer.hpp>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "trainrun/launcher/failure_policy.h"

namespace trainrun::launcher {

class ElasticPolicy final : public FailurePolicy {
 public:
  ElasticPolicy(const PolicyContext& context, ElasticSpec elastic);

  bool OnExit(int rank, const ExitInfo& exit) override;
  void OnHostLost(const std::vector<int>& ranks, const std::string& why) override;
  bool Survived(int rank) const override { return lost_.count(rank) > 0; }
  bool StoppedOnPurpose(int rank) const override { return stopped_.count(rank) > 0; }
  bool Holding() const override { return below_minimum_.has_value() && below_minimum_->waiting; }
  void OnDone() override { elastic_timer_.cancel(); }

  void OnRanksAdded(const std::vector<int>& ranks) override;
  bool OnRanksJoined(const std::vector<int>& ranks, const std::string& why,
                     std::chrono::steady_clock::time_point since, const std::string& host) override;
  void OnRanksRemoved(const std::vector<int>& ranks, const std::string& why) override;
  std::string OnGenerationFormed(int generation) override;
  const std::vector<MembershipChange>& MembershipChanges() const override { return changes_; }
  bool finishing() const override { return finishing_; }
  std::string Summary() const override;

 private:
  // Loss: `ranks` (already ended or being stopped) are lost; a new generation when enough ranks
  // remain, else the wait for ranks.
  void Loss(const std::vector<int>& ranks, const std::string& why,
            std::chrono::steady_clock::time_point when, const std::string& host = "");
  // PastResetLimit ends the job (saying `why` and the limit) when one more membership change would
  // pass --reset-limit, and then returns true.
  bool PastResetLimit(const std::string& why);
  // Record gives `change` the next generation, `why`, `members` and `when`, keeps it and reports
  // it.
  void Record(MembershipChange change, const std::string& why, const std::vector<int>& members,
              std::chrono::steady_clock::time_point when);
  void WaitForRanks();
  // GiveUpPending stops the pending ranks (a member finished: the job ends without them).
  void GiveUpPending();
  // Stop stops `ranks`: SIGTERM now, SIGKILL after the grace period.
  void Stop(const std::vector<int>& ranks);
  // Survivors lists the ranks started and not yet ended, lost or pending, ascending.
  std::vector<int> Survivors() const;

  PolicyContext context_;
  const ElasticSpec elastic_;
  std::vector<MembershipChange> changes_;
  std::set<int> lost_;      // ranks whose end the job survived (never blamed)
  std::set<int> pending_;   // ranks started while the job runs, not yet members
  std::set<int> stopped_;   // ranks stopped because their host left the discovery output
  bool finishing_ = false;  // a member exited 0
  int start_size_ = 0;      // the plan's size at the start (slots past it are the job's growth)
  struct Wait {
    int rank = 0;         // the failure that left too few ranks
    std::string why;      // how it was lost
    int remaining = 0;    // how many ranks were left
    bool waiting = true;  // the elastic timeout has not yet passed
  };
  std::optional<Wait> below_minimum_;
  std::vector<std::unique_ptr<boost::asio::steady_timer>> removal_timers_;
  boost::asio::steady_timer elastic_timer_;
};

}  // namespace trainrun::launcher
