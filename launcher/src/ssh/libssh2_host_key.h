// Host-key policy for the libssh2 client: the server's key against known_hosts, as OpenSSH's
// StrictHostKeyChecking does it (yes / accept-new / no).
#pragma once

#include <libssh2.h>

#include "absl/status/status.h"
#include "ssh/ssh_config.h"

namespace trainrun::launcher::ssh::internal {

// CheckHostKey compares the server's key with target.known_hosts_file under
// options.host_key_policy, and records a new key where the policy allows. Errors are one line
// naming the host, the key's fingerprint, and what to do (ssh-keygen -R, ssh-keyscan, the flag).
absl::Status CheckHostKey(LIBSSH2_SESSION* session, const SshTarget& target,
                          const SshOptions& options);

}  // namespace trainrun::launcher::ssh::internal
