// OutputForwarder: tags, continued lines, interleaving ranks, into a pipe we read back.
#include "trainrun/launcher/output_forwarder.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

namespace {

using trainrun::launcher::OutputForwarder;
using trainrun::launcher::OutputOptions;
using trainrun::launcher::OutputStream;

std::string Drain(int fd) {
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) out.append(buffer, static_cast<size_t>(n));
  return out;
}

}  // namespace

TEST_CASE("a continued line keeps one tag, another rank's line starts on its own",
          "[launcher][output]") {
  int out[2], err[2];
  REQUIRE(pipe2(out, O_NONBLOCK) == 0);
  REQUIRE(pipe2(err, O_NONBLOCK) == 0);
  OutputOptions options;
  options.world_size = 2;
  options.stdout_fd = out[1];
  options.stderr_fd = err[1];
  auto forwarder = OutputForwarder::Create(options);
  REQUIRE(forwarder.ok());
  (*forwarder)->Write(0, OutputStream::kStdout, "abc");
  (*forwarder)->Write(0, OutputStream::kStdout, "def\n");
  (*forwarder)->Write(1, OutputStream::kStdout, "partial");
  (*forwarder)->Write(0, OutputStream::kStdout, "x\n");
  (*forwarder)->Write(1, OutputStream::kStderr, "e\n");
  (*forwarder)->EndLines();
  CHECK(Drain(out[0]) == "[0]<stdout>:abcdef\n[1]<stdout>:partial\n[0]<stdout>:x\n");
  CHECK(Drain(err[0]) == "[1]<stderr>:e\n");
  for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
}

TEST_CASE("a rank added past the start gets its --output-filename and --log-dir files",
          "[launcher][output]") {
  char dir_template[] = "/tmp/trainrun_output_XXXXXX";
  REQUIRE(mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template;
  int out[2];
  REQUIRE(pipe2(out, O_NONBLOCK) == 0);
  OutputOptions options;
  options.world_size = 2;
  options.stdout_fd = out[1];
  options.stderr_fd = out[1];
  options.output_dir = dir + "/out";
  options.log_dir = dir + "/logs";
  options.log_streams = 3;
  auto forwarder = OutputForwarder::Create(options);
  REQUIRE(forwarder.ok());
  CHECK((*forwarder)->AddRank(12).ok());
  (*forwarder)->Write(12, OutputStream::kStdout, "joined\n");
  (*forwarder)->Write(12, OutputStream::kStderr, "warned\n");
  (*forwarder)->Write(0, OutputStream::kStdout, "first\n");
  auto read_file = [](const std::string& path) {
    int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) return std::string("(missing)");
    std::string text = Drain(fd);
    close(fd);
    return text;
  };
  CHECK(read_file(dir + "/out/rank.12/stdout") == "joined\n");
  CHECK(read_file(dir + "/out/rank.12/stderr") == "warned\n");
  CHECK(read_file(dir + "/out/rank.0/stdout") == "first\n");
  CHECK(read_file(dir + "/logs/12/stdout.log") == "joined\n");
  CHECK(read_file(dir + "/logs/12/stderr.log") == "warned\n");
  // A directory that cannot be made: one error naming its path.
  options.output_dir = dir + "/out/rank.0/stdout/below";
  options.log_dir.reset();
  auto refused = OutputForwarder::Create(options);
  REQUIRE_FALSE(refused.ok());
  CHECK(std::string(refused.status().message()).find("--output-filename: cannot create") !=
        std::string::npos);
  forwarder->reset();
  for (int fd : {out[0], out[1]}) close(fd);
  CHECK(std::system(("rm -rf " + dir).c_str()) == 0);
}
