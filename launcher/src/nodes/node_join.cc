#include "nodes/node_join.h"

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
#include <thread>
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

namespace trainrun::launcher::nodes {
namespace {

constexpr char kJoinWord[] = "trainrun-node-join";
constexpr char kChallengeWord[] = "trainrun-node-challenge";
constexpr size_t kNonceBytes = 32;
constexpr int kJoinVersion = 1;
// A connection that has not sent its whole request line by then is dropped (a stranger, a port
// scanner); the line is short.
constexpr absl::Duration kRequestTimeout = absl::Seconds(2);
constexpr size_t kMaxLine = 4096;

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

// Listen binds the endpoint's port on every interface (IPv6 with IPv4 mapped, else IPv4).
absl::StatusOr<posix::UniqueFd> Listen(int port) {
  for (int family : {AF_INET6, AF_INET}) {
    posix::UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) continue;
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage address{};
    socklen_t length = 0;
    if (family == AF_INET6) {
      int zero = 0;
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      auto* a = reinterpret_cast<sockaddr_in6*>(&address);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      a->sin6_port = htons(static_cast<uint16_t>(port));
      length = sizeof(sockaddr_in6);
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&address);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      a->sin_port = htons(static_cast<uint16_t>(port));
      length = sizeof(sockaddr_in);
    }
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), length) != 0) {
      if (errno == EAFNOSUPPORT || errno == EADDRNOTAVAIL) continue;
      return absl::UnavailableError(absl::StrCat(
          "cannot listen at port ", port, " for the other nodes: ", std::strerror(errno),
          " (--rdzv-endpoint's port must be free on node 0)"));
    }
    if (::listen(fd.get(), 128) != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen at port ", port, ": ", std::strerror(errno)));
    }
    return fd;
  }
  return absl::UnavailableError(absl::StrCat("cannot listen at port ", port));
}

class NodeJoinChannel : public channel::HostChannel {
 public:
  NodeJoinChannel(PerNodeSpec spec, std::chrono::seconds start_timeout)
      : spec_(std::move(spec)), start_timeout_(start_timeout) {}

  ~NodeJoinChannel() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  std::string Describe(const hostfile::HostSpec& host, const std::string&) const override {
    return absl::StrCat("joins by dialling this node at port ", spec_.endpoint_port, " (",
                        host.host, "'s own trainrun --nnodes ", spec_.nnodes,
                        " --node-rank N --rdzv-endpoint ", EndpointText(spec_), ")");
  }

  void Start(const std::vector<hostfile::HostSpec>& hosts, const std::string&, absl::Time deadline,
             channel::StreamCallback on_stream) override {
    thread_ = std::thread([this, count = hosts.size(), deadline, on_stream = std::move(on_stream)] {
      Serve(count, deadline, on_stream);
    });
  }

 private:
  void Serve(size_t count, absl::Time deadline, const channel::StreamCallback& on_stream) {
    absl::StatusOr<posix::UniqueFd> listener = Listen(spec_.endpoint_port);
    if (!listener.ok()) {
      for (size_t i = 0; i < count; ++i) on_stream(static_cast<int>(i), listener.status());
      return;
    }
    std::vector<bool> joined(spec_.nnodes, false);
    joined[0] = true;
    size_t arrived = 0;
    while (arrived < count && !stop_ && absl::Now() < deadline) {
      pollfd p{listener->get(), POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      posix::UniqueFd fd(::accept4(listener->get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!fd) continue;
      int one = 1;
      ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      const std::string from = NumericAddress(fd.get(), true);
      const std::string challenge = Nonce();
      if (challenge.empty() || !SendAll(fd.get(), absl::StrCat(kChallengeWord, " ", kJoinVersion,
                                                               " ", challenge, "\n"))) {
        continue;
      }
      absl::StatusOr<std::string> line = ReadLine(fd.get(), absl::Now() + kRequestTimeout);
      if (!line.ok()) {
        Logger().warn("per-node join: dropped a connection from {} that sent no join request ({})",
                      from, std::string(line.status().message()));
        continue;
      }
      absl::StatusOr<JoinRequest> request = DecodeJoinRequest(*line);
      absl::Status verdict =
          request.ok() ? CheckJoin(spec_, challenge, *request, joined) : request.status();
      if (!verdict.ok()) {
        Logger().warn("per-node join: refused {}: {}", from, std::string(verdict.message()));
        SendAll(fd.get(), absl::StrCat("refused ", verdict.message(), "\n"));
        continue;
      }
      if (!SendAll(fd.get(),
                   absl::StrCat("ok ", NodeZeroProof(spec_.token, challenge, *request), "\n"))) {
        continue;
      }
      const int node = request->node_rank;
      absl::StatusOr<std::unique_ptr<SocketStream>> stream =
          SocketStream::Create(std::move(fd), absl::StrCat("node ", node));
      if (!stream.ok()) {
        on_stream(node - 1, stream.status());
        continue;
      }
      joined[node] = true;
      ++arrived;
      Logger().debug("per-node join: node {} joined from {}", node, from);
      on_stream(node - 1, std::unique_ptr<channel::HostStream>(*std::move(stream)));
    }
    listener->Reset();  // the job's rendezvous server binds this port next
    if (arrived == count || stop_) return;
    std::vector<std::string> missing;
    for (int node = 1; node < spec_.nnodes; ++node) {
      if (!joined[node]) missing.push_back(absl::StrCat(node));
    }
    const absl::Status never = absl::DeadlineExceededError(absl::StrCat(
        missing.size() == 1 ? "node " : "nodes ", absl::StrJoin(missing, ", "), " of --nnodes ",
        spec_.nnodes, " never joined at port ", spec_.endpoint_port, " within --start-timeout ",
        start_timeout_.count(), " s; start trainrun there with --node-rank ", missing.front(),
        " and --rdzv-endpoint ", EndpointText(spec_), ", or raise --start-timeout"));
    for (int node = 1; node < spec_.nnodes; ++node) {
      if (!joined[node]) on_stream(node - 1, never);
    }
  }

  const PerNodeSpec spec_;
  const std::chrono::seconds start_timeout_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
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
                                                 " has joined already; give each node its own "
                                                 "--node-rank"));
  }
  if (request.nproc != spec.nproc_per_node) {
    return absl::FailedPreconditionError(
        absl::StrCat("its --nproc-per-node ", request.nproc, " differs from node 0's ",
                     spec.nproc_per_node, "; every node runs the same count of ranks"));
  }
  return absl::OkStatus();
}

std::unique_ptr<channel::HostChannel> MakeNodeJoinChannel(const PerNodeSpec& spec,
                                                          std::chrono::seconds start_timeout) {
  return std::make_unique<NodeJoinChannel>(spec, start_timeout);
}

absl::StatusOr<posix::UniqueFd> DialNodeZero(const PerNodeSpec& spec, absl::Time deadline,
                                             std::chrono::seconds start_timeout) {
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
      if (answer.ok() && absl::StartsWith(*answer, "refused ")) {
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
