// What the libssh2 client's parts share: RAII owners for libssh2's handles, and small helpers.
#pragma once

#include <libssh2.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainrun::launcher::ssh::internal {

struct SessionDeleter {
  void operator()(LIBSSH2_SESSION* session) const {
    libssh2_session_set_blocking(session, 1);
    libssh2_session_set_timeout(session, 1000);
    libssh2_session_disconnect(session, "trainrun: done");
    libssh2_session_free(session);
  }
};
struct ChannelDeleter {
  void operator()(LIBSSH2_CHANNEL* channel) const { libssh2_channel_free(channel); }
};
struct AgentDeleter {
  void operator()(LIBSSH2_AGENT* agent) const {
    libssh2_agent_disconnect(agent);
    libssh2_agent_free(agent);
  }
};
struct KnownHostsDeleter {
  void operator()(LIBSSH2_KNOWNHOSTS* hosts) const { libssh2_knownhost_free(hosts); }
};
using SessionPtr = std::unique_ptr<LIBSSH2_SESSION, SessionDeleter>;
using ChannelPtr = std::unique_ptr<LIBSSH2_CHANNEL, ChannelDeleter>;
using AgentPtr = std::unique_ptr<LIBSSH2_AGENT, AgentDeleter>;
using KnownHostsPtr = std::unique_ptr<LIBSSH2_KNOWNHOSTS, KnownHostsDeleter>;

inline void InitLibssh2Once() {
  static const int rc = libssh2_init(0);
  (void)rc;
}

inline std::string LastError(LIBSSH2_SESSION* session) {
  char* message = nullptr;
  int length = 0;
  libssh2_session_last_error(session, &message, &length, 0);
  return message != nullptr ? std::string(message, length) : "unknown libssh2 error";
}

inline void SetTimeoutUntil(LIBSSH2_SESSION* session, absl::Time deadline) {
  int64_t ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now()));
  libssh2_session_set_timeout(session, ms);
}

}  // namespace trainrun::launcher::ssh::internal
