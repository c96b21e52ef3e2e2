// The data-plane handshake as an acceptor reads it from a stranger: a hello, then a proof. Rank 0
// of a 4-rank communicator with two connections per peer.
#include <cstdint>
#include <string>

#include "fuzz_budget.h"
#include "handshake.h"
#include "trainrun/collectives/errors.h"

namespace internal = trainrun::collectives::internal;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trainrun::fuzz::FuzzBudget budget("handshake");
  if (size < internal::kHandshakeHelloBytes) return 0;
  static const internal::HandshakeParams params{"fuzz-token", "fuzz-job", "world", 4, 2};
  internal::AcceptorChallenge challenge;
  try {
    (void)internal::AnswerHello(params, 0, data, &challenge);
  } catch (const trainrun::Error&) {
    return 0;
  }
  if (size < internal::kHandshakeHelloBytes + internal::kHandshakeProofBytes) return 0;
  try {
    (void)internal::CheckProof(params, challenge, data + internal::kHandshakeHelloBytes);
    std::abort();  // a proof that matches without the token: the handshake is broken
  } catch (const trainrun::Error&) {
  }
  return 0;
}
