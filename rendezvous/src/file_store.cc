#include "trainrun/rendezvous/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"

namespace trainrun::rendezvous {
namespace {

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  *out = buffer.str();
  return true;
}

}  // namespace

FileStore::FileStore(std::string directory) : directory_(std::move(directory)) {}

std::string FileStore::PathOf(const std::string& key) const {
  std::string name;
  for (char c : key) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') {
      name += c;
    } else {
      name += absl::StrCat("%", static_cast<int>(static_cast<unsigned char>(c)));
    }
  }
  return absl::StrCat(directory_, "/", name);
}

absl::Status FileStore::Set(const std::string& key, const std::string& value) {
  // Write aside, then rename: readers never see half a value.
  std::string tmp = absl::StrCat(PathOf(key), ".tmp.", ::getpid(), ".", std::random_device{}());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << value;
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), PathOf(key).c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FileStore::Get(const std::vector<std::string>& keys,
                                                        std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> values(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    while (!ReadFile(PathOf(keys[i]), &values[i])) {
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("timed out waiting for key ", keys[i]));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return values;
}

absl::StatusOr<int64_t> FileStore::Add(const std::string& key, int64_t delta) {
  const std::string path = PathOf(key);
  int fd = ::open((path + ".lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open ", path, ".lock"));
  ::flock(fd, LOCK_EX);
  std::string text;
  int64_t value = ReadFile(path, &text) && !text.empty() ? std::stoll(text) : 0;
  value += delta;
  absl::Status status = Set(key, std::to_string(value));
  ::flock(fd, LOCK_UN);
  ::close(fd);
  if (!status.ok()) return status;
  return value;
}

absl::Status FileStore::Barrier(const std::string& name, int count,
                                std::chrono::milliseconds timeout) {
  const std::string key = absl::StrCat("barrier/", name);
  auto arrived = Add(key, 1);
  if (!arrived.ok()) return arrived.status();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::string text;
    if (ReadFile(PathOf(key), &text) && !text.empty() && std::stoll(text) >= count) {
      return absl::OkStatus();
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("timed out in barrier ", name));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace trainrun::rendezvous
