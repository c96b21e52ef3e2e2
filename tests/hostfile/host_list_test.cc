// -H entries: the accepted forms, and every malformed one the user gets one clear message for.
#include "trainrun/hostfile/host_list.h"

#include <catch2/catch.hpp>
#include <string>

namespace trainrun::hostfile {
namespace {

TEST_CASE("ParseHostList accepts the forms users type", "[hostfile]") {
  struct Case {
    std::string list;
    std::string user, host;
    int slots;
  };
  auto c = GENERATE(values<Case>({
      {"a", "", "a", 1},
      {"a:4", "", "a", 4},
      {"server-1.example.com:8", "", "server-1.example.com", 8},
      {"ubuntu@b:2", "ubuntu", "b", 2},
      {"[::1]:2", "", "::1", 2},
      {"[fe80::1%eth0]:3", "", "fe80::1%eth0", 3},
      {"root@[2001:db8::7]", "root", "2001:db8::7", 1},
      {"10.0.0.1:4096", "", "10.0.0.1", 4096},
  }));
  CAPTURE(c.list);
  auto hosts = ParseHostList(c.list);
  REQUIRE(hosts.ok());
  REQUIRE(hosts->size() == 1);
  CHECK((*hosts)[0].user == c.user);
  CHECK((*hosts)[0].host == c.host);
  CHECK((*hosts)[0].slots == c.slots);
}

TEST_CASE("ParseHostList keeps order and merges a repeated host", "[hostfile]") {
  auto hosts = ParseHostList("b:2,a:1,c,b:3");
  REQUIRE(hosts.ok());
  REQUIRE(hosts->size() == 3);
  CHECK((*hosts)[0].host == "b");
  CHECK((*hosts)[0].slots == 5);
  CHECK((*hosts)[1].host == "a");
  CHECK((*hosts)[2].host == "c");
  CHECK((*hosts)[2].slots == 1);
}

TEST_CASE("ParseHostList rejects malformed lists with one clear message", "[hostfile]") {
  struct Case {
    std::string list;
    std::string message_part;  // the culprit the message must name
  };
  auto c = GENERATE(values<Case>({
      {"", "empty"},
      {"h:", "host 'h' has an empty slot count"},
      {"h:-1", "slot count '-1' for host 'h' is not a positive whole number"},
      {"h:abc", "slot count 'abc' for host 'h' is not a positive whole number"},
      {"h:2x", "slot count '2x'"},
      {":3", "entry ':3' has no host name"},
      {"a:2, b:2", "whitespace"},
      {"a :2", "whitespace"},
      {" a:2", "whitespace"},
      {"a:2,,b:2", "empty entry"},
      {"a:2,", "empty entry"},
      {"h:0", "host 'h' has 0 slots"},
      {"h:4097", "host 'h' asks for 4097 slots; one host may have at most 4096"},
      {"h:99999999999999999999999", "asks for 99999999999999999999999 slots"},
      {"h:2048,h:2049", "4097 slots in all"},
      {"::1:2", "write IPv6 addresses in brackets"},
      {"[::1:2", "never closes"},
      {"[::1]2", "after ']'"},
      {"[]:2", "empty address"},
      {"@h:2", "empty user name"},
      {"a/b:2", "host name 'a/b' contains the character '/'"},
      {"u@a:1,v@a:1", "listed as both 'u@a' and 'v@a'"},
  }));
  CAPTURE(c.list);
  auto hosts = ParseHostList(c.list);
  REQUIRE_FALSE(hosts.ok());
  CHECK(hosts.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(hosts.status().message()), Catch::Contains(c.message_part));
  CHECK(std::string(hosts.status().message()).find('\n') == std::string::npos);
}

TEST_CASE("HostLabel shows hosts as users write them", "[hostfile]") {
  CHECK(HostLabel({"", "a", 1, {}}) == "a");
  CHECK(HostLabel({"u", "a", 1, {}}) == "u@a");
  CHECK(HostLabel({"", "::1", 1, {}}) == "[::1]");
}

}  // namespace
}  // namespace trainrun::hostfile
