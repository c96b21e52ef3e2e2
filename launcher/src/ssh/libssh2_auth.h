// Authentication for the libssh2 client, as OpenSSH would: ssh-agent's keys, then -i, then the
// config's IdentityFile entries or the default keys; and, when none is accepted, one message that
// names every key tried and why the host may have refused it (RSA/SHA-1 on OpenSSH 8.8+).
#pragma once

#include <libssh2.h>

#include "absl/status/status.h"
#include "ssh/ssh_config.h"

namespace trainrun::launcher::ssh::internal {

// Authenticate logs in as target.user on an SSH session whose handshake is done.
absl::Status Authenticate(LIBSSH2_SESSION* session, const SshTarget& target,
                          const SshOptions& options);

}  // namespace trainrun::launcher::ssh::internal
