#include "grpc_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/stat.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "tls.h"
#include "wire.h"

namespace trainrun::rendezvous::internal {
namespace {

// Largest answer a client accepts; the server caps one Get's values below this.
constexpr int kMaxMessageBytes = 256 << 20;

// ChannelTarget names an IP-literal address with gRPC's ipv4:/ipv6: scheme, so connecting skips
// the DNS resolver; host names go through it as usual.
std::string ChannelTarget(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return address;
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  unsigned char buffer[sizeof(in6_addr)];
  if (inet_pton(AF_INET, host.c_str(), buffer) == 1) return "ipv4:" + address;
  if (inet_pton(AF_INET6, host.c_str(), buffer) == 1) return "ipv6:" + address;
  return address;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> UnpackValues(const proto::GetResponse& response,
                                                      size_t count) {
  const std::string& packed = response.values();
  if (static_cast<size_t>(response.value_ends_size()) != count) {
    return absl::InternalError(absl::StrCat("the rendezvous server answered ",
                                            response.value_ends_size(), " values for ", count,
                                            " keys; is it the same trainrun version?"));
  }
  std::vector<std::string> values;
  values.reserve(count);
  size_t begin = 0;
  for (uint32_t end : response.value_ends()) {
    if (end < begin || end > packed.size()) {
      return absl::InternalError("the rendezvous server sent malformed values");
    }
    values.emplace_back(packed, begin, end - begin);
    begin = end;
  }
  return values;
}

proto::GetRequest GetRequestFor(const std::vector<std::string>& keys,
                                std::chrono::milliseconds timeout, int rank) {
  proto::GetRequest request;
  for (const auto& key : keys) request.add_keys(key);
  request.set_timeout_ms(timeout.count());
  request.set_rank(rank);
  return request;
}

proto::BarrierRequest BarrierRequestFor(const std::string& name, int count,
                                        std::chrono::milliseconds timeout, int rank) {
  proto::BarrierRequest request;
  request.set_name(name);
  request.set_count(count);
  request.set_timeout_ms(timeout.count());
  request.set_rank(rank);
  return request;
}

absl::StatusOr<proto::AllgatherRequest> AllgatherRequestFor(const std::string& name, int rank,
                                                            int count, const std::string& value,
                                                            std::chrono::milliseconds timeout) {
  if (count <= 0 || rank < 0 || rank >= count) {
    return absl::InvalidArgumentError(absl::StrCat("allgather '", name, "' was entered as rank ",
                                                   rank, " of ", count, " contributors"));
  }
  proto::AllgatherRequest request;
  request.set_name(name);
  request.set_rank(rank);
  request.set_count(count);
  request.set_value(value);
  request.set_timeout_ms(timeout.count());
  return request;
}

proto::ExitReport PeerFailureReport(int rank, int peer_rank, const std::string& message) {
  proto::ExitReport request;
  request.set_rank(rank);
  request.set_exit_code(1);
  request.set_peer_rank(peer_rank);
  request.set_message(message);
  return request;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> NewChannel(const std::string& address,
                                                          const std::string& token, bool tls) {
  QuietAbseilMutexes();
  grpc::ChannelArguments args;
  // A worker's http_proxy must not route calls to the launcher next door.
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  // Each channel gets its own connection, even where one process holds several (ranks as threads
  // in tests and the benchmark), as separate worker processes would.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // What a rendezvous client never uses, and each channel and call would pay for (a worker's
  // start-up cost, times the job's ranks on the server's side): channelz's registry and trace of
  // every channel and socket, the retry filter's per-call state (no service config asks for
  // retries; a worker's own loops retry), and HTTP/2 bandwidth probes (answers are KiB).
  args.SetInt(GRPC_ARG_ENABLE_CHANNELZ, 0);
  args.SetInt(GRPC_ARG_MAX_CHANNEL_TRACE_EVENT_MEMORY_PER_NODE, 0);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  if (!tls) {
    return grpc::CreateCustomChannel(ChannelTarget(address), grpc::InsecureChannelCredentials(),
                                     args);
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = ClientCredentials(token);
  if (!credentials.ok()) return credentials.status();
  args.SetSslTargetNameOverride(kTlsServerName);
  return grpc::CreateCustomChannel(ChannelTarget(address), *credentials, args);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> NewChannel(const ClientOptions& options) {
  struct stat socket {};
  if (!options.socket.empty() && stat(options.socket.c_str(), &socket) == 0 &&
      S_ISSOCK(socket.st_mode)) {
    return NewChannel("unix:" + options.socket, options.token, /*tls=*/false);
  }
  return NewChannel(options.address, options.token, options.tls);
}

void PrepareContext(grpc::ClientContext& context, const ClientOptions& options,
                    std::chrono::milliseconds timeout) {
  context.AddMetadata(kTokenMetadata, options.token);
  context.AddMetadata(kJobIdMetadata, options.job_id);
  context.set_deadline(std::chrono::system_clock::now() + timeout);
}

bool IsTlsRefusal(const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return false;
  const std::string& message = status.error_message();
  return message.find("andshake") != std::string::npos ||
         message.find("certificate") != std::string::npos ||
         message.find("CERTIFICATE") != std::string::npos;
}

absl::Status ClientError(const grpc::Status& status, const ClientOptions& options,
                         std::chrono::milliseconds timeout) {
  if (options.tls && IsTlsRefusal(status)) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the rendezvous server at ", options.address,
        " and this worker do not share the job's token (TRAINRUN_JOB_TOKEN): the TLS handshake "
        "failed (",
        status.error_message(), "); is the worker from another job?"));
  }
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return absl::UnavailableError(absl::StrCat("cannot reach the rendezvous server at ",
                                                 options.address, " (", status.error_message(),
                                                 "); check that trainrun is still running"));
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      // The server answers a wait's own timeout with a message; an empty or transport-made one
      // means the server itself never answered.
      if (status.error_message().rfind("timed out", 0) == 0) return ToAbsl(status);
      return absl::DeadlineExceededError(
          absl::StrCat("the rendezvous server at ", options.address, " did not answer within ",
                       FormatDuration(timeout), "; check that trainrun is still running"));
    default:
      return ToAbsl(status);
  }
}

GrpcStore::GrpcStore(std::shared_ptr<grpc::Channel> channel, ClientOptions options, int rank)
    : channel_(std::move(channel)),
      stub_(proto::Rendezvous::NewStub(channel_)),
      options_(std::move(options)),
      rank_(rank) {}

absl::Status GrpcStore::Set(const std::string& key, const std::string& value) {
  grpc::ClientContext context;
  PrepareContext(context, options_, options_.call_timeout);
  proto::SetRequest request;
  request.set_key(key);
  request.set_value(value);
  proto::SetResponse response;
  grpc::Status status = stub_->Set(&context, request, &response);
  if (!status.ok()) return ClientError(status, options_, options_.call_timeout);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> GrpcStore::Get(const std::vector<std::string>& keys,
                                                        std::chrono::milliseconds timeout) {
  grpc::ClientContext context;
  PrepareContext(context, options_, timeout + kWaitSlack);
  const proto::GetRequest request = GetRequestFor(keys, timeout, rank_);
  proto::GetResponse response;
  grpc::Status status = stub_->Get(&context, request, &response);
  if (!status.ok()) return ClientError(status, options_, timeout + kWaitSlack);
  return UnpackValues(response, keys.size());
}

absl::StatusOr<int64_t> GrpcStore::Add(const std::string& key, int64_t delta) {
  grpc::ClientContext context;
  PrepareContext(context, options_, options_.call_timeout);
  proto::AddRequest request;
  request.set_key(key);
  request.set_delta(delta);
  proto::AddResponse response;
  grpc::Status status = stub_->Add(&context, request, &response);
  if (!status.ok()) return ClientError(status, options_, options_.call_timeout);
  return response.value();
}

absl::Status GrpcStore::Barrier(const std::string& name, int count,
                                std::chrono::milliseconds timeout) {
  grpc::ClientContext context;
  PrepareContext(context, options_, timeout + kWaitSlack);
  const proto::BarrierRequest request = BarrierRequestFor(name, count, timeout, rank_);
  proto::BarrierResponse response;
  grpc::Status status = stub_->Barrier(&context, request, &response);
  if (!status.ok()) return ClientError(status, options_, timeout + kWaitSlack);
  return absl::OkStatus();
}

absl::StatusOr<GatherTable> GrpcStore::AllgatherTable(const std::string& name, int rank, int count,
                                                      const std::string& value,
                                                      std::chrono::milliseconds timeout) {
  absl::StatusOr<proto::AllgatherRequest> request =
      AllgatherRequestFor(name, rank, count, value, timeout);
  if (!request.ok()) return request.status();
  grpc::ClientContext context;
  PrepareContext(context, options_, timeout + kWaitSlack);
  proto::AllgatherResponse response;
  grpc::Status status = stub_->Allgather(&context, *request, &response);
  if (!status.ok()) return ClientError(status, options_, timeout + kWaitSlack);
  return DecodeGatherTable(response.table(), static_cast<size_t>(count));
}

absl::StatusOr<std::vector<std::string>> GrpcStore::Allgather(const std::string& name, int rank,
                                                              int count, const std::string& value,
                                                              std::chrono::milliseconds timeout) {
  absl::StatusOr<GatherTable> table = AllgatherTable(name, rank, count, value, timeout);
  if (!table.ok()) return table.status();
  return table->ToStrings();
}

absl::Status GrpcStore::ReportPeerFailure(int rank, int peer_rank, const std::string& message) {
  grpc::ClientContext context;
  PrepareContext(context, options_, options_.call_timeout);
  const proto::ExitReport request = PeerFailureReport(rank, peer_rank, message);
  proto::ExitResponse response;
  grpc::Status status = stub_->ReportExit(&context, request, &response);
  if (!status.ok()) return ClientError(status, options_, options_.call_timeout);
  return absl::OkStatus();
}

}  // namespace trainrun::rendezvous::internal
