#include "grpc_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "wire.h"

namespace trainrun::rendezvous::internal {
namespace {

// Largest answer a client accepts; the server caps one Get's values below this.
constexpr int kMaxMessageBytes = 256 << 20;

}  // namespace

std::shared_ptr<grpc::Channel> NewChannel(const std::string& address) {
  grpc::ChannelArguments args;
  // A worker's http_proxy must not route calls to the launcher next door.
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

void PrepareContext(grpc::ClientContext& context, const ClientOptions& options,
                    std::chrono::milliseconds timeout) {
  context.AddMetadata(kTokenMetadata, options.token);
  context.AddMetadata(kJobIdMetadata, options.job_id);
  context.set_deadline(std::chrono::system_clock::now() + timeout);
}

absl::Status ClientError(const grpc::Status& status, const ClientOptions& options,
                         std::chrono::milliseconds timeout) {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return absl::UnavailableError(
          absl::StrCat("cannot reach the rendezvous server at ", options.address, " (",
                       status.error_message(), "); check that trainrun is still running"));
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
  proto::GetRequest request;
  for (const auto& key : keys) request.add_keys(key);
  request.set_timeout_ms(timeout.count());
  request.set_rank(rank_);
  proto::GetResponse response;
  grpc::Status status = stub_->Get(&context, request, &response);
  if (!status.ok()) return ClientError(status, options_, timeout + kWaitSlack);
  if (response.values_size() != static_cast<int>(keys.size())) {
    return absl::InternalError(absl::StrCat("the rendezvous server answered ",
                                            response.values_size(), " values for ", keys.size(),
                                            " keys; is it the same trainrun version?"));
  }
  return std::vector<std::string>(std::make_move_iterator(response.mutable_values()->begin()),
                                  std::make_move_iterator(response.mutable_values()->end()));
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
  proto::BarrierRequest request;
  request.set_name(name);
  request.set_count(count);
  request.set_timeout_ms(timeout.count());
  request.set_rank(rank_);
  proto::BarrierResponse response;
  grpc::Status status = stub_->Barrier(&context, request, &response);
  if (!status.ok()) return ClientError(status, options_, timeout + kWaitSlack);
  return absl::OkStatus();
}

absl::Status GrpcStore::ReportPeerFailure(int rank, int peer_rank, const std::string& message) {
  grpc::ClientContext context;
  PrepareContext(context, options_, options_.call_timeout);
  proto::ExitReport request;
  request.set_rank(rank);
  request.set_exit_code(1);
  request.set_peer_rank(peer_rank);
  request.set_message(message);
  proto::ExitResponse response;
  grpc::Status status = stub_->ReportExit(&context, request, &response);
  if (!status.ok()) return ClientError(status, options_, options_.call_timeout);
  return absl::OkStatus();
}

}  // namespace trainrun::rendezvous::internal
