#include "trainrun/rendezvous/store.h"

#include "absl/strings/str_cat.h"

namespace trainrun::rendezvous {

absl::StatusOr<std::vector<std::string>> Store::Allgather(const std::string& name, int rank,
                                                          int count, const std::string& value,
                                                          std::chrono::milliseconds timeout) {
  if (count <= 0 || rank < 0 || rank >= count) {
    return absl::InvalidArgumentError(absl::StrCat("allgather '", name, "' was entered as rank ",
                                                   rank, " of ", count, " contributors"));
  }
  if (absl::Status status = Set(absl::StrCat(name, "/", rank), value); !status.ok()) return status;
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(count));
  for (int r = 0; r < count; ++r) keys.push_back(absl::StrCat(name, "/", r));
  return Get(keys, timeout);
}

}  // namespace trainrun::rendezvous
