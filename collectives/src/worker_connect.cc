#include "worker_connect.h"

#include <sys/stat.h>

#include <string>

#include "trainrun/rendezvous/environment.h"
#include "trainrun/rendezvous/file_store.h"
#include "trainrun/rendezvous/memory_store.h"

namespace trainrun::collectives {
namespace {

using ::trainrun::internal::MakeMessage;

std::optional<std::string> NonEmpty(const char* name) {
  std::optional<std::string> value = env::Lookup(name);
  if (!value || value->empty()) return std::nullopt;
  return value;
}

}  // namespace

int IntFromEnvironment(const char* name, std::optional<int> fallback, const char* why) {
  std::optional<std::string> value = NonEmpty(name);
  if (!value) {
    if (fallback) return *fallback;
    throw Error(MakeMessage(name, " is not set; ", why));
  }
  try {
    size_t used = 0;
    int parsed = std::stoi(*value, &used);
    if (used == value->size()) return parsed;
  } catch (const std::exception&) {
  }
  throw Error(MakeMessage(name, "=", *value, " is not an integer"));
}

std::unique_ptr<Communicator> ConnectWorld() {
  if (NonEmpty(env::kRendezvousAddr)) return Communicator::FromEnvironment();
  if (std::optional<std::string> directory = NonEmpty(env::kFileStore)) {
    const char* why = "TRAINRUN_FILE_STORE needs every rank's TRAINRUN_RANK and TRAINRUN_SIZE";
    RankInfo info;
    info.rank = IntFromEnvironment(env::kRank, std::nullopt, why);
    info.size = IntFromEnvironment(env::kSize, std::nullopt, why);
    info.local_rank = IntFromEnvironment(env::kLocalRank, info.rank, why);
    info.local_size = IntFromEnvironment(env::kLocalSize, info.size, why);
    info.cross_rank = IntFromEnvironment(env::kCrossRank, 0, why);
    info.cross_size = IntFromEnvironment(env::kCrossSize, 1, why);
    CommunicatorOptions options;
    if (!NonEmpty(env::kJobToken)) options.job_token = "file-store:" + *directory;
    if (!NonEmpty(env::kJobId)) options.job_id = *directory;
    ::mkdir(directory->c_str(), 0700);  // Already there is fine; the store reports real trouble.
    return std::make_unique<Communicator>(std::make_shared<rendezvous::FileStore>(*directory), info,
                                          options);
  }
  // A job of one, unless the environment says this process is one rank of several: then the
  // launcher did not give us its rendezvous, and running alone would silently train wrong.
  if (IntFromEnvironment(env::kSize, 1, "") > 1) {
    throw Error(MakeMessage(
        env::kSize, "=", *NonEmpty(env::kSize), " but ", env::kRendezvousAddr,
        " is not set, so this rank cannot find the others; start the job with trainrun (or set ",
        env::kFileStore, " to a directory shared by the ranks)"));
  }
  CommunicatorOptions options;
  options.job_token = "single-process";
  options.job_id = "single-process";
  options.listen_address = "127.0.0.1";
  return std::make_unique<Communicator>(std::make_shared<rendezvous::MemoryStore>(), 0, 1, options);
}

}  // namespace trainrun::collectives
