#include "trainrun/launcher/output_forwarder.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainrun::launcher {
namespace {

bool SameFile(int a, int b) {
  struct stat sa {
  }, sb{};
  return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

std::string Timestamp() {
  auto now = std::chrono::system_clock::now();
  std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm local{};
  localtime_r(&seconds, &local);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S", &local);
  return absl::StrFormat("%s.%03d ", text, static_cast<int>(ms));
}

absl::StatusOr<int> MakeDirectory(const std::string& path, const char* flag = "--output-filename") {
  if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, ": cannot create directory '", path, "': ", std::strerror(errno)));
  }
  return 0;
}

int StreamBit(OutputStream stream) { return stream == OutputStream::kStdout ? 1 : 2; }

}  // namespace

absl::StatusOr<std::unique_ptr<OutputForwarder>> OutputForwarder::Create(
    const OutputOptions& options) {
  std::unique_ptr<OutputForwarder> forwarder(new OutputForwarder(options));
  if (options.log_dir.has_value() && options.log_streams != 0) {
    if (auto made = MakeDirectory(*options.log_dir, "--log-dir"); !made.ok()) return made.status();
  }
  if (options.output_dir.has_value()) {
    if (auto made = MakeDirectory(*options.output_dir); !made.ok()) return made.status();
  }
  for (int rank = 0; rank < options.world_size; ++rank) {
    if (absl::Status opened = forwarder->AddRank(rank); !opened.ok()) return opened;
  }
  return forwarder;
}

absl::Status OutputForwarder::AddRank(int rank) {
  auto open_file = [](const std::string& path, const char* flag) -> absl::StatusOr<int> {
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(flag, ": cannot create '", path, "': ", std::strerror(errno)));
    }
    return fd;
  };
  if (options_.log_dir.has_value() && options_.log_streams != 0) {
    std::string dir = absl::StrCat(*options_.log_dir, "/", rank);
    if (auto made = MakeDirectory(dir, "--log-dir"); !made.ok()) return made.status();
    for (OutputStream stream : {OutputStream::kStdout, OutputStream::kStderr}) {
      if ((options_.log_streams & StreamBit(stream)) == 0 || log_files_.count({rank, stream})) {
        continue;
      }
      absl::StatusOr<int> fd = open_file(
          dir + (stream == OutputStream::kStdout ? "/stdout.log" : "/stderr.log"), "--log-dir");
      if (!fd.ok()) return fd.status();
      log_files_[{rank, stream}] = *fd;
    }
  }
  if (!options_.output_dir.has_value()) return absl::OkStatus();
  // Padded to the width of the start's last rank (horovodrun's names); a later rank may be wider.
  const int width = static_cast<int>(absl::StrCat(std::max(options_.world_size - 1, 0)).size());
  std::string dir = absl::StrFormat("%s/rank.%0*d", *options_.output_dir, width, rank);
  if (auto made = MakeDirectory(dir); !made.ok()) return made.status();
  for (OutputStream stream : {OutputStream::kStdout, OutputStream::kStderr}) {
    if (files_.count({rank, stream})) continue;
    absl::StatusOr<int> fd = open_file(
        dir + (stream == OutputStream::kStdout ? "/stdout" : "/stderr"), "--output-filename");
    if (!fd.ok()) return fd.status();
    files_[{rank, stream}] = *fd;
  }
  return absl::OkStatus();
}

OutputForwarder::OutputForwarder(const OutputOptions& options)
    : options_(options),
      stdout_{options.stdout_fd, std::nullopt},
      stderr_{options.stderr_fd, std::nullopt},
      stderr_console_(SameFile(options.stdout_fd, options.stderr_fd) ? &stdout_ : &stderr_) {}

OutputForwarder::~OutputForwarder() {
  EndLines();
  for (const auto& [key, fd] : files_) close(fd);
  for (const auto& [key, fd] : log_files_) close(fd);
}

OutputForwarder::Console& OutputForwarder::ConsoleFor(OutputStream stream) {
  return stream == OutputStream::kStdout ? stdout_ : *stderr_console_;
}

void OutputForwarder::Write(int rank, OutputStream stream, std::string_view bytes) {
  if (bytes.empty()) return;
  if (auto it = files_.find({rank, stream}); it != files_.end()) WriteAll(it->second, bytes);
  if (auto it = log_files_.find({rank, stream}); it != log_files_.end()) {
    WriteAll(it->second, bytes);
  }
  if ((options_.console_off & StreamBit(stream)) != 0) return;

  Console& console = ConsoleFor(stream);
  const int fd = stream == OutputStream::kStdout ? options_.stdout_fd : options_.stderr_fd;
  const std::pair<int, OutputStream> writer{rank, stream};
  std::string out;
  if (console.open_line.has_value() && *console.open_line != writer) {
    out.push_back('\n');  // another rank's unfinished line: end it, so this one gets its own
    console.open_line.reset();
  }
  if (!console.open_line.has_value()) {
    if (options_.prefix_timestamp) out += Timestamp();
    if (options_.tag) {
      absl::StrAppend(&out, "[", rank, "]",
                      stream == OutputStream::kStdout ? "<stdout>:" : "<stderr>:");
    }
  }
  if (out.empty()) {
    WriteAll(fd, bytes);
  } else {
    out.append(bytes);
    WriteAll(fd, out);
  }
  if (bytes.back() == '\n') {
    console.open_line.reset();
  } else {
    console.open_line = writer;
  }
}

void OutputForwarder::EndLines() {
  for (Console* console : {&stdout_, stderr_console_}) {
    if (console->open_line.has_value()) {
      WriteAll(console->fd, "\n");
      console->open_line.reset();
    }
  }
}

void OutputForwarder::WriteAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};  // the console was left non-blocking by someone else
      poll(&p, 1, 1000);
    } else {
      return;  // EPIPE (a closed pipe, e.g. `| head`): the output has nowhere to go
    }
  }
}

}  // namespace trainrun::launcher
