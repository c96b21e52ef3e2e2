// The SSH clients (libssh2 and the system `ssh`) against a real sshd: streaming, host keys,
// authentication and each failure's own message.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>

#include "ssh/remote_channel.h"
#include "ssh/ssh_config.h"
#include "sshd_fixture.h"
#include "trainrun/launcher/shell_quote.h"

namespace trainrun::launcher::ssh {
namespace {

using testing::ReadFileText;
using testing::SshWorld;

struct Result {
  absl::Status open;   // OpenRemoteCommand
  std::string output;  // the command's stdout
  absl::Status end;    // EndStatus
  double seconds = 0;  // open to end
};

// Runs `command` on `host`, feeds it `input`, and reads its stdout to the end.
Result RunRemote(const std::string& host, const std::string& command, const SshOptions& options,
                 const std::string& input = "") {
  Result result;
  auto start = std::chrono::steady_clock::now();
  auto target = ResolveSshTarget("", host, options);
  REQUIRE(target.ok());
  auto channel = OpenRemoteCommand(*target, command, options);
  result.open = channel.status();
  if (channel.ok()) {
    if (!input.empty()) REQUIRE((*channel)->Write(input, absl::Seconds(5)).ok());
    (*channel)->CloseStdin();
    char buffer[4096];
    for (;;) {
      auto n = (*channel)->Read(buffer, sizeof buffer, absl::Seconds(15));
      if (!n.ok() || *n == 0) break;
      result.output.append(buffer, *n);
    }
    result.end = (*channel)->EndStatus();
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

TEST_CASE("libssh2: runs a command and streams stdin to stdout", "[ssh]") {
  SshWorld world;
  SshOptions options = world.ClientOptions();
  options.identity_file = world.user_ed25519();
  options.port = world.sshd().port();
  Result r = RunRemote("127.0.0.1", "echo hello; cat; echo bye", options, "ping\n");
  INFO(r.open.message());
  REQUIRE(r.open.ok());
  CHECK(r.output == "hello\nping\nbye\n");
  CHECK(r.end.ok());
  // accept-new recorded the host key, under OpenSSH's "[host]:port" name.
  CHECK(ReadFileText(world.ssh_dir() + "/known_hosts")
            .find("[127.0.0.1]:" + std::to_string(world.sshd().port())) != std::string::npos);
  // A second connection matches the recorded key.
  r = RunRemote("127.0.0.1", "echo again", options);
  REQUIRE(r.open.ok());
  CHECK(r.output == "again\n");
}

TEST_CASE("libssh2: a large stream passes both ways intact", "[ssh]") {
  SshWorld world;
  SshOptions options = world.ClientOptions();
  options.identity_file = world.user_ed25519();
  options.port = world.sshd().port();
  std::string input;
  for (int i = 0; i < 200000; ++i) input += static_cast<char>('a' + i % 26);
  input += "\n";
  Result r = RunRemote("127.0.0.1", "cat", options, input);
  REQUIRE(r.open.ok());
  CHECK(r.output == input);
}

TEST_CASE("libssh2: exit status and stderr reach EndStatus", "[ssh]") {
  SshWorld world;
  SshOptions options = world.ClientOptions();
  options.identity_file = world.user_ed25519();
  options.port = world.sshd().port();
  Result r = RunRemote("127.0.0.1", "echo broken >&2; exit 3", options);
  REQUIRE(r.open.ok());
  CHECK(r.end.message().find("exited with status 3") != std::string::npos);
  CHECK(r.end.message().find("broken") != std::string::npos);
}

TEST_CASE("libssh2: default keys and ~/.ssh/config (Host pattern, HostName, User, Port)", "[ssh]") {
  SshWorld world;
  SshOptions options = world.ClientOptions();
  // No -i: the default id_ed25519 in the SSH directory is found.
  WriteText(world.ssh_dir() + "/id_ed25519", ReadFileText(world.user_ed25519()));
  WriteText(world.ssh_dir() + "/id_ed25519.pub", ReadFileText(world.user_ed25519() + ".pub"));
  chmod((world.ssh_dir() + "/id_ed25519").c_str(), 0600);
  WriteText(world.ssh_dir() + "/config",
            "Host node*\n"
            "  HostName 127.0.0.1\n"
            "  User root\n"
            "  Port " +
                std::to_string(world.sshd().port()) + "\n");
  Result r = RunRemote("node7", "echo $USER", options);
  INFO(r.open.message());
  REQUIRE(r.open.ok());
  CHECK(r.output == "root\n");
}

TEST_CASE("libssh2: a changed host key is refused, saying so", "[ssh]") {
  SshWorld world;
  SshOptions options = world.ClientOptions();
  options.identity_file = world.user_ed25519();
  options.port = world.sshd().port();
  // Record a different ed25519 key for this host and port.
  std::string other = world.dir() + "/other_host_key";
  testing::MakeKey("ed25519", other);
  std::string pub = ReadFileText(other + ".pub");
  WriteText(world.ssh_dir() + "/known_hosts",
            "[127.0.0.1]:" + std::to_string(world.sshd().port()) + " " + pub);
  Result r = RunRemote("127.0.0.1", "echo no", options);
  REQUIRE_FALSE(r.open.ok());
  CHECK(r.open.message().find("host 127.0.0.1") != std::string::npos);
  CHECK(r.open.message().find("host key mismatch") != std::string::npos);
  CHECK(r.open.message().find("ssh-keygen -R") != std::string::npos);
  CHECK(r.output.empty());
}

TEST_CASE("libssh2: StrictHostKeyChecking yes refuses an unknown host", "[ssh]") {
  SshWorld world;
  SshOptions options = world.ClientOptions();
  options.identity_file = world.user_ed25519();
  options.port = world.sshd().port();
  options.host_key_policy = HostKeyPolicy::kYes;
  Result r = RunRemote("127.0.0.1", "echo no", options);
  REQUIRE_FALSE(r.open.ok());
  CHECK(r.open.message().find("host key unknown") != std::string::npos);
  CHECK(ReadFileText(world.ssh_dir() + "/known_hosts").empty());
}

TEST_CASE("libssh2: a key the host does not accept fails authentication", "[ssh]") {
  SshWorld world;
  SshOptions options = world.ClientOptions();
  options.identity_file = world.stranger();
  options.port = world.sshd().port();
  Result r = RunRemote("127.0.0.1", "echo no", options);
  REQUIRE_FALSE(r.open.ok());
  CHECK(r.open.message().find("host 127.0.0.1: authentication failed for user root") !=
        std::string::npos);
  CHECK(r.open.message().find("stranger_ed25519") != std::string::npos);
}

TEST_CASE("libssh2: an RSA-only user gets the SHA-1 explanation, and the openssh client works",
          "[ssh]") {
  SshWorld world;
  SshOptions options = world.ClientOptions();
  options.identity_file = world.user_rsa();
  options.port = world.sshd().port();
  Result r = RunRemote("127.0.0.1", "echo no", options);
  REQUIRE_FALSE(r.open.ok());
  INFO(r.open.message());
  CHECK(r.open.message().find("the only keys offered are RSA") != std::string::npos);
  CHECK(r.open.message().find("\"ssh-rsa\" (SHA-1)") != std::string::npos);
  CHECK(r.open.message().find("--ssh-client openssh") != std::string::npos);
  CHECK(world.sshd().Log().find("ssh-rsa not in PubkeyAcceptedAlgorithms") != std::string::npos);

  options.client = SshClient::kOpenssh;
  r = RunRemote("127.0.0.1", "echo rsa works", options);
  INFO(r.end.message());
  REQUIRE(r.open.ok());
  CHECK(r.output == "rsa works\n");
  CHECK(r.end.ok());
}

TEST_CASE("libssh2: a refused port says connection refused", "[ssh]") {
  SshWorld world;
  SshOptions options = world.ClientOptions();
  options.identity_file = world.user_ed25519();
  options.port = testing::FreeLoopbackPort();
  Result r = RunRemote("127.0.0.1", "true", options);
  REQUIRE_FALSE(r.open.ok());
  CHECK(r.open.message().find("host 127.0.0.1") != std::string::npos);
  CHECK(r.open.message().find("connection refused") != std::string::npos);
  CHECK(r.seconds < 2);
}

TEST_CASE("libssh2: a server that never answers times out within the connect timeout", "[ssh]") {
  SshWorld world;
  // A listening socket that nobody accepts on: TCP connects (the kernel's backlog), SSH never
  // starts.
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(listen(fd, 4) == 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  SshOptions options = world.ClientOptions();
  options.identity_file = world.user_ed25519();
  options.port = ntohs(addr.sin_port);
  options.connect_timeout = absl::Seconds(1);
  Result r = RunRemote("127.0.0.1", "true", options);
  close(fd);
  REQUIRE_FALSE(r.open.ok());
  CHECK(r.open.message().find("timed out") != std::string::npos);
  CHECK(r.seconds < 3);
}

TEST_CASE("openssh: streams, and maps its failures to the same reasons", "[ssh]") {
  SshWorld world;
  SshOptions options = world.ClientOptions();
  options.client = SshClient::kOpenssh;
  options.identity_file = world.user_ed25519();
  options.port = world.sshd().port();
  Result r = RunRemote("127.0.0.1", "echo hello; cat", options, "ping\n");
  INFO(r.end.message());
  REQUIRE(r.open.ok());
  CHECK(r.output == "hello\nping\n");
  CHECK(r.end.ok());

  r = RunRemote("127.0.0.1", "exit 4", options);
  CHECK(r.end.message().find("exited with status 4") != std::string::npos);

  options.identity_file = world.stranger();
  r = RunRemote("127.0.0.1", "true", options);
  CHECK(r.end.message().find("authentication failed for user root") != std::string::npos);

  options.identity_file = world.user_ed25519();
  options.port = testing::FreeLoopbackPort();
  r = RunRemote("127.0.0.1", "true", options);
  CHECK(r.end.message().find("connection refused") != std::string::npos);
}

TEST_CASE("ShellQuote", "[ssh]") {
  CHECK(ShellQuote("/usr/bin/trainrun") == "/usr/bin/trainrun");
  CHECK(ShellQuote("a b") == "'a b'");
  CHECK(ShellQuote("it's") == "'it'\\''s'");
  CHECK(ShellQuote("") == "''");
}

}  // namespace
}  // namespace trainrun::launcher::ssh
