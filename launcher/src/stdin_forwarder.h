// StdinForwarder: trainrun's stdin to rank 0 (the others get /dev/null), as mpirun does.
#pragma once

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <memory>

namespace trainrun::launcher::internal {

class StdinForwarder {
 public:
  // Create decides how rank 0 gets trainrun's stdin: a file or /dev/null is handed over as it is
  // (it cannot be polled, and needs no pump); a pipe, socket or terminal is pumped through a pipe
  // of our own, because rank 0 runs in a process group of its own and would be stopped by SIGTTIN
  // reading the terminal directly. A terminal is read only while trainrun is in the foreground.
  static std::unique_ptr<StdinForwarder> Create(boost::asio::io_context& io);
  ~StdinForwarder();

  // rank_stdin is the fd to give rank 0 as fd 0; -1 means /dev/null.
  int rank_stdin() const { return rank_end_; }
  // RankStarted closes our copy of rank 0's end, so rank 0 alone holds it.
  void RankStarted();

 private:
  explicit StdinForwarder(boost::asio::io_context& io) : in_(io), out_(io) {}
  void WaitForInput();
  void Stop();

  boost::asio::posix::stream_descriptor in_;   // a dup of fd 0
  boost::asio::posix::stream_descriptor out_;  // the pipe's write end
  int rank_end_ = -1;
  bool owns_rank_end_ = false;
  std::array<char, 64 * 1024> buffer_{};
};

}  // namespace trainrun::launcher::internal
