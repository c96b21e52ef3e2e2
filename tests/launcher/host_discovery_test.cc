// --host-discovery-script's output and runs (host_discovery.h).
#include "trainrun/launcher/host_discovery.h"

#include <catch2/catch.hpp>
#include <string>

using trainrun::launcher::ParseDiscoveryOutput;
using trainrun::launcher::RunDiscoveryScript;

TEST_CASE("discovery: host and host:slots lines, defaults, comments, users, IPv6",
          "[launcher][discovery][elastic]") {
  auto hosts = ParseDiscoveryOutput("s", "a:4\n\n# a comment\n  b  \nroot@c:2\n[fe80::1]:3\n", 2);
  REQUIRE(hosts.ok());
  REQUIRE(hosts->size() == 4);
  CHECK((*hosts)[0].host == "a");
  CHECK((*hosts)[0].slots == 4);
  CHECK((*hosts)[1].host == "b");
  CHECK((*hosts)[1].slots == 2);  // --slots-per-host
  CHECK((*hosts)[2].user == "root");
  CHECK((*hosts)[2].host == "c");
  CHECK((*hosts)[2].slots == 2);
  CHECK((*hosts)[3].host == "fe80::1");
  CHECK((*hosts)[3].slots == 3);
  CHECK(ParseDiscoveryOutput("s", "", 1)->empty());
}

TEST_CASE("discovery: garbage is one sentence naming the script and the line",
          "[launcher][discovery][elastic]") {
  auto bad = ParseDiscoveryOutput("./hosts.sh", "a:2\nhello world\n", 1);
  REQUIRE_FALSE(bad.ok());
  // The line's own fault in -H's words (hostfile::ParseHostEntry), then the grammar.
  CHECK(std::string(bad.status().message()) ==
        "the host discovery script './hosts.sh' printed \"hello world\" on line 2: host name "
        "'hello world' contains the character ' ', which is not allowed there; each line must be "
        "host or host:slots");
  auto slots = ParseDiscoveryOutput("s", "a:x\n", 1);
  REQUIRE_FALSE(slots.ok());
  CHECK(std::string(slots.status().message())
            .find("printed \"a:x\" on line 1: slot count 'x' for host 'a' is not a positive whole "
                  "number") != std::string::npos);
  auto v6 = ParseDiscoveryOutput("s", "fe80::1\n", 1);
  REQUIRE_FALSE(v6.ok());
  CHECK(std::string(v6.status().message()).find("write IPv6 addresses in brackets") !=
        std::string::npos);
  auto twice = ParseDiscoveryOutput("s", "a:1\na:2\n", 1);
  REQUIRE_FALSE(twice.ok());
  CHECK(std::string(twice.status().message()).find("the host is listed twice") !=
        std::string::npos);
}

TEST_CASE("discovery: the script is run, a failing one is named with its code",
          "[launcher][discovery][elastic]") {
  auto hosts = RunDiscoveryScript("printf 'x:2\\ny\\n'", 3);
  REQUIRE(hosts.ok());
  REQUIRE(hosts->size() == 2);
  CHECK((*hosts)[1].slots == 3);
  auto failed = RunDiscoveryScript("exit 4", 1);
  REQUIRE_FALSE(failed.ok());
  CHECK(std::string(failed.status().message()) ==
        "the host discovery script 'exit 4' exited with code 4");
  auto missing = RunDiscoveryScript("/nonexistent/discover", 1);
  REQUIRE_FALSE(missing.ok());
  CHECK(std::string(missing.status().message()).find("exited with code 127 (not found?)") !=
        std::string::npos);
}
