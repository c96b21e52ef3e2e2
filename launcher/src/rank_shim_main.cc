// trainrun-rank-shim: the rank shim (rank_shim.h) as an executable of its own, so that trainrun
// starts it with posix_spawn (a vfork: no copy of trainrun's address space, page tables or threads)
// rather than fork()ing the whole launcher once per rank. Linked statically, so its exec maps one
// small file and runs no dynamic loader.
//
//   trainrun-rank-shim PARENT CPUS CWD EXECUTABLE ARGV0 [ARGS...]
//
// fds 0, 1, 2 are the command's stdin, stdout and stderr and fd 3 the status pipe; the environment
// is the command's; every signal is blocked (posix_spawn set the mask). PARENT is trainrun's pid,
// CPUS the command's CPUs ("0,2,5"; "" inherits), CWD its directory ("" inherits). It is no tool
// for people: RankProcessSet is its only caller, and any other use exits 2.
#include <sched.h>
#include <unistd.h>

#include "rank_shim.h"

extern char** environ;

namespace {

// ParseNumber reads a decimal number that ends at `end` (',' or '\0'); -1 when malformed.
long ParseNumber(const char*& text, char end) {
  long value = 0;
  const char* start = text;
  for (; *text >= '0' && *text <= '9'; ++text) value = value * 10 + (*text - '0');
  if (text == start || (*text != end && *text != '\0') || value > 1L << 30) return -1;
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  using trainrun::launcher::internal::ShimArgs;
  if (argc < 6) return 2;
  const char* text = argv[1];
  const long parent = ParseNumber(text, '\0');
  if (parent <= 0 || *text != '\0') return 2;
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (text = argv[2]; *text != '\0';) {
    const long cpu = ParseNumber(text, ',');
    if (cpu < 0 || cpu >= CPU_SETSIZE) return 2;
    CPU_SET(cpu, &cpus);
    if (*text == ',') ++text;
  }
  const ShimArgs args{argv[4],
                      argv + 5,
                      environ,
                      0,
                      1,
                      2,
                      3,
                      static_cast<pid_t>(parent),
                      argv[2][0] == '\0' ? nullptr : &cpus,
                      argv[3][0] == '\0' ? nullptr : argv[3]};
  trainrun::launcher::internal::RunRankShim(args);
}
