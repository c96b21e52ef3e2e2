// The agent protocol as either end reads it from the SSH channel: frames cut from a byte stream
// (fed in two pieces, as reads split it), each decoded by its type.
#include <cstdint>
#include <string>

#include "fuzz_budget.h"
#include "remote/agent_protocol.h"

namespace remote = trainrun::launcher::remote;

namespace {

void Decode(const remote::Frame& frame) {
  switch (frame.type) {
    case remote::MessageType::kHello:
      (void)remote::DecodeHello(frame.payload);
      break;
    case remote::MessageType::kJob:
      (void)remote::DecodeJob(frame.payload);
      break;
    case remote::MessageType::kStarted:
      (void)remote::DecodeStarted(frame.payload);
      break;
    case remote::MessageType::kOutput:
      (void)remote::DecodeOutput(frame.payload);
      break;
    case remote::MessageType::kExit:
      (void)remote::DecodeExit(frame.payload);
      break;
    case remote::MessageType::kError:
      (void)remote::DecodeError(frame.payload);
      break;
    case remote::MessageType::kJobEnd:
      (void)remote::DecodeJobEnd(frame.payload);
      break;
    case remote::MessageType::kSyncOffer:
      (void)remote::DecodeSyncOffer(frame.payload);
      break;
    case remote::MessageType::kSyncWant:
      (void)remote::DecodeSyncWant(frame.payload);
      break;
    case remote::MessageType::kSyncData:
      (void)remote::DecodeSyncData(frame.payload);
      break;
    case remote::MessageType::kSyncDone:
      (void)remote::DecodeSyncDone(frame.payload);
      break;
    default:
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trainrun::fuzz::FuzzBudget budget("agent_frame");
  const char* bytes = reinterpret_cast<const char*>(data);
  const size_t split = size == 0 ? 0 : data[0] % (size + 1);
  remote::FrameReader reader;
  for (auto piece : {std::string(bytes, split), std::string(bytes + split, size - split)}) {
    reader.Append(piece);
    for (;;) {
      auto next = reader.Next();
      if (!next.ok() || !next->has_value()) break;
      Decode(**next);
    }
  }
  return 0;
}
