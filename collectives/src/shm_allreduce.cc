// ShmTransport's allreduce and allgather paths through the slots: small (one step, every rank
// reduces the whole buffer), chunked (each rank reduces its part), across groups (hierarchical),
// from pieces, and with the call record in the first step (TryCheckedAllreduce).
#include <cstring>
#include <future>

#include "reduce.h"
#include "shm_internal.h"

namespace trainrun::collectives::internal {

using namespace shm;  // NOLINT: this transport's own internals

namespace {

// LineElements: elements of `e` bytes in a 64-byte cache line (at least 1).
size_t LineElements(size_t e) { return std::max<size_t>(1, 64 / e); }

// ChunkElements: the chunked allreduce's unit, in elements of `e` bytes: at most `chunk_bytes`
// (but at least one line per rank) and a multiple of `ranks` lines, so that the ranks' parts of a
// chunk are whole cache lines and ranks do not share lines.
size_t ChunkElements(size_t chunk_bytes, size_t ranks, size_t e) {
  const size_t lines = ranks * LineElements(e);
  return std::max(lines, chunk_bytes / e / lines * lines);
}

}  // namespace

bool ShmTransport::TryAllreduce(const void* input, void* output, size_t count, DataType type,
                                ReduceOp op) {
  if (count == 0) return true;
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  const size_t e = ElementSize(type);
  if (size_ == 1) {
    if (in != out) std::memcpy(out, in, count * e);
    return true;
  }
  SetState(kWorking);
  if (count * e <= std::min(options_.small_bytes, options_.chunk_bytes)) {
    SmallAllreduce(in, out, count, type, op);
  } else {
    ChunkAllreduce(in, out, count, type, op, size_, nullptr);
  }
  SetState(kOutside);
  return true;
}

void ShmTransport::AllreduceAcrossGroups(const void* input, void* output, size_t count,
                                         DataType type, ReduceOp op, int divisor,
                                         const PartAllreduce& across) {
  if (count == 0) return;
  SetState(kWorking);
  if (count <= ChunkElements(options_.chunk_bytes, static_cast<size_t>(size_), ElementSize(type))) {
    ChunkAllreduce(static_cast<const char*>(input), static_cast<char*>(output), count, type, op,
                   divisor, &across);
  } else {
    PipelinedAcross(static_cast<const char*>(input), static_cast<char*>(output), count, type, op,
                    divisor, across);
  }
  SetState(kOutside);
}

// Chunk c goes through the phases of ChunkAllreduce: A(c) copies it in and reduces this rank's
// part; across(c) allreduces that part among the other groups, on a helper thread; B(c) copies the
// other ranks' finished parts out. They run in the order A(0), A(1), across(0) done, B(0), A(2),
// across(1) done, B(1), ..., so that across(c) (the network) overlaps A(c+1) and B(c-1) (memory).
// Every rank posts one step per phase in that order, so a peer's step tells which phases it has
// finished. Two slots per rank still suffice: A(c) writes the slot of chunk c-2 (the same parity)
// only outside this rank's own part, which is all that B(c-2) reads (parts sit at the same places
// in every chunk), and reduces into its own part only after every peer posted A(c), i.e. finished
// B(c-2).
void ShmTransport::PipelinedAcross(const char* in, char* out, size_t count, DataType type,
                                   ReduceOp op, int divisor, const PartAllreduce& across) {
  const size_t e = ElementSize(type);
  const size_t n = static_cast<size_t>(size_);
  const size_t chunk = ChunkElements(options_.chunk_bytes, n, e);
  const size_t chunks = (count + chunk - 1) / chunk;
  const uint32_t g0 = generation_;
  generation_ += static_cast<uint32_t>(chunks);
  const uint32_t base = 2 * g0;
  struct Part {
    size_t begin, length;
  };
  // Every chunk, the short last one too, is cut at the same places (chunk is a multiple of n
  // lines), so a rank's part of one chunk never overlaps another rank's part of another: A(c)'s
  // copy-in stays clear of what B(c-2) still reads.
  const size_t per = chunk / n;
  auto part = [&](size_t c, int p) {
    const size_t length = std::min(chunk, count - c * chunk);
    const size_t b = std::min(length, p * per);
    return Part{b, std::min(length, b + per) - b};
  };
  // A(c): copy in all but this rank's part, post, await, reduce this rank's part in its slot.
  auto phase_a = [&](size_t c, uint32_t step) {
    const size_t begin = c * chunk;
    const size_t length = std::min(chunk, count - begin);
    char* mine = chunk_at(rank_, g0 + static_cast<uint32_t>(c));
    const Part own = part(c, rank_);
    const size_t after = own.begin + own.length;
    const char* src = in + begin * e;
    std::memcpy(mine, src, own.begin * e);
    std::memcpy(mine + after * e, src + after * e, (length - after) * e);
    Post(step);
    AwaitSteps(step);
    if (own.length == 0) return;
    char* result = mine + own.begin * e;
    const char* first = in + (begin + own.begin) * e;
    bool reduced = false;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      Reduce(type, op, result, reduced ? result : first,
             chunk_at(p, g0 + static_cast<uint32_t>(c)) + own.begin * e, own.length);
      reduced = true;
    }
    if (!reduced) std::memcpy(result, first, own.length * e);
  };
  // across(c), on the helper thread: this rank's part among the groups, then the average's division
  // and the copy to the output.
  auto phase_across = [&](size_t c) {
    const Part own = part(c, rank_);
    if (own.length == 0) return;
    char* result = chunk_at(rank_, g0 + static_cast<uint32_t>(c)) + own.begin * e;
    across(result, own.length);
    if (op == ReduceOp::kAverage) Divide(type, result, own.length, divisor);
    std::memcpy(out + (c * chunk + own.begin) * e, result, own.length * e);
  };
  // B(c): post that this rank's part is final, await the others', copy theirs out.
  auto phase_b = [&](size_t c, uint32_t step) {
    Post(step);
    AwaitSteps(step);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const Part theirs = part(c, p);
      if (theirs.length == 0) continue;
      std::memcpy(out + (c * chunk + theirs.begin) * e,
                  chunk_at(p, g0 + static_cast<uint32_t>(c)) + theirs.begin * e, theirs.length * e);
    }
  };
  std::future<void> running;
  try {
    phase_a(0, base + 1);
    running = std::async(std::launch::async, phase_across, size_t{0});
    for (size_t c = 1; c < chunks; ++c) {
      phase_a(c, base + 2 * static_cast<uint32_t>(c));
      running.get();  // rethrows the helper's failure
      running = std::async(std::launch::async, phase_across, c);
      phase_b(c - 1, base + 2 * static_cast<uint32_t>(c) + 1);
    }
    running.get();
    phase_b(chunks - 1, base + 2 * static_cast<uint32_t>(chunks));
  } catch (...) {
    // Never leave the helper running on this frame's lambdas; its transport fails or times out.
    if (running.valid()) running.wait();
    throw;
  }
}

void ShmTransport::Finished() { SetState(kOutside); }

void ShmTransport::PrefetchSlots(uint32_t generation, size_t bytes) const {
  constexpr size_t kMostBytes = 2048;  // beyond, the hardware's own prefetch follows the reads
  const size_t lines = (std::min(bytes, kMostBytes) + 63) / 64;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const char* from = slot(p, generation);
    for (size_t i = 0; i < lines; ++i) __builtin_prefetch(from + i * 64);
  }
}

bool ShmTransport::TryAllgather(const void* input, void* output, size_t bytes) {
  if (size_ == 1 || bytes == 0 || bytes > std::min(options_.small_bytes, options_.chunk_bytes)) {
    return false;
  }
  SetState(kWorking);
  char* out = static_cast<char*>(output);
  const uint32_t g = generation_++;
  std::memcpy(slot(rank_, g), input, bytes);
  Post(2 * g + 1);
  AwaitSteps(2 * g + 1);
  for (int p = 0; p < size_; ++p) std::memcpy(out + p * bytes, slot(p, g), bytes);
  SetState(kOutside);
  return true;
}

bool ShmTransport::CompareRecords(uint32_t generation, const void* record, size_t record_bytes,
                                  void* records) const {
  bool same = true;
  for (int p = 0; p < size_ && same; ++p) {
    same = p == rank_ || std::memcmp(slot(p, generation), record, record_bytes) == 0;
  }
  if (!same) {
    char* all = static_cast<char*>(records);
    for (int p = 0; p < size_; ++p) {
      std::memcpy(all + p * record_bytes, slot(p, generation), record_bytes);
    }
  }
  return same;
}

bool ShmTransport::TryCheckedAllreduce(const void* input, void* output, size_t count, DataType type,
                                       ReduceOp op, const void* record, size_t record_bytes,
                                       void* records, FunctionRef<bool(bool)> reduce) {
  const size_t e = ElementSize(type);
  const size_t data_at = RoundUp(record_bytes, 64);
  if (size_ == 1 || count == 0 || op == ReduceOp::kAdasum) return false;
  // One step where the data alone would take it (as TryAllreduce and CanAllreduceCopies choose):
  // the record sits in the slot's head, kChunkAt bytes that the one-step size does not count, so
  // a call record does not push a 16 KiB allreduce onto the chunked path's two steps.
  const size_t one_step = std::min(options_.small_bytes, options_.chunk_bytes);
  if (count * e > one_step || data_at + count * e > kChunkAt + one_step) {
    if (record_bytes > kChunkAt) return false;
    const Check check{record, record_bytes, records, reduce};
    SetState(kWorking);
    ChunkAllreduce(static_cast<const char*>(input), static_cast<char*>(output), count, type, op,
                   size_, nullptr, nullptr, &check);
    SetState(kOutside);
    return true;
  }
  SetState(kWorking);
  const uint32_t g = generation_++;
  char* mine = slot(rank_, g);
  std::memcpy(mine, record, record_bytes);
  std::memcpy(mine + data_at, input, count * e);
  Post(2 * g + 1);
  AwaitSteps(2 * g + 1);
  PrefetchSlots(g, data_at + count * e);
  if (reduce(CompareRecords(g, record, record_bytes, records))) {
    char* out = static_cast<char*>(output);
    Reduce(type, op, out, slot(0, g) + data_at, slot(1, g) + data_at, count);
    for (int p = 2; p < size_; ++p) Reduce(type, op, out, out, slot(p, g) + data_at, count);
    if (op == ReduceOp::kAverage) Divide(type, out, count, size_);
  }
  SetState(kOutside);
  return true;
}

// Every rank copies its input to its slot, then reduces all slots in rank order. It posts step 2g+1
// only: that it has read the others' slots is told by its next generation's step, which every rank
// awaits before it writes a slot of this one's parity again. (TryAllgather and TryCheckedAllreduce
// alike.)
void ShmTransport::SmallAllreduce(const char* in, char* out, size_t count, DataType type,
                                  ReduceOp op) {
  const size_t bytes = count * ElementSize(type);
  const uint32_t g = generation_++;
  std::memcpy(slot(rank_, g), in, bytes);
  Post(2 * g + 1);
  AwaitSteps(2 * g + 1);
  PrefetchSlots(g, bytes);
  Reduce(type, op, out, slot(0, g), slot(1, g), count);
  for (int p = 2; p < size_; ++p) Reduce(type, op, out, out, slot(p, g), count);
  if (op == ReduceOp::kAverage) Divide(type, out, count, size_);
}

// Pieces maps element ranges of the concatenation of the pieces onto the pieces.
struct ShmTransport::Pieces {
  const std::vector<Piece>& pieces;
  size_t e;
  std::vector<size_t> starts;  // element index at which each piece begins

  Pieces(const std::vector<Piece>& p, size_t element) : pieces(p), e(element) {
    size_t at = 0;
    for (const Piece& piece : pieces) {
      starts.push_back(at);
      at += piece.count;
    }
  }
  // Visit calls fn(piece bytes, offset in the range in bytes, bytes) for elements [begin,
  // begin+count).
  template <typename F>
  void Visit(size_t begin, size_t count, F&& fn) const {
    size_t i = std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin() - 1;
    size_t done = 0;
    while (done < count) {
      const size_t within = begin + done - starts[i];
      const size_t k = std::min(pieces[i].count - within, count - done);
      if (k > 0) fn(pieces[i].data + within * e, done * e, k * e);
      done += k;
      ++i;
    }
  }
  void Gather(char* to, size_t begin, size_t count) const {
    Visit(begin, count,
          [&](char* piece, size_t at, size_t bytes) { std::memcpy(to + at, piece, bytes); });
  }
  void Scatter(const char* from, size_t begin, size_t count) const {
    Visit(begin, count,
          [&](char* piece, size_t at, size_t bytes) { std::memcpy(piece, from + at, bytes); });
  }
};

bool ShmTransport::CanAllreduceCopies(size_t count, DataType type, ReduceOp op) const {
  // As TryAllreduce's choice of the chunked path, so that a rank whose buffer is in host memory
  // takes the same steps.
  return size_ > 1 && op != ReduceOp::kAdasum &&
         count * ElementSize(type) > std::min(options_.small_bytes, options_.chunk_bytes);
}

bool ShmTransport::TryAllreduceCopies(BufferCopies& copies, size_t count, DataType type,
                                      ReduceOp op) {
  if (!CanAllreduceCopies(count, type, op)) return false;
  copies.UseHostMemory(segment_.data(), segment_.bytes());
  SetState(kWorking);
  ChunkAllreduce(nullptr, nullptr, count, type, op, size_, nullptr, nullptr, nullptr, &copies);
  SetState(kOutside);
  return true;
}

bool ShmTransport::TryCheckedAllreduceCopies(BufferCopies& copies, size_t count, DataType type,
                                             ReduceOp op, const void* record, size_t record_bytes,
                                             void* records, FunctionRef<bool(bool)> reduce) {
  // TryCheckedAllreduce takes its chunked path for every such count too.
  if (!CanAllreduceCopies(count, type, op) || record_bytes > kChunkAt) return false;
  const Check check{record, record_bytes, records, reduce};
  copies.UseHostMemory(segment_.data(), segment_.bytes());
  SetState(kWorking);
  ChunkAllreduce(nullptr, nullptr, count, type, op, size_, nullptr, nullptr, &check, &copies);
  SetState(kOutside);
  return true;
}

bool ShmTransport::TryAllreducePieces(const std::vector<Piece>& pieces, size_t count, DataType type,
                                      ReduceOp op) {
  const size_t e = ElementSize(type);
  if (size_ == 1 || count * e <= std::min(options_.small_bytes, options_.chunk_bytes)) {
    return false;
  }
  Pieces map(pieces, e);
  SetState(kWorking);
  ChunkAllreduce(nullptr, nullptr, count, type, op, size_, nullptr, &map);
  SetState(kOutside);
  return true;
}

// Chunk by chunk: copy in what the peers need, reduce this rank's part from every slot, publish
// it, copy out the peers' parts.
bool ShmTransport::ChunkAllreduce(const char* in, char* out, size_t count, DataType type,
                                  ReduceOp op, int divisor, const PartAllreduce* across,
                                  const Pieces* pieces, const Check* check, BufferCopies* copies) {
  const size_t e = ElementSize(type);
  const size_t n = static_cast<size_t>(size_);
  // Parts of a chunk are whole cache lines where possible, so ranks do not share lines.
  const size_t line = LineElements(e);
  const size_t chunk = ChunkElements(options_.chunk_bytes, n, e);
  for (size_t begin = 0; begin < count; begin += chunk) {
    const size_t length = std::min(chunk, count - begin);
    const size_t per = RoundUp((length + n - 1) / n, line);
    auto part = [&](int p) {
      size_t b = std::min(length, p * per);
      return std::pair<size_t, size_t>{b, std::min(length, b + per) - b};
    };
    const uint32_t g = generation_++;
    char* mine = chunk_at(rank_, g);
    // The first chunk carries the call record, at the slot's start (where TryAllgather's is).
    if (check != nullptr && begin == 0)
      std::memcpy(slot(rank_, g), check->record, check->record_bytes);
    auto [own_begin, own_length] = part(rank_);
    const size_t after = own_begin + own_length;
    // Copy in everything but this rank's own part, which only this rank reads (from the input).
    if (copies != nullptr) {
      // Through copies the CPU cannot read the input: the whole chunk, own part included, lands in
      // the slot and is reduced there. The Wait also covers the previous chunk's copies out of
      // the slots, which must be over before the step below lets a peer write them again.
      copies->In(mine, begin, length);
      copies->Wait();
    } else if (pieces != nullptr) {
      pieces->Gather(mine, begin, own_begin);
      pieces->Gather(mine + after * e, begin + after, length - after);
    } else {
      const char* src = in + begin * e;
      std::memcpy(mine, src, own_begin * e);
      std::memcpy(mine + after * e, src + after * e, (length - after) * e);
    }
    Post(2 * g + 1);
    AwaitSteps(2 * g + 1);
    if (check != nullptr && begin == 0 &&
        !check->reduce(CompareRecords(g, check->record, check->record_bytes, check->records))) {
      return false;  // as a record exchange: step 2g+1 only, nothing written
    }
    // reduce_own reduces `elements` elements of this rank's part, `at` bytes into it, from `own`
    // (this rank's input) and every peer's slot into `result` (this rank's slot), then finishes
    // them (across, average).
    auto reduce_own = [&](char* result, const char* own, size_t at, size_t elements) {
      bool first = true;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        Reduce(type, op, result, first ? own : result, chunk_at(p, g) + own_begin * e + at,
               elements);
        first = false;
      }
      if (first && result != own) std::memcpy(result, own, elements * e);  // no peers
      if (across != nullptr) (*across)(result, elements);
      if (op == ReduceOp::kAverage) Divide(type, result, elements, divisor);
    };
    if (own_length > 0) {
      char* result = mine + own_begin * e;
      if (copies != nullptr) {
        reduce_own(result, result, 0, own_length);
        copies->Out(result, begin + own_begin, own_length);
      } else if (pieces != nullptr) {
        // Piece by piece, straight from the pieces and back into them while in cache: no gather
        // of this rank's part into its slot first (a copy of 1/n of the data, which the
        // contiguous path does not make either).
        pieces->Visit(begin + own_begin, own_length, [&](char* piece, size_t at, size_t bytes) {
          reduce_own(result + at, piece, at, bytes / e);
          std::memcpy(piece, result + at, bytes);
        });
      } else {
        reduce_own(result, in + (begin + own_begin) * e, 0, own_length);
        std::memcpy(out + (begin + own_begin) * e, result, own_length * e);
      }
    }
    Post(2 * g + 2);
    AwaitSteps(2 * g + 2);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      auto [b, l] = part(p);
      if (l == 0) continue;
      if (copies != nullptr) {
        copies->Out(chunk_at(p, g) + b * e, begin + b, l);
      } else if (pieces != nullptr) {
        pieces->Scatter(chunk_at(p, g) + b * e, begin + b, l);
      } else {
        std::memcpy(out + (begin + b) * e, chunk_at(p, g) + b * e, l * e);
      }
    }
  }
  // The copies out read the last chunk's slots, which the next collective may write.
  if (copies != nullptr) copies->Wait();
  return true;
}

}  // namespace trainrun::collectives::internal
