// Admission (admission.h): the caps and deadline every listener applies before the token's proof.
#include "trainrun/rendezvous/admission.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace trainrun::rendezvous {
namespace {

using Clock = Admission::Clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

struct Lines {
  std::vector<std::string> said;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& line) { said.push_back(line); };
  }
};

TEST_CASE("a connection that has not proved the token by the deadline is closed, whatever it sent",
          "[admission]") {
  Lines lines;
  Admission admission("the rendezvous", Admission::Limits{}, lines.sink());
  const Clock::time_point t0 = Clock::now();
  admission.Admit(1, "10.0.0.9", t0);
  admission.Admit(2, "10.0.0.9", t0 + seconds(1));
  admission.Admit(3, "10.0.0.1", t0 + seconds(1));
  CHECK(admission.Proven(3));
  CHECK(admission.Expired(t0 + milliseconds(4999)).empty());
  CHECK(admission.Expired(t0 + seconds(5)) == std::vector<uint64_t>{1});
  CHECK(admission.Expired(t0 + seconds(7)) == std::vector<uint64_t>{2});
  CHECK(admission.unproven() == 0);
  CHECK(admission.closed_total() == 2);
}

TEST_CASE(
    "over the per-address cap the oldest unproven connection from that address goes, and "
    "a proven one never does",
    "[admission]") {
  Lines lines;
  Admission::Limits limits;
  limits.per_address = 3;
  limits.total = 100;
  Admission admission("the rendezvous", limits, lines.sink());
  const Clock::time_point t0 = Clock::now();
  CHECK(admission.Admit(1, "a", t0).empty());
  CHECK(admission.Admit(2, "a", t0).empty());
  CHECK(admission.Admit(10, "b", t0).empty());  // another address is not counted against "a"
  CHECK(admission.Proven(2));
  CHECK(admission.Admit(3, "a", t0).empty());
  CHECK(admission.Admit(4, "a", t0).empty());
  CHECK(admission.Admit(5, "a", t0) == std::vector<uint64_t>{1});
  CHECK(admission.Admit(6, "a", t0) == std::vector<uint64_t>{3});
  CHECK(admission.unproven_from("a") == 3);
  CHECK(admission.unproven_from("b") == 1);
  CHECK(!admission.Proven(1));  // evicted: it is closed
}

TEST_CASE("over the cap in all the oldest unproven connection of any address goes", "[admission]") {
  Lines lines;
  Admission::Limits limits;
  limits.per_address = 10;
  limits.total = 2;
  Admission admission("the per-node join port", limits, lines.sink());
  const Clock::time_point t0 = Clock::now();
  admission.Admit(1, "a", t0);
  admission.Admit(2, "b", t0);
  CHECK(admission.Admit(3, "c", t0) == std::vector<uint64_t>{1});
  CHECK(admission.unproven() == 2);
}

TEST_CASE("closes are said in one line at once, then at most one line a minute with the counts",
          "[admission]") {
  Lines lines;
  Admission::Limits limits;
  limits.per_address = 1;
  Admission admission("the rendezvous", limits, lines.sink());
  const Clock::time_point t0 = Clock::now();
  admission.Admit(1, "10.0.0.9", t0);
  admission.Admit(2, "10.0.0.9", t0);  // evicts 1: the first line, at once
  REQUIRE(lines.said.size() == 1);
  CHECK(lines.said[0].find("closed 1 connection that did not prove this job's token (1 over the "
                           "per-address cap) from 10.0.0.9 (1)") != std::string::npos);
  for (uint64_t id = 3; id < 1003; ++id) admission.Admit(id, "10.0.0.9", t0 + seconds(1));
  admission.Expired(t0 + seconds(30));
  CHECK(lines.said.size() == 1);  // 1000 more closes, no more lines within the minute
  admission.Expired(t0 + seconds(61));
  REQUIRE(lines.said.size() == 2);
  CHECK(lines.said[1].find("closed 1001 connections") != std::string::npos);
  CHECK(lines.said[1].find("1 past the deadline, 1000 over the per-address cap") !=
        std::string::npos);
  CHECK(lines.said[1].find("in the last minute") != std::string::npos);
  admission.Expired(t0 + seconds(200));
  CHECK(lines.said.size() == 2);  // nothing new: nothing said
}

}  // namespace
}  // namespace trainrun::rendezvous
