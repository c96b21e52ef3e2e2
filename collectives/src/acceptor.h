// Acceptor: accepts a rank's data connections during setup and proves each with the handshake,
// all on one thread with poll(2), so that strangers cannot cost a thread each.
//
// A rank listens while it connects to lower ranks; higher ranks connect to it. Anyone may reach
// that port (on a multi-host job it faces the network), so what a stranger can cost is bounded:
// one thread in all, at most kMaxPending connections mid-handshake and kMaxPendingPerAddress from
// one peer address (rendezvous::Admission's rules: a new one over a cap pushes out the oldest from
// its address, else in all, so a flood of idle connections ages out its own and cannot shut real
// peers out), kHandshakeTimeout each, and a few log lines however many are refused.
//
//   Acceptor acceptor(std::move(listener), params, rank, deadline,
//                     [&](PeerIdentity who, Fd fd) { ...; return true; });
//   ... until enough peers were placed; the destructor stops accepting.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "handshake.h"
#include "socket.h"
#include "trainrun/rendezvous/admission.h"

namespace trainrun::collectives::internal {

class Acceptor {
 public:
  // Place takes a proven connection; it returns false for a duplicate (which is then dropped).
  using Place = std::function<bool(PeerIdentity, Fd)>;

  static constexpr size_t kMaxPending = 256;
  // Three quarters of the whole: a flood from one address leaves the others room.
  static constexpr size_t kMaxPendingPerAddress = kMaxPending * 3 / 4;
  static constexpr std::chrono::seconds kHandshakeTimeout{5};  // the deadline of admission.h
  // Refused connections logged one by one; the rest are counted in one line at the end.
  static constexpr int kMaxLogged = 3;

  // Starts accepting on `listener` until `deadline` or destruction. Throws IoError when its thread
  // cannot be started.
  Acceptor(Fd listener, const HandshakeParams& params, int rank, Clock::time_point deadline,
           Place place);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

 private:
  struct Pending;

  void Run();
  // Refuse logs why a connection was dropped (the first kMaxLogged of them).
  void Refuse(const std::string& peer, const std::string& why);

  Fd listener_;
  HandshakeParams params_;
  int rank_;
  Clock::time_point deadline_;
  Place place_;
  std::atomic<bool> stop_{false};
  rendezvous::Admission admission_;  // the acceptor's thread's
  int refused_ = 0;                  // on the acceptor's thread, then read after it is joined
  std::thread thread_;
};

}  // namespace trainrun::collectives::internal
