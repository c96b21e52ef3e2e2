#include "wire.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

namespace trainrun::rendezvous::internal {

absl::Status ToAbsl(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

std::string FormatDuration(std::chrono::milliseconds duration) {
  const int64_t ms = duration.count();
  if (ms < 1000) return absl::StrCat(ms, " ms");
  if (ms % 1000 == 0) return absl::StrCat(ms / 1000, " s");
  return absl::StrFormat("%.1f s", static_cast<double>(ms) / 1000.0);
}

std::string JoinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && !host.empty() && host.front() != '[') {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

bool ConstantTimeEquals(std::string_view secret, std::string_view candidate) {
  // Every byte of the secret is visited whatever the candidate holds; a length mismatch only
  // flips a bit of the result.
  volatile unsigned char diff = secret.size() == candidate.size() ? 0 : 1;
  for (size_t i = 0; i < secret.size(); ++i) {
    const unsigned char c = candidate.empty() ? 0 : candidate[i % candidate.size()];
    diff = diff | (static_cast<unsigned char>(secret[i]) ^ c);
  }
  return diff == 0;
}

namespace {

void PutVarint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

// GetVarint reads a varint at `at` and moves past it; false when the buffer ends first or the
// number does not fit 32 bits.
bool GetVarint(std::string_view in, size_t& at, uint32_t& value) {
  uint64_t result = 0;
  for (int shift = 0; shift <= 28 && at < in.size(); shift += 7) {
    const auto byte = static_cast<unsigned char>(in[at++]);
    result |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) {
      if (result > UINT32_MAX) return false;
      value = static_cast<uint32_t>(result);
      return true;
    }
  }
  return false;
}

}  // namespace

std::string EncodeTable(const std::vector<const std::string*>& values) {
  size_t bytes = 0;
  for (const std::string* value : values) bytes += value->size();
  std::string out;
  out.reserve(bytes / 2 + 4 * values.size() + 8);
  PutVarint(out, values.size());
  std::string_view previous;
  for (const std::string* value : values) {
    const size_t limit = std::min(previous.size(), value->size());
    size_t shared = 0;
    while (shared < limit && previous[shared] == (*value)[shared]) ++shared;
    PutVarint(out, shared);
    PutVarint(out, value->size() - shared);
    out.append(*value, shared, std::string::npos);
    previous = *value;
  }
  return out;
}

namespace {

// GetVarints reads two varints at `at`, the common case (both under 128) without a loop.
bool GetVarints(std::string_view in, size_t& at, uint32_t& first, uint32_t& second) {
  if (in.size() - at >= 2 && (in[at] & 0x80) == 0 && (in[at + 1] & 0x80) == 0) {
    first = static_cast<unsigned char>(in[at]);
    second = static_cast<unsigned char>(in[at + 1]);
    at += 2;
    return true;
  }
  return GetVarint(in, at, first) && GetVarint(in, at, second);
}

// DecodeValues reads `count` values from `table`, starting at `at` (just past the count).
//
// Every rank decodes the whole table (8192 values at 8192 ranks, and rendezvous_bench's simulated
// ranks decode 67 million on one machine), so the short values are built in `current`, which
// holds the previous value: its shared prefix is already in place, the rest is copied in as one
// fixed 16-byte move where the table has 16 bytes left, and the string is built in one
// constructor (an address fits its inline buffer). Longer values take the general path.
absl::StatusOr<std::vector<std::string>> DecodeValues(std::string_view table, size_t at,
                                                      size_t count) {
  const absl::Status malformed =
      absl::InternalError("the rendezvous server sent a malformed gather table");
  constexpr size_t kShort = 48;
  char current[kShort + 16];
  size_t previous = 0;  // the previous value's size; in `current` when at most kShort
  std::vector<std::string> values;
  values.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    uint32_t shared = 0;
    uint32_t rest = 0;
    if (!GetVarints(table, at, shared, rest) || (i == 0 ? shared != 0 : shared > previous) ||
        rest > table.size() - at) {
      return malformed;
    }
    const size_t size = size_t{shared} + rest;
    const char* from = table.data() + at;
    if (size <= kShort && previous <= kShort) {
      if (rest <= 16 && table.size() - at >= 16) {
        std::memcpy(current + shared, from, 16);
      } else {
        std::memcpy(current + shared, from, rest);
      }
      values.emplace_back(current, size);
    } else {
      std::string value;
      value.reserve(size);
      if (shared > 0) value.append(values.back(), 0, shared);
      value.append(from, rest);
      if (size <= kShort) std::memcpy(current, value.data(), size);
      values.push_back(std::move(value));
    }
    previous = size;
    at += rest;
  }
  if (at != table.size()) return malformed;
  return values;
}

// ReadCount reads the table's count into `at` and checks it is `count`.
absl::Status ReadCount(std::string_view table, size_t count, size_t& at) {
  uint32_t stored = 0;
  if (!GetVarint(table, at, stored)) {
    return absl::InternalError("the rendezvous server sent a malformed gather table");
  }
  if (stored != count) {
    return absl::InternalError(absl::StrCat("the rendezvous server gathered ", stored,
                                            " values for ", count,
                                            " ranks; is it the same trainrun version?"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> DecodeTable(std::string_view table, size_t count) {
  size_t at = 0;
  if (absl::Status status = ReadCount(table, count, at); !status.ok()) return status;
  return DecodeValues(table, at, count);
}

// UninitializedBytes allocates `size` bytes without zeroing them (std::make_unique<char[]> would,
// touching every page of a buffer the decoder is about to fill; C++17 has no
// make_unique_for_overwrite).
namespace {
std::unique_ptr<char[]> UninitializedBytes(size_t size) {
  return std::unique_ptr<char[]>(new char[size]);
}
}  // namespace

// One pass over the table into a buffer sized for what addresses front-code to (a third of it),
// grown should the values be longer. A value of at most 16 bytes (an IPv4 address and port) is
// built in a 128-bit integer from the one before it (its shared prefix) and 16 bytes of the table
// (its rest, shifted into place), and stored whole into the buffer's slack, which the next value
// overwrites. Copying the prefix back out of the buffer instead would load what the two stores
// before had just written in part each, which the CPU cannot forward: a stall on every value.
absl::StatusOr<GatherTable> DecodeGatherTable(std::string_view table, size_t count) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the 16-byte path assumes it");
  using Bytes16 = unsigned __int128;
  constexpr uint32_t kShort = sizeof(Bytes16);
  size_t at = 0;
  if (absl::Status status = ReadCount(table, count, at); !status.ok()) return status;
  const absl::Status malformed =
      absl::InternalError("the rendezvous server sent a malformed gather table");
  size_t capacity = 4 * table.size() + 2 * kShort;
  std::unique_ptr<char[]> bytes = UninitializedBytes(capacity);
  std::vector<uint32_t> ends(count);
  size_t begin = 0;
  uint32_t previous = 0;
  Bytes16 current = 0;  // the previous value's first 16 bytes
  for (size_t i = 0; i < count; ++i) {
    uint32_t shared = 0;
    uint32_t rest = 0;
    if (table.size() - at >= 2 && ((table[at] | table[at + 1]) & 0x80) == 0) {
      shared = static_cast<unsigned char>(table[at]);
      rest = static_cast<unsigned char>(table[at + 1]);
      at += 2;
    } else if (!GetVarints(table, at, shared, rest)) {
      return malformed;
    }
    if (shared > previous || rest > table.size() - at) return malformed;
    const size_t size = size_t{shared} + rest;
    if (begin + size > UINT32_MAX) return malformed;
    if (begin + size + kShort > capacity) {
      capacity = std::max(2 * capacity, begin + size + kShort);
      std::unique_ptr<char[]> grown = UninitializedBytes(capacity);
      std::memcpy(grown.get(), bytes.get(), begin);
      bytes = std::move(grown);
    }
    char* value = bytes.get() + begin;
    const char* from = table.data() + at;
    if (size <= kShort) {
      // Fixed-size copies, so `tail` and `current` stay in registers.
      Bytes16 tail;
      if (table.size() - at >= kShort) {
        std::memcpy(&tail, from, kShort);
      } else {
        char last[kShort] = {};
        std::memcpy(last, from, rest);
        std::memcpy(&tail, last, kShort);
      }
      if (shared < kShort) {
        const Bytes16 keep = shared == 0 ? 0 : ~Bytes16{0} >> (8 * (kShort - shared));
        current = (current & keep) | (tail << (8 * shared));
      }
      std::memcpy(value, &current, kShort);
    } else {
      std::memcpy(value, value - previous, shared);  // no overlap: shared <= previous
      std::memcpy(value + shared, from, rest);
      std::memcpy(&current, value, kShort);
    }
    at += rest;
    begin += size;
    ends[i] = static_cast<uint32_t>(begin);
    previous = static_cast<uint32_t>(size);
  }
  if (at != table.size()) return malformed;
  return GatherTable(std::move(bytes), std::move(ends));
}

absl::StatusOr<std::vector<std::string>> DecodeTable(std::string_view table) {
  size_t at = 0;
  uint32_t stored = 0;
  // Each value takes at least two bytes, so a count past that is damage, not a reason to allocate.
  if (!GetVarint(table, at, stored) || stored > (table.size() - at) / 2) {
    return absl::InternalError("the rendezvous server sent a malformed table");
  }
  return DecodeValues(table, at, stored);
}

void QuietAbseilMutexes() {
  static std::once_flag once;
  std::call_once(once, [] { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); });
}

}  // namespace trainrun::rendezvous::internal
