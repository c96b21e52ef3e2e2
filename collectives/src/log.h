// One-line diagnostics to stderr for events the caller cannot see as an exception (a stranger's
// connection dropped during setup).
#pragma once

#include <cstdio>
#include <string>

namespace trainrun::collectives::internal {

inline void LogWarning(const std::string& line) {
  std::fprintf(stderr, "trainrun collectives: %s\n", line.c_str());
}

}  // namespace trainrun::collectives::internal
