#include "trainrun/launcher/launch_spec.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace trainrun::launcher {

absl::StatusOr<HostKeyPolicy> ParseHostKeyPolicy(absl::string_view text) {
  std::string lower = absl::AsciiStrToLower(text);
  if (lower == "yes" || lower == "true") return HostKeyPolicy::kYes;
  if (lower == "accept-new") return HostKeyPolicy::kAcceptNew;
  if (lower == "no" || lower == "false" || lower == "off") return HostKeyPolicy::kNo;
  return absl::InvalidArgumentError(absl::StrCat("--ssh-strict-host-key-checking '", text,
                                                 "' is not one of yes, accept-new, no"));
}

absl::string_view HostKeyPolicyName(HostKeyPolicy policy) {
  switch (policy) {
    case HostKeyPolicy::kYes:
      return "yes";
    case HostKeyPolicy::kAcceptNew:
      return "accept-new";
    case HostKeyPolicy::kNo:
      return "no";
  }
  return "?";
}

absl::StatusOr<SshClient> ParseSshClient(absl::string_view text) {
  if (text == "libssh2") return SshClient::kLibssh2;
  if (text == "openssh") return SshClient::kOpenssh;
  return absl::InvalidArgumentError(
      absl::StrCat("--ssh-client '", text, "' is not one of libssh2, openssh"));
}

absl::StatusOr<Launcher> ParseLauncher(absl::string_view text) {
  if (text == "auto") return Launcher::kAuto;
  if (text == "ssh") return Launcher::kSsh;
  if (text == "slurm") return Launcher::kSlurm;
  if (text == "rsh") return Launcher::kRsh;
  if (text == "local") return Launcher::kLocal;
  return absl::InvalidArgumentError(
      absl::StrCat("--launcher '", text, "' is not one of auto, ssh, slurm, rsh, local"));
}

absl::StatusOr<BindTo> ParseBindTo(absl::string_view text) {
  std::string lower = absl::AsciiStrToLower(text);
  if (lower == "none") return BindTo::kNone;
  if (lower == "core") return BindTo::kCore;
  if (lower == "socket" || lower == "package") return BindTo::kSocket;
  return absl::InvalidArgumentError(
      absl::StrCat("--bind-to '", text, "' is not one of core, socket, none"));
}

absl::string_view BindToName(BindTo bind_to) {
  switch (bind_to) {
    case BindTo::kNone:
      return "none";
    case BindTo::kCore:
      return "core";
    case BindTo::kSocket:
      return "socket";
  }
  return "?";
}

absl::string_view SshClientName(SshClient client) {
  return client == SshClient::kOpenssh ? "openssh" : "libssh2";
}

}  // namespace trainrun::launcher
