// Service: the rendezvous's gRPC adapter. Each RPC is authenticated with the job's token, turned
// into a call on the job's Membership (membership.h) or RendezvousState (rendezvous_state.h), and
// its reactor finished with the outcome; nothing of the job's state lives here. Get, Barrier and
// Allgather hold a reactor (Call) that the state ends through its Reply, so no thread is parked
// per waiting rank. Allgather is served raw: the state's answer is an AllgatherResponse serialized
// once per gather (WrapAnswer), and every caller's response refers to those same bytes. A host's
// relay sends its ranks' calls batched (JoinBatch, AllgatherBatch, BarrierBatch); each member goes
// through the same checks and state as the call it stands for.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "membership.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous_state.h"
#include "trainrun/rendezvous/server.h"

namespace trainrun::rendezvous::internal {

class Service final : public proto::Rendezvous::WithRawCallbackMethod_Allgather<
                          proto::Rendezvous::WithRawCallbackMethod_AllgatherBatch<
                              proto::Rendezvous::CallbackService>> {
 public:
  // `options`, `membership` and `state` must outlive the service.
  Service(const ServerOptions& options, Membership& membership, RendezvousState& state);

  // WrapAnswer is RendezvousState's `wrap_answer`: a gather's table as an AllgatherResponse.
  static std::string WrapAnswer(std::string table);

  // SetOnProven sets what each authenticated call tells with its peer's name (the listener's
  // Proven: the connection has proved the job's token). Before the server starts.
  void SetOnProven(std::function<void(const std::string& peer)> on_proven) {
    on_proven_ = std::move(on_proven);
  }

 private:
  class Call;

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context,
                                 const proto::JoinRequest* request,
                                 proto::JoinResponse* response) override;
  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context,
                                const proto::SetRequest* request,
                                proto::SetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context,
                                const proto::GetRequest* request,
                                proto::GetResponse* response) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* context,
                                const proto::AddRequest* request,
                                proto::AddResponse* response) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* context,
                                    const proto::BarrierRequest* request,
                                    proto::BarrierResponse* response) override;
  grpc::ServerUnaryReactor* Allgather(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* raw_request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ReportExit(grpc::CallbackServerContext* context,
                                       const proto::ExitReport* request,
                                       proto::ExitResponse* response) override;
  grpc::ServerUnaryReactor* JoinBatch(grpc::CallbackServerContext* context,
                                      const proto::JoinBatchRequest* request,
                                      proto::JoinBatchResponse* response) override;
  grpc::ServerUnaryReactor* AllgatherBatch(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* raw_request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* BarrierBatch(grpc::CallbackServerContext* context,
                                         const proto::BarrierBatchRequest* request,
                                         proto::BarrierBatchResponse* response) override;
  grpc::ServerUnaryReactor* SetBatch(grpc::CallbackServerContext* context,
                                     const proto::SetBatchRequest* request,
                                     proto::SetBatchResponse* response) override;
  grpc::ServerUnaryReactor* Hello(grpc::CallbackServerContext* context,
                                  const proto::HelloRequest* request,
                                  proto::HelloResponse* response) override;

  // JoinOne joins one worker, filling its place (and host_names, for a worker that did not ask
  // for the host table) into `response`; the caller adds the runs, table and job id.
  absl::StatusOr<Placement> JoinOne(const proto::JoinRequest& request,
                                    proto::JoinResponse* response);
  // FillRuns adds the runs of hosts that cover ranks 0 .. size-1.
  void FillRuns(proto::JoinResponse* response, int size) const;
  // EnterBarrier and EnterGather start a waiting call on the state, as one reactor.
  grpc::ServerUnaryReactor* EnterBarrier(const std::string& name, int count, int64_t timeout_ms,
                                         const std::vector<int>& ranks);
  grpc::ServerUnaryReactor* EnterGather(
      const std::string& name, int count, int64_t timeout_ms,
      const std::vector<std::pair<int, const std::string*>>& members, grpc::ByteBuffer* response);

  static grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context,
                                             const grpc::Status& status);
  grpc::Status Authenticate(grpc::CallbackServerContext* context) const;

  const ServerOptions& options_;
  Membership& membership_;
  RendezvousState& state_;
  std::function<void(const std::string& peer)> on_proven_;
};

}  // namespace trainrun::rendezvous::internal
