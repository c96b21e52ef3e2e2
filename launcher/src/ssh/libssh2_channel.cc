// The libssh2 client behind RemoteChannel: connect, check the host key (libssh2_host_key.h),
// authenticate as OpenSSH would (libssh2_auth.h), run one command on an exec channel (here).
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
#include <initializer_list>
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
#include "ssh/libssh2_auth.h"
#include "ssh/libssh2_host_key.h"
#include "ssh/libssh2_session.h"
#include "ssh/remote_channel.h"
#include "ssh/tcp_connect.h"

namespace trainrun::launcher::ssh {
namespace {

using internal::Authenticate;
using internal::ChannelPtr;
using internal::CheckHostKey;
using internal::InitLibssh2Once;
using internal::LastError;
using internal::SessionPtr;
using internal::SetTimeoutUntil;

// Keepalives let a dead network show up as an error in Read instead of a silent hang.
constexpr int kKeepaliveIntervalSeconds = 10;
// Stderr kept for EndStatus.
constexpr size_t kStderrTailBytes = 4096;

class Libssh2Channel final : public RemoteChannel {
 public:
  Libssh2Channel(std::string alias, UniqueFd socket, SessionPtr session, ChannelPtr channel)
      : alias_(std::move(alias)),
        socket_(std::move(socket)),
        session_(std::move(session)),
        channel_(std::move(channel)),
        wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
        local_address_(SocketLocalAddress(socket_.get())),
        remote_address_(SocketRemoteAddress(socket_.get())) {}

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
  std::string RemoteAddress() const override { return remote_address_; }

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
  const std::string remote_address_;
};

// SupportedPreference is `wanted`, in its order, less what this libssh2 does not support, as
// libssh2_session_method_pref takes it. Only supported names may be passed: libssh2 1.10 drops
// the others from the list with an overlapping memcpy (ASan found it; Debian 12's libssh2 has no
// rsa-sha2-*).
std::string SupportedPreference(LIBSSH2_SESSION* session, int method,
                                std::initializer_list<absl::string_view> wanted) {
  const char** algs = nullptr;
  int count = libssh2_session_supported_algs(session, method, &algs);
  if (count <= 0 || algs == nullptr) return "";
  std::vector<absl::string_view> supported(algs, algs + count);
  libssh2_free(session, algs);
  std::vector<absl::string_view> kept;
  for (absl::string_view name : wanted) {
    if (std::find(supported.begin(), supported.end(), name) != supported.end()) {
      kept.push_back(name);
    }
  }
  return absl::StrJoin(kept, ",");
}

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
  if (std::string hostkeys =
          SupportedPreference(session.get(), LIBSSH2_METHOD_HOSTKEY,
                              {"ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
                               "ecdsa-sha2-nistp521", "rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"});
      !hostkeys.empty()) {
    libssh2_session_method_pref(session.get(), LIBSSH2_METHOD_HOSTKEY, hostkeys.c_str());
  }
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
