// The libssh2 client behind RemoteChannel: connect, check the host key, authenticate as OpenSSH
// would (agent, -i, the config's and the default keys), run one command on an exec channel.
//
// The handshake and authentication run in libssh2's blocking mode under libssh2_session_set_timeout
// (the time left before the connect deadline); once the command runs, the session is switched to
// non-blocking mode so that one thread can wait in Read while another writes. libssh2 sessions are
// not thread-safe, so every libssh2 call holds mu_, and waiting happens in poll() outside it.
#include <fcntl.h>
#include <libssh2.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "ssh/remote_channel.h"
#include "ssh/tcp_connect.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::launcher::ssh {
namespace {

// Keepalives let a dead network show up as an error in Read instead of a silent hang.
constexpr int kKeepaliveIntervalSeconds = 10;
// Stderr kept for EndStatus.
constexpr size_t kStderrTailBytes = 4096;

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

void InitLibssh2Once() {
  static const int rc = libssh2_init(0);
  (void)rc;
}

std::string LastError(LIBSSH2_SESSION* session) {
  char* message = nullptr;
  int length = 0;
  libssh2_session_last_error(session, &message, &length, 0);
  return message != nullptr ? std::string(message, length) : "unknown libssh2 error";
}

void SetTimeoutUntil(LIBSSH2_SESSION* session, absl::Time deadline) {
  int64_t ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now()));
  libssh2_session_set_timeout(session, ms);
}

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

class Libssh2Channel final : public RemoteChannel {
 public:
  Libssh2Channel(std::string alias, UniqueFd socket, SessionPtr session, ChannelPtr channel)
      : alias_(std::move(alias)),
        socket_(std::move(socket)),
        session_(std::move(session)),
        channel_(std::move(channel)),
        wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
        local_address_(SocketLocalAddress(socket_.get())) {}

  ~Libssh2Channel() override {
    std::lock_guard<std::mutex> lock(mu_);
    channel_.reset();
    session_.reset();
  }

  absl::Status Write(absl::string_view data, absl::Duration timeout) override {
    absl::Time deadline = absl::Now() + timeout;
    while (!data.empty()) {
      ssize_t rc;
      int directions;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (failed_) return end_status_;
        rc = libssh2_channel_write(channel_.get(), data.data(), data.size());
        directions = libssh2_session_block_directions(session_.get());
        if (rc < 0 && rc != LIBSSH2_ERROR_EAGAIN) {
          return Fail(absl::StrCat("connection lost while sending: ", LastError(session_.get())));
        }
      }
      Wake();  // libssh2 may have read incoming data into its buffers: let Read look again
      if (rc > 0) {
        data.remove_prefix(rc);
        continue;
      }
      if (!WaitSocket(directions, deadline, /*with_wake=*/false)) {
        return absl::DeadlineExceededError(
            absl::StrCat("host ", alias_, ": timed out sending to the remote command"));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<size_t> Read(char* buffer, size_t size, absl::Duration timeout) override {
    absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      if (interrupted_.load()) return absl::CancelledError("interrupted");
      int directions;
      int next_keepalive = kKeepaliveIntervalSeconds;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (failed_) return end_status_;
        DrainStderr();
        ssize_t rc = libssh2_channel_read(channel_.get(), buffer, size);
        if (rc > 0) return static_cast<size_t>(rc);
        if (rc < 0 && rc != LIBSSH2_ERROR_EAGAIN) {
          return Fail(absl::StrCat("connection lost: ", LastError(session_.get())));
        }
        if (libssh2_channel_eof(channel_.get())) {
          DrainStderr();
          return size_t{0};
        }
        if (libssh2_keepalive_send(session_.get(), &next_keepalive) < 0 &&
            libssh2_session_last_errno(session_.get()) != LIBSSH2_ERROR_EAGAIN) {
          return Fail(absl::StrCat("connection lost: ", LastError(session_.get())));
        }
        directions = libssh2_session_block_directions(session_.get());
      }
      absl::Time until = std::min(deadline, absl::Now() + absl::Seconds(next_keepalive));
      WaitSocket(directions | LIBSSH2_SESSION_BLOCK_INBOUND, until, /*with_wake=*/true);
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("host ", alias_, ": nothing received for ",
                                                        absl::FormatDuration(timeout)));
      }
    }
  }

  void Interrupt() override {
    interrupted_.store(true);
    Wake();
  }

  void CloseStdin() override {
    absl::Time deadline = absl::Now() + absl::Seconds(2);
    for (;;) {
      int rc, directions;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (failed_) return;
        rc = libssh2_channel_send_eof(channel_.get());
        directions = libssh2_session_block_directions(session_.get());
      }
      if (rc != LIBSSH2_ERROR_EAGAIN || !WaitSocket(directions, deadline, false)) return;
    }
  }

  absl::Status EndStatus() override {
    // sshd sends the exit status after end-of-file: wait (briefly) for the channel to close, so
    // that the status has arrived.
    absl::Time deadline = absl::Now() + absl::Seconds(2);
    for (;;) {
      int rc, directions;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (failed_) return end_status_;
        DrainStderr();
        rc = libssh2_channel_wait_closed(channel_.get());
        directions = libssh2_session_block_directions(session_.get());
      }
      if (rc != LIBSSH2_ERROR_EAGAIN || !WaitSocket(directions, deadline, false)) break;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) return end_status_;
    int code = libssh2_channel_get_exit_status(channel_.get());
    char* signal = nullptr;
    size_t signal_length = 0;
    libssh2_channel_get_exit_signal(channel_.get(), &signal, &signal_length, nullptr, nullptr,
                                    nullptr, nullptr);
    std::string tail = std::string(absl::StripTrailingAsciiWhitespace(stderr_tail_));
    absl::Status status;
    if (signal != nullptr) {
      status = absl::AbortedError(
          absl::StrCat("host ", alias_, ": the remote command was killed by SIG",
                       absl::string_view(signal, signal_length), tail.empty() ? "" : ": ", tail));
    } else if (code != 0) {
      status = absl::AbortedError(absl::StrCat("host ", alias_,
                                               ": the remote command exited with status ", code,
                                               tail.empty() ? "" : ": ", tail));
    }
    if (signal != nullptr) libssh2_free(session_.get(), signal);
    return status;
  }

  std::string LocalAddress() const override { return local_address_; }

 private:
  // Fail records a connection failure (mu_ held) so every later call reports the same thing.
  absl::Status Fail(absl::string_view what) {
    failed_ = true;
    end_status_ = absl::UnavailableError(absl::StrCat("host ", alias_, ": ", what));
    return end_status_;
  }

  void DrainStderr() {
    char chunk[1024];
    for (;;) {
      ssize_t n = libssh2_channel_read_stderr(channel_.get(), chunk, sizeof chunk);
      if (n <= 0) return;
      stderr_tail_.append(chunk, n);
      if (stderr_tail_.size() > kStderrTailBytes) {
        stderr_tail_.erase(0, stderr_tail_.size() - kStderrTailBytes);
      }
    }
  }

  void Wake() {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof one);
  }

  // Waits until the socket is ready in libssh2's blocked directions (or the wake fd fires), up to
  // `deadline`. False when the deadline passed.
  bool WaitSocket(int directions, absl::Time deadline, bool with_wake) {
    pollfd fds[2];
    short events = 0;
    if (directions & LIBSSH2_SESSION_BLOCK_INBOUND) events |= POLLIN;
    if (directions & LIBSSH2_SESSION_BLOCK_OUTBOUND) events |= POLLOUT;
    if (events == 0) events = POLLIN;
    fds[0] = {socket_.get(), events, 0};
    fds[1] = {wake_.get(), POLLIN, 0};
    int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) return false;
    int n = ::poll(fds, with_wake ? 2 : 1, static_cast<int>(std::min<int64_t>(ms, 1 << 30)));
    if (with_wake && n > 0 && (fds[1].revents & POLLIN)) {
      uint64_t value;
      [[maybe_unused]] ssize_t r = ::read(wake_.get(), &value, sizeof value);
    }
    return n != 0;
  }

  const std::string alias_;
  UniqueFd socket_;
  std::mutex mu_;
  SessionPtr session_;
  ChannelPtr channel_;
  UniqueFd wake_;
  std::atomic<bool> interrupted_{false};
  bool failed_ = false;
  absl::Status end_status_;
  std::string stderr_tail_;
  const std::string local_address_;
};

absl::Status TimedOut(const SshTarget& target, absl::string_view phase) {
  return absl::DeadlineExceededError(absl::StrCat(
      "host ", target.alias, " (", FormatHostPort(target.hostname, target.port), "): timed out ",
      phase, "; check that the host is up and its sshd is responsive, or raise --start-timeout"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteChannel>> OpenLibssh2Command(const SshTarget& target,
                                                                  const std::string& command,
                                                                  const SshOptions& options) {
  InitLibssh2Once();
  absl::Time deadline = absl::Now() + options.connect_timeout;
  auto socket = ConnectTcp(target.alias, target.hostname, target.port, deadline);
  if (!socket.ok()) return socket.status();

  SessionPtr session(libssh2_session_init());
  if (!session) return absl::InternalError("libssh2_session_init failed");
  libssh2_session_set_blocking(session.get(), 1);
  // Prefer the host key types OpenSSH prefers, so the key checked is the one `ssh` recorded.
  libssh2_session_method_pref(session.get(), LIBSSH2_METHOD_HOSTKEY,
                              "ssh-ed25519,ecdsa-sha2-nistp256,ecdsa-sha2-nistp384,"
                              "ecdsa-sha2-nistp521,rsa-sha2-512,rsa-sha2-256,ssh-rsa");
  SetTimeoutUntil(session.get(), deadline);
  int rc = libssh2_session_handshake(session.get(), socket->get());
  if (rc == LIBSSH2_ERROR_TIMEOUT) return TimedOut(target, "during the SSH handshake");
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("host ", target.alias, " (", FormatHostPort(target.hostname, target.port),
                     "): SSH handshake failed: ", LastError(session.get()),
                     "; check that an SSH server listens on that port"));
  }
  if (absl::Status s = CheckHostKey(session.get(), target, options); !s.ok()) return s;

  SetTimeoutUntil(session.get(), deadline);
  if (absl::Status s = Authenticate(session.get(), target, options); !s.ok()) {
    if (absl::Now() >= deadline) return TimedOut(target, "authenticating");
    return s;
  }

  SetTimeoutUntil(session.get(), deadline);
  ChannelPtr channel(libssh2_channel_open_session(session.get()));
  if (!channel) {
    if (absl::Now() >= deadline) return TimedOut(target, "opening a session channel");
    return absl::UnavailableError(
        absl::StrCat("host ", target.alias,
                     ": could not open an SSH session channel: ", LastError(session.get())));
  }
  if (libssh2_channel_exec(channel.get(), command.c_str()) != 0) {
    if (absl::Now() >= deadline) return TimedOut(target, "starting the remote command");
    return absl::UnavailableError(
        absl::StrCat("host ", target.alias,
                     ": the server refused to run a command: ", LastError(session.get())));
  }
  libssh2_keepalive_config(session.get(), 1, kKeepaliveIntervalSeconds);
  libssh2_session_set_blocking(session.get(), 0);
  return std::unique_ptr<RemoteChannel>(std::make_unique<Libssh2Channel>(
      target.alias, std::move(*socket), std::move(session), std::move(channel)));
}

absl::StatusOr<std::unique_ptr<RemoteChannel>> OpenRemoteCommand(const SshTarget& target,
                                                                 const std::string& command,
                                                                 const SshOptions& options) {
  if (options.client == SshClient::kOpenssh) return OpenOpensshCommand(target, command, options);
  return OpenLibssh2Command(target, command, options);
}

}  // namespace trainrun::launcher::ssh
