// The C API maps every exception to a status code and keeps its message per thread.
#include "trainrun/collectives/c_api.h"

#include <memory>
#include <string>

#include "trainrun/collectives/communicator.h"

struct trainrun_comm {
  std::unique_ptr<trainrun::collectives::Communicator> comm;
};

namespace {

using trainrun::collectives::DataType;
using trainrun::collectives::ReduceOp;

thread_local std::string last_error;

template <typename F>
trainrun_status Guard(F&& body) {
  try {
    body();
    return TRAINRUN_OK;
  } catch (const trainrun::InvalidArgumentError& e) {
    last_error = e.what();
    return TRAINRUN_INVALID_ARGUMENT;
  } catch (const trainrun::TimeoutError& e) {
    last_error = e.what();
    return TRAINRUN_TIMEOUT;
  } catch (const trainrun::IoError& e) {
    last_error = e.what();
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
  if (comm == nullptr || comm->comm == nullptr) {
    throw trainrun::InvalidArgumentError("the communicator is null");
  }
  return *comm->comm;
}

}  // namespace

extern "C" {

trainrun_status trainrun_comm_init(trainrun_comm** comm) {
  return Guard([&] {
    if (comm == nullptr) throw trainrun::InvalidArgumentError("trainrun_comm_init: comm is null");
    auto out = std::make_unique<trainrun_comm>();
    out->comm = trainrun::collectives::Communicator::FromEnvironment();
    *comm = out.release();
  });
}

void trainrun_comm_destroy(trainrun_comm* comm) { delete comm; }

#define TRAINRUN_INFO_GETTER(field)                                                  \
  int trainrun_comm_##field(const trainrun_comm* comm) {                             \
    return comm == nullptr || comm->comm == nullptr ? -1 : comm->comm->info().field; \
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
  return Guard([&] {
    Comm(comm).Allreduce(input, output, count, static_cast<DataType>(dtype),
                         static_cast<ReduceOp>(op));
  });
}

trainrun_status trainrun_broadcast(trainrun_comm* comm, void* data, size_t count,
                                   trainrun_dtype dtype, int root) {
  return Guard([&] { Comm(comm).Broadcast(data, count, static_cast<DataType>(dtype), root); });
}

trainrun_status trainrun_allgather(trainrun_comm* comm, const void* input, void* output,
                                   size_t count, trainrun_dtype dtype) {
  return Guard([&] { Comm(comm).Allgather(input, output, count, static_cast<DataType>(dtype)); });
}

trainrun_status trainrun_allgatherv(trainrun_comm* comm, const void* input, void* output,
                                    const size_t* counts, trainrun_dtype dtype) {
  return Guard([&] {
    auto& c = Comm(comm);
    if (counts == nullptr) throw trainrun::InvalidArgumentError("allgatherv: counts is null");
    c.Allgatherv(input, output, std::vector<size_t>(counts, counts + c.size()),
                 static_cast<DataType>(dtype));
  });
}

trainrun_status trainrun_reduce_scatter(trainrun_comm* comm, const void* input, void* output,
                                        size_t count, trainrun_dtype dtype, trainrun_op op) {
  return Guard([&] {
    Comm(comm).ReduceScatter(input, output, count, static_cast<DataType>(dtype),
                             static_cast<ReduceOp>(op));
  });
}

trainrun_status trainrun_barrier(trainrun_comm* comm) {
  return Guard([&] { Comm(comm).Barrier(); });
}

const char* trainrun_last_error(void) { return last_error.c_str(); }

}  // extern "C"
