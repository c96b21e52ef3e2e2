#include "elastic_session.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <string>

#include "rank_setting.h"
#include "trainrun/rendezvous/client.h"
#include "trainrun/rendezvous/environment.h"
#include "trainrun/rendezvous/generation.h"

namespace trainrun::collectives {
namespace {

using ::trainrun::internal::MakeMessage;

bool IsSet(const char* name) {
  std::optional<std::string> value = env::Lookup(name);
  return value && !value->empty();
}

// ReadGeneration reads generation `number`'s membership.
absl::StatusOr<rendezvous::Generation> ReadGeneration(rendezvous::Store& store, int number,
                                                      std::chrono::milliseconds timeout) {
  absl::StatusOr<std::vector<std::string>> text =
      store.Get({rendezvous::GenerationKey(number)}, timeout);
  if (!text.ok()) return text.status();
  return rendezvous::Generation::Decode(number, (*text)[0]);
}

// LosesMember answers CommunicatorOptions::interrupt for an elastic worker's communicator of
// generation `generation` (members `members`): true once a newer generation has been published
// that leaves one of them out (a lost rank or host; a generation that only adds ranks is not a
// reason to give up a collective). Remembers the newest generation it found harmless.
std::function<bool()> LosesMember(std::shared_ptr<rendezvous::Store> store, int generation,
                                  std::vector<int> members) {
  auto checked = std::make_shared<int>(generation);
  return [store = std::move(store), members = std::move(members), checked]() {
    absl::StatusOr<int> latest = rendezvous::LatestGeneration(*store);
    if (!latest.ok() || *latest <= *checked) return false;
    absl::StatusOr<rendezvous::Generation> next =
        ReadGeneration(*store, *latest, std::chrono::milliseconds(1000));
    if (!next.ok()) return false;
    for (int slot : members) {
      if (!next->PlaceOf(slot)) return true;
    }
    *checked = *latest;
    return false;
  };
}

}  // namespace

bool ElasticSession::Requested() {
  std::optional<std::string> value = env::Lookup(env::kElastic);
  return value && *value == "1" && IsSet(env::kRendezvousAddr);
}

std::unique_ptr<Communicator> ElasticSession::Join() {
  const auto timeout = std::chrono::milliseconds(RankSetting(env::kTimeoutSeconds) * 1000);
  auto session = rendezvous::JoinFromEnvironment(timeout);
  if (!session.ok()) {
    throw Error(MakeMessage("cannot join the trainrun job: ", session.status().message()));
  }
  store_ = session->store;
  slot_ = session->assignment.rank;
  generation_ = 0;
  timeout_ = std::chrono::seconds(RankSetting(env::kElasticTimeoutSeconds));
  // A rank the job grew by (started while the job ran) joins the first generation that has it.
  if (IsSet(env::kElasticSlot)) return JoinNext(/*first_with_me=*/true);
  const RankInfo& info = session->assignment;
  members_.clear();
  for (int slot = 0; slot < info.size; ++slot) members_.push_back(slot);
  CommunicatorOptions options;
  options.job_id = session->assignment.job_id;
  options.interrupt = LosesMember(store_, 0, members_);
  return std::make_unique<Communicator>(store_, info, options);
}

std::unique_ptr<Communicator> ElasticSession::JoinNext(bool first_with_me) {
  absl::StatusOr<rendezvous::Generation> next =
      rendezvous::WaitForGeneration(*store_, generation_ + 1, timeout_);
  while (first_with_me && next.ok() && !next->PlaceOf(slot_)) {
    generation_ = next->number;
    next = rendezvous::WaitForGeneration(*store_, generation_ + 1, timeout_);
  }
  if (!next.ok()) {
    throw Error(MakeMessage("the rank that started as rank ", slot_,
                            " found no generation of the elastic job after generation ",
                            generation_, ": ", next.status().message()));
  }
  std::optional<RankInfo> place = next->PlaceOf(slot_);
  if (!place) {
    throw Error(MakeMessage("slot ", slot_, " is not a member of generation ", next->number,
                            " of the elastic job"));
  }
  // From here on a failure waits for the generation after this one.
  generation_ = next->number;
  members_.clear();
  for (const rendezvous::GenerationMember& member : next->members) members_.push_back(member.slot);
  CommunicatorOptions options;
  options.name = MakeMessage("world.g", next->number);
  options.interrupt = LosesMember(store_, next->number, members_);
  auto comm = std::make_unique<Communicator>(store_, *place, options);
  (void)store_->Set(MakeMessage(rendezvous::GenerationJoinedPrefix(next->number), slot_), "");
  return comm;
}

int ElasticSession::LatestGeneration() {
  absl::StatusOr<int> latest = rendezvous::LatestGeneration(*store_);
  if (!latest.ok()) {
    throw IoError(
        MakeMessage("cannot read the elastic job's generation: ", latest.status().message()));
  }
  return *latest;
}

bool ElasticSession::Moved() {
  absl::StatusOr<int> latest = rendezvous::LatestGeneration(*store_);
  return latest.ok() && *latest > generation_;
}

bool ElasticSession::LatestAdds() {
  absl::StatusOr<int> latest = rendezvous::LatestGeneration(*store_);
  if (!latest.ok() || *latest <= generation_) return false;
  absl::StatusOr<rendezvous::Generation> next =
      ReadGeneration(*store_, *latest, std::chrono::milliseconds(10000));
  if (!next.ok()) {
    throw IoError(MakeMessage("cannot read the elastic job's generation ", *latest, ": ",
                              next.status().message()));
  }
  for (const rendezvous::GenerationMember& member : next->members) {
    if (std::find(members_.begin(), members_.end(), member.slot) == members_.end()) return true;
  }
  return false;
}

}  // namespace trainrun::collectives
