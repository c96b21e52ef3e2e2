// RankProcessSet: starts rank processes and reports what they do, on one Asio event loop.
//
// The shape is ninja's SubprocessSet: passive processes, one loop that reads their output and reaps
// them. It knows nothing of jobs, summaries or consoles — events go to callbacks — so the local
// launcher and the remote agent share it.
//
//   boost::asio::io_context io;
//   RankProcessSet ranks(io, callbacks);  // on_output, on_exit
//   ranks.Start(0, spec);  // executable, argv, env, stdin_fd
//   io.run();  // until the callbacks stop it
//
// Each rank runs under a small supervisor process (see src/rank_shim.h), trainrun-rank-shim,
// started with posix_spawn (or, where that executable is not installed, a forked copy of this
// process), that makes itself a session leader and child subreaper, starts the command in its own
// process group, and makes sure that nothing the command started outlives it — including when this
// process is killed with SIGKILL (it notices through PR_SET_PDEATHSIG).
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainrun/launcher/exit_info.h"

namespace trainrun::launcher {

enum class OutputStream { kStdout, kStderr };

// ProcessSpec is one rank's command.
struct ProcessSpec {
  std::string executable;         // the path given to execve (resolved already; no PATH search)
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // "NAME=value", the whole environment
  int stdin_fd = -1;              // becomes the process's fd 0 (the set dups it); -1: /dev/null
  // fd 1 is a pseudo-terminal in raw mode (no echo, no "\n" -> "\r\n", every byte unaltered), so
  // that stdio line-buffers it and a rank's lines arrive as it writes them; false: a pipe. fd 2
  // is a pipe either way, so stdout and stderr stay apart.
  bool stdout_pty = true;
  // The CPUs the command may run on (sched_setaffinity before exec); empty: as this process.
  std::vector<int> cpus;
  // The command's working directory (chdir before exec); empty: this process's.
  std::string cwd;
};

// RankControl is how a job's policy stops ranks, wherever they run.
class RankControl {
 public:
  virtual ~RankControl() = default;
  // TerminateAll asks every running rank to stop: SIGTERM to its process group.
  virtual void TerminateAll() = 0;
  // KillAll ends every running rank and every process it started, with SIGKILL.
  virtual void KillAll() = 0;
  // TerminateRanks and KillRanks do the same to some ranks only (an elastic job's host that left
  // the discovery output); ranks this RankControl does not run are ignored. A remote host's ranks
  // go together: asking for one of them asks for all of that host's.
  virtual void TerminateRanks(const std::vector<int>& ranks) {}
  virtual void KillRanks(const std::vector<int>& ranks) {}
};

// RankProcessSet owns rank processes started on this host. Not thread-safe: use it on the thread
// that runs its io_context, and that thread must outlive the processes (PR_SET_PDEATHSIG follows
// the thread that forked).
class RankProcessSet : public RankControl {
 public:
  struct Callbacks {
    // on_output receives a rank's output in order, unaltered: whole lines ending in '\n'; a line
    // longer than kMaxPiece in pieces; an unterminated tail after kIdleFlush without new bytes and
    // at exit. Concatenated, the pieces are exactly the bytes the rank wrote.
    std::function<void(int rank, OutputStream stream, std::string_view bytes)> on_output;
    // on_exit comes once per started rank, after all of its output.
    std::function<void(int rank, const ExitInfo& exit)> on_exit;
  };

  static constexpr size_t kMaxPiece = 64 * 1024;
  static constexpr std::chrono::milliseconds kIdleFlush{200};

  RankProcessSet(boost::asio::io_context& io, Callbacks callbacks);
  // Kills and reaps every rank still running.
  ~RankProcessSet() override;
  RankProcessSet(const RankProcessSet&) = delete;
  RankProcessSet& operator=(const RankProcessSet&) = delete;

  // Start starts rank `rank`'s supervisor, which starts the command. Returns an error only when no
  // process could be made (fork, pipe); a command that cannot be executed ends with an on_exit
  // whose exec_errno is set.
  absl::Status Start(int rank, const ProcessSpec& spec);

  void TerminateAll() override;
  void KillAll() override;
  void TerminateRanks(const std::vector<int>& ranks) override;
  void KillRanks(const std::vector<int>& ranks) override;

  // running returns the number of started ranks whose on_exit has not come yet.
  int running() const;

 private:
  struct Rank;
  struct Reader;

  void ReadMore(Reader& reader);
  // ReadWaiting reads what is already waiting after the `n` bytes in `reader`'s buffer, without
  // blocking; returns how many.
  size_t ReadWaiting(Reader& reader, size_t n);
  void OnBytes(Reader& reader, size_t n);
  void ArmIdleFlush(Reader& reader);
  void Flush(Reader& reader, size_t n);
  void Close(Reader& reader);
  void WaitForChildren();
  void Reap();
  void OnShimExit(Rank& rank, int shim_status);
  void MaybeFinish(Rank& rank);
  // ForkShim starts a rank's shim as a fork of this process, where no shim executable is found.
  absl::StatusOr<pid_t> ForkShim(const ProcessSpec& spec, int stdin_fd, int stdout_fd,
                                 int stderr_fd, int status_fd);

  boost::asio::io_context& io_;
  Callbacks callbacks_;
  boost::asio::signal_set sigchld_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::string shim_path_;  // trainrun-rank-shim; "": ForkShim
};

}  // namespace trainrun::launcher
