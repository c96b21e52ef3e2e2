// Admission: what a listener facing the network allows a connection that has not yet proved the
// job's token. Every listener of a job (the rendezvous, node 0's join port) keeps one, so that no
// stranger can hold a resource for long before authentication:
//
//   - one deadline from accept to proof (kDefaultDeadline), whatever the connection sent;
//   - a cap on unproven connections from one peer address and in all: a new connection over a cap
//     closes the oldest unproven one (from that address, or in all), so a flood ages out its own
//     connections while a real rank, which proves itself in milliseconds, is never the oldest;
//   - a cap on the bytes read from a connection before its proof (the listener enforces it; the
//     count of its closes is kept here).
//
// Connections closed for any of these are counted, and the counts said in one line a minute at
// most (the first at once), never a line per connection.
//
//   Admission admission("the rendezvous", Admission::Limits{});
//   for (uint64_t evicted : admission.Admit(id, "10.0.0.7", now)) Close(evicted);
//   ...                                // the connection proved the token:
//   admission.Proven(id);
//   for (uint64_t late : admission.Expired(now)) Close(late);   // every sweep
//
// Not thread-safe: the listener's own thread owns it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace trainrun::rendezvous {

class Admission {
 public:
  using Clock = std::chrono::steady_clock;

  static constexpr std::chrono::milliseconds kDefaultDeadline{5000};
  // A few KiB: a join line or a rank's handshake fits; a large message does not. (The rendezvous'
  // TCP port cannot count bytes inside TLS: there gRPC refuses a call without the token before it
  // reads the call's message, rendezvous/src/tls.h.)
  static constexpr size_t kDefaultMaxBytesBeforeProof = 16 * 1024;
  static constexpr std::chrono::seconds kReportPeriod{60};

  struct Limits {
    std::chrono::milliseconds deadline = kDefaultDeadline;
    size_t per_address = 256;  // unproven connections from one peer address
    size_t total = 1024;       // unproven connections in all
    size_t max_bytes = kDefaultMaxBytesBeforeProof;
  };

  // Why a connection was closed before its proof.
  enum class Reason { kDeadline, kPerAddress, kTotal, kTooManyBytes, kRefused };

  // `what` names the listener in the report line ("the rendezvous", "the per-node join port").
  // `report` receives that line (default: stderr).
  Admission(std::string what, Limits limits, std::function<void(const std::string&)> report = {});

  // Admit records connection `id` (unique among those held) from `address`, accepted at `now`.
  // Returns the connections to close to keep within the caps (the oldest unproven from that
  // address, else in all), counted; `id` itself is never among them.
  std::vector<uint64_t> Admit(uint64_t id, const std::string& address, Clock::time_point now);
  // Proven forgets `id` as unproven: it proved the token. False when it was not held (already
  // closed, or evicted).
  bool Proven(uint64_t id);
  // Closed forgets `id` (it went away, or the listener closed it for `why`, which is counted).
  void Closed(uint64_t id);
  void Closed(uint64_t id, Reason why);
  // Expired returns (and forgets, counted) the unproven connections whose deadline has passed.
  std::vector<uint64_t> Expired(Clock::time_point now);
  // Report says the counts of closes since the last line, if any, when kReportPeriod has passed
  // since it (or at the first close). Expired and Admit call it; a quiet listener may too.
  void Report(Clock::time_point now);

  size_t unproven() const { return held_.size(); }
  size_t unproven_from(const std::string& address) const;
  const Limits& limits() const { return limits_; }
  // Every connection closed before its proof so far.
  uint64_t closed_total() const { return closed_total_; }

 private:
  struct Held {
    std::string address;
    Clock::time_point accepted;
  };
  void Forget(uint64_t id, const Held& held);
  // Oldest unproven connection (from `address`, or any when empty) still held; 0 if none.
  uint64_t Oldest(const std::string* address);

  std::string what_;
  Limits limits_;
  std::function<void(const std::string&)> report_;
  std::unordered_map<uint64_t, Held> held_;
  std::unordered_map<std::string, size_t> per_address_;
  // Admission order; entries no longer held are skipped (and dropped) lazily.
  std::deque<uint64_t> order_;
  std::unordered_map<std::string, std::deque<uint64_t>> order_by_address_;
  // Closes since the last report, by Reason, and the addresses they came from (a few named).
  uint64_t counts_[5] = {0, 0, 0, 0, 0};
  std::unordered_map<std::string, uint64_t> closed_from_;
  uint64_t closed_total_ = 0;
  bool reported_once_ = false;
  Clock::time_point last_report_{};
};

}  // namespace trainrun::rendezvous
