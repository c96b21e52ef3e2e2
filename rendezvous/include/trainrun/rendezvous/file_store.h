// FileStore: a Store in a directory that processes on one host share, for tests that fork real
// processes, benchmarks in their standalone mode, and the Python package's launcher-less mode
// (TRAINRUN_FILE_STORE), as gloo has its FileStore beside its other stores. Not what a job under
// trainrun uses: that is the launcher's gRPC store. Its own target,
// trainrun::rendezvous_file_store, outside what a worker links by default.
//
//   auto store = std::make_shared<trainrun::rendezvous::FileStore>("/tmp/job42");
#pragma once

#include <string>

#include "trainrun/rendezvous/store.h"

namespace trainrun::rendezvous {

class FileStore : public Store {
 public:
  // FileStore uses `directory`, which must exist and be shared by every process of the job.
  explicit FileStore(std::string directory);

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               std::chrono::milliseconds timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::Status Barrier(const std::string& name, int count,
                       std::chrono::milliseconds timeout) override;

 private:
  std::string PathOf(const std::string& key) const;

  std::string directory_;
};

}  // namespace trainrun::rendezvous
