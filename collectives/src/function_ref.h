// FunctionRef: a non-owning reference to a callable, for a callback that is called while the call
// that takes it runs (as absl::FunctionRef). Unlike std::function it never allocates: a small
// allreduce's per-call cost has no room for a malloc and a free.
//
//   bool Visit(FunctionRef<bool(int)> fn);
//   Visit([&](int x) { return x > limit; });
#pragma once

#include <type_traits>
#include <utility>

namespace trainrun::collectives::internal {

template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  // The callable must outlive every call through this reference.
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f)  // NOLINT(google-explicit-constructor): passed as a lambda, as std::function
      : object_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* object, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(object))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace trainrun::collectives::internal
