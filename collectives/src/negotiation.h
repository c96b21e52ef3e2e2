// One round of the negotiation of named collectives' order (comm_thread.h), shared by the
// communication thread (CommThread::Negotiate) and a rank in join() (Communicator::Join), which
// takes part in the other ranks' negotiation with no keys of its own.
//
// Every rank of the communicator allgathers kWords words: [number of keys, waits, tag, ms
// negotiated so far, keys...]. `waits` is 1 when the rank has a thread waiting and queued nothing
// new, kJoined for a rank in join() (it waits, and is left out of what must be common); `tag`
// tells the communicators apart. Every rank decides alike from the same words (Decide).
//
//   std::vector<uint64_t> common;
//   switch (Negotiation::Decide(all, n, tag, timeout_ms, &stuck_rounds, &common)) { ... }
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace trainrun::collectives::internal {

struct Negotiation {
  static constexpr size_t kHeader = 4;
  // How many keys one round exchanges per rank at most (8 KiB each with the header).
  static constexpr size_t kMostKeys = 1020;
  static constexpr size_t kWords = kHeader + kMostKeys;
  static constexpr uint64_t kJoined = 2;
  // Rounds with every rank waiting, nothing in common and nothing new before the ranks' first
  // pending collectives fail.
  static constexpr int kStuckRounds = 500;

  enum class Outcome {
    kAgreed,     // `common` holds what runs next, in order
    kOtherSets,  // the ranks' heads belong to different communicators over one transport
    kStuck,      // kStuckRounds rounds with every rank waiting and nothing new
    kTimedOut,   // the lowest rank has negotiated for timeout_ms
    kAgain,      // nothing in common yet: another round
  };

  // Tag: a communicator's tag word (odd), from its set's name and size.
  static uint64_t Tag(const std::string& set_name, size_t n);

  // Decide: what one round's words `all` (n ranks, kWords each) decide. `common`: the keys every
  // rank not in join() has, in the lowest such rank's order. `stuck_rounds` counts the rounds in a
  // row with every rank waiting.
  static Outcome Decide(const std::vector<uint64_t>& all, size_t n, uint64_t tag,
                        int64_t timeout_ms, int* stuck_rounds, std::vector<uint64_t>* common);
};

}  // namespace trainrun::collectives::internal
