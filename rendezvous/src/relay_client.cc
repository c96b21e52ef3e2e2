#include "relay_client.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpc_store.h"
#include "proto/rendezvous.pb.h"
#include "wire.h"

namespace trainrun::rendezvous::internal {

// relay.cc: the sockaddr of a relay's socket name.
socklen_t RelaySocketAddress(const std::string& name, sockaddr_un& address);

namespace {

using Clock = std::chrono::steady_clock;

const char* MethodName(RelayMethod method) {
  switch (method) {
    case RelayMethod::kJoin:
      return "Join";
    case RelayMethod::kSet:
      return "Set";
    case RelayMethod::kGet:
      return "Get";
    case RelayMethod::kAdd:
      return "Add";
    case RelayMethod::kBarrier:
      return "Barrier";
    case RelayMethod::kAllgather:
      return "Allgather";
    case RelayMethod::kReportExit:
      return "ReportExit";
    case RelayMethod::kHello:
      break;
  }
  return "Hello";
}

// WriteAll writes `bytes` to the blocking socket `fd`.
bool WriteAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t wrote = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(wrote));
  }
  return true;
}

// FindGatherTable finds the table of a serialized AllgatherResponse in `body` (the last one, as
// parsing would keep), skipping fields it does not know; false when `body` is malformed.
bool FindGatherTable(std::string_view body, std::string_view& table) {
  namespace wire = google::protobuf::internal;
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(body.data()),
                                            static_cast<int>(body.size()));
  constexpr uint32_t kTableTag = wire::WireFormatLite::MakeTag(
      proto::AllgatherResponse::kTableFieldNumber, wire::WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
  table = {};
  while (const uint32_t tag = in.ReadTag()) {
    if (tag != kTableTag) {
      if (!wire::WireFormatLite::SkipField(&in, tag)) return false;
      continue;
    }
    uint32_t length = 0;
    if (!in.ReadVarint32(&length)) return false;
    const size_t at = static_cast<size_t>(in.CurrentPosition());
    if (length > body.size() - at || !in.Skip(static_cast<int>(length))) return false;
    table = body.substr(at, length);
  }
  return in.ConsumedEntireMessage();
}

}  // namespace

RelayClient::~RelayClient() {
  for (int fd : idle_) ::close(fd);
}

std::string RelayClient::RelayName() const {
  return absl::StrCat("the rendezvous relay of host '", options_.host, "' at ", options_.relay);
}

absl::StatusOr<int> RelayClient::Connect(std::string& frames) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!idle_.empty()) {
      const int fd = idle_.back();
      idle_.pop_back();
      return fd;
    }
  }
  sockaddr_un address;
  const socklen_t length = RelaySocketAddress(options_.relay, address);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (length == 0 || fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&address), length) != 0) {
    const int error = errno;
    if (fd >= 0) ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot reach ", RelayName(), " (",
                     length == 0 ? "a bad socket name" : std::strerror(error),
                     "); the host's trainrun agent may have died"));
  }
  // The token first; the relay refuses every call of a connection without it. It goes in one
  // write with the first call, so the relay wakes once for both.
  AppendRequest(frames, RelayMethod::kHello, 0, 0, options_.token);
  return fd;
}

absl::Status RelayClient::CallForBytes(RelayMethod method,
                                       const google::protobuf::MessageLite& request,
                                       std::chrono::milliseconds timeout, std::string& in,
                                       std::string_view& body) {
  std::string frame;
  absl::StatusOr<int> connected = Connect(frame);
  if (!connected.ok()) return connected.status();
  const int fd = *connected;
  const uint32_t call_id = next_call_++;
  AppendRequest(frame, method, call_id, timeout.count(), request.SerializeAsString());
  const Clock::time_point deadline = Clock::now() + timeout;
  // The answer is read straight into `in`, grown to the frame's length once that has arrived: a
  // buffer on the stack would fault in pages of every rank thread's stack (64 KiB each, 512 MiB
  // for the bench's 8192 ranks), and one appended to would be copied as it grows.
  in.assign(4096, '\0');
  size_t have = 0;
  size_t length = 0;
  bool written = WriteAll(fd, frame);
  bool timed_out = false;
  while (written) {
    if (length == 0 && have >= 4) {
      length = FrameLength(std::string_view(in.data(), have));
      if (length > kMaxRelayFrame) break;
      if (length > in.size()) in.resize(length);
    }
    if (length != 0 && have >= length) break;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd poll_fd{fd, POLLIN, 0};
    const int ready =
        ::poll(&poll_fd, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) continue;
    // One call at a time on a connection: nothing follows this answer, so reading up to the
    // buffer's end never takes the next one's bytes.
    const ssize_t got = ::read(fd, in.data() + have, (length != 0 ? length : in.size()) - have);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    have += static_cast<size_t>(got);
  }
  RelayResponse answer;
  if (timed_out || length == 0 || have != length ||
      !ParseResponse(std::string_view(in.data(), length), answer) || answer.call_id != call_id) {
    // The connection is in an unknown state; the relay cancels what it carried when it closes.
    ::close(fd);
    if (timed_out) {
      return absl::DeadlineExceededError(
          absl::StrCat(RelayName(), " did not answer a ", MethodName(method), " call within ",
                       FormatDuration(timeout), "; check that trainrun is still running"));
    }
    return absl::UnavailableError(absl::StrCat(RelayName(), " closed the connection during a ",
                                               MethodName(method),
                                               " call; the host's trainrun agent may have died"));
  }
  const grpc::Status status(static_cast<grpc::StatusCode>(answer.code),
                            std::string(answer.message));
  if (answer.code == static_cast<int32_t>(grpc::StatusCode::UNAUTHENTICATED)) {
    ::close(fd);  // the relay closes it too
  } else {
    std::lock_guard<std::mutex> lock(mutex_);
    idle_.push_back(fd);
  }
  if (!status.ok()) return ClientError(status, options_, timeout);
  body = answer.body;
  return absl::OkStatus();
}

absl::Status RelayClient::Malformed(RelayMethod method) const {
  return absl::InternalError(
      absl::StrCat(RelayName(), " sent a malformed answer to a ", MethodName(method), " call"));
}

absl::Status RelayClient::Call(RelayMethod method, const google::protobuf::MessageLite& request,
                               google::protobuf::MessageLite* response,
                               std::chrono::milliseconds timeout) {
  std::string frame;
  std::string_view body;
  if (absl::Status status = CallForBytes(method, request, timeout, frame, body); !status.ok()) {
    return status;
  }
  if (!response->ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return Malformed(method);
  }
  return absl::OkStatus();
}

absl::Status RelayStore::Set(const std::string& key, const std::string& value) {
  proto::SetRequest request;
  request.set_key(key);
  request.set_value(value);
  proto::SetResponse response;
  return client_->Call(RelayMethod::kSet, request, &response, client_->options().call_timeout);
}

absl::StatusOr<std::vector<std::string>> RelayStore::Get(const std::vector<std::string>& keys,
                                                         std::chrono::milliseconds timeout) {
  const proto::GetRequest request = GetRequestFor(keys, timeout, rank_);
  proto::GetResponse response;
  if (absl::Status status =
          client_->Call(RelayMethod::kGet, request, &response, timeout + kWaitSlack);
      !status.ok()) {
    return status;
  }
  return UnpackValues(response, keys.size());
}

absl::StatusOr<int64_t> RelayStore::Add(const std::string& key, int64_t delta) {
  proto::AddRequest request;
  request.set_key(key);
  request.set_delta(delta);
  proto::AddResponse response;
  if (absl::Status status =
          client_->Call(RelayMethod::kAdd, request, &response, client_->options().call_timeout);
      !status.ok()) {
    return status;
  }
  return response.value();
}

absl::Status RelayStore::Barrier(const std::string& name, int count,
                                 std::chrono::milliseconds timeout) {
  const proto::BarrierRequest request = BarrierRequestFor(name, count, timeout, rank_);
  proto::BarrierResponse response;
  return client_->Call(RelayMethod::kBarrier, request, &response, timeout + kWaitSlack);
}

absl::StatusOr<GatherTable> RelayStore::AllgatherTable(const std::string& name, int rank, int count,
                                                       const std::string& value,
                                                       std::chrono::milliseconds timeout) {
  absl::StatusOr<proto::AllgatherRequest> request =
      AllgatherRequestFor(name, rank, count, value, timeout);
  if (!request.ok()) return request.status();
  // The table (~40 KiB at 8192 ranks) is decoded where it arrived, not copied into a response
  // message first.
  std::string frame;
  std::string_view body;
  if (absl::Status status = client_->CallForBytes(RelayMethod::kAllgather, *request,
                                                  timeout + kWaitSlack, frame, body);
      !status.ok()) {
    return status;
  }
  std::string_view table;
  if (!FindGatherTable(body, table)) return client_->Malformed(RelayMethod::kAllgather);
  return DecodeGatherTable(table, static_cast<size_t>(count));
}

absl::StatusOr<std::vector<std::string>> RelayStore::Allgather(const std::string& name, int rank,
                                                               int count, const std::string& value,
                                                               std::chrono::milliseconds timeout) {
  absl::StatusOr<GatherTable> table = AllgatherTable(name, rank, count, value, timeout);
  if (!table.ok()) return table.status();
  return table->ToStrings();
}

absl::Status RelayStore::ReportPeerFailure(int rank, int peer_rank, const std::string& message) {
  const proto::ExitReport request = PeerFailureReport(rank, peer_rank, message);
  proto::ExitResponse response;
  return client_->Call(RelayMethod::kReportExit, request, &response,
                       client_->options().call_timeout);
}

}  // namespace trainrun::rendezvous::internal
