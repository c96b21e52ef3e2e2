// NcclApi: NCCL's entry points as a table of function pointers, so that DeviceCollectives calls
// NCCL without linking it (LoadNcclApi resolves the table from the library loader.h opens) and the
// tests can hand it a fake table instead (tests/gpu/fake_nccl.h, through
// DeviceOptions::nccl_api_for_tests, which only C++ test code sets).
//
// Types are NCCL's (nccl.h) with the communicator as void*, enums as int, and ncclUniqueId as 128
// bytes, which NCCL has kept since 2.0; the enum values below are stable across NCCL 2 releases.
//
//   const NcclApi* nccl = LoadNcclApi(&why);
//   nccl->all_reduce(in, out, count, kNcclFloat32, kNcclSum, comm, stream);
#pragma once

#include <cstddef>
#include <string>

namespace trainrun::collectives::gpu {

constexpr int kNcclSuccess = 0;
constexpr int kNcclSystemError = 2;
constexpr int kNcclInvalidArgument = 4;
constexpr int kNcclInvalidUsage = 5;
constexpr int kNcclRemoteError = 6;
constexpr int kNcclInProgress = 7;
constexpr size_t kNcclUniqueIdBytes = 128;

enum NcclType {
  kNcclInt8 = 0,
  kNcclUint8 = 1,
  kNcclInt32 = 2,
  kNcclInt64 = 4,
  kNcclFloat16 = 6,
  kNcclFloat32 = 7,
  kNcclFloat64 = 8,
  kNcclBfloat16 = 9
};
enum NcclOp { kNcclSum = 0, kNcclProd = 1, kNcclMax = 2, kNcclMin = 3, kNcclAvg = 4 };
// ncclScalarResidence: where ncclRedOpCreatePreMulSum's scalar lives (here: host memory, read
// when the op is created).
constexpr int kNcclScalarHostImmediate = 1;

struct NcclUniqueId {
  char internal[kNcclUniqueIdBytes];
};

struct NcclApi {
  int (*get_version)(int*);
  int (*get_unique_id)(NcclUniqueId*);
  int (*comm_init_rank)(void**, int, NcclUniqueId, int);
  int (*comm_destroy)(void*);
  int (*comm_abort)(void*);
  int (*comm_get_async_error)(void*, int*);
  const char* (*get_error_string)(int);
  const char* (*get_last_error)(void*);
  int (*all_reduce)(const void*, void*, size_t, int, int, void*, void*);
  int (*broadcast)(const void*, void*, size_t, int, int, void*, void*);
  int (*all_gather)(const void*, void*, size_t, int, void*, void*);
  int (*reduce_scatter)(const void*, void*, size_t, int, int, void*, void*);
  int (*send)(const void*, size_t, int, int, void*, void*);
  int (*recv)(void*, size_t, int, int, void*, void*);
  int (*group_start)();
  int (*group_end)();
  // ncclRedOpCreatePreMulSum(op, scalar, datatype, residence, comm): a sum of each input
  // multiplied by *scalar (of `datatype`) first; ncclRedOpDestroy(op, comm).
  int (*red_op_create_pre_mul_sum)(int*, void*, int, int, void*);
  int (*red_op_destroy)(int, void*);
};

// LoadNcclApi returns the table resolved from the NCCL library loader.h's OpenNccl found (once
// per process), or null with *why_not (when not null) set to one sentence.
const NcclApi* LoadNcclApi(std::string* why_not);

}  // namespace trainrun::collectives::gpu
