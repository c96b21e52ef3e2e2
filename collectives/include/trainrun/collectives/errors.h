// The exceptions the collectives library throws, as gloo's, and the one invariant-check macro.
//
//   TRAINRUN_ENFORCE(count <= capacity, "count ", count, " exceeds capacity ", capacity);
//   throw trainrun::IoError("connection to rank 3 closed");
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace trainrun {

// Error is the base of every exception the collectives library throws.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// IoError: a connection to a peer failed (closed, reset, refused, bad handshake).
class IoError : public Error {
 public:
  using Error::Error;
};

// TimeoutError: a wait for a peer or the rendezvous passed its deadline.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// InvalidArgumentError: the caller passed something the operation cannot take.
class InvalidArgumentError : public Error {
 public:
  using Error::Error;
};

// MismatchError: the ranks of a communicator called different collectives, or the same one with
// different arguments (shape, type, op, root, name). Every rank raises it for the same call, and
// the communicator stays usable.
class MismatchError : public InvalidArgumentError {
 public:
  using InvalidArgumentError::InvalidArgumentError;
};

// OrderError: the ranks' next collectives have different names: they were called in different
// orders (as Horovod allows: collectives are matched by name). Every rank raises it for the same
// call, which did nothing. The communication thread (comm_thread.h) catches it and negotiates the
// order; a caller driving a Communicator itself sees a MismatchError.
class OrderError : public MismatchError {
 public:
  using MismatchError::MismatchError;
};

// EnforceError: an internal invariant failed (a bug in trainrun).
class EnforceError : public Error {
 public:
  using Error::Error;
};

namespace internal {

// StrCat-like formatting for error messages without a dependency on absl in public headers.
template <typename... Args>
std::string MakeMessage(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

}  // namespace internal
}  // namespace trainrun

// TRAINRUN_ENFORCE throws EnforceError with the condition, the place and the message (one or more
// streamable values) when `cond` is false.
#define TRAINRUN_ENFORCE(cond, ...)                                         \
  do {                                                                      \
    if (!(cond)) {                                                          \
      throw ::trainrun::EnforceError(::trainrun::internal::MakeMessage(     \
          __FILE__, ":", __LINE__, ": ", #cond, " failed: ", __VA_ARGS__)); \
    }                                                                       \
  } while (0)
