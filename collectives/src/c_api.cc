// The C API maps every exception to a status code and keeps its message per thread. A
// trainrun_comm is a worker runtime (runtime.h): it joins as every language's worker does, and in
// an elastic job rejoins the next generation; the C calls run their collectives on its world
// communicator from the caller's thread (nothing is submitted to its communication thread).
#include "trainrun/collectives/c_api.h"

#include <string>

#include "trainrun/collectives/communicator.h"
#include "trainrun/collectives/runtime.h"

struct trainrun_comm {
  // mutable: the rank getters take a const trainrun_comm*, and the runtime's world() is not const.
  mutable trainrun::collectives::Runtime runtime;
};

namespace {

using trainrun::collectives::DataType;
using trainrun::collectives::ReduceOp;

thread_local std::string last_error;

// Guard runs body and maps what it throws; a lost peer (IoError, TimeoutError) is noted on `comm`
// (when given), so that its next rejoin joins the elastic job's next generation.
template <typename F>
trainrun_status Guard(F&& body, trainrun_comm* comm = nullptr) {
  try {
    body();
    return TRAINRUN_OK;
  } catch (const trainrun::InvalidArgumentError& e) {
    last_error = e.what();
    return TRAINRUN_INVALID_ARGUMENT;
  } catch (const trainrun::TimeoutError& e) {
    last_error = e.what();
    if (comm != nullptr) comm->runtime.NoteFailure();
    return TRAINRUN_TIMEOUT;
  } catch (const trainrun::IoError& e) {
    last_error = e.what();
    if (comm != nullptr) comm->runtime.NoteFailure();
    return TRAINRUN_IO_ERROR;
  } catch (const trainrun::EnforceError& e) {
    last_error = e.what();
    return TRAINRUN_INTERNAL;
  } catch (const std::exception& e) {
    last_error = e.what();
    return TRAINRUN_ERROR;
  } catch (...) {
    last_error = "unknown error";
    return TRAINRUN_ERROR;
  }
}

trainrun::collectives::Communicator& Comm(trainrun_comm* comm) {
  if (comm == nullptr) throw trainrun::InvalidArgumentError("the communicator is null");
  if (!comm->runtime.initialized()) {
    throw trainrun::Error(
        "the communicator is in no generation of the job (its last trainrun_comm_rejoin "
        "failed); call trainrun_comm_rejoin again");
  }
  return comm->runtime.world();
}

// Usable: the communicator is in a generation (the getters' -1 otherwise).
bool Usable(const trainrun_comm* comm) { return comm != nullptr && comm->runtime.initialized(); }

}  // namespace

extern "C" {

trainrun_status trainrun_comm_init(trainrun_comm** comm) {
  return Guard([&] {
    if (comm == nullptr) throw trainrun::InvalidArgumentError("trainrun_comm_init: comm is null");
    auto out = std::make_unique<trainrun_comm>();
    out->runtime.Init();
    *comm = out.release();
  });
}

void trainrun_comm_destroy(trainrun_comm* comm) { delete comm; }

#define TRAINRUN_INFO_GETTER(field)                                \
  int trainrun_comm_##field(const trainrun_comm* comm) {           \
    return Usable(comm) ? comm->runtime.world().info().field : -1; \
  }
TRAINRUN_INFO_GETTER(rank)
TRAINRUN_INFO_GETTER(size)
TRAINRUN_INFO_GETTER(local_rank)
TRAINRUN_INFO_GETTER(local_size)
TRAINRUN_INFO_GETTER(cross_rank)
TRAINRUN_INFO_GETTER(cross_size)
#undef TRAINRUN_INFO_GETTER

trainrun_status trainrun_allreduce(trainrun_comm* comm, const void* input, void* output,
                                   size_t count, trainrun_dtype dtype, trainrun_op op) {
  return Guard(
      [&] {
        Comm(comm).Allreduce(input, output, count, static_cast<DataType>(dtype),
                             static_cast<ReduceOp>(op));
      },
      comm);
}

trainrun_status trainrun_broadcast(trainrun_comm* comm, void* data, size_t count,
                                   trainrun_dtype dtype, int root) {
  return Guard([&] { Comm(comm).Broadcast(data, count, static_cast<DataType>(dtype), root); },
               comm);
}

trainrun_status trainrun_allgather(trainrun_comm* comm, const void* input, void* output,
                                   size_t count, trainrun_dtype dtype) {
  return Guard([&] { Comm(comm).Allgather(input, output, count, static_cast<DataType>(dtype)); },
               comm);
}

trainrun_status trainrun_allgatherv(trainrun_comm* comm, const void* input, void* output,
                                    const size_t* counts, trainrun_dtype dtype) {
  return Guard(
      [&] {
        auto& c = Comm(comm);
        if (counts == nullptr) throw trainrun::InvalidArgumentError("allgatherv: counts is null");
        c.Allgatherv(input, output, std::vector<size_t>(counts, counts + c.size()),
                     static_cast<DataType>(dtype));
      },
      comm);
}

trainrun_status trainrun_reduce_scatter(trainrun_comm* comm, const void* input, void* output,
                                        size_t count, trainrun_dtype dtype, trainrun_op op) {
  return Guard(
      [&] {
        Comm(comm).ReduceScatter(input, output, count, static_cast<DataType>(dtype),
                                 static_cast<ReduceOp>(op));
      },
      comm);
}

trainrun_status trainrun_barrier(trainrun_comm* comm) {
  return Guard([&] { Comm(comm).Barrier(); }, comm);
}

int trainrun_comm_elastic(const trainrun_comm* comm) {
  return comm == nullptr ? -1 : comm->runtime.elastic() ? 1 : 0;
}

int trainrun_comm_generation(const trainrun_comm* comm) {
  return comm == nullptr ? -1 : comm->runtime.generation();
}

int trainrun_comm_slot(const trainrun_comm* comm) {
  return Usable(comm) ? comm->runtime.slot() : -1;
}

trainrun_status trainrun_comm_latest_generation(trainrun_comm* comm, int* generation, int* adds) {
  return Guard([&] {
    if (comm == nullptr) throw trainrun::InvalidArgumentError("the communicator is null");
    if (generation == nullptr) {
      throw trainrun::InvalidArgumentError("trainrun_comm_latest_generation: generation is null");
    }
    *generation = comm->runtime.LatestGeneration();
    if (adds != nullptr) *adds = comm->runtime.LatestGenerationAdds() ? 1 : 0;
  });
}

trainrun_status trainrun_comm_rejoin(trainrun_comm* comm) {
  return Guard([&] {
    if (comm == nullptr) throw trainrun::InvalidArgumentError("the communicator is null");
    comm->runtime.Shutdown();
    comm->runtime.Init();
  });
}

const char* trainrun_last_error(void) { return last_error.c_str(); }

}  // extern "C"
