// ElasticSession: an elastic worker's side of the job's membership protocol (TRAINRUN_ELASTIC=1,
// trainrun --min-np; rendezvous/generation.h): it joins the job once, keeps the rendezvous store,
// and when a member is lost (or the job grows) connects to the job's next generation with a new
// communicator, a new rank and a new size.
//
//   ElasticSession session;
//   std::unique_ptr<Communicator> world = session.Join();  // generation 0, or the first with me
//   ... a collective throws IoError: a member was lost ...
//   world.reset();                                          // close the old data plane first
//   world = session.JoinNext();                             // the survivors, renumbered
//
// Runtime (runtime.h) drives it; a worker program uses the Runtime.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "trainrun/collectives/communicator.h"
#include "trainrun/rendezvous/store.h"

namespace trainrun::collectives {

class ElasticSession {
 public:
  // Requested: the environment asks for an elastic worker (TRAINRUN_ELASTIC=1 under trainrun).
  static bool Requested();

  // Join joins the job through its rendezvous (TRAINRUN_* variables) and connects to generation 0;
  // a rank the job grew by (TRAINRUN_ELASTIC_SLOT) waits for the first generation that has it.
  // Throws Error when the rendezvous refuses or does not answer, and what JoinNext throws.
  std::unique_ptr<Communicator> Join();

  // JoinNext waits for the job's next generation, then connects to its members. Throws Error (not
  // an IoError, which an elastic loop answers by waiting again) when none comes within the elastic
  // timeout or this rank is not a member, and what the communicator throws when a member is lost
  // while it connects (the caller then calls JoinNext again). The caller closes its previous
  // communicator first.
  std::unique_ptr<Communicator> JoinNext() { return JoinNext(/*first_with_me=*/false); }

  // generation is the generation of the last communicator made (0 before any change).
  int generation() const { return generation_; }
  // slot is this worker's rank at the start of the job (or the slot it was started for).
  int slot() const { return slot_; }

  // LatestGeneration is the job's newest generation (a store call). Throws IoError when the
  // rendezvous cannot be asked.
  int LatestGeneration();
  // Moved: a generation newer than generation() has been published (a store call; false when the
  // rendezvous cannot be asked).
  bool Moved();
  // LatestAdds: the job's newest generation has a member that generation() lacks (the job grew;
  // its newcomers need the state). A store call; throws IoError when it cannot be read.
  bool LatestAdds();

 private:
  std::unique_ptr<Communicator> JoinNext(bool first_with_me);

  std::shared_ptr<rendezvous::Store> store_;
  int slot_ = 0;
  int generation_ = 0;
  std::chrono::milliseconds timeout_{0};  // the longest wait for a next generation
  std::vector<int> members_;              // the slots of `generation_`, in rank order
};

}  // namespace trainrun::collectives
