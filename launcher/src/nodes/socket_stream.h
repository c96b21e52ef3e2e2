// SocketStream: a HostStream over a connected TCP socket — per-node mode's connection between
// node 0's trainrun (the launcher) and a joining node's trainrun (its agent), which dialled in.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "channel/host_channel.h"
#include "posix/unique_fd.h"

namespace trainrun::launcher::nodes {

// NumericAddress is the address of a socket's own end (`peer` false) or the other end, without
// the port; "" when unknown.
std::string NumericAddress(int fd, bool peer);

class SocketStream : public channel::HostStream {
 public:
  // Takes the connected socket `fd`; `name` names the other side in errors ("node 1").
  // `keep_alive` is held as long as the stream (node 0's join port, which stays open while any
  // joined node's stream lives); `joined_slots` is the joined node's --nproc-per-node; `seal_key`:
  // the join's SealKey (node_join.h), which Seal uses; `on_end` is called once, when a Read finds
  // the connection ended or failed, or else when the stream is destroyed (node 0's join port then
  // lets that node join again).
  static absl::StatusOr<std::unique_ptr<SocketStream>> Create(
      posix::UniqueFd fd, std::string name, std::shared_ptr<void> keep_alive = nullptr,
      int joined_slots = 0, std::string seal_key = "", std::function<void()> on_end = {});
  ~SocketStream() override;

  absl::Status Write(absl::string_view data, absl::Duration timeout) override;
  absl::StatusOr<size_t> Read(char* buffer, size_t size, absl::Duration timeout) override;
  void Interrupt() override;
  void CloseStdin() override;
  absl::Status EndStatus() override;
  std::string LocalAddress() const override;
  std::string RemoteAddress() const override;
  int JoinedSlots() const override { return joined_slots_; }
  // Seal hides the job's token from the wire with the join's key (node_join.h's Seal).
  std::string Seal(const std::string& secret) const override;

 private:
  SocketStream(posix::UniqueFd fd, posix::UniqueFd wake_read, posix::UniqueFd wake_write,
               std::string name);
  void Ended();

  std::shared_ptr<void> keep_alive_;  // first: released last
  posix::UniqueFd fd_;
  posix::UniqueFd wake_read_;  // a pipe: Interrupt writes, a blocked Read wakes
  posix::UniqueFd wake_write_;
  const std::string name_;
  std::string seal_key_;
  std::atomic<bool> interrupted_{false};
  std::function<void()> on_end_;
  std::atomic<bool> ended_{false};  // on_end_ was called
  int joined_slots_ = 0;
  absl::Status end_;
};

}  // namespace trainrun::launcher::nodes
