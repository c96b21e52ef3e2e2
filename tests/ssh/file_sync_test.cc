// --sync-dst-dir's pieces without hosts: its frames round-trip, the exclude rules, and the
// receiver writing a real directory (what changed only, modes and mtimes kept, nothing outside it).
#include "remote/file_sync.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "sshd_fixture.h"

namespace trainrun::launcher::remote {
namespace {

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::string Read(const std::string& path) { return trainrun::testing::ReadFileText(path); }

TEST_CASE("file sync: the sync frames round-trip", "[ssh]") {
  SyncOffer offer;
  offer.dir = "/tmp/job dir";
  offer.entries = {{"a/b.py", 0100644, 5ull << 32, -3, ""}, {"link", 0120777, 0, 1, "a/b.py"}};
  FrameReader reader;
  reader.Append(EncodeSyncOffer(offer) + EncodeSyncWant({0, 7}) +
                EncodeSyncData(7, 1ull << 33, std::string("x\0y", 3)) +
                EncodeSyncDone({3, 1ull << 40}));
  auto decoded = DecodeSyncOffer((*reader.Next())->payload);
  REQUIRE(decoded.ok());
  CHECK(decoded->dir == offer.dir);
  REQUIRE(decoded->entries.size() == 2);
  CHECK(decoded->entries[0].size == 5ull << 32);
  CHECK(decoded->entries[0].mtime_ns == -3);
  CHECK(decoded->entries[1].link == "a/b.py");
  CHECK(decoded->entries[1].mode == 0120777u);
  CHECK(*DecodeSyncWant((*reader.Next())->payload) == std::vector<uint32_t>{0, 7});
  auto data = DecodeSyncData((*reader.Next())->payload);
  REQUIRE(data.ok());
  CHECK(data->offset == 1ull << 33);
  CHECK(data->bytes == std::string("x\0y", 3));
  CHECK(DecodeSyncDone((*reader.Next())->payload)->bytes == 1ull << 40);
  CHECK_FALSE(DecodeSyncData("short").ok());
}

TEST_CASE("file sync: .git and the patterns are left out, by name or by path", "[ssh]") {
  const std::vector<std::string> excludes = {"*.log", "data/raw", "/top.txt"};
  CHECK(Excluded(".git", {}));
  CHECK(Excluded("sub/.git", {}));
  CHECK_FALSE(Excluded(".gitignore", {}));
  CHECK(Excluded("x.log", excludes));
  CHECK(Excluded("deep/er/x.log", excludes));
  CHECK(Excluded("data/raw", excludes));
  CHECK_FALSE(Excluded("other/data/raw", excludes));
  CHECK(Excluded("top.txt", excludes));
  CHECK_FALSE(Excluded("train.py", excludes));
}

TEST_CASE("file sync: only what changed is written, with its mode and mtime", "[ssh]") {
  trainrun::testing::TempDir temp;
  const std::string src = temp.path() + "/src", dst = temp.path() + "/deep/dst";
  mkdir(src.c_str(), 0755);
  mkdir((src + "/sub").c_str(), 0755);
  Write(src + "/run.sh", "#!/bin/sh\n");
  chmod((src + "/run.sh").c_str(), 0750);
  Write(src + "/sub/data", std::string(3 << 20, 'd'));
  Write(src + "/skip.tmp", "left out");
  symlink("sub/data", (src + "/latest").c_str());
  // DIR inside SRC is not copied into itself.
  mkdir((src + "/deep").c_str(), 0755);
  auto offer = ScanSource(src, src + "/deep", {"*.tmp"});
  REQUIRE(offer.ok());
  std::vector<std::string> paths;
  for (const SyncEntry& entry : offer->entries) paths.push_back(entry.path);
  CHECK(paths == std::vector<std::string>{"latest", "run.sh", "sub", "sub/data"});

  offer->dir = dst;
  SyncProgress progress;
  auto first = SyncLocally(*offer, src, progress);
  REQUIRE(first.ok());
  CHECK(first->files == 2);
  CHECK(first->bytes == (3u << 20) + 10);
  CHECK(progress.sent == progress.total);
  CHECK(Read(dst + "/sub/data") == std::string(3 << 20, 'd'));
  struct stat a {
  }, b{};
  REQUIRE(stat((src + "/run.sh").c_str(), &a) == 0);
  REQUIRE(stat((dst + "/run.sh").c_str(), &b) == 0);
  CHECK((b.st_mode & 07777) == 0750);
  CHECK(b.st_mtim.tv_sec == a.st_mtim.tv_sec);
  CHECK(b.st_mtim.tv_nsec == a.st_mtim.tv_nsec);
  char target[64] = {};
  CHECK(readlink((dst + "/latest").c_str(), target, sizeof target - 1) > 0);
  CHECK(std::string(target) == "sub/data");

  auto again = SyncLocally(*offer, src, progress);
  REQUIRE(again.ok());
  CHECK(again->files == 0);
  CHECK(again->unchanged == 2);

  // The same size, another mtime: copied again.
  Write(src + "/run.sh", "#!/bin/bash");
  Write(src + "/run.sh", "#!/bin/zsh");
  struct timespec later[2] = {{0, UTIME_OMIT}, {a.st_mtim.tv_sec + 5, 0}};
  utimensat(AT_FDCWD, (src + "/run.sh").c_str(), later, 0);
  offer = ScanSource(src, dst, {"*.tmp"});
  REQUIRE(offer.ok());
  auto changed = SyncLocally(*offer, src, progress);
  REQUIRE(changed.ok());
  CHECK(changed->files == 1);
  CHECK(Read(dst + "/run.sh") == "#!/bin/zsh");
}

TEST_CASE("file sync: the receiver refuses paths outside its directory and a file as DIR",
          "[ssh]") {
  trainrun::testing::TempDir temp;
  SyncReceiver receiver;
  SyncOffer offer;
  offer.dir = temp.path();
  offer.entries = {{"../escape", 0100644, 1, 0, ""}};
  auto wanted = receiver.Offer(offer);
  REQUIRE_FALSE(wanted.ok());
  CHECK(wanted.status().message() ==
        "the sync offered '../escape', a path outside '" + temp.path() + "'");

  Write(temp.path() + "/file", "x");
  SyncReceiver other;
  offer.dir = temp.path() + "/file/job";
  offer.entries.clear();
  auto refused = other.Offer(offer);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().message() ==
        "cannot sync to '" + temp.path() + "/file': it is not a directory there");
}

}  // namespace
}  // namespace trainrun::launcher::remote
