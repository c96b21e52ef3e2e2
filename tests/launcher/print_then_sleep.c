// A worker that prints with stdio and never flushes: "step 1", a sleep, "step 2". Under a pipe,
// C stdio holds both lines until exit; under a terminal it writes each line as it ends.
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char** argv) {
  unsigned seconds = argc > 1 ? (unsigned)atoi(argv[1]) : 3;
  printf("step 1 isatty=%d\n", isatty(1));
  sleep(seconds);
  printf("step 2\n");
  return 0;
}
