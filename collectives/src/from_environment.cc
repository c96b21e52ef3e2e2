// Communicator::FromEnvironment: join the job through the rendezvous client, then connect. Kept in
// its own file so that programs using only explicit stores do not pull in the gRPC client.
#include "rank_setting.h"
#include "trainrun/collectives/communicator.h"
#include "trainrun/rendezvous/client.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::collectives {

std::unique_ptr<Communicator> Communicator::FromEnvironment(CommunicatorOptions options) {
  const auto timeout = options.timeout.count() > 0
                           ? options.timeout
                           : std::chrono::milliseconds(RankSetting(env::kTimeoutSeconds) * 1000);
  auto session = rendezvous::JoinFromEnvironment(timeout);
  if (!session.ok()) {
    const std::string message = ::trainrun::internal::MakeMessage(
        "cannot join the trainrun job: ", session.status().message(),
        " (start this program with `trainrun -np N ...`)");
    if (absl::IsDeadlineExceeded(session.status()) || absl::IsUnavailable(session.status())) {
      throw TimeoutError(message);
    }
    throw Error(message);
  }
  const rendezvous::Assignment& a = session->assignment;
  const RankInfo& info = a;
  if (options.job_id.empty()) options.job_id = a.job_id;
  return std::make_unique<Communicator>(session->store, info, std::move(options));
}

}  // namespace trainrun::collectives
