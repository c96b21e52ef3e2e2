#include "ssh/libssh2_host_key.h"

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "ssh/libssh2_session.h"

namespace trainrun::launcher::ssh::internal {
namespace {

int KnownHostKeyType(int hostkey_type) {
  switch (hostkey_type) {
    case LIBSSH2_HOSTKEY_TYPE_RSA:
      return LIBSSH2_KNOWNHOST_KEY_SSHRSA;
    case LIBSSH2_HOSTKEY_TYPE_DSS:
      return LIBSSH2_KNOWNHOST_KEY_SSHDSS;
    case LIBSSH2_HOSTKEY_TYPE_ECDSA_256:
      return LIBSSH2_KNOWNHOST_KEY_ECDSA_256;
    case LIBSSH2_HOSTKEY_TYPE_ECDSA_384:
      return LIBSSH2_KNOWNHOST_KEY_ECDSA_384;
    case LIBSSH2_HOSTKEY_TYPE_ECDSA_521:
      return LIBSSH2_KNOWNHOST_KEY_ECDSA_521;
    case LIBSSH2_HOSTKEY_TYPE_ED25519:
      return LIBSSH2_KNOWNHOST_KEY_ED25519;
    default:
      return LIBSSH2_KNOWNHOST_KEY_UNKNOWN;
  }
}

const char* HostKeyTypeName(int hostkey_type) {
  switch (hostkey_type) {
    case LIBSSH2_HOSTKEY_TYPE_RSA:
      return "RSA";
    case LIBSSH2_HOSTKEY_TYPE_DSS:
      return "DSA";
    case LIBSSH2_HOSTKEY_TYPE_ECDSA_256:
    case LIBSSH2_HOSTKEY_TYPE_ECDSA_384:
    case LIBSSH2_HOSTKEY_TYPE_ECDSA_521:
      return "ECDSA";
    case LIBSSH2_HOSTKEY_TYPE_ED25519:
      return "ED25519";
    default:
      return "unknown";
  }
}

std::string Sha256Fingerprint(LIBSSH2_SESSION* session) {
  const char* hash = libssh2_hostkey_hash(session, LIBSSH2_HOSTKEY_HASH_SHA256);
  if (hash == nullptr) return "";
  std::string encoded = absl::Base64Escape(absl::string_view(hash, 32));
  while (!encoded.empty() && encoded.back() == '=') encoded.pop_back();
  return "SHA256:" + encoded;
}

// The name known_hosts files use for a host: "[name]:port" unless the port is 22.
std::string KnownHostsName(const SshTarget& target) {
  if (target.port == 22) return target.hostname;
  return absl::StrCat("[", target.hostname, "]:", target.port);
}

}  // namespace

// CheckHostKey compares the server's key with known_hosts under the policy, and records a new key
// where the policy allows. known_hosts is read line by line so that lines libssh2 cannot parse
// (certificates, security-key types) are skipped rather than fatal, and a new key is appended, so
// those lines survive.
absl::Status CheckHostKey(LIBSSH2_SESSION* session, const SshTarget& target,
                          const SshOptions& options) {
  size_t key_length = 0;
  int key_type = 0;
  const char* key = libssh2_session_hostkey(session, &key_length, &key_type);
  if (key == nullptr) {
    return absl::InternalError(
        absl::StrCat("host ", target.alias, ": the server sent no host key: ", LastError(session)));
  }
  KnownHostsPtr hosts(libssh2_knownhost_init(session));
  std::ifstream in(target.known_hosts_file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    libssh2_knownhost_readline(hosts.get(), line.data(), line.size(),
                               LIBSSH2_KNOWNHOST_FILE_OPENSSH);
  }
  int typemask =
      LIBSSH2_KNOWNHOST_TYPE_PLAIN | LIBSSH2_KNOWNHOST_KEYENC_RAW | KnownHostKeyType(key_type);
  libssh2_knownhost* found = nullptr;
  int check = libssh2_knownhost_checkp(hosts.get(), target.hostname.c_str(), target.port, key,
                                       key_length, typemask, &found);
  std::string fingerprint = Sha256Fingerprint(session);
  if (check == LIBSSH2_KNOWNHOST_CHECK_MATCH) return absl::OkStatus();
  if (check == LIBSSH2_KNOWNHOST_CHECK_MISMATCH) {
    std::string message = absl::StrCat(
        "host ", target.alias, ": host key mismatch: the ", HostKeyTypeName(key_type),
        " key it presented (", fingerprint, ") is not the one recorded in ",
        target.known_hosts_file,
        "; someone may be intercepting the connection, or the host was reinstalled: if you trust "
        "it, remove the old key with `ssh-keygen -R '",
        KnownHostsName(target), "' -f ", target.known_hosts_file, "`");
    if (options.host_key_policy != HostKeyPolicy::kNo) {
      return absl::PermissionDeniedError(message);
    }
    return absl::OkStatus();  // "no" accepts even a changed key, as OpenSSH does
  }
  if (options.host_key_policy == HostKeyPolicy::kYes) {
    return absl::PermissionDeniedError(absl::StrCat(
        "host ", target.alias, ": host key unknown: its ", HostKeyTypeName(key_type), " key (",
        fingerprint, ") is not in ", target.known_hosts_file,
        " and host key checking is strict; add it (`ssh-keyscan -p ", target.port, " ",
        target.hostname, " >> ", target.known_hosts_file,
        "`, after checking the fingerprint) or use --ssh-strict-host-key-checking accept-new"));
  }
  // accept-new / no: record the key, as OpenSSH does.
  libssh2_knownhost* added = nullptr;
  std::string name = KnownHostsName(target);
  if (libssh2_knownhost_addc(hosts.get(), name.c_str(), nullptr, key, key_length, nullptr, 0,
                             typemask, &added) == 0 &&
      added != nullptr) {
    std::vector<char> buffer(key_length * 2 + name.size() + 256);
    size_t written = 0;
    if (libssh2_knownhost_writeline(hosts.get(), added, buffer.data(), buffer.size(), &written,
                                    LIBSSH2_KNOWNHOST_FILE_OPENSSH) == 0) {
      std::ofstream out(target.known_hosts_file, std::ios::app);
      out.write(buffer.data(), written);
    }
  }
  return absl::OkStatus();
}

}  // namespace trainrun::launcher::ssh::internal
