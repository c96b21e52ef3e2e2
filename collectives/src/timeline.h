// Timeline: a Chrome trace (JSON array format; opens in chrome://tracing and Perfetto) of every
// collective this rank runs: one track per rank (pid = the rank), each collective one event named
// by kind and name, with its bytes, dtype and count, and two nested phases: "wait for peers" (the
// exchange of call records, which lasts until the slowest rank arrives) and "transfer and reduce".
//
// Every rank appends its own events to the one file, one write(2) of whole lines each with
// O_APPEND, so lines never interleave; rank 0 creates (truncates) the file and writes the opening
// "[" when the timeline starts, before any event of a collective it takes part in can exist. The
// closing "]" is left out, which the JSON array format allows.
//
//   Timeline timeline;
//   timeline.Start("/tmp/trace.json", rank);       // rank 0 truncates
//   auto t0 = Timeline::Now(); ... auto t1 = Timeline::Now(); ... auto t2 = Timeline::Now();
//   timeline.Record(record, "process set 1", t0, t1, t2);
//
// Off (the default), Record is not called: the cost is one branch per collective.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_set>

#include "call_check.h"

namespace trainrun::collectives::internal {

class Timeline {
 public:
  Timeline() = default;
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Start opens `path` (rank 0 truncates it and writes the header) and names this rank's track.
  // Throws InvalidArgumentError naming the path when it cannot be opened.
  void Start(const std::string& path, int rank);
  // Stop closes the file; later collectives are not recorded.
  void Stop();
  bool enabled() const { return fd_ >= 0; }

  // Now is the timestamp the events use: microseconds of the system clock, so ranks on one host
  // share a time base.
  static int64_t Now();

  // Record appends one collective: `call` describes it, `set` names its process set ("" for the
  // job), [start, agreed) was spent waiting for peers, [agreed, end) moving and reducing data.
  void Record(const CallRecord& call, const std::string& set, int64_t start, int64_t agreed,
              int64_t end);

 private:
  void Write(const std::string& lines);
  void WriteLocked(const std::string& lines);

  int fd_ = -1;
  int rank_ = 0;
  std::string pending_;  // this rank's metadata lines, written with its first event
  std::unordered_set<int64_t> named_tracks_;  // process-set tracks already named
  std::mutex mutex_;
};

}  // namespace trainrun::collectives::internal
