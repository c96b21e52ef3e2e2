// What the rendezvous client and server agree on beyond the .proto: metadata names, status
// conversion, and the small formatting both sides share.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

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

}  // namespace trainrun::rendezvous::internal
