#include "service.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "wire.h"

namespace trainrun::rendezvous::internal {
namespace {

// ParseRaw parses a raw callback method's request.
bool ParseRaw(const grpc::ByteBuffer& raw, google::protobuf::MessageLite& message) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (raw.Dump(&slices).ok()) {
    for (const grpc::Slice& slice : slices) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
  }
  return message.ParseFromString(bytes);
}

// SharedBytes is a response made of `bytes` without copying them: a gather's answer, serialized
// once, is every caller's response.
grpc::ByteBuffer SharedBytes(std::shared_ptr<const std::string> bytes) {
  auto* owner = new std::shared_ptr<const std::string>(std::move(bytes));
  grpc::Slice slice(
      const_cast<char*>((*owner)->data()), (*owner)->size(),
      [](void* p) { delete static_cast<std::shared_ptr<const std::string>*>(p); }, owner);
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace

// Call is the reactor of a Get, Barrier or Allgather. The state ends it through its Reply (at
// once, or when what it waits for comes), or gRPC cancels it; gRPC owns it and it deletes itself in
// OnDone, the callback API's idiom.
class Service::Call final : public grpc::ServerUnaryReactor {
 public:
  explicit Call(RendezvousState& state) : state_(state) {}
  // Waiting records the id of the state's wait, for OnCancel (0: it did not wait).
  void Waiting(WaitId id) { id_.store(id); }
  void OnCancel() override {
    if (const WaitId id = id_.load(); id != 0) state_.Cancel(id);
  }
  void OnDone() override { delete this; }

 private:
  RendezvousState& state_;
  std::atomic<WaitId> id_{0};
};

Service::Service(const ServerOptions& options, Membership& membership, RendezvousState& state)
    : options_(options), membership_(membership), state_(state) {}

std::string Service::WrapAnswer(std::string table) {
  proto::AllgatherResponse response;
  response.set_table(std::move(table));
  return response.SerializeAsString();
}

grpc::ServerUnaryReactor* Service::FinishNow(grpc::CallbackServerContext* context,
                                             const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

grpc::Status Service::Authenticate(grpc::CallbackServerContext* context) const {
  const auto& metadata = context->client_metadata();
  auto token = metadata.find(kTokenMetadata);
  if (token == metadata.end() ||
      !ConstantTimeEquals(options_.token,
                          std::string_view(token->second.data(), token->second.size()))) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the rendezvous refused a call without this job's token "
                        "(TRAINRUN_JOB_TOKEN); is the worker from another job?");
  }
  if (on_proven_) on_proven_(context->peer());
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* Service::Hello(grpc::CallbackServerContext* context,
                                         const proto::HelloRequest* /*request*/,
                                         proto::HelloResponse* /*response*/) {
  return FinishNow(context, Authenticate(context));
}

// --- Membership ----------------------------------------------------------------------------------

absl::StatusOr<Placement> Service::JoinOne(const proto::JoinRequest& request,
                                           proto::JoinResponse* response) {
  JoinClaim claim;
  claim.host = request.host();
  claim.local_rank = request.local_rank();
  if (request.has_rank()) claim.rank = request.rank();
  claim.pid = request.pid();
  std::vector<std::string> host_names;
  absl::StatusOr<Placement> placed =
      membership_.Join(claim, request.host_table() ? nullptr : &host_names);
  if (!placed.ok()) return placed;
  response->set_rank(placed->rank);
  response->set_size(placed->size);
  response->set_local_rank(placed->slot.local_rank);
  response->set_local_size(placed->slot.local_size);
  response->set_cross_rank(placed->slot.cross_rank);
  response->set_cross_size(placed->slot.cross_size);
  if (!request.host_table()) {
    *response->mutable_host_names() = {std::make_move_iterator(host_names.begin()),
                                       std::make_move_iterator(host_names.end())};
  }
  return placed;
}

void Service::FillRuns(proto::JoinResponse* response, int size) const {
  for (const auto& [host, length] : membership_.Runs(size)) {
    response->add_host_run_hosts(host);
    response->add_host_run_lengths(length);
  }
}

grpc::ServerUnaryReactor* Service::Join(grpc::CallbackServerContext* context,
                                        const proto::JoinRequest* request,
                                        proto::JoinResponse* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  absl::StatusOr<Placement> placed = JoinOne(*request, response);
  if (!placed.ok()) return FinishNow(context, ToGrpc(placed.status()));
  if (request->host_table()) response->set_host_table(*membership_.HostTable());
  FillRuns(response, response->size());
  response->set_job_id(options_.job_id);
  if (options_.on_join) options_.on_join(placed->rank);
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* Service::JoinBatch(grpc::CallbackServerContext* context,
                                             const proto::JoinBatchRequest* request,
                                             proto::JoinBatchResponse* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  if (const int size = membership_.size(); request->joins_size() > size) {
    return FinishNow(context,
                     grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                  absl::StrCat("a batch of ", request->joins_size(),
                                               " joins is more than the job's ", size, " ranks")));
  }
  // Members of the start share one size, hence one set of runs: `common` carries them once.
  int common_size = -1;
  std::shared_ptr<const std::string> host_table;
  std::vector<int> joined;
  for (const proto::JoinRequest& join : request->joins()) {
    proto::MemberStatus* status = response->add_status();
    proto::JoinResponse* member = response->add_joins();
    bool shares = false;
    if (absl::StatusOr<Placement> placed = JoinOne(join, member); !placed.ok()) {
      status->set_code(static_cast<int>(placed.status().code()));
      status->set_message(std::string(placed.status().message()));
      member->Clear();
    } else {
      joined.push_back(placed->rank);
      if (common_size < 0) {
        common_size = member->size();
        FillRuns(response->mutable_common(), common_size);
        host_table = membership_.HostTable();
      }
      shares = join.host_table() && member->size() == common_size;
      if (!shares) {
        FillRuns(member, member->size());
        if (join.host_table()) member->set_host_table(*host_table);
        member->set_job_id(options_.job_id);
      }
    }
    response->add_shares_common(shares);
  }
  if (options_.on_join) {
    for (int rank : joined) options_.on_join(rank);
  }
  if (host_table != nullptr) response->mutable_common()->set_host_table(*host_table);
  response->mutable_common()->set_job_id(options_.job_id);
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* Service::ReportExit(grpc::CallbackServerContext* context,
                                              const proto::ExitReport* request,
                                              proto::ExitResponse* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  const int size = membership_.size();
  if (request->rank() < 0 || request->rank() >= size || request->peer_rank() >= size) {
    return FinishNow(
        context,
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     absl::StrCat("an exit report names rank ", request->rank(), " or peer ",
                                  request->peer_rank(), "; the job has ", size, " ranks")));
  }
  if (request->peer_rank() >= 0) {
    PeerFailure failure;
    failure.rank = request->rank();
    failure.peer_rank = request->peer_rank();
    failure.exit_code = request->exit_code();
    failure.message = request->message().substr(0, 1024);
    if (membership_.AddPeerFailure(failure) && options_.on_peer_failure) {
      options_.on_peer_failure(failure);
    }
  }
  return FinishNow(context, grpc::Status::OK);
}

// --- Keys, counters, barriers, gathers ----------------------------------------------------------

grpc::ServerUnaryReactor* Service::Set(grpc::CallbackServerContext* context,
                                       const proto::SetRequest* request,
                                       proto::SetResponse* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  absl::Status status = state_.CheckKey(request->key(), "key");
  if (status.ok()) status = state_.CheckValue(request->key(), request->value().size());
  if (status.ok()) status = state_.Set(request->key(), request->value());
  return FinishNow(context, ToGrpc(status));
}

grpc::ServerUnaryReactor* Service::SetBatch(grpc::CallbackServerContext* context,
                                            const proto::SetBatchRequest* request,
                                            proto::SetBatchResponse* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  for (const proto::SetRequest& set : request->sets()) {
    absl::Status status = state_.CheckKey(set.key(), "key");
    if (status.ok()) status = state_.CheckValue(set.key(), set.value().size());
    if (status.ok()) status = state_.Set(set.key(), set.value());
    proto::MemberStatus* member = response->add_status();
    member->set_code(static_cast<int>(status.code()));
    member->set_message(std::string(status.message()));
  }
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* Service::Add(grpc::CallbackServerContext* context,
                                       const proto::AddRequest* request,
                                       proto::AddResponse* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  if (absl::Status status = state_.CheckKey(request->key(), "counter name"); !status.ok()) {
    return FinishNow(context, ToGrpc(status));
  }
  absl::StatusOr<int64_t> value = state_.Add(request->key(), request->delta());
  if (!value.ok()) return FinishNow(context, ToGrpc(value.status()));
  response->set_value(*value);
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* Service::Get(grpc::CallbackServerContext* context,
                                       const proto::GetRequest* request,
                                       proto::GetResponse* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  auto* call = new Call(state_);
  call->Waiting(state_.Get({request->keys().begin(), request->keys().end()}, request->timeout_ms(),
                           [call, response](Outcome done) {
                             if (done.status.ok()) {
                               response->set_values(std::move(done.values.packed));
                               response->mutable_value_ends()->Add(done.values.ends.begin(),
                                                                   done.values.ends.end());
                             }
                             call->Finish(ToGrpc(done.status));
                           }));
  return call;
}

grpc::ServerUnaryReactor* Service::Barrier(grpc::CallbackServerContext* context,
                                           const proto::BarrierRequest* request,
                                           proto::BarrierResponse* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  return EnterBarrier(request->name(), request->count(), request->timeout_ms(), {request->rank()});
}

grpc::ServerUnaryReactor* Service::BarrierBatch(grpc::CallbackServerContext* context,
                                                const proto::BarrierBatchRequest* request,
                                                proto::BarrierBatchResponse* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  if (request->ranks_size() == 0 || request->ranks_size() > std::max(request->count(), 1)) {
    return FinishNow(context,
                     grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                  absl::StrCat("a batch of ", request->ranks_size(),
                                               " callers entered barrier '", request->name(),
                                               "' of count ", request->count())));
  }
  return EnterBarrier(request->name(), request->count(), request->timeout_ms(),
                      {request->ranks().begin(), request->ranks().end()});
}

grpc::ServerUnaryReactor* Service::EnterBarrier(const std::string& name, int count,
                                                int64_t timeout_ms, const std::vector<int>& ranks) {
  auto* call = new Call(state_);
  call->Waiting(state_.Barrier(name, count, timeout_ms, ranks,
                               [call](Outcome done) { call->Finish(ToGrpc(done.status)); }));
  return call;
}

grpc::ServerUnaryReactor* Service::Allgather(grpc::CallbackServerContext* context,
                                             const grpc::ByteBuffer* raw_request,
                                             grpc::ByteBuffer* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  proto::AllgatherRequest request;
  if (!ParseRaw(*raw_request, request)) {
    return FinishNow(context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                           "an allgather request could not be parsed; is the "
                                           "worker the same trainrun version?"));
  }
  if (absl::Status status =
          state_.CheckContribution(request.name(), request.rank(), request.count(),
                                   request.value().size(), request.timeout_ms());
      !status.ok()) {
    return FinishNow(context, ToGrpc(status));
  }
  return EnterGather(request.name(), request.count(), request.timeout_ms(),
                     {{request.rank(), &request.value()}}, response);
}

grpc::ServerUnaryReactor* Service::AllgatherBatch(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* raw_request,
                                                  grpc::ByteBuffer* response) {
  if (grpc::Status status = Authenticate(context); !status.ok()) return FinishNow(context, status);
  proto::AllgatherBatchRequest request;
  if (!ParseRaw(*raw_request, request) || request.ranks_size() != request.values_size() ||
      request.ranks_size() == 0) {
    return FinishNow(context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                           "an allgather batch could not be parsed; is the "
                                           "host's trainrun the same version?"));
  }
  // Every member is checked as its own call would be; when one is refused, none is applied, so the
  // others can be sent again alone without counting twice.
  std::vector<absl::Status> checked;
  bool refused = false;
  for (int i = 0; i < request.ranks_size(); ++i) {
    checked.push_back(state_.CheckContribution(request.name(), request.ranks(i), request.count(),
                                               request.values(i).size(), request.timeout_ms()));
    refused |= !checked.back().ok();
  }
  if (refused) {
    proto::AllgatherBatchResponse answer;
    for (const absl::Status& status : checked) {
      proto::MemberStatus* member = answer.add_status();
      member->set_code(static_cast<int>(status.code()));
      member->set_message(std::string(status.message()));
      member->set_resend(status.ok());
    }
    grpc::Slice bytes(answer.SerializeAsString());
    *response = grpc::ByteBuffer(&bytes, 1);
    return FinishNow(context, grpc::Status::OK);
  }
  std::vector<std::pair<int, const std::string*>> members;
  for (int i = 0; i < request.ranks_size(); ++i) {
    members.emplace_back(request.ranks(i), &request.values(i));
  }
  return EnterGather(request.name(), request.count(), request.timeout_ms(), members, response);
}

grpc::ServerUnaryReactor* Service::EnterGather(
    const std::string& name, int count, int64_t timeout_ms,
    const std::vector<std::pair<int, const std::string*>>& members, grpc::ByteBuffer* response) {
  auto* call = new Call(state_);
  call->Waiting(state_.Allgather(name, count, timeout_ms, members, [call, response](Outcome done) {
    if (done.status.ok()) *response = SharedBytes(std::move(done.answer));
    call->Finish(ToGrpc(done.status));
  }));
  return call;
}

}  // namespace trainrun::rendezvous::internal
