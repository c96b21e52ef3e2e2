#include "rsh/piped_host_stream.h"

#include <sys/wait.h>

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace trainrun::launcher::rsh {

PipedHostStream::PipedHostStream(std::string host, std::unique_ptr<posix::PipedChild> child,
                                 ssh::RouteAddresses route, Words words)
    : host_(std::move(host)),
      child_(std::move(child)),
      route_(std::move(route)),
      words_(std::move(words)) {}

absl::Status PipedHostStream::Write(absl::string_view data, absl::Duration timeout) {
  return child_->Write(data, timeout);
}

absl::StatusOr<size_t> PipedHostStream::Read(char* buffer, size_t size, absl::Duration timeout) {
  return child_->Read(buffer, size, timeout);
}

void PipedHostStream::Interrupt() { child_->Interrupt(); }

void PipedHostStream::CloseStdin() { child_->CloseStdin(); }

absl::Status PipedHostStream::EndStatus() {
  std::optional<int> exit_status = child_->Finish();
  std::string tail(absl::StripTrailingAsciiWhitespace(child_->stderr_tail()));
  if (size_t newline = tail.rfind('\n'); newline != std::string::npos) {
    tail = tail.substr(newline + 1);
  }
  if (!exit_status) {
    return absl::UnavailableError(absl::StrCat("host ", host_, ": ", words_.step, " ended but ",
                                               words_.program, " did not exit"));
  }
  const int status = *exit_status;
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
    if (words_.scheduler_ended) {
      if (std::string why = words_.scheduler_ended(); !why.empty()) {
        return absl::AbortedError(
            absl::StrCat("host ", host_, ": ", why, ", so ", words_.step, " ended"));
      }
    }
    return absl::AbortedError(absl::StrCat("host ", host_, ": ", words_.step, " ended with status ",
                                           WEXITSTATUS(status), tail.empty() ? "" : ": ", tail));
  }
  if (WIFSIGNALED(status)) {
    return absl::AbortedError(absl::StrCat("host ", host_, ": ", words_.program,
                                           " was killed by signal ", WTERMSIG(status)));
  }
  return absl::OkStatus();
}

}  // namespace trainrun::launcher::rsh
