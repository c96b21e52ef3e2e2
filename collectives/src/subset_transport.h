// SubsetTransport: a transport for a subset of a communicator's ranks (a process set), over the
// parent's connections. Its rank i is the parent's rank ranks[i]; it only renumbers.
//
// Sharing the parent's connections is safe because one thread drives every communicator of a rank
// and the byte streams between two ranks carry their collectives in the order both called them;
// the call check (call_check.h) tells ranks that interleave sets differently.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "transport.h"

namespace trainrun::collectives::internal {

class SubsetTransport : public Transport {
 public:
  SubsetTransport(std::shared_ptr<Transport> parent, std::vector<int> ranks, int rank)
      : parent_(std::move(parent)), ranks_(std::move(ranks)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  Request Send(int peer, const void* data, size_t bytes) override {
    return parent_->Send(ranks_[peer], data, bytes);
  }
  Request Recv(int peer, void* data, size_t bytes) override {
    return parent_->Recv(ranks_[peer], data, bytes);
  }
  void Wait(Request request) override { parent_->Wait(request); }
  void WaitAll() override { parent_->WaitAll(); }
  // failed_peer is a rank of the parent (the job's numbering), which is what reports need.
  int failed_peer() const override { return parent_->failed_peer(); }
  void Abort(int peer, const std::string& message) override { parent_->Abort(peer, message); }
  void Finished() override { parent_->Finished(); }
  // A set of every rank in order is the parent renamed: it takes the parent's own ways of
  // exchanging records too, so that a set's collective and the world's meet at the same place
  // (over TCP between two ranks, the same frames; see TcpTransport::TryAllgather).
  bool TryAllgather(const void* input, void* output, size_t bytes) override {
    return whole() && parent_->TryAllgather(input, output, bytes);
  }
  bool TryCheckedAllreduce(const void* input, void* output, size_t count, DataType type,
                           ReduceOp op, const void* record, size_t record_bytes, void* records,
                           FunctionRef<bool(bool)> reduce) override {
    return whole() && parent_->TryCheckedAllreduce(input, output, count, type, op, record,
                                                   record_bytes, records, reduce);
  }
  const char* name() const override { return parent_->name(); }

 private:
  bool whole() const {
    if (size() != parent_->size()) return false;
    for (int i = 0; i < size(); ++i) {
      if (ranks_[i] != i) return false;
    }
    return true;
  }

  std::shared_ptr<Transport> parent_;
  std::vector<int> ranks_;
  int rank_;
};

}  // namespace trainrun::collectives::internal
