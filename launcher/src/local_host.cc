#include "trainrun/launcher/local_host.h"

#include <unistd.h>

#include "absl/strings/match.h"

namespace trainrun::launcher {

bool IsLocalHost(const std::string& host) {
  if (host == "localhost" || host == "::1" || absl::StartsWith(host, "127.") ||
      absl::StartsWith(host, "localhost.")) {
    return true;
  }
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return false;
  std::string self = name;
  std::string short_self = self.substr(0, self.find('.'));
  return host == self || host == short_self;
}

}  // namespace trainrun::launcher
