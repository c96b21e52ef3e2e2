#include "acceptor.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <memory>
#include <system_error>
#include <vector>

#include "log.h"
#include "trainrun/collectives/errors.h"

namespace trainrun::collectives::internal {

using ::trainrun::internal::MakeMessage;

// Pending is one connection mid-handshake: what it has sent so far, what is left to send it.
struct Acceptor::Pending {
  enum class Step { kHello, kProof, kAccepting };

  Fd fd;
  std::string peer;
  std::string address;  // the peer's, without its port (the per-address cap's)
  uint64_t id = 0;      // in admission_
  Clock::time_point deadline;
  Step step = Step::kHello;
  std::string in;   // bytes of the hello or the proof read so far
  std::string out;  // bytes still to send
  AcceptorChallenge challenge;
  PeerIdentity who;
};

namespace {

// Sends what it can of `out` without blocking; false when the connection failed.
bool SendSome(int fd, std::string& out) {
  while (!out.empty()) {
    ssize_t n = ::send(fd, out.data(), out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      out.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
  return true;
}

// PeerAddress is the numeric address of the remote end of `fd`, without its port.
std::string PeerAddress(int fd) {
  sockaddr_storage peer{};
  socklen_t length = sizeof(peer);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) != 0) return "?";
  char text[INET6_ADDRSTRLEN] = "?";
  if (peer.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&peer)->sin6_addr, text,
                sizeof(text));
  } else if (peer.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&peer)->sin_addr, text,
                sizeof(text));
  }
  return text;
}

}  // namespace

Acceptor::Acceptor(Fd listener, const HandshakeParams& params, int rank, Clock::time_point deadline,
                   Place place)
    : listener_(std::move(listener)),
      params_(params),
      rank_(rank),
      deadline_(deadline),
      place_(std::move(place)),
      admission_(
          MakeMessage("rank ", rank, "'s data port"),
          {std::chrono::duration_cast<std::chrono::milliseconds>(kHandshakeTimeout),
           kMaxPendingPerAddress, kMaxPending, rendezvous::Admission::kDefaultMaxBytesBeforeProof},
          [](const std::string& line) { LogWarning(line); }) {
  try {
    thread_ = std::thread([this] { Run(); });
  } catch (const std::system_error& e) {
    throw IoError(
        MakeMessage("rank ", rank_, " cannot start a thread to accept its peers: ", e.what()));
  }
}

Acceptor::~Acceptor() {
  stop_ = true;
  thread_.join();
  if (refused_ > kMaxLogged) {
    LogWarning(MakeMessage("rank ", rank_, ": dropped ", refused_,
                           " data connections in all that did not prove to be from this job"));
  }
}

void Acceptor::Refuse(const std::string& peer, const std::string& why) {
  ++refused_;
  if (refused_ <= kMaxLogged) {
    LogWarning(
        MakeMessage("rank ", rank_, ": dropped a data connection from ", peer, ": ", why,
                    refused_ == kMaxLogged ? " (further ones are counted, not logged)" : ""));
  }
}

void Acceptor::Run() {
  std::deque<std::unique_ptr<Pending>> pending;  // oldest first
  std::vector<pollfd> fds;
  // After EMFILE/ENFILE, the listener rests a while instead of spinning on a connection it cannot
  // take; the kernel keeps it in the backlog meanwhile.
  Clock::time_point listener_rests_until{};
  uint64_t next_id = 1;
  while (!stop_ && Clock::now() < deadline_) {
    const Clock::time_point now = Clock::now();
    fds.clear();
    const bool listening = now >= listener_rests_until;
    fds.push_back(pollfd{listening ? listener_.get() : -1, POLLIN, 0});
    for (const auto& p : pending) {
      fds.push_back(pollfd{p->fd.get(), static_cast<short>(p->out.empty() ? POLLIN : POLLOUT), 0});
    }
    if (::poll(fds.data(), fds.size(), 20) < 0 && errno != EINTR) break;

    // Progress every connection that is ready; drop those that fail or run out of time.
    for (size_t i = 0; i < pending.size();) {
      Pending& p = *pending[i];
      const short revents = fds[i + 1].revents;
      std::string error;
      bool done = false;
      try {
        if ((revents & (POLLOUT | POLLERR)) != 0) {
          if (!SendSome(p.fd.get(), p.out)) throw IoError("it closed the connection");
          if (p.out.empty() && p.step == Pending::Step::kAccepting) done = true;
        }
        if (!done && (revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
          const size_t want =
              p.step == Pending::Step::kHello ? kHandshakeHelloBytes : kHandshakeProofBytes;
          char buffer[kHandshakeHelloBytes];
          ssize_t n = ::recv(p.fd.get(), buffer, want - p.in.size(), MSG_DONTWAIT);
          if (n == 0) throw IoError("it closed the connection before finishing the handshake");
          if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            throw IoError(MakeMessage("reading its handshake failed: ", std::strerror(errno)));
          }
          if (n > 0) p.in.append(buffer, static_cast<size_t>(n));
          if (p.in.size() == want && p.step == Pending::Step::kHello) {
            p.out = AnswerHello(params_, rank_, reinterpret_cast<const unsigned char*>(p.in.data()),
                                &p.challenge);
            p.in.clear();
            p.step = Pending::Step::kProof;
            if (!SendSome(p.fd.get(), p.out)) throw IoError("it closed the connection");
          } else if (p.in.size() == want && p.step == Pending::Step::kProof) {
            p.who = CheckProof(params_, p.challenge,
                               reinterpret_cast<const unsigned char*>(p.in.data()));
            p.out.assign(1, kHandshakeAccepted);
            p.step = Pending::Step::kAccepting;
            if (!SendSome(p.fd.get(), p.out)) throw IoError("it closed the connection");
            done = p.out.empty();
          }
        }
        if (!done && Clock::now() >= p.deadline) {
          throw TimeoutError(MakeMessage("it did not finish the handshake within ",
                                         kHandshakeTimeout.count(), " s"));
        }
      } catch (const Error& e) {
        error = e.what();
      }
      if (error.empty() && !done) {
        ++i;
        continue;
      }
      std::unique_ptr<Pending> finished = std::move(pending[i]);
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      fds.erase(fds.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      if (error.empty()) {
        admission_.Proven(finished->id);
      } else {
        admission_.Closed(finished->id);
      }
      if (!error.empty()) {
        Refuse(finished->peer, error);
      } else if (!place_(finished->who, std::move(finished->fd))) {
        Refuse(finished->peer, MakeMessage("a second connection ", finished->who.index,
                                           " from rank ", finished->who.rank));
      }
    }

    // New connections, as many as are waiting (up to a batch, so the others still progress).
    if (!listening || (fds[0].revents & POLLIN) == 0) continue;
    for (int batch = 0; batch < 64; ++batch) {
      int raw = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (raw < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          listener_rests_until = Clock::now() + std::chrono::milliseconds(50);
        }
        break;
      }
      auto p = std::make_unique<Pending>();
      p->fd = Fd(raw);
      p->peer = PeerName(raw);
      p->address = PeerAddress(raw);
      p->id = next_id++;
      const Clock::time_point accepted = Clock::now();
      p->deadline = std::min(deadline_, accepted + kHandshakeTimeout);
      // Real peers prove themselves in a millisecond: the oldest waiting one from the flood's
      // address (else in all) is a stranger. Admission counts these and says them once a minute.
      for (uint64_t evicted : admission_.Admit(p->id, p->address, accepted)) {
        for (auto it = pending.begin(); it != pending.end(); ++it) {
          if ((*it)->id != evicted) continue;
          ++refused_;
          pending.erase(it);
          break;
        }
      }
      pending.push_back(std::move(p));
    }
  }
}

}  // namespace trainrun::collectives::internal
