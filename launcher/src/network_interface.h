// --network-interface: the address of one of this host's interfaces.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace trainrun::launcher {

// NetworkInterfaceAddress is the IPv4 address of this host's interface `name`
// (--network-interface), for the rendezvous server to bind; an unknown interface, or one without an
// IPv4 address, is an InvalidArgument naming it.
absl::StatusOr<std::string> NetworkInterfaceAddress(const std::string& name);

}  // namespace trainrun::launcher
