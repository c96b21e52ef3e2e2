// GrpcStore: the Store a worker gets from Join, backed by the launcher's rendezvous server.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/rendezvous.grpc.pb.h"
#include "trainrun/rendezvous/client.h"
#include "trainrun/rendezvous/store.h"

namespace trainrun::rendezvous::internal {

// NewChannel opens a channel to `address` with the options every rendezvous client uses (no HTTP
// proxy, large enough messages): TLS with the job's certificate made from `token` (tls.h), or
// plain text when `tls` is false (--no-tls). INTERNAL when the certificate cannot be made.
absl::StatusOr<std::shared_ptr<grpc::Channel>> NewChannel(const std::string& address,
                                                          const std::string& token, bool tls);
// NewChannel for a worker's `options`: to the server's Unix socket in plain text when
// `options.socket` names one that exists here, else to `options.address` as above.
absl::StatusOr<std::shared_ptr<grpc::Channel>> NewChannel(const ClientOptions& options);

// PrepareContext sets the job's metadata and a deadline of `timeout` from now on `context`.
void PrepareContext(grpc::ClientContext& context, const ClientOptions& options,
                    std::chrono::milliseconds timeout);

// IsTlsRefusal: the call failed because the TLS handshake did: the server's certificate is not
// the one this worker's token makes (the server is another job's).
bool IsTlsRefusal(const grpc::Status& status);

// ClientError turns a failed call into a status a person can act on: the server's own message
// when it answered, else one naming the server's address.
absl::Status ClientError(const grpc::Status& status, const ClientOptions& options,
                         std::chrono::milliseconds timeout);

// UnpackValues splits a GetResponse's concatenated values (`count` of them).
absl::StatusOr<std::vector<std::string>> UnpackValues(const proto::GetResponse& response,
                                                      size_t count);

// The requests GrpcStore and RelayStore (relay_client.h) send alike, to the server or through the
// host's relay. `rank` is the caller's (-1 before it joined); the server names it in errors.
proto::GetRequest GetRequestFor(const std::vector<std::string>& keys,
                                std::chrono::milliseconds timeout, int rank);
proto::BarrierRequest BarrierRequestFor(const std::string& name, int count,
                                        std::chrono::milliseconds timeout, int rank);
// AllgatherRequestFor refuses a rank outside 0 .. count-1 in one sentence naming the gather.
absl::StatusOr<proto::AllgatherRequest> AllgatherRequestFor(const std::string& name, int rank,
                                                            int count, const std::string& value,
                                                            std::chrono::milliseconds timeout);
// PeerFailureReport is the ExitReport of `rank`, which failed because `peer_rank` did.
proto::ExitReport PeerFailureReport(int rank, int peer_rank, const std::string& message);

// GrpcStore is thread-safe: gRPC stubs are, and it holds no other state.
class GrpcStore : public Store {
 public:
  // `rank` is this worker's rank (-1 when it has not joined); the server names it in errors.
  GrpcStore(std::shared_ptr<grpc::Channel> channel, ClientOptions options, int rank);

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               std::chrono::milliseconds timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::Status Barrier(const std::string& name, int count,
                       std::chrono::milliseconds timeout) override;
  // Allgather is one Allgather call (rendezvous.proto): the server answers with the table it built
  // once for the whole gather.
  absl::StatusOr<std::vector<std::string>> Allgather(const std::string& name, int rank, int count,
                                                     const std::string& value,
                                                     std::chrono::milliseconds timeout) override;
  absl::StatusOr<GatherTable> AllgatherTable(const std::string& name, int rank, int count,
                                             const std::string& value,
                                             std::chrono::milliseconds timeout) override;
  absl::Status ReportPeerFailure(int rank, int peer_rank, const std::string& message) override;

 private:
  // The client waits this much longer than the server-side timeout, so the server's message (which
  // names the missing ranks) arrives before the client's own deadline fires.
  static constexpr std::chrono::milliseconds kWaitSlack{5000};

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::Rendezvous::Stub> stub_;
  ClientOptions options_;
  int rank_;
};

}  // namespace trainrun::rendezvous::internal
