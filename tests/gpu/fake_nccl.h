// FakeNccl: a NcclApi (collectives/src/gpu/nccl_api.h) over FakeGpuRuntime, for tests only (no
// shipped binary contains it; DeviceOptions::nccl_api_for_tests is how a C++ test hands it to a
// DeviceCollectives), so that the NCCL path's logic runs in CI without a GPU.
//
// Each NCCL call (or each group, ncclGroupStart to ncclGroupEnd) is enqueued on the stream it is
// given, as a "kernel" of the fake runtime: it runs in that stream's order, after what the stream
// waits for. There it meets the same call of every other rank of the communicator (ranks are
// threads of one process; calls are matched by a sequence number per communicator), checks that
// every rank posted the same collectives (kind, count, type, op, root; sends and receives in
// pairs) and only then reads every rank's inputs and writes its own outputs. A rank that posted
// something else (it fused a different number of allreduces, say), or a peer that posts nothing
// within the meeting timeout, is not a hang: the call fails on every rank that came, with a
// sentence (ncclGetLastError) that ncclCommGetAsyncError reports as ncclInvalidUsage, so the
// collective's Wait throws; the failed call holds its stream until the communicator is destroyed
// or aborted, as a GPU's stream would stay behind a failed NCCL kernel.
//
// The table's functions are plain function pointers (NCCL's C API), so they find the fake
// through one process-wide pointer: one FakeNccl at a time.
//
//   FakeGpuRuntime runtime(2);
//   FakeNccl nccl(runtime);
//   DeviceOptions options;
//   options.nccl_api_for_tests = nccl.api();
//   ... every rank's DeviceCollectives(comm, runtime, options) goes over the fake NCCL
//   REQUIRE(nccl.failures().empty());
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fake_gpu_runtime.h"
#include "gpu/nccl_api.h"

namespace trainrun::collectives::gpu::testing {

class FakeNccl {
 public:
  // `meet_timeout`: how long a call waits for the other ranks' same call before it fails.
  explicit FakeNccl(FakeGpuRuntime& runtime,
                    std::chrono::milliseconds meet_timeout = std::chrono::seconds(20));
  ~FakeNccl();
  FakeNccl(const FakeNccl&) = delete;
  FakeNccl& operator=(const FakeNccl&) = delete;

  // api: the table, valid while this FakeNccl lives.
  const NcclApi* api() const;
  // allreduces: ncclAllReduce calls every rank ran together (counted once per meeting), and the
  // element count of each, in order; meetings: calls and groups met so far.
  size_t allreduces() const;
  std::vector<size_t> allreduce_counts() const;
  size_t meetings() const;
  // pre_mul_sums: ncclAllReduce calls with a ncclRedOpCreatePreMulSum op, counted so.
  size_t pre_mul_sums() const;
  // pre_mul_sum_ops: ncclRedOpCreatePreMulSum calls of every rank; live_ops: those of them that
  // ncclRedOpDestroy has not destroyed yet.
  size_t pre_mul_sum_ops() const;
  size_t live_ops() const;
  // failures: the sentence of every call that failed (one per rank that came).
  std::vector<std::string> failures() const;

  struct State;  // the fake's communicators and meetings (fake_nccl.cc)

 private:
  std::unique_ptr<State> state_;
};

}  // namespace trainrun::collectives::gpu::testing
