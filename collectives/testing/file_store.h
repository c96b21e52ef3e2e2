// FileStore: a Store in a directory that processes on one host share, for benchmarks in their
// standalone mode and for tests that fork real processes (gloo has the same FileStore). Not for
// production: the launcher's gRPC store is.
//
//   auto store = std::make_shared<FileStore>("/tmp/job42");
#pragma once

#include <string>

#include "trainrun/rendezvous/store.h"

namespace trainrun::collectives::testing {

class FileStore : public rendezvous::Store {
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

}  // namespace trainrun::collectives::testing
