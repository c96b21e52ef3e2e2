// The frames between a rank's rendezvous client and its host's relay (relay.h), on a Unix socket.
//
// A request frame: u32 length of what follows, u8 method, u32 call id, i64 the caller's deadline
// in milliseconds from now, then the method's request proto, serialized. A response frame: u32
// length, u32 call id, i32 status code (grpc::StatusCode), u32 message length, the message, then
// the response proto. Integers are little-endian (both ends are on one host). A connection opens
// with a kHello request carrying the job's token, which the relay checks before any call; a client
// has one call at a time on a connection and opens another for concurrent calls.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace trainrun::rendezvous::internal {

enum class RelayMethod : uint8_t {
  kHello = 0,
  kJoin = 1,
  kSet = 2,
  kGet = 3,
  kAdd = 4,
  kBarrier = 5,
  kAllgather = 6,
  kReportExit = 7,
};
inline constexpr uint8_t kRelayMethodCount = 8;

// RelayMethodPath is the method's full gRPC name ("/trainrun.rendezvous.proto.Rendezvous/Set").
const char* RelayMethodPath(RelayMethod method);

// The largest frame either end accepts: the largest rendezvous answer and some.
inline constexpr uint32_t kMaxRelayFrame = (256u << 20) + 4096;
// The largest frame of a connection that has not shown the token: a hello, or the call that comes
// with it (a join). Anything on the host can connect, so a stranger must not make the relay hold
// kMaxRelayFrame bytes before it is refused.
inline constexpr uint32_t kMaxUnauthenticatedFrame = 64u << 10;
inline constexpr size_t kRequestHeader = 4 + 1 + 4 + 8;
inline constexpr size_t kResponseHeader = 4 + 4 + 4 + 4;

struct RelayRequest {
  RelayMethod method = RelayMethod::kHello;
  uint32_t call_id = 0;
  int64_t deadline_ms = 0;
  std::string_view body;
};

struct RelayResponse {
  uint32_t call_id = 0;
  int32_t code = 0;
  std::string_view message;
  std::string_view body;
};

// AppendRequest and AppendResponse append one whole frame to `out`. `body2` follows `body` (the
// relay appends a join batch's shared part this way, protobuf merging concatenated messages).
void AppendRequest(std::string& out, RelayMethod method, uint32_t call_id, int64_t deadline_ms,
                   std::string_view body);
void AppendResponse(std::string& out, uint32_t call_id, int32_t code, std::string_view message,
                    std::string_view body, std::string_view body2 = {});
// AppendResponseHead appends a response frame's header and message only, its length counting
// `body_size` bytes of body that the caller sends after it (the relay writes a shared body
// straight from where it is, rather than copying it into each rank's frame).
void AppendResponseHead(std::string& out, uint32_t call_id, int32_t code, std::string_view message,
                        size_t body_size);

// FrameLength returns the length of the whole frame at the start of `buffer` (header included), or
// 0 when not even its length has arrived.
size_t FrameLength(std::string_view buffer);

// ParseRequest and ParseResponse read one whole frame (FrameLength bytes); false when malformed.
bool ParseRequest(std::string_view frame, RelayRequest& request);
bool ParseResponse(std::string_view frame, RelayResponse& response);

}  // namespace trainrun::rendezvous::internal
