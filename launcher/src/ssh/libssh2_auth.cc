#include "ssh/libssh2_auth.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ssh/libssh2_session.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::launcher::ssh::internal {
namespace {

bool FileExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// ReadSshString reads one SSH wire-format string (u32 length + bytes) at *pos.
bool ReadSshString(absl::string_view data, size_t* pos, absl::string_view* out) {
  if (*pos + 4 > data.size()) return false;
  uint32_t n = (uint8_t(data[*pos]) << 24) | (uint8_t(data[*pos + 1]) << 16) |
               (uint8_t(data[*pos + 2]) << 8) | uint8_t(data[*pos + 3]);
  *pos += 4;
  if (*pos + n > data.size()) return false;
  *out = data.substr(*pos, n);
  *pos += n;
  return true;
}

// KeyTypeOfFile names a private key's algorithm ("ssh-rsa", "ssh-ed25519", ...) from its .pub
// file, or from the private key itself when there is none; "" when it cannot tell.
std::string KeyTypeOfFile(const std::string& path) {
  if (FileExists(path + ".pub")) {
    std::string pub = ReadText(path + ".pub");
    std::vector<std::string> words = absl::StrSplit(pub, ' ', absl::SkipEmpty());
    if (!words.empty()) return words[0];
  }
  std::string text = ReadText(path);
  if (absl::StrContains(text, "BEGIN RSA PRIVATE KEY")) return "ssh-rsa";
  if (absl::StrContains(text, "BEGIN EC PRIVATE KEY")) return "ecdsa";
  const std::string kBegin = "-----BEGIN OPENSSH PRIVATE KEY-----";
  const std::string kEnd = "-----END OPENSSH PRIVATE KEY-----";
  size_t begin = text.find(kBegin), end = text.find(kEnd);
  if (begin == std::string::npos || end == std::string::npos) return "";
  std::string base64 = text.substr(begin + kBegin.size(), end - begin - kBegin.size());
  base64.erase(std::remove_if(base64.begin(), base64.end(), ::isspace), base64.end());
  std::string blob;
  if (!absl::Base64Unescape(base64, &blob)) return "";
  // "openssh-key-v1\0", cipher, kdf, kdf options, u32 key count, then the first public key, whose
  // first string is its type.
  constexpr absl::string_view kMagic("openssh-key-v1\0", 15);
  if (!absl::StartsWith(blob, kMagic)) return "";
  size_t pos = kMagic.size();
  absl::string_view field, public_key;
  for (int i = 0; i < 3; ++i) {
    if (!ReadSshString(blob, &pos, &field)) return "";
  }
  pos += 4;
  if (!ReadSshString(blob, &pos, &public_key)) return "";
  size_t key_pos = 0;
  absl::string_view type;
  if (!ReadSshString(public_key, &key_pos, &type)) return "";
  return std::string(type);
}

// The server's OpenSSH version from its banner ("SSH-2.0-OpenSSH_9.2p1 Debian-2"), as major*100 +
// minor; 0 when it is not OpenSSH.
int OpensshVersion(LIBSSH2_SESSION* session) {
  const char* banner = libssh2_session_banner_get(session);
  if (banner == nullptr) return 0;
  absl::string_view text(banner);
  size_t at = text.find("OpenSSH_");
  if (at == absl::string_view::npos) return 0;
  text.remove_prefix(at + 8);
  int major = 0, minor = 0;
  if (std::sscanf(std::string(text).c_str(), "%d.%d", &major, &minor) < 1) return 0;
  return major * 100 + minor;
}

// The keys that authentication tried, for the message when none worked.
struct AuthAttempts {
  std::vector<std::string> tried;  // "ssh-agent key 'comment' (ssh-ed25519)", "/path (ssh-rsa)"
  int rsa = 0;
  int other = 0;
  std::vector<std::string> unreadable;  // files that exist but libssh2 could not use

  void Note(const std::string& what, const std::string& type) {
    tried.push_back(type.empty() ? what : absl::StrCat(what, " (", type, ")"));
    if (type == "ssh-rsa") {
      ++rsa;
    } else {
      ++other;
    }
  }
};

std::string AgentKeyType(const libssh2_agent_publickey* identity) {
  size_t pos = 0;
  absl::string_view type;
  absl::string_view blob(reinterpret_cast<const char*>(identity->blob), identity->blob_len);
  if (!ReadSshString(blob, &pos, &type)) return "";
  return std::string(type);
}

bool TryAgent(LIBSSH2_SESSION* session, const SshTarget& target, AuthAttempts* attempts) {
  std::optional<std::string> socket = env::Lookup(env::kSshAuthSock);
  if (!socket || socket->empty()) return false;
  AgentPtr agent(libssh2_agent_init(session));
  if (!agent || libssh2_agent_connect(agent.get()) != 0) return false;
  if (libssh2_agent_list_identities(agent.get()) != 0) return false;
  libssh2_agent_publickey* identity = nullptr;
  while (libssh2_agent_get_identity(agent.get(), &identity, identity) == 0) {
    attempts->Note(absl::StrCat("ssh-agent key '", identity->comment ? identity->comment : "", "'"),
                   AgentKeyType(identity));
    if (libssh2_agent_userauth(agent.get(), target.user.c_str(), identity) == 0) return true;
  }
  return false;
}

bool TryKeyFiles(LIBSSH2_SESSION* session, const SshTarget& target, AuthAttempts* attempts) {
  for (const std::string& path : target.identity_files) {
    if (!FileExists(path)) continue;
    std::string pub = path + ".pub";
    bool have_pub = FileExists(pub);
    std::string type = KeyTypeOfFile(path);
    attempts->Note(path, type);
    int rc = libssh2_userauth_publickey_fromfile_ex(
        session, target.user.c_str(), static_cast<unsigned>(target.user.size()),
        have_pub ? pub.c_str() : nullptr, path.c_str(), nullptr);
    if (rc == 0) return true;
    if (rc == LIBSSH2_ERROR_FILE) attempts->unreadable.push_back(path);
    if (rc == LIBSSH2_ERROR_TIMEOUT || rc == LIBSSH2_ERROR_SOCKET_RECV ||
        rc == LIBSSH2_ERROR_SOCKET_SEND || rc == LIBSSH2_ERROR_SOCKET_DISCONNECT) {
      return false;
    }
  }
  return false;
}

}  // namespace

absl::Status Authenticate(LIBSSH2_SESSION* session, const SshTarget& target,
                          const SshOptions& options) {
  const char* methods = libssh2_userauth_list(session, target.user.c_str(),
                                              static_cast<unsigned>(target.user.size()));
  if (methods == nullptr) {
    if (libssh2_userauth_authenticated(session)) return absl::OkStatus();  // "none" was accepted
    return absl::UnavailableError(absl::StrCat(
        "host ", target.alias, ": SSH authentication could not start: ", LastError(session)));
  }
  if (!absl::StrContains(methods, "publickey")) {
    return absl::PermissionDeniedError(
        absl::StrCat("host ", target.alias, ": authentication failed for user ", target.user,
                     ": the server does not accept public keys (it offers: ", methods,
                     "); enable PubkeyAuthentication there, or use --ssh-client openssh"));
  }
  AuthAttempts attempts;
  if (TryAgent(session, target, &attempts)) return absl::OkStatus();
  if (TryKeyFiles(session, target, &attempts)) return absl::OkStatus();

  std::string where =
      absl::StrCat("host ", target.alias, ": authentication failed for user ", target.user);
  if (attempts.tried.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        where, ": no key to offer (no ssh-agent, and none of ",
        absl::StrJoin(target.identity_files, ", "),
        " exists); create one with `ssh-keygen -t ed25519` and add its .pub to the host's "
        "~/.ssh/authorized_keys, or pass -i/--ssh-identity-file"));
  }
  // OpenSSH 8.8 and newer refuse "ssh-rsa" (RSA with SHA-1) signatures, the only ones libssh2 1.10
  // makes with an RSA key; the server logs "signature algorithm ssh-rsa not in
  // PubkeyAcceptedAlgorithms" while the client sees a plain refusal.
  bool rsa_refused = attempts.rsa > 0 && OpensshVersion(session) >= 808;
  std::string rsa_note = absl::StrCat(
      "this libssh2 (", LIBSSH2_VERSION,
      ") signs with RSA keys only as \"ssh-rsa\" (SHA-1), which the host's OpenSSH refuses "
      "(\"signature algorithm ssh-rsa not in PubkeyAcceptedAlgorithms\"): use an ed25519 or ECDSA "
      "key (`ssh-keygen -t ed25519`, then add it to the host's authorized_keys), or pass "
      "--ssh-client openssh");
  if (rsa_refused && attempts.other == 0) {
    return absl::PermissionDeniedError(absl::StrCat(where, ": the only keys offered are RSA (",
                                                    absl::StrJoin(attempts.tried, ", "), "); ",
                                                    rsa_note));
  }
  std::string message = absl::StrCat(where, ": the host accepted none of the keys offered (",
                                     absl::StrJoin(attempts.tried, ", "), ")");
  if (!attempts.unreadable.empty()) {
    absl::StrAppend(&message, "; libssh2 could not load ", absl::StrJoin(attempts.unreadable, ", "),
                    " (a key with a passphrase must be loaded into ssh-agent)");
  }
  absl::StrAppend(&message, "; check the host's ~/.ssh/authorized_keys for user ", target.user,
                  ", or pass -i/--ssh-identity-file");
  if (rsa_refused) absl::StrAppend(&message, "; note: ", rsa_note);
  return absl::PermissionDeniedError(message);
}

}  // namespace trainrun::launcher::ssh::internal
