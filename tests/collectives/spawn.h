// Spawn runs `size` ranks as threads, as gloo's tests do, and rethrows the first rank's failure.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "trainrun/rendezvous/memory_store.h"

namespace trainrun::collectives::testing {

inline void Spawn(int size,
                  const std::function<void(int rank, std::shared_ptr<rendezvous::Store>)>& fn) {
  auto store = std::make_shared<rendezvous::MemoryStore>();
  std::vector<std::exception_ptr> errors(size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        fn(rank, store);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace trainrun::collectives::testing
