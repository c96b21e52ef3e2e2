// PipedHostStream: one host's agent reached through a program on this machine (`srun`, an rsh
// agent such as `qrsh -inherit` or `kubectl exec`), whose stdin and stdout are the agent's. The
// stream of both channels that start a program per host (slurm/srun_host_channel.h,
// rsh/rsh_host_channel.h); only the words of its end differ.
//
//   PipedHostStream::Words words{"srun", "the agent's job step (srun)", AllocationEnded};
//   auto stream = std::make_unique<PipedHostStream>(host, std::move(child), route, words);
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "channel/host_channel.h"
#include "posix/piped_child.h"
#include "ssh/tcp_connect.h"

namespace trainrun::launcher::rsh {

class PipedHostStream final : public channel::HostStream {
 public:
  struct Words {
    std::string program;  // "srun", "qrsh": "<program> was killed by signal N"
    std::string step;     // "the agent's job step (srun)": "<step> ended with status N: ..."
    // Why the scheduler ended the host's step, asked when the program exited non-zero ("" when it
    // cannot tell, or when nullptr): "Slurm job 7 was cancelled (scancel)".
    std::function<std::string()> scheduler_ended;
  };

  PipedHostStream(std::string host, std::unique_ptr<posix::PipedChild> child,
                  ssh::RouteAddresses route, Words words);

  absl::Status Write(absl::string_view data, absl::Duration timeout) override;
  absl::StatusOr<size_t> Read(char* buffer, size_t size, absl::Duration timeout) override;
  void Interrupt() override;
  void CloseStdin() override;
  absl::Status EndStatus() override;
  std::string LocalAddress() const override { return route_.local; }
  std::string RemoteAddress() const override { return route_.remote; }

 private:
  const std::string host_;
  // Dropping it closes the agent's stdin and sends the program SIGTERM, which ends the remote
  // side (srun cancels its step; an rsh agent closes its connection).
  const std::unique_ptr<posix::PipedChild> child_;
  const ssh::RouteAddresses route_;
  const Words words_;
};

}  // namespace trainrun::launcher::rsh
