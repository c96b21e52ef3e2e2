// OutputForwarder: tags, continued lines, interleaving ranks, into a pipe we read back.
#include "trainrun/launcher/output_forwarder.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
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

TEST_CASE("a continued line keeps one tag; another rank's line starts on its own",
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
