#include "trainrun/launcher/process_set.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "posix/unique_fd.h"
#include "rank_shim.h"
#include "shim_spawn.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::launcher {
namespace asio = boost::asio;
using internal::ShimRecord;

// Reader is one of a rank's output pipes, and the unterminated tail read from it so far.
struct RankProcessSet::Reader {
  Reader(asio::io_context& io, Rank* owner, OutputStream which)
      : rank(owner), stream(which), pipe(io), idle(io) {}

  Rank* rank;
  OutputStream stream;
  asio::posix::stream_descriptor pipe;
  asio::steady_timer idle;
  std::string pending;
  bool closed = false;
  std::array<char, kMaxPiece> buffer;  // not zeroed: 128 KiB a rank, written before it is read
};

struct RankProcessSet::Rank {
  Rank(asio::io_context& io, int index_in)
      : index(index_in),
        out(io, this, OutputStream::kStdout),
        err(io, this, OutputStream::kStderr),
        eof_deadline(io) {}
  int index;
  pid_t shim = -1;
  std::unique_ptr<internal::ShimSpawn> spawn;  // what the shim's clone may still read; until reaped
  posix::UniqueFd status_fd;
  bool reaped = false;  // the shim has exited: the rank and all it started are gone
  bool exited = false;  // on_exit delivered
  ExitInfo exit;
  Reader out;
  Reader err;
  // Bounds the wait for EOF after the shim is reaped (an fd passed to an unrelated process).
  asio::steady_timer eof_deadline;
};

namespace {

using posix::UniqueFd;

absl::Status MakePipe(UniqueFd& read_end, UniqueFd& write_end) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot create a pipe: ", std::strerror(errno)));
  }
  read_end.Reset(fds[0]);
  write_end.Reset(fds[1]);
  return absl::OkStatus();
}

// MakePty opens a pseudo-terminal for a rank's stdout: the master end for trainrun to read, the
// slave end (raw: no echo, no output processing, so bytes pass unaltered) for the rank. The slave
// is opened with O_NOCTTY: it never becomes anyone's controlling terminal, so no job-control
// signal (SIGTTOU, SIGHUP) can reach the rank through it.
absl::Status MakePty(UniqueFd& master, UniqueFd& slave) {
  auto fail = [](const char* what) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot create a pseudo-terminal (", what,
                                                     "): ", std::strerror(errno),
                                                     "; --no-pty gives ranks a pipe instead"));
  };
  master.Reset(posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (master.get() < 0) return fail("posix_openpt");
  if (grantpt(master.get()) != 0 || unlockpt(master.get()) != 0) return fail("unlockpt");
  char name[128];
  if (ptsname_r(master.get(), name, sizeof(name)) != 0) return fail("ptsname");
  slave.Reset(open(name, O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (slave.get() < 0) return fail(name);
  termios mode{};
  if (tcgetattr(slave.get(), &mode) != 0) return fail("tcgetattr");
  cfmakeraw(&mode);
  // Output processing on, with nothing to process: the bytes arrive as written (no '\r' before a
  // '\n', no case or tab changes), as raw; but the kernel's output path then writes no more than
  // the pty has room for each time (process_output_block), where raw's writes as much as it can
  // queue and waits, and bulk output reaches the reader 1.4-1.6 times faster (docs/performance.md).
  mode.c_oflag |= OPOST;
  mode.c_oflag &= ~(ONLCR | OCRNL | ONOCR | ONLRET | OLCUC | OFILL | NLDLY | CRDLY | TABDLY |
                    BSDLY | VTDLY | FFDLY);
  if (tcsetattr(slave.get(), TCSANOW, &mode) != 0) return fail("tcsetattr");
  return absl::OkStatus();
}

// null-terminated char* array over strings that outlive it.
std::vector<char*> CStrings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const std::string& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

absl::Status ErrnoStatus(int error) {
  return absl::Status(absl::ErrnoToStatusCode(error), std::strerror(error));
}

// FindRankShim is the trainrun-rank-shim executable to start ranks under (TRAINRUN_RANK_SHIM, else
// next to this executable, else in ../libexec/trainrun/ from it), or "" to fork this process.
std::string FindRankShim() {
  std::string chosen = env::kRankShim.Get();
  if (chosen == "fork") return "";
  if (!chosen.empty()) return chosen;
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "";
  std::string dir(self, static_cast<size_t>(n));
  dir.erase(dir.rfind('/') + 1);
  for (const char* relative : {"trainrun-rank-shim", "../libexec/trainrun/trainrun-rank-shim"}) {
    std::string path = dir + relative;
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

std::chrono::steady_clock::time_point FromMonotonicNs(int64_t ns) {
  return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns));
}

}  // namespace

RankProcessSet::RankProcessSet(asio::io_context& io, Callbacks callbacks)
    : io_(io), callbacks_(std::move(callbacks)), sigchld_(io, SIGCHLD), shim_path_(FindRankShim()) {
  WaitForChildren();
}

RankProcessSet::~RankProcessSet() {
  sigchld_.cancel();
  for (auto& rank : ranks_) {
    if (rank->reaped) continue;
    kill(rank->shim, internal::kShimKillSignal);
    // The shim kills its rank and exits at once; bound the wait all the same.
    int status;
    bool reaped = false;
    for (int i = 0; i < 2000 && !reaped; ++i) {
      reaped = waitpid(rank->shim, &status, WNOHANG) != 0;
      if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!reaped) {
      kill(rank->shim, SIGKILL);
      waitpid(rank->shim, &status, 0);
    }
  }
}

absl::Status RankProcessSet::Start(int rank_index, const ProcessSpec& spec) {
  UniqueFd out_read, out_write, err_read, err_write, status_read, status_write;
  if (absl::Status s =
          spec.stdout_pty ? MakePty(out_read, out_write) : MakePipe(out_read, out_write);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = MakePipe(err_read, err_write); !s.ok()) return s;
  if (absl::Status s = MakePipe(status_read, status_write); !s.ok()) return s;
  UniqueFd dev_null;
  int stdin_fd = spec.stdin_fd;
  if (stdin_fd < 0) {
    dev_null.Reset(open("/dev/null", O_RDONLY | O_CLOEXEC));
    stdin_fd = dev_null.get();
  }
  std::unique_ptr<internal::ShimSpawn> spawn;
  absl::StatusOr<pid_t> pid = -1;
  if (!shim_path_.empty() && access(shim_path_.c_str(), X_OK) != 0) {
    // Checked here: a shim that fails its execve later is reported as its command's exec failure.
    pid = ErrnoStatus(errno);
  } else if (shim_path_.empty()) {
    pid = ForkShim(spec, stdin_fd, out_write.get(), err_write.get(), status_write.get());
  } else if (absl::StatusOr<std::unique_ptr<internal::ShimSpawn>> spawned =
                 internal::ShimSpawn::Start(
                     shim_path_, spec,
                     {stdin_fd, out_write.get(), err_write.get(), status_write.get()});
             spawned.ok()) {
    spawn = *std::move(spawned);
    pid = spawn->pid();
  } else {
    pid = spawned.status();
  }
  if (!pid.ok() && shim_path_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start rank ", rank_index, ": fork failed: ", pid.status().message()));
  }
  if (!pid.ok()) {
    return absl::Status(
        pid.status().code(),
        absl::StrCat("cannot start rank ", rank_index, ": cannot execute the rank shim ",
                     shim_path_, ": ", pid.status().message(), " (", env::kRankShim.name,
                     " names another, or \"fork\" for none)"));
  }

  auto rank = std::make_unique<Rank>(io_, rank_index);
  rank->shim = *pid;
  rank->spawn = std::move(spawn);
  fcntl(status_read.get(), F_SETFL, O_NONBLOCK);
  rank->status_fd = std::move(status_read);
  rank->out.pipe.assign(out_read.Release());
  rank->err.pipe.assign(err_read.Release());
  Rank& started = *rank;
  ranks_.push_back(std::move(rank));
  ReadMore(started.out);
  ReadMore(started.err);
  return absl::OkStatus();
}

absl::StatusOr<pid_t> RankProcessSet::ForkShim(const ProcessSpec& spec, int stdin_fd, int stdout_fd,
                                               int stderr_fd, int status_fd) {
  std::vector<char*> argv = CStrings(spec.argv);
  std::vector<char*> envp = CStrings(spec.env);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int cpu : spec.cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &cpus);
  }
  internal::ShimArgs args{spec.executable.c_str(),
                          argv.data(),
                          envp.data(),
                          stdin_fd,
                          stdout_fd,
                          stderr_fd,
                          status_fd,
                          getpid(),
                          spec.cpus.empty() ? nullptr : &cpus,
                          spec.cwd.empty() ? nullptr : spec.cwd.c_str()};

  // Block every signal across fork(): the shim must not run this process's handlers (Asio's
  // would write to its signal pipe, which the shim shares until it closes its fds).
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  pid_t pid = fork();
  if (pid == 0) internal::RunRankShim(args);
  int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0) return ErrnoStatus(fork_errno);
  return pid;
}

void RankProcessSet::TerminateAll() {
  for (auto& rank : ranks_) {
    if (!rank->reaped) kill(rank->shim, SIGTERM);
  }
}

void RankProcessSet::KillAll() {
  for (auto& rank : ranks_) {
    if (!rank->reaped) kill(rank->shim, internal::kShimKillSignal);
  }
}

void RankProcessSet::TerminateRanks(const std::vector<int>& ranks) {
  for (auto& rank : ranks_) {
    if (!rank->reaped && std::find(ranks.begin(), ranks.end(), rank->index) != ranks.end()) {
      kill(rank->shim, SIGTERM);
    }
  }
}

void RankProcessSet::KillRanks(const std::vector<int>& ranks) {
  for (auto& rank : ranks_) {
    if (!rank->reaped && std::find(ranks.begin(), ranks.end(), rank->index) != ranks.end()) {
      kill(rank->shim, internal::kShimKillSignal);
    }
  }
}

int RankProcessSet::running() const {
  int n = 0;
  for (const auto& rank : ranks_) n += rank->exited ? 0 : 1;
  return n;
}

void RankProcessSet::ReadMore(Reader& reader) {
  reader.pipe.async_read_some(asio::buffer(reader.buffer),
                              [this, &reader](const boost::system::error_code& error, size_t n) {
                                if (reader.closed) return;
                                if (error) {
                                  Close(reader);  // EOF: every writer is gone
                                  return;
                                }
                                OnBytes(reader, n + ReadWaiting(reader, n));
                                ReadMore(reader);
                              });
}

size_t RankProcessSet::ReadWaiting(Reader& reader, size_t n) {
  // A pseudo-terminal hands its reader at most 4 KiB a read (the line discipline's buffer) where
  // a pipe hands 64 KiB: one trip through the event loop, and one callback per line, for every
  // 4 KiB made bulk output through the default pty 8 times slower than through a pipe. What is
  // already waiting is read here, without returning to the loop, until the buffer is full.
  size_t more = 0;
  boost::system::error_code error;
  reader.pipe.non_blocking(true, error);
  while (!error && n + more < reader.buffer.size()) {
    const size_t got = reader.pipe.read_some(
        asio::buffer(reader.buffer.data() + n + more, reader.buffer.size() - n - more), error);
    if (got == 0) break;
    more += got;
  }
  return more;  // an error (EOF, EAGAIN) comes again to the next async read, which handles it
}

void RankProcessSet::OnBytes(Reader& reader, size_t n) {
  reader.pending.append(reader.buffer.data(), n);
  // Whole lines, one callback each.
  size_t start = 0;
  for (size_t newline; (newline = reader.pending.find('\n', start)) != std::string::npos;
       start = newline + 1) {
    callbacks_.on_output(reader.rank->index, reader.stream,
                         std::string_view(reader.pending).substr(start, newline + 1 - start));
  }
  reader.pending.erase(0, start);
  // A line longer than kMaxPiece goes on in pieces: nobody waits for a newline that may never come.
  while (reader.pending.size() >= kMaxPiece) Flush(reader, kMaxPiece);
  ArmIdleFlush(reader);
}

void RankProcessSet::ArmIdleFlush(Reader& reader) {
  if (reader.pending.empty()) {
    reader.idle.cancel();
    return;
  }
  // A prompt or a '\r' progress bar shows up after a short pause instead of at the next newline.
  reader.idle.expires_after(kIdleFlush);
  reader.idle.async_wait([this, &reader](const boost::system::error_code& error) {
    if (!error && !reader.pending.empty()) Flush(reader, reader.pending.size());
  });
}

void RankProcessSet::Flush(Reader& reader, size_t n) {
  std::string piece = reader.pending.substr(0, n);
  reader.pending.erase(0, n);
  callbacks_.on_output(reader.rank->index, reader.stream, piece);
}

void RankProcessSet::Close(Reader& reader) {
  if (reader.closed) return;
  reader.closed = true;
  boost::system::error_code ignored;
  reader.pipe.close(ignored);
  reader.idle.cancel();
  if (!reader.pending.empty()) Flush(reader, reader.pending.size());
  MaybeFinish(*reader.rank);
}

void RankProcessSet::WaitForChildren() {
  sigchld_.async_wait([this](const boost::system::error_code& error, int) {
    if (error) return;
    Reap();
    WaitForChildren();
  });
}

void RankProcessSet::Reap() {
  // Only our shims are waited for: other children of this process are not ours to reap.
  for (size_t i = 0; i < ranks_.size(); ++i) {
    Rank& rank = *ranks_[i];
    if (rank.reaped) continue;
    int status = 0;
    pid_t pid = waitpid(rank.shim, &status, WNOHANG);
    if (pid == 0) continue;
    OnShimExit(rank, pid < 0 ? -1 : status);
  }
}

void RankProcessSet::OnShimExit(Rank& rank, int shim_status) {
  rank.reaped = true;
  rank.spawn.reset();
  ExitInfo& exit = rank.exit;
  exit.time = std::chrono::steady_clock::now();
  bool ended = false;
  pid_t command = -1;
  ShimRecord record;
  while (read(rank.status_fd.get(), &record, sizeof(record)) ==
         static_cast<ssize_t>(sizeof(record))) {
    if (record.kind == ShimRecord::kStarted) {
      command = record.value;
    } else if (record.kind == ShimRecord::kExecFailed) {
      ended = true;
      exit.exec_errno = record.value;
      exit.code = 127;
      exit.time = FromMonotonicNs(record.time_ns);
    } else if (record.kind == ShimRecord::kExited) {
      ended = true;
      if (WIFSIGNALED(record.value)) {
        exit.signal = WTERMSIG(record.value);
      } else {
        exit.code = WEXITSTATUS(record.value);
      }
      exit.time = FromMonotonicNs(record.time_ns);
    }
  }
  rank.status_fd.Reset();
  if (!ended) {
    // The shim itself was killed before the command ended; PR_SET_PDEATHSIG has killed the
    // command, so sweep its group and report the shim's fate as the rank's.
    if (command > 0) kill(-command, SIGKILL);
    exit.signal = shim_status >= 0 && WIFSIGNALED(shim_status) ? WTERMSIG(shim_status) : SIGKILL;
  }
  // The exit is reported after the output: wait for EOF on both pipes, which comes at once now
  // that every writer is dead — within a bound, in case an fd was passed to an unrelated process.
  rank.eof_deadline.expires_after(std::chrono::seconds(1));
  rank.eof_deadline.async_wait([this, &rank](const boost::system::error_code& error) {
    if (error) return;
    Close(rank.out);
    Close(rank.err);
  });
  MaybeFinish(rank);
}

void RankProcessSet::MaybeFinish(Rank& rank) {
  if (rank.exited || !rank.reaped || !rank.out.closed || !rank.err.closed) return;
  rank.exited = true;
  rank.eof_deadline.cancel();
  callbacks_.on_exit(rank.index, rank.exit);
}

}  // namespace trainrun::launcher
