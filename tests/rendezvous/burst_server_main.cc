// A rendezvous server in a process of its own, with the file-descriptor limits a test chooses:
//
//   burst_server SOFT HARD     prints "port P soft S" once listening, serves until stdin closes
//
// (The limits must be set before the server starts, and a hard limit cannot be raised again, so
// this cannot run inside the test process.) One rank: host "localhost", local_rank 0; job
// "burst-job", token "burst-token".
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "trainrun/rendezvous/server.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s SOFT HARD\n", argv[0]);
    return 2;
  }
  rlimit limit{static_cast<rlim_t>(std::atol(argv[1])), static_cast<rlim_t>(std::atol(argv[2]))};
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    std::perror("setrlimit");
    return 2;
  }
  trainrun::rendezvous::ServerOptions options;
  options.job_id = "burst-job";
  options.token = "burst-token";
  options.ranks = {{"localhost", 0, 1, 0, 1}};
  auto server = trainrun::rendezvous::Server::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  getrlimit(RLIMIT_NOFILE, &limit);
  std::printf("port %d soft %lu\n", (*server)->port(), static_cast<unsigned long>(limit.rlim_cur));
  std::fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  return 0;
}
