// A worker outside trainrun's tree: joins the job of the trainrun that started it, allreduces a
// vector and checks the sum. Exit 0 when every element is 1 + 2 + ... + size.
#include <cstdio>
#include <vector>

#include "trainrun/collectives/communicator.h"

int main() {
  using trainrun::collectives::Communicator;
  using trainrun::collectives::DataType;
  using trainrun::collectives::ReduceOp;
  try {
    auto comm = Communicator::FromEnvironment();
    std::vector<float> data(1 << 16, static_cast<float>(comm->rank() + 1));
    comm->Allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
    const float expected = comm->size() * (comm->size() + 1) / 2.0f;
    for (float x : data) {
      if (x != expected) {
        std::fprintf(stderr, "rank %d: got %g, expected %g\n", comm->rank(), x, expected);
        return 1;
      }
    }
    std::printf("rank %d of %d: C++ allreduce sum %g ok over %s\n", comm->rank(), comm->size(),
                expected, comm->transport());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_cxx: %s\n", e.what());
    return 1;
  }
}
