// Call agreement: before every collective, the ranks of a communicator exchange one fixed-size
// record saying what each is about to do (which collective, element type, count, op or root, shape
// and name), and each rank compares them all.
//
// Why every collective, barrier included: the transports carry bytes, not meaning, so a rank in an
// allreduce and a rank in a barrier would otherwise read each other's data as their own and the
// stream would be garbled for good. Because the record has the same size whatever the collective,
// the exchange itself always lines up, every rank sees the same records, and so every rank raises
// the same MismatchError and stays at the same place in the stream: the next collective works.
//
//   CallRecord mine = DescribeCall(CollectiveKind::kAllreduce, type, count, int(op), check);
//   std::vector<CallRecord> all = ExchangeRecords(ctx, mine);  // one small allgather
//   CheckAgreement(all, rank);                                 // throws MismatchError
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "algorithms.h"
#include "trainrun/collectives/communicator.h"

namespace trainrun::collectives::internal {

enum class CollectiveKind : uint32_t {
  kAllreduce = 1,
  kBroadcast = 2,
  kAllgather = 3,
  kReduceScatter = 4,
  kBarrier = 5,
  kAlltoall = 6,
  // A rank in Join(): it takes part in the others' allreduces (zeros) and barriers until every
  // rank has joined. Its record's op_or_root counts the rounds it has spent joined.
  kJoin = 7,
  // A call this rank refused for its arguments (Communicator::Refuse): its record takes the
  // call's place, so that ranks that made the call raise MismatchError instead of waiting for it.
  // op_or_root holds the refused call's kind.
  kRefused = 8,
};

// KindName is a collective kind's name in messages ("allreduce", "join", ...).
const char* KindName(uint32_t kind);

// CallRecord is what one rank says about its call. Plain bytes: it travels as is between ranks of
// one job (same build, same byte order).
struct CallRecord {
  static constexpr uint32_t kMagic = 0x54524331;  // "TRC1"
  static constexpr int kMaxDims = 6;
  static constexpr int kNameBytes = 48;
  uint32_t magic = kMagic;
  uint32_t kind = 0;
  int32_t dtype = -1;
  int32_t op_or_root = 0;       // the reduce op, or the broadcast root; 0 where neither applies
  uint32_t count_varies = 0;    // 1: count may differ between ranks (allgather, alltoall)
  int32_t ndim = -1;            // -1: no shape given
  uint64_t count = 0;           // elements this rank passes
  uint64_t detail = 0;          // a hash of what else must agree (allgatherv's counts)
  uint64_t name_hash = 0;       // of the whole name, which may be longer than `name`
  int64_t dims[kMaxDims] = {};  // the shape; with count_varies, without its first dimension
  char name[kNameBytes] = {};   // the start of the name, NUL-padded
  // How many in-place allreduces like this one the rank has queued and could run as one
  // (Communicator::AllreduceReady); 0 for a call that cannot be fused. Not compared: the ranks
  // run the fewest any of them has ready.
  uint64_t ready = 0;
  // With `ready` > 1: a hash of the records of the ready allreduces after the first (all of them;
  // Communicator::AllreduceReady). Ranks with as many ready and the same hash agree on them all
  // within this one exchange; otherwise a second exchange checks the ones they run. Not compared.
  uint64_t ready_hash = 0;
  // Straggler attribution (attribution.h), not compared: at a sampled collective, its number on
  // this communicator, the time this rank spent in the one before, and every how many collectives
  // this rank proposes the next sample. 0: not a sample.
  uint64_t sample_sequence = 0;
  uint64_t sample_wait_ns = 0;
  uint32_t sample_spacing = 0;
  uint32_t unused = 0;
};

CallRecord DescribeCall(CollectiveKind kind, DataType type, uint64_t count, int op_or_root,
                        const CallCheck& check, bool count_varies = false, uint64_t detail = 0);

// ExchangeRecords allgathers one record per rank over the context's transport.
std::vector<CallRecord> ExchangeRecords(AlgorithmContext& ctx, const CallRecord& mine);

// Disagreement returns why the records cannot run together ("" when they can): ranks that called
// different things, or a collective other than allreduce (sum, average) or barrier while some
// ranks have joined. Joined ranks' records are not compared. The message names the first ranks
// that differ and what each called; `set` names the communicator ("" for the whole job). Every
// rank computes the same answer from the same records.
std::string Disagreement(const std::vector<CallRecord>& records, const std::string& set);

// Unanimous is Disagreement's fast path: true when every record is the same bytes as the first and
// none is a join, so the calls run together and no rank has joined. False says nothing: ask
// Disagreement.
bool Unanimous(const CallRecord* records, size_t n);

// NamesDiffer: the records of the ranks that have not joined do not all have the same name (one
// unnamed and one named count as different): those ranks called their collectives in different
// orders, which the communication thread resolves by name (comm_thread.h; a joined rank takes
// part with no names of its own), rather than a mismatch.
bool NamesDiffer(const std::vector<CallRecord>& records);

// CheckAgreement throws MismatchError with Disagreement's message when it is not empty: an
// OrderError (a MismatchError) when NamesDiffer.
void CheckAgreement(const std::vector<CallRecord>& records, const std::string& set);

// Describe says what a record asks for, e.g. "allreduce 'loss' of float32[4, 3] (op sum)".
std::string Describe(const CallRecord& record);

}  // namespace trainrun::collectives::internal
