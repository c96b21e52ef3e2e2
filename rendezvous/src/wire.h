// What the rendezvous client and server agree on beyond the .proto: metadata names, status
// conversion, and the small formatting both sides share.
#pragma once

#include <grpcpp/support/status.h>

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainrun/rendezvous/store.h"

namespace trainrun::rendezvous::internal {

// Metadata entries every call carries (lower case, as HTTP/2 requires).
inline constexpr char kTokenMetadata[] = "trainrun-job-token";
inline constexpr char kJobIdMetadata[] = "trainrun-job-id";

// ToAbsl and ToGrpc map statuses; the two code sets are the same numbers.
absl::Status ToAbsl(const grpc::Status& status);
grpc::Status ToGrpc(const absl::Status& status);

// FormatDuration writes a timeout for people: "60 s", "1.5 s", "250 ms".
std::string FormatDuration(std::chrono::milliseconds duration);

// JoinHostPort writes host:port, bracketing an IPv6 address: "[::1]:4000".
std::string JoinHostPort(const std::string& host, int port);

// ConstantTimeEquals compares a secret with a candidate in time that depends only on the
// secret's length, so a caller cannot learn the token byte by byte from response times.
bool ConstantTimeEquals(std::string_view secret, std::string_view candidate);

// QuietAbseilMutexes turns off Abseil's mutex deadlock detection for the process, once. Debian's
// Abseil leaves it on, and gRPC's mutexes then spend a tenth of the rendezvous's CPU building lock
// graphs. Called by the server and the client before they use gRPC.
void QuietAbseilMutexes();

// EncodeTable writes an Allgather's values, in order, as one front-coded buffer: the count, then
// for each value the length of the prefix it shares with the value before, the length of the rest
// and the rest (lengths as LEB128 varints). Encoded once per gather by the server.
std::string EncodeTable(const std::vector<const std::string*>& values);
// DecodeTable reads EncodeTable's buffer back; fails with INTERNAL when it is malformed or does
// not hold `count` values.
absl::StatusOr<std::vector<std::string>> DecodeTable(std::string_view table, size_t count);
// DecodeGatherTable reads EncodeTable's buffer into a GatherTable, as DecodeTable checks it.
absl::StatusOr<GatherTable> DecodeGatherTable(std::string_view table, size_t count);
// DecodeTable without an expected count reads however many values the table says it holds.
absl::StatusOr<std::vector<std::string>> DecodeTable(std::string_view table);

}  // namespace trainrun::rendezvous::internal
