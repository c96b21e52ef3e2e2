#include "network_interface.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace trainrun::launcher {

absl::StatusOr<std::string> NetworkInterfaceAddress(const std::string& name) {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot list network interfaces: ", std::strerror(errno)));
  }
  std::string address;
  for (ifaddrs* it = all; it != nullptr && address.empty(); it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET || name != it->ifa_name)
      continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr, text,
                sizeof text);
    address = text;
  }
  ::freeifaddrs(all);
  if (address.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--network-interface ", name, ": this host has no interface '", name,
                     "' with an IPv4 address; see `ip -4 addr` for the names"));
  }
  return address;
}

}  // namespace trainrun::launcher
