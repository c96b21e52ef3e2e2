#include "posix/unique_fd.h"

#include <unistd.h>

namespace trainrun::launcher::posix {

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

}  // namespace trainrun::launcher::posix
