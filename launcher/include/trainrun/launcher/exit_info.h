// ExitInfo: how one rank process ended, and how trainrun names it to the user.
//
//   ExitInfo e;
//   e.signal = SIGSEGV;
//   e.ExitCode();   // 139
//   e.Describe();   // "was killed by SIGSEGV"
#pragma once

#include <chrono>
#include <string>

namespace trainrun::launcher {

// ExitInfo is the end of one rank: an exit code, a terminating signal, or a failed exec.
struct ExitInfo {
  int code = 0;        // the exit code, when signal == 0
  int signal = 0;      // the signal that killed it, or 0
  int exec_errno = 0;  // nonzero when the command could not be executed (code is then 127)
  // When the process ended (its supervisor reaped it), on the steady clock; used to order failures.
  std::chrono::steady_clock::time_point time;

  // ExitCode returns the code a shell would report: code, or 128+N for signal N.
  int ExitCode() const { return signal != 0 ? 128 + signal : code; }
  // ok() is true for exit code 0.
  bool ok() const { return signal == 0 && exec_errno == 0 && code == 0; }
  // Describe returns a phrase: "exited with code 1", "was killed by SIGKILL",
  // "could not be executed: No such file or directory".
  std::string Describe() const;
};

// SignalName returns "SIGKILL" for SIGKILL, and "signal 42" for signals without a name.
std::string SignalName(int signal);

}  // namespace trainrun::launcher
