// Whether a host name in the plan means this machine (its ranks then start here, without SSH).
#pragma once

#include <string>

namespace trainrun::launcher {

// IsLocalHost is true for names that mean this machine: localhost, 127.0.0.0/8, ::1, and this
// host's own name (with or without its domain).
bool IsLocalHost(const std::string& host);

}  // namespace trainrun::launcher
