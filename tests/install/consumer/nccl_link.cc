// Links trainrun::collectives_nccl from an installed trainrun. Without arguments it only proves the
// library and its CUDA and NCCL dependencies load; with --run, under trainrun on a GPU host, it
// allreduces one float per rank on the GPUs and checks the sum.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#include "trainrun/collectives/nccl/communicator.h"

int main(int argc, char** argv) {
  using trainrun::collectives::nccl::Communicator;
  using trainrun::collectives::nccl::DataType;
  using trainrun::collectives::nccl::ReduceOp;
  if (argc < 2 || std::strcmp(argv[1], "--run") != 0) {
    std::printf("nccl_link: trainrun::collectives_nccl loaded (%s)\n",
                trainrun::collectives::nccl::DataTypeName(DataType::kFloat32));
    return 0;
  }
  auto comm = Communicator::FromEnvironment();
  float* value = nullptr;
  cudaMalloc(&value, sizeof(float));
  float mine = static_cast<float>(comm->rank() + 1);
  cudaMemcpy(value, &mine, sizeof mine, cudaMemcpyHostToDevice);
  comm->Allreduce(value, value, 1, DataType::kFloat32, ReduceOp::kSum);
  comm->Synchronize();
  float sum = 0;
  cudaMemcpy(&sum, value, sizeof sum, cudaMemcpyDeviceToHost);
  cudaFree(value);
  const float expected = comm->size() * (comm->size() + 1) / 2.0f;
  std::printf("rank %d of %d: NCCL allreduce sum %g %s\n", comm->rank(), comm->size(), sum,
              sum == expected ? "ok" : "WRONG");
  return sum == expected ? 0 : 1;
}
