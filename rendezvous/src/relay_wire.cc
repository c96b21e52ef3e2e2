#include "relay_wire.h"

#include <cstring>

namespace trainrun::rendezvous::internal {
namespace {

template <typename T>
void Put(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // x86 and arm64 Linux: little-endian
  out.append(bytes, sizeof(T));
}

template <typename T>
T Take(std::string_view& in) {
  T value;
  std::memcpy(&value, in.data(), sizeof(T));
  in.remove_prefix(sizeof(T));
  return value;
}

}  // namespace

const char* RelayMethodPath(RelayMethod method) {
  switch (method) {
    case RelayMethod::kJoin:
      return "/trainrun.rendezvous.proto.Rendezvous/Join";
    case RelayMethod::kSet:
      return "/trainrun.rendezvous.proto.Rendezvous/Set";
    case RelayMethod::kGet:
      return "/trainrun.rendezvous.proto.Rendezvous/Get";
    case RelayMethod::kAdd:
      return "/trainrun.rendezvous.proto.Rendezvous/Add";
    case RelayMethod::kBarrier:
      return "/trainrun.rendezvous.proto.Rendezvous/Barrier";
    case RelayMethod::kAllgather:
      return "/trainrun.rendezvous.proto.Rendezvous/Allgather";
    case RelayMethod::kReportExit:
      return "/trainrun.rendezvous.proto.Rendezvous/ReportExit";
    case RelayMethod::kHello:
      break;
  }
  return "";
}

void AppendRequest(std::string& out, RelayMethod method, uint32_t call_id, int64_t deadline_ms,
                   std::string_view body) {
  Put<uint32_t>(out, static_cast<uint32_t>(kRequestHeader - 4 + body.size()));
  Put<uint8_t>(out, static_cast<uint8_t>(method));
  Put<uint32_t>(out, call_id);
  Put<int64_t>(out, deadline_ms);
  out.append(body);
}

void AppendResponseHead(std::string& out, uint32_t call_id, int32_t code, std::string_view message,
                        size_t body_size) {
  Put<uint32_t>(out, static_cast<uint32_t>(kResponseHeader - 4 + message.size() + body_size));
  Put<uint32_t>(out, call_id);
  Put<int32_t>(out, code);
  Put<uint32_t>(out, static_cast<uint32_t>(message.size()));
  out.append(message);
}

void AppendResponse(std::string& out, uint32_t call_id, int32_t code, std::string_view message,
                    std::string_view body, std::string_view body2) {
  AppendResponseHead(out, call_id, code, message, body.size() + body2.size());
  out.append(body);
  out.append(body2);
}

size_t FrameLength(std::string_view buffer) {
  if (buffer.size() < 4) return 0;
  return size_t{Take<uint32_t>(buffer)} + 4;
}

bool ParseRequest(std::string_view frame, RelayRequest& request) {
  if (frame.size() < kRequestHeader || FrameLength(frame) != frame.size()) return false;
  frame.remove_prefix(4);
  const uint8_t method = Take<uint8_t>(frame);
  if (method >= kRelayMethodCount) return false;
  request.method = static_cast<RelayMethod>(method);
  request.call_id = Take<uint32_t>(frame);
  request.deadline_ms = Take<int64_t>(frame);
  request.body = frame;
  return true;
}

bool ParseResponse(std::string_view frame, RelayResponse& response) {
  if (frame.size() < kResponseHeader || FrameLength(frame) != frame.size()) return false;
  frame.remove_prefix(4);
  response.call_id = Take<uint32_t>(frame);
  response.code = Take<int32_t>(frame);
  const uint32_t message_size = Take<uint32_t>(frame);
  if (message_size > frame.size()) return false;
  response.message = frame.substr(0, message_size);
  response.body = frame.substr(message_size);
  return true;
}

}  // namespace trainrun::rendezvous::internal
