// FileStore: a rendezvous Store kept as files in a directory that every rank can see, as gloo's
// FileStore, so ranks can meet without a launcher (a shared file system, or one host's /tmp).
//
//   auto store = std::make_shared<trainrun::python::FileStore>("/tmp/job42");
//   trainrun::collectives::Communicator comm(store, rank, size);
//
// The Python package uses it when TRAINRUN_FILE_STORE names a directory (environment.h), and the
// Python tests use it to run ranks as plain processes. Waits poll the directory every millisecond
// or so; that is fine for rendezvous, which happens once.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "trainrun/rendezvous/store.h"

namespace trainrun::python {

class FileStore : public rendezvous::Store {
 public:
  // FileStore keeps its keys in `directory`, creating it when missing.
  explicit FileStore(std::string directory);

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               std::chrono::milliseconds timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::Status Barrier(const std::string& name, int count,
                       std::chrono::milliseconds timeout) override;

 private:
  // PathOf maps a key to a file name in directory_ (escaping '/' and other odd bytes).
  std::string PathOf(const std::string& key, const char* suffix) const;
  absl::StatusOr<int64_t> ReadCounter(const std::string& key);

  std::string directory_;
};

}  // namespace trainrun::python
