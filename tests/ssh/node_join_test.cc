// Per-node mode's join handshake (launcher/src/nodes/node_join.h): node 0's checks, and a joining
// node's side against a fake node 0 on loopback.
#include "nodes/node_join.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace trainrun::launcher::nodes {
namespace {

PerNodeSpec NodeZero(const std::string& token) {
  PerNodeSpec spec;
  spec.nnodes = 3;
  spec.node_rank = 0;
  spec.nproc_per_node = 2;
  spec.endpoint_host = "127.0.0.1";
  spec.token = token;
  return spec;
}

JoinRequest Request(const std::string& token, const std::string& challenge, int node = 1,
                    int nproc = 2, const std::string& id = "none") {
  JoinRequest request{id, node, nproc, "abcd", ""};
  request.proof = JoinProof(token, challenge, request);
  return request;
}

std::string Verdict(const PerNodeSpec& spec, const JoinRequest& request,
                    std::vector<bool> joined = {true, false, false}) {
  absl::Status status = CheckJoin(spec, "c0", request, joined);
  return status.ok() ? "ok" : std::string(status.message());
}

TEST_CASE("node join: node 0 accepts the right proof and names what differs", "[nodes]") {
  const PerNodeSpec spec = NodeZero("secret");
  CHECK(Verdict(spec, Request("secret", "c0")) == "ok");
  // The request survives its encoding.
  std::string line = EncodeJoinRequest(Request("secret", "c0", 2));
  line.pop_back();
  auto decoded = DecodeJoinRequest(line);
  REQUIRE(decoded.ok());
  CHECK(Verdict(spec, *decoded) == "ok");

  CHECK_THAT(Verdict(spec, Request("other", "c0")),
             Catch::Contains("its --rdzv-token does not match node 0's"));
  // A proof made for another challenge (a replay) is refused too.
  CHECK_THAT(Verdict(spec, Request("secret", "old")),
             Catch::Contains("its --rdzv-token does not match node 0's"));
  CHECK_THAT(Verdict(spec, Request("", "c0")),
             Catch::Contains("it gives no --rdzv-token but node 0 has one"));
  CHECK_THAT(Verdict(NodeZero(""), Request("secret", "c0")),
             Catch::Contains("it gives an --rdzv-token but node 0 has none"));
  CHECK(Verdict(NodeZero(""), Request("", "c0")) == "ok");
  CHECK_THAT(Verdict(spec, Request("secret", "c0", 1, 2, "job7")),
             Catch::Contains("its --rdzv-id 'job7' differs from node 0's 'none'"));
  CHECK_THAT(Verdict(spec, Request("secret", "c0", 3)),
             Catch::Contains("its --node-rank 3 is not one of 1 to 2"));
  CHECK_THAT(Verdict(spec, Request("secret", "c0", 1), {true, true, false}),
             Catch::Contains("node 1 of this job has already joined"));
  // Nodes may run different counts of ranks (node 0 plans the job once all have joined).
  CHECK(Verdict(spec, Request("secret", "c0", 1, 4)) == "ok");
  CHECK_THAT(Verdict(spec, Request("secret", "c0", 1, 0)),
             Catch::Contains("its --nproc-per-node 0 is not from 1 to"));
  CHECK_FALSE(DecodeJoinRequest("GET / HTTP/1.1").ok());
}

// A one-connection fake node 0 on a loopback port: sends a challenge, reads the request, and
// answers `answer`.
class FakeNodeZero {
 public:
  explicit FakeNodeZero(std::string answer) : answer_(std::move(answer)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    socklen_t length = sizeof address;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    REQUIRE(::listen(fd_, 4) == 0);
    thread_ = std::thread([this] {
      int client = ::accept(fd_, nullptr, nullptr);
      if (client < 0) return;
      const std::string challenge = "trainrun-node-challenge 1 c0\n";
      [[maybe_unused]] ssize_t n = ::write(client, challenge.data(), challenge.size());
      char c = 0;
      while (::read(client, &c, 1) == 1 && c != '\n') request_ += c;
      n = ::write(client, answer_.data(), answer_.size());
      ::close(client);
    });
  }
  ~FakeNodeZero() {
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }
  const std::string& request() const { return request_; }

 private:
  std::string answer_;
  int fd_ = -1;
  int port_ = 0;
  std::string request_;
  std::thread thread_;
};

TEST_CASE("node join: the job's token crosses sealed with the join's key, and unseals", "[nodes]") {
  const std::string token(64, 'a');
  const JoinRequest request = Request("secret", "c0");
  const std::string key = SealKey("secret", "c0", request);
  REQUIRE(!key.empty());
  const std::string sealed = Seal(key, token);
  CHECK(sealed.size() == 64);
  CHECK(sealed != token);
  CHECK(Seal(key, sealed) == token);
  // Another join (node 0's challenge is fresh each time) seals it otherwise.
  CHECK(Seal(SealKey("secret", "c1", request), token) != sealed);
  // Without a secret there is nothing to seal with; what is no token passes as it is.
  CHECK(SealKey("", "c0", request).empty());
  CHECK(Seal("", token) == token);
  CHECK(Seal(key, "not-a-token") == "not-a-token");
}

TEST_CASE("node join: a joining node refuses a node 0 that cannot prove the token", "[nodes]") {
  FakeNodeZero fake("ok -\n");
  PerNodeSpec spec = NodeZero("secret");
  spec.node_rank = 1;
  spec.endpoint_port = fake.port();
  auto fd = DialNodeZero(spec, absl::Now() + absl::Seconds(5), std::chrono::seconds(5));
  REQUIRE_FALSE(fd.ok());
  CHECK(fd.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(fd.status().message()),
             Catch::Contains("could not prove it knows this node's --rdzv-token: it is not this "
                             "job's node 0"));
}

TEST_CASE("node join: node 0's refusal reaches the joining node as one sentence", "[nodes]") {
  FakeNodeZero fake("refused its --rdzv-token does not match node 0's\n");
  PerNodeSpec spec = NodeZero("secret");
  spec.node_rank = 2;
  spec.endpoint_port = fake.port();
  auto fd = DialNodeZero(spec, absl::Now() + absl::Seconds(5), std::chrono::seconds(5));
  REQUIRE_FALSE(fd.ok());
  CHECK(std::string(fd.status().message()) ==
        absl::StrCat("node 0 at 127.0.0.1:", fake.port(),
                     " refused this node (--node-rank 2): its --rdzv-token does not match node "
                     "0's"));
  // The secret never crossed the wire.
  CHECK(fake.request().find("secret") == std::string::npos);
}

TEST_CASE("node join: a node 0 that never answers is named at the start timeout", "[nodes]") {
  PerNodeSpec spec = NodeZero("");
  spec.node_rank = 1;
  {
    // A port nobody listens on: bind, read it back, close.
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
    socklen_t length = sizeof address;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
    spec.endpoint_port = ntohs(address.sin_port);
    ::close(fd);
  }
  const absl::Time start = absl::Now();
  auto fd = DialNodeZero(spec, absl::Now() + absl::Seconds(1), std::chrono::seconds(1));
  REQUIRE_FALSE(fd.ok());
  CHECK(absl::Now() - start < absl::Seconds(3));
  CHECK_THAT(std::string(fd.status().message()),
             Catch::Contains(absl::StrCat("node 0 did not answer at 127.0.0.1:", spec.endpoint_port,
                                          " within --start-timeout 1 s (Connection refused)")));
}

}  // namespace
}  // namespace trainrun::launcher::nodes
