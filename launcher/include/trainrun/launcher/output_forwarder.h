// OutputForwarder: worker output to trainrun's console, tagged with the rank, and to per-rank
// files.
//
//   auto out = OutputForwarder::Create(options);  // tag = true, world_size = 4
//   (*out)->Write(2, OutputStream::kStderr, "loss 0.3\n");   // "[2]<stderr>:loss 0.3\n" on fd 2
//
// Bytes pass unaltered (no decoding: '\r' and invalid UTF-8 go through as they came). A piece that
// does not end in '\n' leaves its console line open: the same rank's next piece continues it
// without a second tag; any other rank's piece first ends the line, so tags always start a line.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "trainrun/launcher/process_set.h"

namespace trainrun::launcher {

struct OutputOptions {
  bool tag = true;                // "[rank]<stdout>:" before each line
  bool prefix_timestamp = false;  // "YYYY-MM-DD HH:MM:SS.mmm " before each line
  // DIR/rank.<N>/stdout and stderr get each rank's raw bytes, N zero-padded to the width of
  // world_size-1 as horovodrun does (rank.07 of 16), so the directories sort.
  std::optional<std::string> output_dir;
  int world_size = 1;
  // torchrun's --log-dir: DIR/<rank>/stdout.log and DIR/<rank>/stderr.log get the streams in
  // log_streams (bit 1 stdout, bit 2 stderr, as torchrun's Std: 1 OUT, 2 ERR, 3 ALL); the streams
  // in console_off (--redirects without --tee) go to those files only, not to the console.
  std::optional<std::string> log_dir;
  int log_streams = 0;
  int console_off = 0;
  int stdout_fd = 1;  // the console: where worker stdout goes
  int stderr_fd = 2;  // and worker stderr
};

class OutputForwarder {
 public:
  // Create makes the per-rank directories and files when output_dir is set; an error names the
  // path that could not be made.
  static absl::StatusOr<std::unique_ptr<OutputForwarder>> Create(const OutputOptions& options);
  ~OutputForwarder();
  OutputForwarder(const OutputForwarder&) = delete;
  OutputForwarder& operator=(const OutputForwarder&) = delete;

  // AddRank makes the --output-filename and --log-dir files of a rank past the start's world_size
  // (an elastic job that grew), as Create does for the start's; an error names the path.
  absl::Status AddRank(int rank);

  // Write forwards one piece of rank `rank`'s output (RankProcessSet's on_output).
  void Write(int rank, OutputStream stream, std::string_view bytes);

  // EndLines ends any open console line, so that trainrun's own messages start on a line of their
  // own.
  void EndLines();

 private:
  // Console is one destination fd, and which rank's line is open on it.
  struct Console {
    int fd;
    std::optional<std::pair<int, OutputStream>> open_line;
  };

  explicit OutputForwarder(const OutputOptions& options);
  static void WriteAll(int fd, std::string_view bytes);
  Console& ConsoleFor(OutputStream stream);

  OutputOptions options_;
  Console stdout_;
  Console stderr_;
  Console* stderr_console_;  // &stdout_ when both fds are the same file (a terminal, usually)
  std::map<std::pair<int, OutputStream>, int> files_;      // (rank, stream) → fd
  std::map<std::pair<int, OutputStream>, int> log_files_;  // --log-dir's, the same way
};

}  // namespace trainrun::launcher
