#include "stdin_forwarder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/write.hpp>
#include <cerrno>

#include "posix/unique_fd.h"

namespace trainrun::launcher::internal {
namespace asio = boost::asio;

std::unique_ptr<StdinForwarder> StdinForwarder::Create(asio::io_context& io) {
  std::unique_ptr<StdinForwarder> forwarder(new StdinForwarder(io));
  struct stat st {};
  if (fstat(0, &st) != 0) return forwarder;  // no stdin at all: rank 0 gets /dev/null
  if (S_ISREG(st.st_mode) || (S_ISCHR(st.st_mode) && !isatty(0))) {
    forwarder->rank_end_ = 0;  // handed over; the shim dups it
    return forwarder;
  }
  if (isatty(0) && tcgetpgrp(0) != getpgrp()) return forwarder;  // background job: /dev/null
  posix::UniqueFd in(fcntl(0, F_DUPFD_CLOEXEC, 3));
  int fds[2];
  if (!in || pipe2(fds, O_CLOEXEC) != 0) return forwarder;
  posix::UniqueFd pipe_read(fds[0]), pipe_write(fds[1]);
  boost::system::error_code error;
  forwarder->in_.assign(in.get(), error);  // epoll refuses what cannot be polled
  if (error) {
    forwarder->rank_end_ = 0;
    return forwarder;
  }
  in.Release();  // in_ owns it now
  forwarder->out_.assign(pipe_write.Release());
  forwarder->rank_end_ = pipe_read.Release();
  forwarder->owns_rank_end_ = true;
  forwarder->WaitForInput();
  return forwarder;
}

StdinForwarder::~StdinForwarder() {
  RankStarted();
  Stop();
}

void StdinForwarder::RankStarted() {
  if (owns_rank_end_) close(rank_end_);
  owns_rank_end_ = false;
}

void StdinForwarder::Stop() {
  boost::system::error_code ignored;
  in_.close(ignored);
  out_.close(ignored);  // rank 0 reads EOF
}

void StdinForwarder::WaitForInput() {
  // Wait for readiness, then read(2) on the descriptor as it is: an Asio read would set O_NONBLOCK
  // on the open file description, which is shared with the shell (and the terminal) after we exit.
  in_.async_wait(asio::posix::stream_descriptor::wait_read,
                 [this](const boost::system::error_code& error) {
                   if (error) return;
                   ssize_t n;
                   do {
                     n = read(in_.native_handle(), buffer_.data(), buffer_.size());
                   } while (n < 0 && errno == EINTR);
                   if (n <= 0) {
                     Stop();  // EOF (or an error): rank 0 sees EOF too
                     return;
                   }
                   asio::async_write(out_, asio::buffer(buffer_.data(), static_cast<size_t>(n)),
                                     [this](const boost::system::error_code& write_error, size_t) {
                                       if (write_error) {
                                         Stop();  // rank 0 is gone or closed its stdin
                                         return;
                                       }
                                       WaitForInput();
                                     });
                 });
}

}  // namespace trainrun::launcher::internal
