#include "trainrun/rendezvous/client.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpc_store.h"
#include "relay_client.h"
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

// ReadHosts copies a join answer's runs of ranks per host into `a` (whose size is set), checking
// that they name known hosts and cover ranks 0 .. size-1 exactly.
absl::Status ReadHosts(const proto::JoinResponse& response, Assignment& a) {
  const absl::Status malformed =
      absl::InternalError("the rendezvous server sent a malformed host list");
  if (response.host_run_lengths_size() != response.host_run_hosts_size()) return malformed;
  if (!response.host_table().empty()) {
    absl::StatusOr<std::vector<std::string>> names = internal::DecodeTable(response.host_table());
    if (!names.ok()) return malformed;
    a.host_names = *std::move(names);
  } else {
    // A server of an older release sends the names one by one.
    a.host_names.assign(response.host_names().begin(), response.host_names().end());
  }
  const int64_t hosts = static_cast<int64_t>(a.host_names.size());
  a.host_run_hosts.reserve(static_cast<size_t>(response.host_run_hosts_size()));
  a.host_run_ends.reserve(static_cast<size_t>(response.host_run_hosts_size()));
  int64_t end = 0;
  for (int k = 0; k < response.host_run_hosts_size(); ++k) {
    const int host = response.host_run_hosts(k);
    const int length = response.host_run_lengths(k);
    end += length;
    if (host < 0 || host >= hosts || length <= 0 || end > a.size) {
      return malformed;
    }
    a.host_run_hosts.push_back(host);
    a.host_run_ends.push_back(static_cast<int>(end));
  }
  return end == a.size ? absl::OkStatus() : malformed;
}

}  // namespace

absl::StatusOr<WorkerSession> Join(const ClientOptions& options,
                                   std::chrono::milliseconds timeout) {
  proto::JoinRequest request;
  request.set_host(options.host);
  request.set_local_rank(options.local_rank);
  request.set_pid(static_cast<int64_t>(::getpid()));
  if (options.expected_rank >= 0) request.set_rank(options.expected_rank);
  request.set_host_table(true);
  proto::JoinResponse response;
  std::shared_ptr<grpc::Channel> channel;
  std::shared_ptr<internal::RelayClient> relay;
  if (!options.relay.empty()) {
    // Through the host's relay (relay.h), which batches the host's joins into one call.
    relay = std::make_shared<internal::RelayClient>(options);
    if (absl::Status status =
            relay->Call(internal::RelayMethod::kJoin, request, &response, timeout);
        !status.ok()) {
      return status;
    }
  } else {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> made = internal::NewChannel(options);
    if (!made.ok()) return made.status();
    channel = *std::move(made);
    auto stub = proto::Rendezvous::NewStub(channel);
    grpc::ClientContext context;
    internal::PrepareContext(context, options, timeout);
    // The worker may start a moment before the server accepts; wait for it until the deadline.
    context.set_wait_for_ready(true);
    grpc::Status status = stub->Join(&context, request, &response);
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
        channel->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE) {
      // Waiting hides why the connection failed; one call that does not wait says it (a TLS
      // handshake refused: this worker's token is not the server's job's).
      grpc::ClientContext probe;
      internal::PrepareContext(probe, options, std::chrono::seconds(1));
      grpc::Status why = stub->Join(&probe, request, &response);
      if (internal::IsTlsRefusal(why)) status = why;
    }
    if (!status.ok()) return internal::ClientError(status, options, timeout);
  }

  WorkerSession session;
  Assignment& a = session.assignment;
  a.rank = response.rank();
  a.size = response.size();
  a.local_rank = response.local_rank();
  a.local_size = response.local_size();
  a.cross_rank = response.cross_rank();
  a.cross_size = response.cross_size();
  if (absl::Status hosts = ReadHosts(response, a); !hosts.ok()) return hosts;
  a.job_id = response.job_id();
  if (relay != nullptr) {
    session.store = std::make_shared<internal::RelayStore>(std::move(relay), a.rank);
  } else {
    session.store = std::make_shared<internal::GrpcStore>(std::move(channel), options, a.rank);
  }
  return session;
}

const std::string& Assignment::HostOf(int rank) const {
  static const std::string kNone;
  auto run = std::upper_bound(host_run_ends.begin(), host_run_ends.end(), rank);
  if (rank < 0 || run == host_run_ends.end()) return kNone;
  return host_names[static_cast<size_t>(host_run_hosts[run - host_run_ends.begin()])];
}

absl::StatusOr<std::shared_ptr<Store>> ConnectStore(const ClientOptions& options) {
  if (!options.relay.empty()) {
    return std::shared_ptr<Store>(std::make_shared<internal::RelayStore>(
        std::make_shared<internal::RelayClient>(options), options.expected_rank));
  }
  if (options.address.empty()) {
    return absl::InvalidArgumentError("no rendezvous server address given");
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = internal::NewChannel(options);
  if (!channel.ok()) return channel.status();
  return std::shared_ptr<Store>(
      std::make_shared<internal::GrpcStore>(*std::move(channel), options, options.expected_rank));
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
  // "off" asks for plain text (--no-tls), which the server then speaks too.
  if (std::optional<std::string> tls = env::Lookup(env::kRendezvousTls); tls && *tls == "off") {
    options.tls = false;
  }
  if (std::optional<std::string> socket = env::Lookup(env::kRendezvousSocket); socket) {
    options.socket = *std::move(socket);
  }
  // "off" is what asks the agents for no relay (environment.h); the ranks then dial the server.
  if (std::optional<std::string> relay = env::Lookup(env::kRendezvousRelay);
      relay && *relay != "off") {
    options.relay = *std::move(relay);
  }
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
