#include "remote/file_sync.h"

#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "remote/agent.h"

namespace trainrun::launcher::remote {
namespace {

// Pieces of a file travel in frames of this size (far below kMaxFrameBytes).
constexpr size_t kChunkBytes = 1u << 20;

std::string Errno() { return std::strerror(errno); }

std::string Join(const std::string& dir, absl::string_view path) {
  return path.empty() ? dir : absl::StrCat(dir, "/", path);
}

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

// Walks `dir`/`rel` into `entries`, sorted by name.
absl::Status Walk(const std::string& src, const std::string& rel, const std::string& skip,
                  const std::vector<std::string>& excludes, std::vector<SyncEntry>& entries) {
  const std::string path = Join(src, rel);
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--sync-src-dir: cannot read the directory '", path, "': ", Errno()));
  }
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      names.emplace_back(e->d_name);
    }
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const std::string child = rel.empty() ? name : absl::StrCat(rel, "/", name);
    if (Excluded(child, excludes)) continue;
    const std::string full = Join(src, child);
    struct stat st {};
    if (::lstat(full.c_str(), &st) != 0) continue;  // gone meanwhile
    SyncEntry entry;
    entry.path = child;
    entry.mode = st.st_mode;
    entry.mtime_ns = MtimeNs(st);
    if (S_ISDIR(st.st_mode)) {
      if (full == skip) continue;
      entries.push_back(entry);
      if (absl::Status walked = Walk(src, child, skip, excludes, entries); !walked.ok()) {
        return walked;
      }
    } else if (S_ISREG(st.st_mode)) {
      entry.size = static_cast<uint64_t>(st.st_size);
      entries.push_back(entry);
    } else if (S_ISLNK(st.st_mode)) {
      char target[4096];
      ssize_t n = ::readlink(full.c_str(), target, sizeof target);
      if (n < 0) continue;
      entry.link.assign(target, static_cast<size_t>(n));
      entries.push_back(entry);
    }
  }
  return absl::OkStatus();
}

// A path of the offer must stay inside the directory.
bool SafePath(absl::string_view path) {
  if (path.empty() || path[0] == '/') return false;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

// MakeDirs makes `dir` and its missing parents.
absl::Status MakeDirs(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("cannot sync to '", dir, "': it is not a directory there"));
  }
  const size_t slash = dir.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    if (absl::Status parent = MakeDirs(dir.substr(0, slash)); !parent.ok()) return parent;
  }
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the directory '", dir, "': ", Errno()));
  }
  return absl::OkStatus();
}

// SendFiles reads the wanted files of `offer` from `src` and hands each piece to `sink`.
absl::Status SendFiles(
    const SyncOffer& offer, const std::string& src, const std::vector<uint32_t>& wanted,
    SyncProgress& progress,
    const std::function<absl::Status(uint32_t, uint64_t, absl::string_view)>& sink) {
  std::string buffer(kChunkBytes, '\0');
  for (uint32_t index : wanted) {
    const SyncEntry& entry = offer.entries[index];
    const std::string path = Join(src, entry.path);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("--sync-src-dir: cannot read '", path, "': ", Errno()));
    }
    uint64_t offset = 0;
    absl::Status status;
    do {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunkBytes, entry.size - offset));
      ssize_t n = want == 0 ? 0 : ::pread(fd, buffer.data(), want, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 || (want > 0 && n == 0)) {
        status = absl::FailedPreconditionError(absl::StrCat(
            "--sync-src-dir: '", path, "' ", n < 0 ? Errno() : "shrank during the sync"));
        break;
      }
      status = sink(index, offset, absl::string_view(buffer.data(), static_cast<size_t>(n)));
      if (!status.ok()) break;
      offset += static_cast<uint64_t>(n);
      progress.sent += static_cast<uint64_t>(n);
    } while (offset < entry.size);
    ::close(fd);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

uint64_t WantedBytes(const SyncOffer& offer, const std::vector<uint32_t>& wanted) {
  uint64_t bytes = 0;
  for (uint32_t index : wanted) bytes += offer.entries[index].size;
  return bytes;
}

uint64_t FileCount(const SyncOffer& offer) {
  return static_cast<uint64_t>(std::count_if(offer.entries.begin(), offer.entries.end(),
                                             [](const SyncEntry& e) { return S_ISREG(e.mode); }));
}

// AgentSync is one host's side of SyncToAgents, on its own thread.
class AgentSync {
 public:
  AgentSync(RemoteAgent& agent, const std::atomic<bool>& stop) : agent_(agent), stop_(stop) {}

  absl::StatusOr<SyncStats> Run(const SyncOffer& offer, const std::string& encoded_offer,
                                const std::string& src, SyncProgress& progress) {
    if (absl::Status sent = Write(encoded_offer); !sent.ok()) return sent;
    absl::StatusOr<Frame> want = Await(MessageType::kSyncWant);
    if (!want.ok()) return want.status();
    absl::StatusOr<std::vector<uint32_t>> wanted = DecodeSyncWant(want->payload);
    if (!wanted.ok()) return Named(wanted.status().message());
    for (uint32_t index : *wanted) {
      if (index >= offer.entries.size() || !S_ISREG(offer.entries[index].mode)) {
        return Named("the agent asked for a file the sync did not offer");
      }
    }
    progress.total += WantedBytes(offer, *wanted);
    absl::Status sent = SendFiles(offer, src, *wanted, progress,
                                  [this](uint32_t index, uint64_t offset, absl::string_view bytes) {
                                    if (stop_) return absl::CancelledError("another host failed");
                                    // Now and then: has the agent given up (a full disk)? Then
                                    // stop now, not after the rest of the copy.
                                    if (absl::Now() - last_glance_ > absl::Milliseconds(200)) {
                                      last_glance_ = absl::Now();
                                      absl::Status early = Glance();
                                      if (!early.ok()) return early;
                                    }
                                    return Write(EncodeSyncData(index, offset, bytes));
                                  });
    if (!sent.ok()) return sent;
    if (absl::Status ended = Write(EncodeFrame(MessageType::kSyncEnd)); !ended.ok()) return ended;
    absl::StatusOr<Frame> frame = Await(MessageType::kSyncDone);
    if (!frame.ok()) return frame.status();
    absl::StatusOr<SyncDone> done = DecodeSyncDone(frame->payload);
    if (!done.ok()) return Named(done.status().message());
    SyncStats stats;
    stats.hosts = 1;
    stats.files = done->files;
    stats.bytes = done->bytes;
    stats.unchanged = FileCount(offer) - wanted->size();
    return stats;
  }

 private:
  absl::Status Named(absl::string_view message) const {
    return absl::FailedPreconditionError(absl::StrCat("host ", agent_.name(), ": ", message));
  }

  absl::Status Write(const std::string& frame) {
    absl::Status written =
        agent_.stream->Write(frame, absl::FromChrono(std::chrono::seconds(kSilenceLimit)));
    if (written.ok()) return written;
    // The agent may have said why it stopped reading (a full disk).
    absl::StatusOr<Frame> reason = Await(MessageType::kSyncDone, absl::Seconds(1));
    if (!reason.ok() && !absl::IsDeadlineExceeded(reason.status())) return reason.status();
    return Named(absl::StrCat("the sync's connection failed: ", written.message()));
  }

  // Glance reads what has arrived already (waiting a millisecond at most): an Error from the agent
  // is returned.
  absl::Status Glance() {
    char buffer[4096];
    absl::StatusOr<size_t> n = agent_.stream->Read(buffer, sizeof buffer, absl::Milliseconds(1));
    if (!n.ok() || *n == 0) return absl::OkStatus();  // nothing, or the end: Write will say
    agent_.reader.Append(absl::string_view(buffer, *n));
    for (;;) {
      absl::StatusOr<std::optional<Frame>> next = agent_.reader.Next();
      if (!next.ok()) return Named(next.status().message());
      if (!next->has_value()) return absl::OkStatus();
      if ((*next)->type == MessageType::kError) {
        absl::StatusOr<std::string> message = DecodeError((*next)->payload);
        return Named(message.ok() ? *message : "the agent failed the sync");
      }
    }
  }

  // Await reads frames until one of `type` (an Error from the agent is its failure).
  absl::StatusOr<Frame> Await(MessageType type,
                              absl::Duration silence = absl::FromChrono(kSilenceLimit)) {
    char buffer[64 * 1024];
    absl::Time deadline = absl::Now() + silence;
    for (;;) {
      absl::StatusOr<std::optional<Frame>> next = agent_.reader.Next();
      if (!next.ok()) return Named(next.status().message());
      if (next->has_value()) {
        Frame& frame = **next;
        if (frame.type == type) return std::move(frame);
        if (frame.type == MessageType::kError) {
          absl::StatusOr<std::string> message = DecodeError(frame.payload);
          return Named(message.ok() ? *message : "the agent failed the sync");
        }
        continue;  // a heartbeat's answer
      }
      if (stop_) return absl::CancelledError("another host failed");
      absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(absl::StrCat("host ", agent_.name(),
                                                        ": the agent did not answer the sync for ",
                                                        absl::FormatDuration(silence)));
      }
      absl::StatusOr<size_t> n =
          agent_.stream->Read(buffer, sizeof buffer, std::min(left, absl::Milliseconds(200)));
      if (!n.ok() && absl::IsDeadlineExceeded(n.status())) continue;
      if (!n.ok()) return n.status();
      if (*n == 0) {
        absl::Status end = agent_.stream->EndStatus();
        return end.ok() ? Named("the agent ended during the sync") : end;
      }
      deadline = absl::Now() + silence;
      agent_.reader.Append(absl::string_view(buffer, *n));
    }
  }

  RemoteAgent& agent_;
  const std::atomic<bool>& stop_;
  absl::Time last_glance_ = absl::Now();
};

void Add(SyncStats& sum, const SyncStats& part) {
  sum.hosts += part.hosts;
  sum.files += part.files;
  sum.bytes += part.bytes;
  sum.unchanged += part.unchanged;
}

}  // namespace

bool Excluded(absl::string_view path, const std::vector<std::string>& excludes) {
  const size_t slash = path.rfind('/');
  const std::string name(slash == absl::string_view::npos ? path : path.substr(slash + 1));
  if (name == ".git") return true;
  const std::string whole(path);
  for (const std::string& pattern : excludes) {
    const bool anchored = pattern.find('/') != std::string::npos;
    const std::string bare = absl::StartsWith(pattern, "/") ? pattern.substr(1) : pattern;
    if (::fnmatch(bare.c_str(), anchored ? whole.c_str() : name.c_str(), 0) == 0) return true;
  }
  return false;
}

absl::StatusOr<SyncOffer> ScanSource(const std::string& src, const std::string& dir,
                                     const std::vector<std::string>& excludes) {
  struct stat st {};
  const bool missing = ::stat(src.c_str(), &st) != 0;
  if (missing || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--sync-src-dir '", src, "' ",
        missing ? absl::StrCat("cannot be read: ", Errno()) : std::string("is not a directory"),
        "; give the directory to copy to the hosts"));
  }
  SyncOffer offer;
  offer.dir = dir;
  if (absl::Status walked = Walk(src, "", dir, excludes, offer.entries); !walked.ok()) {
    return walked;
  }
  return offer;
}

SyncReceiver::~SyncReceiver() { Abandon(); }

void SyncReceiver::Abandon() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(temp_path_.c_str());
  fd_ = -1;
}

absl::StatusOr<std::vector<uint32_t>> SyncReceiver::Offer(SyncOffer offer) {
  offer_ = std::move(offer);
  const std::string& dir = offer_.dir;
  if (dir.empty() || dir[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("the sync directory '", dir, "' is not an absolute path"));
  }
  if (absl::Status made = MakeDirs(dir); !made.ok()) return made;
  // Writable? (root ignores the permission bits, not a read-only file system.)
  std::string probe = Join(dir, ".trainrun-sync-probe.XXXXXX");
  const int probe_fd = ::mkstemp(probe.data());
  if (probe_fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write to the sync directory '", dir, "': ", Errno()));
  }
  ::close(probe_fd);
  ::unlink(probe.c_str());
  std::vector<uint32_t> wanted;
  for (uint32_t i = 0; i < offer_.entries.size(); ++i) {
    const SyncEntry& entry = offer_.entries[i];
    if (!SafePath(entry.path)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the sync offered '", entry.path, "', a path outside '", dir, "'"));
    }
    const std::string path = Join(dir, entry.path);
    struct stat st {};
    const bool exists = ::lstat(path.c_str(), &st) == 0;
    if (S_ISDIR(entry.mode)) {
      if (exists && S_ISDIR(st.st_mode)) continue;
      // EEXIST: another host's agent made it a moment ago (hosts that share this file system).
      if (::mkdir(path.c_str(), (entry.mode & 07777) | 0700) != 0 &&
          !(errno == EEXIST && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))) {
        return absl::FailedPreconditionError(
            absl::StrCat("cannot create the directory '", path, "': ", Errno()));
      }
    } else if (S_ISLNK(entry.mode)) {
      if (exists && S_ISLNK(st.st_mode)) {
        char target[4096];
        ssize_t n = ::readlink(path.c_str(), target, sizeof target);
        if (n >= 0 && absl::string_view(target, static_cast<size_t>(n)) == entry.link) continue;
      }
      if (exists) ::unlink(path.c_str());
      if (::symlink(entry.link.c_str(), path.c_str()) != 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("cannot make the link '", path, "': ", Errno()));
      }
    } else if (S_ISREG(entry.mode)) {
      if (exists && S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) == entry.size &&
          MtimeNs(st) == entry.mtime_ns) {
        continue;
      }
      wanted.push_back(i);
    }
  }
  wanted_ = wanted;
  next_wanted_ = 0;
  return wanted;
}

absl::Status SyncReceiver::Data(uint32_t index, uint64_t offset, absl::string_view bytes) {
  if (next_wanted_ >= wanted_.size() || wanted_[next_wanted_] != index || offset != written_) {
    return absl::DataLossError("the sync's pieces arrived out of order");
  }
  const SyncEntry& entry = offer_.entries[index];
  const std::string path = Join(offer_.dir, entry.path);
  if (fd_ < 0) {
    temp_path_ = absl::StrCat(path, ".trainrun-sync.", ::getpid());
    fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd_ < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot write '", temp_path_, "': ", Errno()));
    }
  }
  while (!bytes.empty()) {
    ssize_t n = ::write(fd_, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string message = absl::StrCat("cannot write '", path, "': ", Errno());
      Abandon();
      return absl::FailedPreconditionError(message);
    }
    bytes.remove_prefix(static_cast<size_t>(n));
    written_ += static_cast<uint64_t>(n);
  }
  if (written_ >= entry.size) return Finish();
  return absl::OkStatus();
}

absl::Status SyncReceiver::Finish() {
  const SyncEntry& entry = offer_.entries[wanted_[next_wanted_]];
  const std::string path = Join(offer_.dir, entry.path);
  struct timespec times[2];
  times[0].tv_sec = 0;
  times[0].tv_nsec = UTIME_OMIT;
  times[1].tv_sec = static_cast<time_t>(entry.mtime_ns / 1000000000);
  times[1].tv_nsec = static_cast<long>(entry.mtime_ns % 1000000000);
  if (::fchmod(fd_, entry.mode & 07777) != 0 || ::futimens(fd_, times) != 0 || ::close(fd_) != 0) {
    std::string message = absl::StrCat("cannot write '", path, "': ", Errno());
    Abandon();
    return absl::FailedPreconditionError(message);
  }
  fd_ = -1;
  if (::rename(temp_path_.c_str(), path.c_str()) != 0) {
    std::string message = absl::StrCat("cannot put '", path, "' in place: ", Errno());
    ::unlink(temp_path_.c_str());
    return absl::FailedPreconditionError(message);
  }
  ++done_.files;
  done_.bytes += entry.size;
  written_ = 0;
  ++next_wanted_;
  return absl::OkStatus();
}

absl::StatusOr<SyncDone> SyncReceiver::End() {
  if (next_wanted_ != wanted_.size()) {
    Abandon();
    return absl::DataLossError(absl::StrCat("the sync ended with ", wanted_.size() - next_wanted_,
                                            " files of ", wanted_.size(), " not received"));
  }
  return done_;
}

absl::StatusOr<SyncStats> SyncToAgents(const SyncOffer& offer, const std::string& src,
                                       std::vector<RemoteAgent>& agents, SyncProgress& progress) {
  const std::string encoded = EncodeSyncOffer(offer);
  if (encoded.size() + 5 > kMaxFrameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("--sync-src-dir '", src, "' lists ",
                                                   offer.entries.size(),
                                                   " files and directories, more than one sync can "
                                                   "offer; leave some out with --sync-exclude"));
  }
  std::atomic<bool> stop{false};
  std::mutex mu;
  SyncStats sum;
  std::optional<absl::Status> failure;
  std::vector<std::thread> threads;
  for (RemoteAgent& agent : agents) {
    threads.emplace_back([&, agent = &agent] {
      absl::StatusOr<SyncStats> stats = AgentSync(*agent, stop).Run(offer, encoded, src, progress);
      std::lock_guard<std::mutex> lock(mu);
      if (stats.ok()) {
        Add(sum, *stats);
      } else if (!failure || (absl::IsCancelled(*failure) && !absl::IsCancelled(stats.status()))) {
        failure = stats.status();
        stop = true;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  if (failure) return *failure;
  return sum;
}

absl::StatusOr<SyncStats> SyncLocally(const SyncOffer& offer, const std::string& src,
                                      SyncProgress& progress) {
  SyncReceiver receiver;
  absl::StatusOr<std::vector<uint32_t>> wanted = receiver.Offer(offer);
  if (!wanted.ok()) return wanted.status();
  progress.total += WantedBytes(offer, *wanted);
  absl::Status sent = SendFiles(offer, src, *wanted, progress,
                                [&](uint32_t index, uint64_t offset, absl::string_view bytes) {
                                  return receiver.Data(index, offset, bytes);
                                });
  if (!sent.ok()) return sent;
  absl::StatusOr<SyncDone> done = receiver.End();
  if (!done.ok()) return done.status();
  SyncStats stats;
  stats.hosts = 1;
  stats.files = done->files;
  stats.bytes = done->bytes;
  stats.unchanged = FileCount(offer) - wanted->size();
  return stats;
}

}  // namespace trainrun::launcher::remote
