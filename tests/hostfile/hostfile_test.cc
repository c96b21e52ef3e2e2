// Hostfiles: the Horovod/DeepSpeed/Open MPI and host:N forms, comments, CRLF, tabs, and errors as
// FILE:LINE.
#include "trainrun/hostfile/hostfile.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <string>

namespace trainrun::hostfile {
namespace {

TEST_CASE("ParseHostfile reads the forms people already have", "[hostfile]") {
  const std::string text =
      "# cluster A\r\n"
      "node1 slots=4\r\n"
      "\r\n"
      "ubuntu@node2\tslots=2   max_slots=8   # trailing comment\r\n"
      "   \t\n"
      "node3:3\n"
      "[fe80::2]:2\n"
      "node4\n"
      "node5 max-slots=2";
  auto hosts = ParseHostfile(text, "hosts.txt");
  REQUIRE(hosts.ok());
  REQUIRE(hosts->size() == 6);
  CHECK((*hosts)[0].host == "node1");
  CHECK((*hosts)[0].slots == 4);
  CHECK_FALSE((*hosts)[0].max_slots.has_value());
  CHECK((*hosts)[1].user == "ubuntu");
  CHECK((*hosts)[1].host == "node2");
  CHECK((*hosts)[1].slots == 2);
  CHECK((*hosts)[1].max_slots == 8);
  CHECK((*hosts)[2].host == "node3");
  CHECK((*hosts)[2].slots == 3);
  CHECK((*hosts)[3].host == "fe80::2");
  CHECK((*hosts)[3].slots == 2);
  CHECK((*hosts)[4].host == "node4");
  CHECK((*hosts)[4].slots == 1);
  CHECK((*hosts)[5].max_slots == 2);
}

TEST_CASE("ParseHostfile sums a host listed once per slot, as Open MPI does", "[hostfile]") {
  auto hosts = ParseHostfile("a\nb\na\na\n", "f");
  REQUIRE(hosts.ok());
  REQUIRE(hosts->size() == 2);
  CHECK((*hosts)[0].slots == 3);
  CHECK((*hosts)[1].slots == 1);
}

TEST_CASE("ParseHostfile reports syntax errors as FILE:LINE", "[hostfile]") {
  struct Case {
    std::string text;
    std::string message;  // the exact message, or its start
  };
  auto c = GENERATE(values<Case>({
      {"a slots=2\nb slots=abc\n", "hosts.txt:2: slot count 'abc' for host 'b'"},
      {"# c\n\na slots=0\n", "hosts.txt:3: host 'a' has 0 slots"},
      {"a slots=2\r\nb slots=-1\r\n", "hosts.txt:2: slot count '-1' for host 'b'"},
      {"a slot=2\n", "hosts.txt:1: unknown field 'slot' for host 'a'"},
      {"a 2\n", "hosts.txt:1: unexpected '2' after host 'a'"},
      {"a:2 slots=3\n", "hosts.txt:1: host 'a' is given a slot count twice"},
      {"a slots=4 max_slots=2\n", "hosts.txt:1: host 'a' has max_slots=2 below its slots=4"},
      {"\n\n\n:3\n", "hosts.txt:4: entry ':3' has no host name"},
      {"a slots=100000\n", "hosts.txt:1: host 'a' asks for 100000 slots"},
      {"h:\n", "hosts.txt:1: host 'h' has an empty slot count"},
      {"", "hostfile 'hosts.txt' lists no hosts"},
      {"# only comments\n\n", "hostfile 'hosts.txt' lists no hosts"},
  }));
  CAPTURE(c.text);
  auto hosts = ParseHostfile(c.text, "hosts.txt");
  REQUIRE_FALSE(hosts.ok());
  CHECK(hosts.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(hosts.status().message()), Catch::StartsWith(c.message));
}

// A scratch directory for files the tests write, removed at the end.
class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/trainrun_hostfile_test.XXXXXX";
    REQUIRE(::mkdtemp(pattern) != nullptr);
    path_ = pattern;
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  std::string Write(const std::string& name, const std::string& text) const {
    std::string file = path_ + "/" + name;
    std::ofstream(file) << text;
    return file;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST_CASE("ReadHostfile reads a file and names it in errors", "[hostfile]") {
  TempDir dir;
  SECTION("a good file") {
    auto hosts = ReadHostfile(dir.Write("hosts", "a slots=2\nb slots=2\n"));
    REQUIRE(hosts.ok());
    CHECK(hosts->size() == 2);
  }
  SECTION("a syntax error carries the path and line") {
    std::string file = dir.Write("hosts", "a slots=2\nb slots=x\n");
    auto hosts = ReadHostfile(file);
    REQUIRE_FALSE(hosts.ok());
    CHECK_THAT(std::string(hosts.status().message()), Catch::StartsWith(file + ":2: "));
  }
  SECTION("a missing file") {
    auto hosts = ReadHostfile(dir.path() + "/nope");
    REQUIRE_FALSE(hosts.ok());
    CHECK(hosts.status().code() == absl::StatusCode::kNotFound);
    CHECK(std::string(hosts.status().message()) ==
          "hostfile '" + dir.path() + "/nope' does not exist");
  }
  SECTION("a directory") {
    auto hosts = ReadHostfile(dir.path());
    REQUIRE_FALSE(hosts.ok());
    CHECK_THAT(std::string(hosts.status().message()), Catch::Contains("is a directory"));
  }
  SECTION("an unreadable file") {
    std::string file = dir.Write("secret", "a slots=2\n");
    REQUIRE(::chmod(file.c_str(), 0) == 0);
    if (::geteuid() == 0) return;  // root reads anything; nothing to assert
    auto hosts = ReadHostfile(file);
    REQUIRE_FALSE(hosts.ok());
    CHECK(std::string(hosts.status().message()) ==
          "cannot read hostfile '" + file + "': Permission denied");
  }
}

}  // namespace
}  // namespace trainrun::hostfile
