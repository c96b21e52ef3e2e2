#include "wire.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

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

}  // namespace trainrun::rendezvous::internal
