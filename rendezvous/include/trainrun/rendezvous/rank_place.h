// RankPlace: where a worker stands in its job, as the rendezvous tells it and the collectives use
// it.
#pragma once

namespace trainrun::rendezvous {

// RankPlace is a worker's place in the job (DESIGN.md, "Rank layout"): the one struct for it on
// the worker side (the collectives' RankInfo is this struct). The defaults are one rank alone.
struct RankPlace {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
};

}  // namespace trainrun::rendezvous
