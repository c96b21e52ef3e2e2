#include "membership_controller.h"

#include <boost/asio/post.hpp>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "elastic_controller.h"
#include "remote/host_access.h"
#include "trainrun/launcher/logging.h"

namespace trainrun::launcher {
namespace {

// FixedMembership: the members are the start's; what ends is the supervisor's to judge. In
// per-node mode with --nnodes MIN:MAX and --max-restarts (torchrun's way: the job re-forms by
// starting again), a node that joins the running job ends this start (NodesChanged, not a failure)
// so that the next one has it: its agent is greeted and held until then, and told to join again
// with the others (EndJob).
class FixedMembership final : public MembershipController {
 public:
  explicit FixedMembership(JobParts parts)
      : spec_(parts.spec),
        io_(parts.io),
        supervisor_(parts.supervisor),
        channel_(std::move(parts.channel)) {}
  ~FixedMembership() override { Stop(); }

  void OnRankExit(int rank, const ExitInfo& exit) override { supervisor_->OnRankExit(rank, exit); }

  void Start() override {
    const bool range = spec_.per_node && spec_.per_node->min_nnodes > 0 &&
                       spec_.per_node->min_nnodes < spec_.per_node->nnodes;
    if (!range || spec_.max_restarts == 0 || !channel_) return;
    channel_->AcceptLateHosts([this, shared = shared_](channel::LateHost node) {
      std::lock_guard<std::mutex> lock(shared->mu);
      if (shared->closed) return;  // its stream closes
      ++shared->running;
      const std::string command = remote::AgentCommand(remote::RemoteTrainrunPath(spec_));
      const absl::Time deadline = absl::Now() + absl::FromChrono(spec_.start_timeout);
      // Its agent's Hello is read first (on a thread of its own), so that nothing unread is left
      // when its connection closes after the JobEnd.
      std::thread([this, shared, command, deadline, node = std::move(node)]() mutable {
        const hostfile::HostSpec host = node.host;
        absl::StatusOr<remote::RemoteAgent> agent = remote::ConnectAgent(
            *remote::JoinedHostChannel(std::move(node.stream)), host, command, deadline);
        std::lock_guard<std::mutex> lock(shared->mu);
        --shared->running;
        shared->changed.notify_all();
        if (shared->closed || !agent.ok()) return;
        boost::asio::post(
            io_, [this, agent = *std::move(agent)]() mutable { OnNodeJoined(std::move(agent)); });
      }).detach();
    });
  }

  void Stop() override {
    if (channel_) channel_->AcceptLateHosts({});
    std::unique_lock<std::mutex> lock(shared_->mu);
    shared_->closed = true;
    shared_->changed.wait_for(lock, std::chrono::seconds(1),
                              [this] { return shared_->running == 0; });
  }

  int NodesWaiting() const override { return static_cast<int>(waiting_.size()); }

  void EndJob(const remote::JobEnd& end) override {
    const std::string frame = remote::EncodeJobEnd(end);
    for (remote::RemoteAgent& agent : waiting_) {
      (void)agent.stream->Write(frame, absl::Seconds(10));
    }
  }

 private:
  void OnNodeJoined(remote::RemoteAgent agent) {
    const std::string name = agent.name();
    waiting_.push_back(std::move(agent));
    if (supervisor_->done() || supervisor_->ending()) return;  // told with the others at the end
    if (!spec_.quiet) {
      Logger().info("{} joined the job: every node's ranks start again with it", name);
    }
    supervisor_->EndFor(NodesChanged{absl::StrCat(
        name, " joined the job (--nnodes ", spec_.per_node->min_nnodes, ":", spec_.per_node->nnodes,
        "), so it starts again with every node (a change of nodes, not "
        "counted against --max-restarts)")});
  }

  const LaunchSpec& spec_;
  boost::asio::io_context& io_;
  std::optional<JobSupervisor>& supervisor_;
  std::shared_ptr<channel::HostChannel> channel_;
  std::vector<remote::RemoteAgent> waiting_;  // nodes that joined, for the next start
  // What the greeting threads share with the controller: once `closed` (Stop), they post nothing.
  struct Shared {
    std::mutex mu;
    std::condition_variable changed;
    bool closed = false;
    int running = 0;
  };
  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
};

}  // namespace

std::unique_ptr<MembershipController> MakeMembershipController(JobParts parts) {
  if (FailureModeOf(parts.spec) == FailureMode::kElastic) {
    return std::make_unique<ElasticController>(std::move(parts));
  }
  return std::make_unique<FixedMembership>(std::move(parts));
}

}  // namespace trainrun::launcher
