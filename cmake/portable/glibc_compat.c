/* For the portable collectives library (cmake/TrainrunPortable.cmake), two references its link
   redirects (-Wl,--wrap=...) to the definitions here:
   - `stderr`: Debian's libre2.a, compiled as position-independent executable code, reads glibc's
     `stderr` at a fixed offset from its code (an executable's copy relocation), which a shared
     object cannot have. It reads this pointer instead, set when the library loads to glibc's
     standard error stream (what `stderr` holds unless a program assigns it).
   - `arc4random` (glibc 2.36, used by the libstdc++ linked in for std::random_device): from
     getrandom(2) (glibc 2.25), so that the library loads with glibc 2.34 (Ubuntu 22.04, RHEL 9)
     like the launcher. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>

extern FILE _IO_2_1_stderr_;
__attribute__((visibility("hidden"))) FILE* __wrap_stderr = &_IO_2_1_stderr_;

__attribute__((visibility("hidden"))) uint32_t __wrap_arc4random(void) {
  uint32_t value;
  for (;;) {
    ssize_t n = getrandom(&value, sizeof value, 0);
    if (n == (ssize_t)sizeof value) return value;
    if (n < 0 && errno != EINTR) abort();  // as glibc's arc4random: it cannot fail
  }
}
