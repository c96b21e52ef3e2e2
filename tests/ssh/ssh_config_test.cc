// ~/.ssh/config resolution: OpenSSH's precedence and pattern rules, through the text entry point.
#include "ssh/ssh_config.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace trainrun::launcher::ssh {
namespace {

absl::StatusOr<SshTarget> Resolve(const std::string& config, const std::string& user,
                                  const std::string& alias, SshOptions options = {}) {
  options.ssh_dir = "/home/u/.ssh";
  return ResolveSshTargetFromText(config, "cfg", user, alias, options, "/home/u");
}

TEST_CASE("ssh config: first value wins, patterns and negation", "[ssh]") {
  const std::string config =
      "# cluster\n"
      "Host gpu* !gpu9\n"
      "    HostName %h.cluster.example\n"
      "    User alice\n"
      "    Port 2222\n"
      "    IdentityFile ~/.ssh/cluster_key\n"
      "Host *\n"
      "    User nobody\n"
      "    Port=22\n"
      "    IdentityFile %d/.ssh/fallback\n";
  auto t = Resolve(config, "", "gpu1");
  REQUIRE(t.ok());
  CHECK(t->hostname == "gpu1.cluster.example");
  CHECK(t->user == "alice");
  CHECK(t->port == 2222);
  CHECK(t->identity_files ==
        std::vector<std::string>{"/home/u/.ssh/cluster_key", "/home/u/.ssh/fallback"});
  CHECK_FALSE(t->default_identities);

  auto negated = Resolve(config, "", "gpu9");
  REQUIRE(negated.ok());
  CHECK(negated->hostname == "gpu9");
  CHECK(negated->user == "nobody");
  CHECK(negated->port == 22);
}

TEST_CASE("ssh config: user@host and flags win over the config", "[ssh]") {
  SshOptions options;
  options.port = 2200;
  options.identity_file = "/keys/id";
  auto t = Resolve("Host a\n User alice\n Port 1\n IdentityFile /keys/cfg\n", "bob", "a", options);
  REQUIRE(t.ok());
  CHECK(t->user == "bob");
  CHECK(t->port == 2200);
  CHECK(t->identity_files == std::vector<std::string>{"/keys/id", "/keys/cfg"});
}

TEST_CASE("ssh config: defaults when nothing is configured", "[ssh]") {
  auto t = Resolve("", "", "10.0.0.5");
  REQUIRE(t.ok());
  CHECK(t->hostname == "10.0.0.5");
  CHECK(t->port == 22);
  CHECK(t->user == LocalUserName());
  CHECK(t->default_identities);
  CHECK(t->identity_files == std::vector<std::string>{"/home/u/.ssh/id_ed25519",
                                                      "/home/u/.ssh/id_ecdsa",
                                                      "/home/u/.ssh/id_rsa"});
  CHECK(t->known_hosts_file == "/home/u/.ssh/known_hosts");
}

TEST_CASE("ssh config: Match blocks are skipped, unknown keywords ignored", "[ssh]") {
  auto t =
      Resolve("ForwardAgent yes\nMatch host x\n User matched\nHost x\n User hosted\n", "", "x");
  REQUIRE(t.ok());
  CHECK(t->user == "hosted");
}

TEST_CASE("ssh config: a bad Port names file and line", "[ssh]") {
  auto t = Resolve("Host a\n  Port twenty\n", "", "a");
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().message().find("cfg:2: Port 'twenty' is not a port number") !=
        std::string::npos);
}

TEST_CASE("ssh config: Include reads matching files, passes over directories, refuses devices",
          "[ssh]") {
  char dir_template[] = "/tmp/trainrun-sshcfg-XXXXXX";
  REQUIRE(mkdtemp(dir_template) != nullptr);
  const std::filesystem::path home = dir_template;
  std::filesystem::create_directories(home / ".ssh/config.d/subdir");
  std::ofstream(home / ".ssh/config.d/10-cluster") << "Host gpu*\n  User alice\n  Port 2200\n";
  std::ofstream(home / ".ssh/loop") << "Include loop\n";
  SshOptions options;
  options.ssh_dir = (home / ".ssh").string();
  auto resolve = [&](const std::string& config) {
    return ResolveSshTargetFromText(config, "cfg", "", "gpu1", options, home.string());
  };

  auto included = resolve("Include config.d/*\nHost *\n  User nobody\n");
  REQUIRE(included.ok());
  CHECK(included->user == "alice");
  CHECK(included->port == 2200);

  auto device = resolve("Host *\n  Include /dev/null /dev/zero\n");
  REQUIRE_FALSE(device.ok());
  CHECK(device.status().message().find(
            "cfg:2: Include matched /dev/null, which is not a regular file") != std::string::npos);

  auto loop = resolve("Include loop\n");
  REQUIRE_FALSE(loop.ok());
  CHECK(loop.status().message().find("Include nests too deeply") != std::string::npos);

  std::filesystem::remove_all(home);
}

TEST_CASE("ssh config: host patterns", "[ssh]") {
  CHECK(MatchHostPattern("*", "anything"));
  CHECK(MatchHostPattern("node?", "node1"));
  CHECK_FALSE(MatchHostPattern("node?", "node12"));
  CHECK(MatchHostPattern("*.example.com", "a.b.EXAMPLE.com"));
  CHECK_FALSE(MatchHostPattern("*.example.com", "example.com"));
}

TEST_CASE("flag values: host key policy and ssh client", "[ssh]") {
  CHECK(*ParseHostKeyPolicy("accept-new") == HostKeyPolicy::kAcceptNew);
  CHECK(*ParseHostKeyPolicy("yes") == HostKeyPolicy::kYes);
  CHECK(*ParseHostKeyPolicy("no") == HostKeyPolicy::kNo);
  CHECK_FALSE(ParseHostKeyPolicy("ask").ok());
  CHECK(*ParseSshClient("openssh") == SshClient::kOpenssh);
  CHECK_FALSE(ParseSshClient("putty").ok());
}

}  // namespace
}  // namespace trainrun::launcher::ssh
