// The rank's side of a host's relay (relay.h): the Unix-socket calls that replace the gRPC
// channel when TRAINRUN_RENDEZVOUS_RELAY is set, and the Store built on them.
#pragma once

#include <google/protobuf/message_lite.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "relay_wire.h"
#include "trainrun/rendezvous/client.h"
#include "trainrun/rendezvous/store.h"

namespace trainrun::rendezvous::internal {

// RelayClient sends calls to the relay at `options.relay`. Thread-safe: a call takes an idle
// connection, or opens one, so concurrent calls (a Get waiting while another thread Sets) do not
// queue behind each other.
class RelayClient {
 public:
  explicit RelayClient(ClientOptions options) : options_(std::move(options)) {}
  ~RelayClient();

  // Call sends `request` as `method` and parses the answer into `response`, waiting at most
  // `timeout`. The server's refusals come back as ClientError makes them; a relay that cannot be
  // reached, closes the connection or does not answer in time fails with one sentence naming it.
  absl::Status Call(RelayMethod method, const google::protobuf::MessageLite& request,
                    google::protobuf::MessageLite* response, std::chrono::milliseconds timeout);
  // CallForBytes is Call leaving the response unparsed: `frame` holds the answer and `body` the
  // serialized response in it, for a caller that reads a large field in place.
  absl::Status CallForBytes(RelayMethod method, const google::protobuf::MessageLite& request,
                            std::chrono::milliseconds timeout, std::string& frame,
                            std::string_view& body);

  const ClientOptions& options() const { return options_; }
  // Malformed is the error for an answer to `method` that cannot be parsed.
  absl::Status Malformed(RelayMethod method) const;

 private:
  // Connect takes an idle connection or opens one; a new one's hello is appended to `frames`,
  // to be written with the call.
  absl::StatusOr<int> Connect(std::string& frames);
  std::string RelayName() const;

  const ClientOptions options_;
  std::mutex mutex_;
  std::vector<int> idle_;  // connections with no call in flight
  std::atomic<uint32_t> next_call_{1};
};

// RelayStore is GrpcStore's counterpart over a relay.
class RelayStore : public Store {
 public:
  RelayStore(std::shared_ptr<RelayClient> client, int rank)
      : client_(std::move(client)), rank_(rank) {}

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               std::chrono::milliseconds timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::Status Barrier(const std::string& name, int count,
                       std::chrono::milliseconds timeout) override;
  absl::StatusOr<std::vector<std::string>> Allgather(const std::string& name, int rank, int count,
                                                     const std::string& value,
                                                     std::chrono::milliseconds timeout) override;
  absl::StatusOr<GatherTable> AllgatherTable(const std::string& name, int rank, int count,
                                             const std::string& value,
                                             std::chrono::milliseconds timeout) override;
  absl::Status ReportPeerFailure(int rank, int peer_rank, const std::string& message) override;

 private:
  // As GrpcStore's: the server's own timeout message arrives before the client gives up.
  static constexpr std::chrono::milliseconds kWaitSlack{5000};

  std::shared_ptr<RelayClient> client_;
  int rank_;
};

}  // namespace trainrun::rendezvous::internal
