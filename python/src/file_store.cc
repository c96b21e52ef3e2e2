#include "file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainrun::python {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(1);

// Fd closes its descriptor when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

absl::Status ErrnoStatus(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream text;
  text << in.rdbuf();
  *out = text.str();
  return true;
}

// WriteAtomically writes `value` to a temporary file, then renames it over `path`, so readers see
// either nothing or all of it.
absl::Status WriteAtomically(const std::string& path, const std::string& value) {
  static thread_local std::mt19937_64 random(std::random_device{}());
  const std::string temporary = absl::StrCat(path, ".tmp.", ::getpid(), ".", random());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << value;
    out.close();
    if (!out) return ErrnoStatus("cannot write", temporary);
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) return ErrnoStatus("cannot rename", path);
  return absl::OkStatus();
}

}  // namespace

FileStore::FileStore(std::string directory) : directory_(std::move(directory)) {
  ::mkdir(directory_.c_str(), 0700);  // Already there is fine; a later write reports real trouble.
}

std::string FileStore::PathOf(const std::string& key, const char* suffix) const {
  std::string name;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.') {
      name += static_cast<char>(c);
    } else {
      absl::StrAppend(&name, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return absl::StrCat(directory_, "/", name, suffix);
}

absl::Status FileStore::Set(const std::string& key, const std::string& value) {
  return WriteAtomically(PathOf(key, ".value"), value);
}

absl::StatusOr<std::vector<std::string>> FileStore::Get(const std::vector<std::string>& keys,
                                                        std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> values(keys.size());
  std::vector<bool> have(keys.size(), false);
  while (true) {
    std::vector<std::string> missing;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!have[i]) have[i] = ReadFile(PathOf(keys[i], ".value"), &values[i]);
      if (!have[i]) missing.push_back(keys[i]);
    }
    if (missing.empty()) return values;
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("timed out after ", timeout.count(), " ms waiting for keys ",
                       absl::StrJoin(missing, ", "), " in file store ", directory_));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

absl::StatusOr<int64_t> FileStore::ReadCounter(const std::string& key) {
  std::string text;
  if (!ReadFile(PathOf(key, ".counter"), &text) || text.empty()) return 0;
  return std::stoll(text);
}

absl::StatusOr<int64_t> FileStore::Add(const std::string& key, int64_t delta) {
  const std::string lock_path = PathOf(key, ".lock");
  Fd lock(::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600));
  if (lock.get() < 0) return ErrnoStatus("cannot open", lock_path);
  if (::flock(lock.get(), LOCK_EX) != 0) return ErrnoStatus("cannot lock", lock_path);
  auto value = ReadCounter(key);  // The lock goes with the descriptor.
  if (!value.ok()) return value.status();
  const int64_t sum = *value + delta;
  if (auto status = WriteAtomically(PathOf(key, ".counter"), std::to_string(sum)); !status.ok()) {
    return status;
  }
  return sum;
}

absl::Status FileStore::Barrier(const std::string& name, int count,
                                std::chrono::milliseconds timeout) {
  const std::string key = "barrier/" + name;
  auto arrived = Add(key, 1);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (arrived.ok() && *arrived < count) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("timed out after ", timeout.count(),
                                                      " ms in barrier '", name, "': ", *arrived,
                                                      " of ", count, " arrived"));
    }
    std::this_thread::sleep_for(kPollInterval);
    arrived = ReadCounter(key);
  }
  return arrived.status();
}

}  // namespace trainrun::python
