#include "trainrun/rendezvous/client.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpc_store.h"
#include "trainrun/rendezvous/environment.h"
#include "wire.h"

namespace trainrun::rendezvous {
namespace {

// RequireEnv returns the value of `name`, or FAILED_PRECONDITION naming it.
absl::StatusOr<std::string> RequireEnv(const char* name) {
  std::optional<std::string> value = env::Lookup(name);
  if (!value || value->empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, " is not set; start this worker with trainrun to use the rendezvous"));
  }
  return *std::move(value);
}

absl::StatusOr<int> RequireIntEnv(const char* name) {
  absl::StatusOr<std::string> text = RequireEnv(name);
  if (!text.ok()) return text.status();
  int value = 0;
  if (!absl::SimpleAtoi(*text, &value) || value < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, "='", *text, "' is not a non-negative integer"));
  }
  return value;
}

}  // namespace

absl::StatusOr<WorkerSession> Join(const ClientOptions& options,
                                   std::chrono::milliseconds timeout) {
  std::shared_ptr<grpc::Channel> channel = internal::NewChannel(options.address);
  auto stub = proto::Rendezvous::NewStub(channel);
  grpc::ClientContext context;
  internal::PrepareContext(context, options, timeout);
  // The worker may start a moment before the server accepts; wait for it until the deadline.
  context.set_wait_for_ready(true);
  proto::JoinRequest request;
  request.set_host(options.host);
  request.set_local_rank(options.local_rank);
  request.set_pid(static_cast<int64_t>(::getpid()));
  if (options.expected_rank >= 0) request.set_rank(options.expected_rank);
  proto::JoinResponse response;
  grpc::Status status = stub->Join(&context, request, &response);
  if (!status.ok()) return internal::ClientError(status, options, timeout);

  WorkerSession session;
  Assignment& a = session.assignment;
  a.rank = response.rank();
  a.size = response.size();
  a.local_rank = response.local_rank();
  a.local_size = response.local_size();
  a.cross_rank = response.cross_rank();
  a.cross_size = response.cross_size();
  a.hosts.reserve(response.host_of_rank_size());
  for (int host : response.host_of_rank()) {
    if (host < 0 || host >= response.host_names_size()) {
      return absl::InternalError("the rendezvous server sent a malformed host list");
    }
    a.hosts.push_back(response.host_names(host));
  }
  a.job_id = response.job_id();
  session.store = std::make_shared<internal::GrpcStore>(std::move(channel), options, a.rank);
  return session;
}

absl::StatusOr<std::shared_ptr<Store>> ConnectStore(const ClientOptions& options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("no rendezvous server address given");
  }
  return std::shared_ptr<Store>(std::make_shared<internal::GrpcStore>(
      internal::NewChannel(options.address), options, options.expected_rank));
}

absl::StatusOr<ClientOptions> ClientOptionsFromEnvironment() {
  ClientOptions options;
  absl::StatusOr<std::string> address = RequireEnv(env::kRendezvousAddr);
  if (!address.ok()) return address.status();
  absl::StatusOr<std::string> job_id = RequireEnv(env::kJobId);
  if (!job_id.ok()) return job_id.status();
  absl::StatusOr<std::string> token = RequireEnv(env::kJobToken);
  if (!token.ok()) return token.status();
  absl::StatusOr<std::string> host = RequireEnv(env::kHostname);
  if (!host.ok()) return host.status();
  absl::StatusOr<int> local_rank = RequireIntEnv(env::kLocalRank);
  if (!local_rank.ok()) return local_rank.status();
  options.address = *std::move(address);
  options.job_id = *std::move(job_id);
  options.token = *std::move(token);
  options.host = *std::move(host);
  options.local_rank = *local_rank;
  if (env::Lookup(env::kRank).has_value()) {
    absl::StatusOr<int> rank = RequireIntEnv(env::kRank);
    if (!rank.ok()) return rank.status();
    options.expected_rank = *rank;
  }
  // A rank an elastic job grew by joins by its slot (environment.h).
  if (env::Lookup(env::kElasticSlot).has_value()) {
    absl::StatusOr<int> slot = RequireIntEnv(env::kElasticSlot);
    if (!slot.ok()) return slot.status();
    options.expected_rank = *slot;
  }
  return options;
}

absl::StatusOr<WorkerSession> JoinFromEnvironment(std::chrono::milliseconds timeout) {
  absl::StatusOr<ClientOptions> options = ClientOptionsFromEnvironment();
  if (!options.ok()) return options.status();
  return Join(*options, timeout);
}

absl::StatusOr<std::string> ShareFromRoot(Store& store, const std::string& name, int rank, int root,
                                          const std::function<std::string()>& make,
                                          std::chrono::milliseconds timeout) {
  const std::string key = absl::StrCat("share/", name);
  if (rank == root) {
    std::string blob = make();
    absl::Status status = store.Set(key, blob);
    if (!status.ok()) return status;
    return blob;
  }
  absl::StatusOr<std::vector<std::string>> values = store.Get({key}, timeout);
  if (!values.ok()) return values.status();
  return std::move((*values)[0]);
}

}  // namespace trainrun::rendezvous
