#include "timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>

#include "call_check.h"
#include "trainrun/collectives/errors.h"

namespace trainrun::collectives::internal {
namespace {

using ::trainrun::internal::MakeMessage;

// Escaped returns `text` as the inside of a JSON string.
std::string Escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += MakeMessage("\\u00", "0123456789abcdef"[(c >> 4) & 0xf], "0123456789abcdef"[c & 0xf]);
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

Timeline::~Timeline() { Stop(); }

int64_t Timeline::Now() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void Timeline::Start(const std::string& path, int rank) {
  Stop();
  const int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (rank == 0 ? O_TRUNC : 0);
  const int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) {
    throw InvalidArgumentError(MakeMessage("cannot write the timeline to ", path, ": ",
                                           std::strerror(errno),
                                           " (check TRAINRUN_TIMELINE / --timeline-filename)"));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  fd_ = fd;
  rank_ = rank;
  named_tracks_.clear();
  // The track's name goes with this rank's first event, which cannot exist before rank 0 has
  // truncated the file (it takes part in that collective); only rank 0 may write now.
  pending_ =
      MakeMessage(R"({"name":"process_name","ph":"M","pid":)", rank, R"(,"args":{"name":"rank )",
                  rank, R"("}},)", "\n", R"({"name":"process_sort_index","ph":"M","pid":)", rank,
                  R"(,"args":{"sort_index":)", rank, "}},\n");
  if (rank == 0) WriteLocked("[\n");
}

void Timeline::Stop() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Timeline::Record(const CallRecord& call, const std::string& set, int64_t start, int64_t agreed,
                      int64_t end) {
  const std::string name(call.name, strnlen(call.name, sizeof(call.name)));
  const bool has_type = static_cast<CollectiveKind>(call.kind) != CollectiveKind::kBarrier &&
                        static_cast<CollectiveKind>(call.kind) != CollectiveKind::kJoin;
  const auto type = static_cast<DataType>(call.dtype);
  const uint64_t bytes = has_type ? call.count * ElementSize(type) : 0;
  const std::string title =
      name.empty() ? KindName(call.kind) : MakeMessage(KindName(call.kind), " ", name);
  // Thread 0 is the job; a process set gets a track of its own under the rank, numbered from its
  // name so that every rank numbers it alike.
  const int64_t tid =
      set.empty() ? 0 : 1 + static_cast<int64_t>(std::hash<std::string>{}(set) % 1000000);
  std::string lines;
  if (!set.empty() && named_tracks_.insert(tid).second) {
    lines += MakeMessage(R"({"name":"thread_name","ph":"M","pid":)", rank_, R"(,"tid":)", tid,
                         R"(,"args":{"name":")", Escaped(set), "\"}},\n");
  }
  lines += MakeMessage(R"({"name":")", Escaped(title), R"(","cat":")", KindName(call.kind),
                       R"(","ph":"X","pid":)", rank_, R"(,"tid":)", tid, R"(,"ts":)", start,
                       R"(,"dur":)", end - start, R"(,"args":{"bytes":)", bytes, R"(,"count":)",
                       call.count, R"(,"dtype":")", has_type ? DataTypeName(type) : "none",
                       R"(","name":")", Escaped(name), "\"}},\n");
  lines += MakeMessage(R"({"name":"wait for peers","cat":"phase","ph":"X","pid":)", rank_,
                       R"(,"tid":)", tid, R"(,"ts":)", start, R"(,"dur":)", agreed - start, "},\n");
  lines += MakeMessage(R"({"name":"transfer and reduce","cat":"phase","ph":"X","pid":)", rank_,
                       R"(,"tid":)", tid, R"(,"ts":)", agreed, R"(,"dur":)", end - agreed, "},\n");
  Write(lines);
}

void Timeline::Write(const std::string& lines) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!pending_.empty()) {
    WriteLocked(pending_ + lines);
    pending_.clear();
  } else {
    WriteLocked(lines);
  }
}

void Timeline::WriteLocked(const std::string& lines) {
  if (fd_ < 0) return;
  // One write of whole lines: with O_APPEND, another rank's lines never land inside them.
  const ssize_t n = ::write(fd_, lines.data(), lines.size());
  (void)n;  // A full disk loses trace lines, never the training run.
}

}  // namespace trainrun::collectives::internal
