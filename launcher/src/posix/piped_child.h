// PipedChild: a child process whose stdin, stdout and stderr are pipes to the launcher, the
// transport of the two channels that reach a host through a program (`ssh`, `srun`): the agent
// protocol goes in on its stdin and comes back on its stdout, and the last of its stderr explains
// its end.
//
//   PipedChild::Options options;
//   options.argv = {"srun", "-N1", ..., "sh", "-c", command};
//   options.where = "host n1";  options.program = "srun";  options.peer = "the agent's job step";
//   auto child = PipedChild::Start(std::move(options));
//   (*child)->Write(frame, absl::Seconds(10));
//   absl::StatusOr<size_t> n = (*child)->Read(buffer, sizeof buffer, absl::Seconds(30));
//   std::optional<int> status = (*child)->Finish();  // its wait status, once it has exited
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "posix/unique_fd.h"

namespace trainrun::launcher::posix {

class PipedChild {
 public:
  struct Options {
    std::vector<std::string> argv;  // searched on PATH
    // What the child prints on its stderr, and the status it exits with, when it cannot exec.
    std::string exec_failure;
    int exec_failure_status = 255;
    // The words of the messages: "<where>: <program> stopped reading: ...",
    // "<where>: timed out sending to <peer>", "<where>: nothing received for ...".
    std::string where;
    std::string program;
    std::string peer;
    // How long the child has to end after SIGTERM (when dropped), or to close its stderr (Finish).
    absl::Duration grace = absl::Seconds(2);
  };

  // Start forks and execs options.argv. The child gets SIGTERM when the thread that called Start
  // ends (PR_SET_PDEATHSIG), so that it never outlives the launcher.
  static absl::StatusOr<std::unique_ptr<PipedChild>> Start(Options options);

  // Closes stdin; a child that has not exited gets SIGTERM, then SIGKILL after options.grace.
  ~PipedChild();
  PipedChild(const PipedChild&) = delete;
  PipedChild& operator=(const PipedChild&) = delete;

  // Write writes all of `data` to the child's stdin (one writer at a time): Unavailable when the
  // child stopped reading, DeadlineExceeded after `timeout`, FailedPrecondition after CloseStdin.
  absl::Status Write(absl::string_view data, absl::Duration timeout);
  // Read returns what the child's stdout has (up to `size`), 0 at its end; Cancelled after
  // Interrupt, DeadlineExceeded when nothing came within `timeout`. One reader at a time.
  absl::StatusOr<size_t> Read(char* buffer, size_t size, absl::Duration timeout);
  // Interrupt makes a Read in progress, and every later one, return Cancelled.
  void Interrupt();
  void CloseStdin();

  // Finish reads the rest of stderr until the child closes it (up to options.grace) and reaps the
  // child: its wait status, or nullopt when it has not exited by then.
  std::optional<int> Finish();
  // The last 4 KiB the child printed on its stderr.
  const std::string& stderr_tail() const { return stderr_tail_; }

 private:
  PipedChild(Options options, pid_t pid, UniqueFd in, UniqueFd out, UniqueFd err);
  void DrainStderr();
  void Reap(absl::Time deadline);

  const Options options_;
  const pid_t pid_;
  std::mutex write_mu_;
  UniqueFd stdin_;
  UniqueFd stdout_;
  UniqueFd stderr_;
  UniqueFd wake_;
  std::atomic<bool> interrupted_{false};
  std::string stderr_tail_;
  std::optional<int> exit_status_;
};

}  // namespace trainrun::launcher::posix
