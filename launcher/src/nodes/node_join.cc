#include "nodes/node_join.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "nodes/socket_stream.h"
#include "trainrun/launcher/logging.h"
#include "trainrun/rendezvous/admission.h"

namespace trainrun::launcher::nodes {
namespace {

constexpr char kJoinWord[] = "trainrun-node-join";
constexpr char kChallengeWord[] = "trainrun-node-challenge";
constexpr size_t kNonceBytes = 32;
constexpr int kJoinVersion = 1;
constexpr size_t kMaxLine = 4096;
// Join requests with a wrong token said one by one on node 0; the rest are counted (a flood of
// forged requests makes no more lines than that, plus the admission's one a minute).
constexpr int kUnprovedRefusalsSaid = 3;

// ReadLine reads one '\n'-terminated line, byte by byte so that nothing after it is consumed (the
// agent protocol follows on the same socket).
absl::StatusOr<std::string> ReadLine(int fd, absl::Time deadline) {
  std::string line;
  while (line.size() < kMaxLine) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) return absl::DeadlineExceededError("no answer in time");
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000))) <= 0) continue;
    char c = 0;
    ssize_t n = ::recv(fd, &c, 1, 0);
    if (n == 0) return absl::UnavailableError("the connection was closed");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return absl::UnavailableError(std::strerror(errno));
    }
    if (c == '\n') return line;
    line.push_back(c);
  }
  return absl::InvalidArgumentError("line too long");
}

bool SendAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::send(fd, text.data() + done, text.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// Compares proofs in time independent of where they differ.
bool SameProof(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

// Nonce is a fresh challenge, hex.
std::string Nonce() {
  unsigned char bytes[kNonceBytes];
  if (RAND_bytes(bytes, sizeof bytes) != 1) return "";
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof bytes));
}

// Hmac is HMAC-SHA256(token, text), hex; "-" without a token.
std::string Hmac(const std::string& token, const std::string& text) {
  if (token.empty()) return "-";
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(text.data()), text.size(), mac, &length);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(mac), length));
}

}  // namespace

std::string SealKey(const std::string& token, const std::string& challenge,
                    const JoinRequest& request) {
  if (token.empty()) return "";
  return Hmac(token, absl::StrCat("seal|", challenge, "|", request.nonce));
}

std::string Seal(const std::string& key, const std::string& value) {
  std::string bytes;
  if (key.empty() || value.size() != 64 ||
      value.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
    return value;
  }
  bytes = absl::HexStringToBytes(value);
  unsigned char pad[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  static constexpr char kLabel[] = "job token";
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(kLabel), sizeof(kLabel) - 1, pad, &length);
  if (length < bytes.size()) return value;
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(bytes[i] ^ pad[i]);
  OPENSSL_cleanse(pad, sizeof pad);
  return absl::BytesToHexString(bytes);
}

namespace {

// Listen binds the endpoint's address and port (--rdzv-endpoint's host, as every node dials it):
// a stranger on another interface of node 0 never reaches the join port.
absl::StatusOr<posix::UniqueFd> Listen(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int error = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
      error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve --rdzv-endpoint's host ", host, ": ", gai_strerror(error)));
  }
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    posix::UniqueFd fd(
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!fd) continue;
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), 1024) != 0) {
      why = std::strerror(errno);
      continue;
    }
    ::freeaddrinfo(found);
    return fd;
  }
  ::freeaddrinfo(found);
  return absl::UnavailableError(absl::StrCat(
      "cannot listen at ", host, ":", port, " for the other nodes: ", why,
      " (--rdzv-endpoint must name an address of node 0, and its port must be free there)"));
}

// JoinPort serves node 0's join port on a thread of its own. Each joined node's stream holds it, so
// once every node has joined it outlives the channel that started it and answers latecomers for
// as long as the job's streams live.
class JoinPort : public std::enable_shared_from_this<JoinPort> {
 public:
  JoinPort(PerNodeSpec spec, std::chrono::seconds start_timeout)
      : spec_(std::move(spec)), start_timeout_(start_timeout), joins_(spec_.nnodes, 0) {}
  ~JoinPort() { Stop(); }

  const PerNodeSpec& spec() const { return spec_; }
  bool started() const { return started_; }

  // AcceptLate: nodes that come after the start go to `on_host`, those that came before it was
  // given first; empty: from now on they are refused (the job is ending).
  void AcceptLate(channel::LateHostCallback on_host) {
    std::vector<channel::LateHost> queued;
    channel::LateHostCallback given;
    {
      std::lock_guard<std::mutex> lock(mu_);
      late_ = std::move(on_host);
      late_closed_ = !late_;
      queued.swap(queued_);
      given = late_;
    }
    // Outside the lock: a stream dropped here (the job is ending) calls Left.
    for (channel::LateHost& node : queued) {
      if (given) given(std::move(node));
    }
  }

  // Left: the stream of node `node`'s join number `join` ended (any thread); a --nnodes MIN:MAX
  // job's node may join again (unless it already has: a later join's number differs).
  void Left(int node, uint64_t join) {
    std::lock_guard<std::mutex> lock(mu_);
    left_.push_back({node, join});
  }

  void Start(size_t count, absl::Time deadline, channel::StreamCallback on_stream) {
    thread_ = std::thread([this, count, deadline, on_stream = std::move(on_stream)] {
      Serve(count, deadline, on_stream);
    });
  }

  // Stop closes the port and ends its thread.
  void Stop() {
    stop_ = true;
    if (!thread_.joinable()) return;
    // The last stream may go on the port's own thread (a join whose stream failed at once).
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }

 private:
  // Pending is a connection that has not yet sent its join request.
  struct Pending {
    posix::UniqueFd fd;
    std::string from;
    std::string challenge;
    std::string received;  // what it has sent so far: part of its request line
  };

  // Serve answers every connection at the join port concurrently (a stranger's idle connection
  // delays nobody), each under rendezvous::Admission's deadline and caps, until every node has
  // joined, and then goes on answering (a second "node 1" hears at once that node 1 has joined)
  // until the job ends. Nodes missing at `deadline` get one error naming them all.
  void Serve(size_t count, absl::Time deadline, const channel::StreamCallback& on_stream) {
    absl::StatusOr<posix::UniqueFd> listener = Listen(spec_.endpoint_host, spec_.endpoint_port);
    if (!listener.ok()) {
      for (size_t i = 0; i < count; ++i) on_stream(static_cast<int>(i), listener.status());
      return;
    }
    rendezvous::Admission admission(absl::StrCat("the per-node join port ", EndpointText(spec_)),
                                    rendezvous::Admission::Limits{},
                                    [](const std::string& line) { Logger().warn("{}", line); });
    std::unordered_map<uint64_t, Pending> pending;
    uint64_t next_id = 1;
    auto drop = [&](uint64_t id) { pending.erase(id); };
    std::vector<bool> joined(spec_.nnodes, false);
    joined[0] = true;
    size_t arrived = 0;
    // --nnodes MIN:MAX: the job starts once MIN nodes (node 0 with them) have joined and the last
    // call has passed since, or at once when every node has.
    const bool range = spec_.min_nnodes > 0 && spec_.min_nnodes < spec_.nnodes;
    const size_t enough = range ? static_cast<size_t>(spec_.min_nnodes - 1) : count;
    std::optional<absl::Time> last_call;
    while (!stop_ &&
           (started_ || absl::Now() < deadline || (range && arrived >= enough && !started_))) {
      if (!started_ && arrived == count) started_ = true;
      if (range && started_) {
        // A node whose stream ended has left the running job: it may join again.
        std::lock_guard<std::mutex> lock(mu_);
        for (auto [node, join] : left_) {
          if (joins_[node] == join) joined[node] = false;
        }
        left_.clear();
      }
      if (!started_ && range && arrived >= enough) {
        if (!last_call) last_call = absl::Now() + absl::FromChrono(spec_.last_call);
        // A restart: the nodes of the last start are back (spec_.expect_nodes).
        const bool back =
            spec_.expect_nodes > 0 && arrived + 1 >= static_cast<size_t>(spec_.expect_nodes);
        if (absl::Now() >= *last_call || absl::Now() >= deadline || back) {
          StartWithout(joined, arrived, on_stream, *listener);
          if (!*listener) return;
        }
      }
      std::vector<pollfd> polled{{listener->get(), POLLIN, 0}};
      std::vector<uint64_t> ids;
      for (const auto& [id, connection] : pending) {
        polled.push_back({connection.fd.get(), POLLIN, 0});
        ids.push_back(id);
      }
      // Nodes that joined a range's job before its start: watched for leaving (their agent's
      // Hello waits unread in the socket).
      const size_t first_held = polled.size();
      for (const Held& node : held_) polled.push_back({node.fd.get(), POLLRDHUP, 0});
      ::poll(polled.data(), polled.size(), 100);
      for (size_t i = held_.size(); i-- > 0;) {
        if ((polled[first_held + i].revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0) continue;
        Logger().info("per-node join: node {} left before the job started; it may join again",
                      held_[i].node);
        joined[held_[i].node] = false;
        --arrived;
        held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(i));
        if (arrived < enough) last_call.reset();  // fewer than MIN again: no last call yet
      }
      polled.resize(first_held);
      const auto now = rendezvous::Admission::Clock::now();
      if ((polled[0].revents & POLLIN) != 0) {
        for (int batch = 0; batch < 1024; ++batch) {
          posix::UniqueFd fd(
              ::accept4(listener->get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
          if (!fd) break;
          int one = 1;
          ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          std::string from = NumericAddress(fd.get(), true);
          Pending connection{std::move(fd), std::move(from), Nonce(), ""};
          const std::string greeting =
              absl::StrCat(kChallengeWord, " ", kJoinVersion, " ", connection.challenge, "\n");
          if (connection.challenge.empty() ||
              ::send(connection.fd.get(), greeting.data(), greeting.size(),
                     MSG_NOSIGNAL | MSG_DONTWAIT) != static_cast<ssize_t>(greeting.size())) {
            continue;
          }
          const uint64_t id = next_id++;
          for (uint64_t evicted : admission.Admit(id, connection.from, now)) drop(evicted);
          pending.emplace(id, std::move(connection));
        }
      }
      for (size_t i = 1; i < polled.size(); ++i) {
        if (polled[i].revents == 0) continue;
        auto it = pending.find(ids[i - 1]);
        if (it == pending.end()) continue;  // evicted by this round's accepts
        std::string line;
        const Taken taken = TakeLine(it->second, line);
        if (taken == Taken::kWaiting) continue;
        Pending connection = std::move(it->second);
        pending.erase(it);
        if (taken == Taken::kClosed) {
          admission.Closed(ids[i - 1]);
        } else if (taken == Taken::kTooLong) {
          admission.Closed(ids[i - 1], rendezvous::Admission::Reason::kTooManyBytes);
        } else if (Answer(std::move(connection), line, joined, admission, ids[i - 1], on_stream,
                          arrived + 1 == count ? &*listener : nullptr) &&
                   !started_) {
          if (++arrived == count) {
            Release(on_stream);
            started_ = true;
          }
        }
      }
      for (uint64_t late : admission.Expired(now)) drop(late);
      if (started_ && !*listener) return;  // the port went to the ranks' MASTER_PORT
    }
    if (started_ || stop_) return;
    std::vector<std::string> missing;
    for (int node = 1; node < spec_.nnodes; ++node) {
      if (!joined[node]) missing.push_back(absl::StrCat(node));
    }
    const absl::Status never =
        range ? absl::DeadlineExceededError(absl::StrCat(
                    "only ", arrived + 1, " of at least ", spec_.min_nnodes, " nodes (--nnodes ",
                    NnodesText(spec_), ") joined at port ", spec_.endpoint_port,
                    " within --start-timeout ", start_timeout_.count(),
                    " s; start trainrun on more nodes with --rdzv-endpoint ", EndpointText(spec_),
                    " and a --node-rank of ", absl::StrJoin(missing, ", "),
                    ", or raise --start-timeout"))
              : absl::DeadlineExceededError(absl::StrCat(
                    missing.size() == 1 ? "node " : "nodes ", absl::StrJoin(missing, ", "),
                    " of --nnodes ", spec_.nnodes, " never joined at port ", spec_.endpoint_port,
                    " within --start-timeout ", start_timeout_.count(),
                    " s; start trainrun there with --node-rank ", missing.front(),
                    " and --rdzv-endpoint ", EndpointText(spec_), ", or raise --start-timeout"));
    // (A range's nodes that had joined hear it too: their streams were held for the start.)
    held_.clear();
    for (int node = 1; node < spec_.nnodes; ++node) {
      if (!joined[node] || range) on_stream(node - 1, never);
    }
  }

  // StartWithout starts a --nnodes MIN:MAX job with the nodes that have joined: every other node
  // is absent (channel::HostAbsent), and one that comes later is refused (Answer). The join port
  // closes now when it is also the ranks' MASTER_PORT.
  void StartWithout(const std::vector<bool>& joined, size_t arrived,
                    const channel::StreamCallback& on_stream, posix::UniqueFd& listener) {
    Release(on_stream);
    started_ = true;
    Logger().info("per-node join: {} of --nnodes {} nodes joined; starting the job with them",
                  arrived + 1, NnodesText(spec_));
    if (spec_.master_port != 0 && spec_.master_port == spec_.endpoint_port) listener.Reset();
    for (int node = 1; node < spec_.nnodes; ++node) {
      if (!joined[node]) {
        on_stream(node - 1, channel::HostAbsent(absl::StrCat("node ", node, " had not joined")));
      }
    }
  }

  // Release hands on the streams of the nodes held until the start (a range's).
  void Release(const channel::StreamCallback& on_stream) {
    for (Held& node : held_) {
      absl::StatusOr<std::unique_ptr<SocketStream>> stream = SocketStream::Create(
          std::move(node.fd), absl::StrCat("node ", node.node), shared_from_this(), node.nproc,
          std::move(node.seal_key), OnEnd(node.node));
      if (!stream.ok()) {
        on_stream(node.node - 1, stream.status());
      } else {
        on_stream(node.node - 1, std::unique_ptr<channel::HostStream>(*std::move(stream)));
      }
    }
    held_.clear();
  }

  enum class Taken { kWaiting, kLine, kClosed, kTooLong };

  // TakeLine reads what `connection` sent into its buffer and, once it holds a whole line, moves
  // it (without its '\n') into `line`. A joining node sends nothing after its request until it is
  // answered (the agent protocol follows), so whatever is read is the request. kWaiting while the
  // line is incomplete; kTooLong when more than a line may hold came without one, or anything came
  // after it.
  static Taken TakeLine(Pending& connection, std::string& line) {
    char buffer[kMaxLine];
    const ssize_t n = ::recv(connection.fd.get(), buffer, sizeof buffer, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return Taken::kWaiting;
    if (n <= 0) return Taken::kClosed;
    connection.received.append(buffer, static_cast<size_t>(n));
    const size_t newline = connection.received.find('\n');
    if (newline == std::string::npos) {
      return connection.received.size() >= kMaxLine ? Taken::kTooLong : Taken::kWaiting;
    }
    if (newline + 1 != connection.received.size()) return Taken::kTooLong;
    line = connection.received.substr(0, newline);
    return Taken::kLine;
  }

  // Answer checks one join request and answers it; true when node `request.node_rank` joined.
  // `listener`, given for the last node to join, is closed before its stream is handed on when
  // the join port is also the ranks' MASTER_PORT (--master-addr with --master-port), so that rank
  // 0 may listen there; a node started twice then finds no join port rather than a refusal.
  bool Answer(Pending connection, const std::string& line, std::vector<bool>& joined,
              rendezvous::Admission& admission, uint64_t id,
              const channel::StreamCallback& on_stream, posix::UniqueFd* listener) {
    absl::StatusOr<JoinRequest> request = DecodeJoinRequest(line);
    const bool proved =
        request.ok() && !spec_.token.empty() &&
        SameProof(request->proof, JoinProof(spec_.token, connection.challenge, *request));
    absl::Status verdict =
        request.ok() ? CheckJoin(spec_, connection.challenge, *request, joined) : request.status();
    const bool range = spec_.min_nnodes > 0 && spec_.min_nnodes < spec_.nnodes;
    bool late = false;
    if (verdict.ok() && started_) {
      std::lock_guard<std::mutex> lock(mu_);
      late = range && !late_closed_;
    }
    if (verdict.ok() && started_ && !late) {
      // A node that comes after the start, which this job does not take (it is ending, or it has
      // every node of --nnodes N).
      verdict = absl::FailedPreconditionError(absl::StrCat(
          range ? "the job is ending" : "the job has started", " and takes no new node (--nnodes ",
          NnodesText(spec_), "); start this node again with the next job"));
    }
    if (!verdict.ok()) {
      // A node that proved the token but differs is the user's mistake: said here as well as there,
      // as is a join request with another token (a node given the wrong one), for the first few
      // such; the rest, and anything that is no join request, are counted in the admission's line.
      const bool said = request.ok() && (proved || spec_.token.empty() ||
                                         unproved_refusals_said_++ < kUnprovedRefusalsSaid);
      if (said) {
        admission.Closed(id);
        Logger().warn("per-node join: refused {}: {}", connection.from,
                      std::string(verdict.message()));
      } else {
        admission.Closed(id, rendezvous::Admission::Reason::kRefused);
      }
      const std::string refusal = absl::StrCat("refused ", verdict.message(), "\n");
      ::send(connection.fd.get(), refusal.data(), refusal.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      return false;
    }
    admission.Proven(id);
    const int flags = ::fcntl(connection.fd.get(), F_GETFL);
    ::fcntl(connection.fd.get(), F_SETFL, flags & ~O_NONBLOCK);
    if (!SendAll(connection.fd.get(),
                 absl::StrCat("ok ", NodeZeroProof(spec_.token, connection.challenge, *request),
                              "\n"))) {
      return false;
    }
    const int node = request->node_rank;
    if (late) {
      // A node that joins the running job: the job's controller grows onto it.
      absl::StatusOr<std::unique_ptr<SocketStream>> stream = SocketStream::Create(
          std::move(connection.fd), absl::StrCat("node ", node), shared_from_this(), request->nproc,
          SealKey(spec_.token, connection.challenge, *request), OnEnd(node));
      if (!stream.ok()) return false;
      joined[node] = true;
      Logger().debug("per-node join: node {} joined the running job from {}", node,
                     connection.from);
      hostfile::HostSpec host;
      host.host = absl::StrCat("node", node);
      host.slots = request->nproc;
      HandOn(channel::LateHost{std::move(host),
                               std::unique_ptr<channel::HostStream>(*std::move(stream))});
      return true;
    }
    if (spec_.min_nnodes > 0 && spec_.min_nnodes < spec_.nnodes) {
      // A range: held until the start, so that a node that leaves before it is left out.
      joined[node] = true;
      Logger().debug("per-node join: node {} joined from {}", node, connection.from);
      if (listener != nullptr && spec_.master_port != 0 &&
          spec_.master_port == spec_.endpoint_port) {
        listener->Reset();
      }
      held_.push_back({node, std::move(connection.fd), request->nproc,
                       SealKey(spec_.token, connection.challenge, *request)});
      return true;
    }
    absl::StatusOr<std::unique_ptr<SocketStream>> stream = SocketStream::Create(
        std::move(connection.fd), absl::StrCat("node ", node), shared_from_this(), request->nproc,
        SealKey(spec_.token, connection.challenge, *request), OnEnd(node));
    if (!stream.ok()) {
      on_stream(node - 1, stream.status());
      return false;
    }
    joined[node] = true;
    Logger().debug("per-node join: node {} joined from {}", node, connection.from);
    if (listener != nullptr && spec_.master_port != 0 && spec_.master_port == spec_.endpoint_port) {
      listener->Reset();
    }
    on_stream(node - 1, std::unique_ptr<channel::HostStream>(*std::move(stream)));
    return true;
  }

  // HandOn gives a node that joined the running job to the job's controller (AcceptLate), or keeps
  // it until the controller asks (the job has just started); dropped once the job is ending.
  void HandOn(channel::LateHost node) {
    channel::LateHostCallback on_host;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!late_ && !late_closed_) {
        queued_.push_back(std::move(node));
        return;
      }
      on_host = late_;
    }
    if (on_host) on_host(std::move(node));
  }

  // OnEnd is what a node's stream calls when it ends: the port hears that the node left.
  std::function<void()> OnEnd(int node) {
    const uint64_t join = ++joins_[node];
    return [port = weak_from_this(), node, join] {
      if (std::shared_ptr<JoinPort> alive = port.lock()) alive->Left(node, join);
    };
  }

  // A node of a --nnodes MIN:MAX job that has joined before the start (the port's thread's).
  struct Held {
    int node = 0;
    posix::UniqueFd fd;
    int nproc = 0;
    std::string seal_key;
  };

  const PerNodeSpec spec_;
  const std::chrono::seconds start_timeout_;
  std::vector<Held> held_;
  std::atomic<bool> stop_{false};
  // Every node has joined, or (--nnodes MIN:MAX) the job started without the rest.
  std::atomic<bool> started_{false};
  int unproved_refusals_said_ = 0;  // the port's thread's
  std::mutex mu_;
  channel::LateHostCallback late_;  // under mu_
  // Under mu_: AcceptLate({}) was called (the job is ending); the nodes that joined before the
  // first AcceptLate.
  bool late_closed_ = false;
  std::vector<channel::LateHost> queued_;
  // Under mu_: (node, join number) of the streams that ended, for Serve to see.
  std::vector<std::pair<int, uint64_t>> left_;
  std::vector<uint64_t> joins_;  // the port's thread's: each node's latest join number
  std::thread thread_;
};

class NodeJoinChannel : public channel::HostChannel {
 public:
  NodeJoinChannel(PerNodeSpec spec, std::chrono::seconds start_timeout)
      : port_(std::make_shared<JoinPort>(std::move(spec), start_timeout)) {}

  // Until the job starts, the port ends with the channel; after, with the job's streams.
  ~NodeJoinChannel() override {
    if (!port_->started()) port_->Stop();
    port_->AcceptLate({});
  }

  void AcceptLateHosts(channel::LateHostCallback on_host) override {
    port_->AcceptLate(std::move(on_host));
  }

  std::string Describe(const hostfile::HostSpec& host, const std::string&) const override {
    const PerNodeSpec& spec = port_->spec();
    return absl::StrCat("joins by dialling this node at port ", spec.endpoint_port, " (", host.host,
                        "'s own trainrun --nnodes ", spec.nnodes, " --node-rank N --rdzv-endpoint ",
                        EndpointText(spec), ")");
  }

  void Start(const std::vector<hostfile::HostSpec>& hosts, const std::string&, absl::Time deadline,
             channel::StreamCallback on_stream) override {
    port_->Start(hosts.size(), deadline, std::move(on_stream));
  }

 private:
  std::shared_ptr<JoinPort> port_;
};

// Connect dials host:port once; "" and errno text on failure.
absl::StatusOr<posix::UniqueFd> Connect(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int error = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
      error != 0) {
    return absl::NotFoundError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(error)));
  }
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    posix::UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd) continue;
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0) {
      ::freeaddrinfo(found);
      int one = 1;
      ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    why = std::strerror(errno);
  }
  ::freeaddrinfo(found);
  return absl::UnavailableError(why);
}

}  // namespace

std::string NnodesText(const PerNodeSpec& spec) {
  return spec.min_nnodes > 0 && spec.min_nnodes != spec.nnodes
             ? absl::StrCat(spec.min_nnodes, ":", spec.nnodes)
             : absl::StrCat(spec.nnodes);
}

std::string EndpointText(const PerNodeSpec& spec) {
  return spec.endpoint_host.find(':') != std::string::npos
             ? absl::StrCat("[", spec.endpoint_host, "]:", spec.endpoint_port)
             : absl::StrCat(spec.endpoint_host, ":", spec.endpoint_port);
}

std::string JoinProof(const std::string& token, const std::string& challenge,
                      const JoinRequest& request) {
  return Hmac(token, absl::StrCat("join|", challenge, "|", request.rdzv_id, "|", request.node_rank,
                                  "|", request.nproc, "|", request.nonce));
}

std::string NodeZeroProof(const std::string& token, const std::string& challenge,
                          const JoinRequest& request) {
  return Hmac(token, absl::StrCat("node0|", request.nonce, "|", challenge));
}

std::string EncodeJoinRequest(const JoinRequest& request) {
  return absl::StrCat(kJoinWord, " ", kJoinVersion, " ", request.rdzv_id, " ", request.node_rank,
                      " ", request.nproc, " ", request.nonce, " ", request.proof, "\n");
}

absl::StatusOr<JoinRequest> DecodeJoinRequest(absl::string_view line) {
  std::vector<std::string> words = absl::StrSplit(line, ' ');
  JoinRequest request;
  int version = 0;
  if (words.size() != 7 || words[0] != kJoinWord || !absl::SimpleAtoi(words[1], &version)) {
    return absl::InvalidArgumentError("it is not a trainrun node (no join request)");
  }
  if (version != kJoinVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("it speaks node-join version ", version, ", this trainrun ", kJoinVersion,
                     "; run the same trainrun release on every node"));
  }
  if (!absl::SimpleAtoi(words[3], &request.node_rank) ||
      !absl::SimpleAtoi(words[4], &request.nproc)) {
    return absl::InvalidArgumentError("its join request is garbled");
  }
  request.rdzv_id = words[2];
  request.nonce = words[5];
  request.proof = words[6];
  return request;
}

absl::Status CheckJoin(const PerNodeSpec& spec, const std::string& challenge,
                       const JoinRequest& request, const std::vector<bool>& joined) {
  if (spec.token.empty() && request.proof != "-") {
    return absl::PermissionDeniedError(
        "it gives an --rdzv-token but node 0 has none; give every node the same token");
  }
  if (!spec.token.empty() && request.proof == "-") {
    return absl::PermissionDeniedError(
        "it gives no --rdzv-token but node 0 has one; give every node the same --rdzv-token (or "
        "TRAINRUN_RDZV_TOKEN)");
  }
  if (!SameProof(request.proof, JoinProof(spec.token, challenge, request))) {
    return absl::PermissionDeniedError(
        "its --rdzv-token does not match node 0's; give every node the same --rdzv-token "
        "(or TRAINRUN_RDZV_TOKEN)");
  }
  if (request.rdzv_id != spec.rdzv_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "its --rdzv-id '", request.rdzv_id, "' differs from node 0's '", spec.rdzv_id, "'"));
  }
  if (request.node_rank < 1 || request.node_rank >= spec.nnodes) {
    return absl::FailedPreconditionError(absl::StrCat("its --node-rank ", request.node_rank,
                                                      " is not one of 1 to ", spec.nnodes - 1,
                                                      " (node 0 has --nnodes ", spec.nnodes, ")"));
  }
  if (joined[request.node_rank]) {
    return absl::AlreadyExistsError(absl::StrCat("node ", request.node_rank,
                                                 " of this job has already joined; give each "
                                                 "node its own --node-rank"));
  }
  if (request.nproc < 1 || request.nproc > hostfile::kMaxSlotsPerHost) {
    return absl::FailedPreconditionError(absl::StrCat(
        "its --nproc-per-node ", request.nproc, " is not from 1 to ", hostfile::kMaxSlotsPerHost));
  }
  return absl::OkStatus();
}

std::unique_ptr<channel::HostChannel> MakeNodeJoinChannel(const PerNodeSpec& spec,
                                                          std::chrono::seconds start_timeout) {
  return std::make_unique<NodeJoinChannel>(spec, start_timeout);
}

absl::StatusOr<posix::UniqueFd> DialNodeZero(const PerNodeSpec& spec, absl::Time deadline,
                                             std::chrono::seconds start_timeout,
                                             std::string* seal_key, bool rejoin) {
  const std::string endpoint = EndpointText(spec);
  std::string why;
  // Node 0 may start after this node: dial again until the deadline.
  for (absl::Duration pause = absl::Milliseconds(50);;
       pause = std::min(pause * 2, absl::Seconds(1))) {
    absl::StatusOr<posix::UniqueFd> fd = Connect(spec.endpoint_host, spec.endpoint_port);
    if (fd.ok()) {
      JoinRequest request{spec.rdzv_id, spec.node_rank, spec.nproc_per_node, Nonce(), ""};
      absl::StatusOr<std::string> answer = ReadLine(fd->get(), deadline);
      const std::string challenge_prefix = absl::StrCat(kChallengeWord, " ", kJoinVersion, " ");
      if (answer.ok() && absl::StartsWith(*answer, challenge_prefix)) {
        const std::string challenge = answer->substr(challenge_prefix.size());
        request.proof = JoinProof(spec.token, challenge, request);
        if (!SendAll(fd->get(), EncodeJoinRequest(request))) {
          answer = absl::UnavailableError("the connection was closed");
        } else {
          answer = ReadLine(fd->get(), deadline);
        }
        if (answer.ok() && absl::StartsWith(*answer, "ok ")) {
          if (SameProof(answer->substr(3), NodeZeroProof(spec.token, challenge, request))) {
            if (seal_key != nullptr) *seal_key = SealKey(spec.token, challenge, request);
            return fd;
          }
          return absl::PermissionDeniedError(absl::StrCat(
              "the trainrun at ", endpoint,
              " could not prove it knows this node's --rdzv-token: it is not this job's node 0 "
              "(or its token differs); nothing was run"));
        }
      } else if (answer.ok()) {
        answer =
            absl::StrCat("it is not a trainrun node 0 (it said '", answer->substr(0, 60), "')");
      }
      if (answer.ok() && absl::StartsWith(*answer, "refused ") && !rejoin) {
        return absl::PermissionDeniedError(absl::StrCat("node 0 at ", endpoint,
                                                        " refused this node (--node-rank ",
                                                        spec.node_rank, "): ", answer->substr(8)));
      }
      why = answer.ok() ? *answer : std::string(answer.status().message());
    } else {
      why = std::string(fd.status().message());
    }
    if (absl::Now() + pause >= deadline) break;
    absl::SleepFor(pause);
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "node 0 did not answer at ", endpoint, " within --start-timeout ", start_timeout.count(),
      " s (", why, "); start it with --node-rank 0, or check --rdzv-endpoint"));
}

}  // namespace trainrun::launcher::nodes
