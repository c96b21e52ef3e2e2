#include "trainrun/rendezvous/store.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace trainrun::rendezvous {

GatherTable GatherTable::FromValues(const std::vector<std::string>& values) {
  size_t bytes = 0;
  for (const std::string& value : values) bytes += value.size();
  auto buffer = std::make_unique<char[]>(bytes);
  std::vector<uint32_t> ends;
  ends.reserve(values.size());
  size_t end = 0;
  for (const std::string& value : values) {
    std::memcpy(buffer.get() + end, value.data(), value.size());
    end += value.size();
    ends.push_back(static_cast<uint32_t>(end));
  }
  return GatherTable(std::move(buffer), std::move(ends));
}

std::vector<std::string> GatherTable::ToStrings() const {
  std::vector<std::string> values;
  values.reserve(size());
  for (size_t i = 0; i < size(); ++i) values.emplace_back((*this)[i]);
  return values;
}

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

absl::StatusOr<GatherTable> Store::AllgatherTable(const std::string& name, int rank, int count,
                                                  const std::string& value,
                                                  std::chrono::milliseconds timeout) {
  absl::StatusOr<std::vector<std::string>> values = Allgather(name, rank, count, value, timeout);
  if (!values.ok()) return values.status();
  return GatherTable::FromValues(*values);
}

}  // namespace trainrun::rendezvous
