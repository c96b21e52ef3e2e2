#include "algorithms.h"

#include <algorithm>
#include <cstring>

#include "reduce.h"
#include "trainrun/collectives/errors.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::collectives::internal {
namespace {

// A byte range of a buffer.
struct Span {
  char* data;
  size_t bytes;
};

char* Bytes(void* p) { return static_cast<char*>(p); }
char* Bytes(const void* p) { return static_cast<char*>(const_cast<void*>(p)); }

int Mod(int a, int n) { return ((a % n) + n) % n; }

char* Scratch(AlgorithmContext& ctx, size_t bytes) {
  if (ctx.scratch.size() < bytes) ctx.scratch.resize(bytes);
  return ctx.scratch.data();
}

// RunRing drives the ring pipeline that ring allreduce, reduce-scatter and allgather share.
//
// Each of `steps` steps sends one block to the right neighbour and receives one from the left;
// every block is cut into `segments` segments, and a unit is one segment of one step. Segment k of
// step s+1 can leave only once segment k of step s has arrived and been processed (`on_recv`, e.g.
// reduced into the work buffer). Units travel in a wavefront order rather than step by step: unit
// (s, k) has position key k + s * `lag`, so segment k of step s+1 goes out `lag` segments after
// segment k of step s came in, while what was just reduced is still in cache, and no rank runs more
// than about `lag` segments per step ahead of its neighbour, which keeps the kernel's socket queues
// (and so the bytes they copy) short and cache-resident too. Every rank uses the same order, so the
// receiver expects units in the order the sender sends them. With one thread, sending, receiving
// and reducing still overlap: the kernel moves bytes while this rank reduces. Receives are posted
// `window` units ahead into slot (position % window) of whatever temporary space `recv_span` hands
// out; a slot is reused only after `on_recv` has consumed it.
template <typename SendSpan, typename RecvSpan, typename OnRecv>
void RunRing(Transport& t, int steps, int segments, int window, int lag, SendSpan send_span,
             RecvSpan recv_span, OnRecv on_recv) {
  const int n = t.size();
  const int right = Mod(t.rank() + 1, n);
  const int left = Mod(t.rank() - 1, n);
  const int units = steps * segments;
  lag = std::max(1, lag);
  // order[p] = the unit at position p; position[s * segments + k] = where unit (s, k) is.
  std::vector<std::pair<int, int>> order;
  order.reserve(units);
  std::vector<int> position(units);
  const int keys = segments + (steps - 1) * lag;
  for (int key = 0; key < keys; ++key) {
    for (int s = std::min(steps - 1, key / lag); s >= 0; --s) {
      const int k = key - s * lag;
      if (k < 0 || k >= segments) continue;
      position[s * segments + k] = static_cast<int>(order.size());
      order.emplace_back(s, k);
    }
  }
  std::vector<Request> received(units);
  auto post_recv = [&](int p) {
    Span span = recv_span(order[p].first, order[p].second, p % window);
    received[p] = t.Recv(left, span.data, span.bytes);
  };
  int next_send = 0;  // the next position to send; units go out in position order
  auto post_sends = [&](int processed) {  // positions < processed have been received and processed
    while (next_send < units) {
      auto [s, k] = order[next_send];
      if (s > 0 && position[(s - 1) * segments + k] >= processed) break;
      Span span = send_span(s, k);
      t.Send(right, span.data, span.bytes);
      ++next_send;
    }
  };
  for (int p = 0; p < std::min(window, units); ++p) post_recv(p);
  post_sends(0);
  for (int p = 0; p < units; ++p) {
    auto [s, k] = order[p];
    t.Wait(received[p]);
    on_recv(s, k, p % window);
    if (p + window < units) post_recv(p + window);
    post_sends(p + 1);
  }
  t.WaitAll();
}

// Blocks of `count` elements split over n ranks: block b is [b * per_block, ...), clipped, and
// segment k of it is [k * per_segment, ...) within the block, clipped (possibly empty).
struct Blocks {
  size_t count;
  size_t per_block;
  size_t per_segment;
  int segments;

  Blocks(size_t count_in, size_t per_block_in, size_t segment_elements)
      : count(count_in), per_block(per_block_in) {
    per_segment = std::max<size_t>(1, std::min(segment_elements, per_block));
    segments = static_cast<int>(std::max<size_t>(1, (per_block + per_segment - 1) / per_segment));
  }
  // Element range [begin, end) of segment k of block b.
  std::pair<size_t, size_t> Range(int b, int k) const {
    size_t block_begin = std::min(count, b * per_block);
    size_t block_end = std::min(count, block_begin + per_block);
    size_t begin = std::min(block_end, block_begin + k * per_segment);
    size_t end = std::min(block_end, begin + per_segment);
    return {begin, end};
  }
};

size_t SegmentElements(const AlgorithmContext& ctx, size_t element) {
  return std::max<size_t>(1, ctx.segment_bytes / element);
}

// A ring allreduce cuts each rank's block into at least this many segments (of at least
// kMinRingSegmentBytes, at most the configured segment; a block of up to four of those stays
// whole), so that a block of 512 KiB-2 MiB (an allreduce of 1-4 MiB at n = 2) still pipelines: with
// two 256 KiB segments a block's first segment crossed alone before anything could be reduced and
// passed on.
constexpr size_t kRingSegmentsPerBlock = 16;
constexpr size_t kMinRingSegmentBytes = 64 << 10;

size_t AllreduceSegmentElements(const AlgorithmContext& ctx, size_t element, size_t per_block) {
  const size_t configured = SegmentElements(ctx, element);
  const size_t least = std::max<size_t>(1, kMinRingSegmentBytes / element);
  // A block of up to four least segments stays whole: cut, it cost more steps than it gained
  // (256 and 512 KiB at n = 2 beside a busy loop: 1.05-1.06).
  if (per_block <= 4 * least) return configured;
  return std::min(configured, std::max(least, per_block / kRingSegmentsPerBlock));
}

constexpr int kRingWindow = 4;
// Segments by which step s+1 trails step s in RunRing's wire order.
int RingLag() {
  static const int lag = static_cast<int>(env::kRingLag.Get());
  return lag;
}

}  // namespace

void AllreduceRing(AlgorithmContext& ctx, const void* input, void* output, size_t count,
                   DataType type, ReduceOp op) {
  Transport& t = ctx.transport;
  const int n = t.size();
  const int r = t.rank();
  const size_t e = ElementSize(type);
  const size_t per_block = (count + n - 1) / n;
  const Blocks blocks(count, per_block, AllreduceSegmentElements(ctx, e, per_block));
  char* tmp = Scratch(ctx, kRingWindow * blocks.per_segment * e);
  char* in = Bytes(input);
  char* out = Bytes(output);
  // Reduce-scatter steps s < n-1 send block r-s and receive block r-s-1, which they reduce into
  // `out` (in op received); after them rank r holds block r+1 complete. Allgather steps then pass
  // complete blocks around: step n-1+t sends block r+1-t and receives block r-t straight into
  // `out`.
  auto send_span = [&](int s, int k) {
    const bool scatter = s < n - 1;
    const int b = scatter ? Mod(r - s, n) : Mod(r + 1 - (s - (n - 1)), n);
    auto [begin, end] = blocks.Range(b, k);
    return Span{(s == 0 ? in : out) + begin * e, (end - begin) * e};
  };
  auto recv_span = [&](int s, int k, int slot) {
    const bool scatter = s < n - 1;
    const int b = scatter ? Mod(r - s - 1, n) : Mod(r - (s - (n - 1)), n);
    auto [begin, end] = blocks.Range(b, k);
    char* where = scatter ? tmp + slot * blocks.per_segment * e : out + begin * e;
    return Span{where, (end - begin) * e};
  };
  auto on_recv = [&](int s, int k, int slot) {
    if (s >= n - 1) return;
    auto [begin, end] = blocks.Range(Mod(r - s - 1, n), k);
    char* dst = out + begin * e;
    Reduce(type, op, dst, in + begin * e, tmp + slot * blocks.per_segment * e, end - begin);
    if (op == ReduceOp::kAverage && s == n - 2) Divide(type, dst, end - begin, n);
  };
  RunRing(t, 2 * (n - 1), blocks.segments, kRingWindow, RingLag(), send_span, recv_span, on_recv);
}

// Recursive doubling: log2(n) exchanges of the whole buffer, for small messages where latency
// dominates. Sizes that are not a power of two fold the first 2*(n-p) ranks in pairs first (p the
// largest power of two <= n) and unfold at the end. Both partners of every exchange compute
// a op b from the same two values, so all ranks end bit-identical.
void AllreduceRecursiveDoubling(AlgorithmContext& ctx, const void* input, void* output,
                                size_t count, DataType type, ReduceOp op) {
  Transport& t = ctx.transport;
  const int n = t.size();
  const int r = t.rank();
  const size_t bytes = count * ElementSize(type);
  char* out = Bytes(output);
  char* tmp = Scratch(ctx, bytes);
  if (input != output) std::memcpy(out, input, bytes);
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int extra = n - p;
  int v;  // rank among the p that take part in the doubling
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      t.Send(r + 1, out, bytes);
      t.Recv(r + 1, out, bytes);
      t.WaitAll();
      return;
    }
    t.Wait(t.Recv(r - 1, tmp, bytes));
    Reduce(type, op, out, out, tmp, count);
    v = r / 2;
  } else {
    v = r - extra;
  }
  for (int mask = 1; mask < p; mask <<= 1) {
    const int pv = v ^ mask;
    const int peer = pv < extra ? 2 * pv + 1 : pv + extra;
    t.Recv(peer, tmp, bytes);
    t.Send(peer, out, bytes);
    t.WaitAll();
    Reduce(type, op, out, out, tmp, count);
  }
  if (op == ReduceOp::kAverage) Divide(type, out, count, n);
  if (r < 2 * extra) {
    t.Send(r - 1, out, bytes);
    t.WaitAll();
  } else {
    t.WaitAll();
  }
}

void Allreduce(AlgorithmContext& ctx, const void* input, void* output, size_t count, DataType type,
               ReduceOp op) {
  if (count == 0) return;
  if (ctx.transport.size() == 1) {
    if (input != output) std::memcpy(output, input, count * ElementSize(type));
    return;
  }
  if (count * ElementSize(type) <= ctx.small_allreduce_bytes ||
      count < static_cast<size_t>(ctx.transport.size())) {
    AllreduceRecursiveDoubling(ctx, input, output, count, type, op);
  } else {
    AllreduceRing(ctx, input, output, count, type, op);
  }
}

// Small messages go down a binomial tree (log2 n hops); large ones down a chain, segment by
// segment, so every link carries the message once and the hops overlap.
void Broadcast(AlgorithmContext& ctx, void* data, size_t bytes, int root) {
  Transport& t = ctx.transport;
  const int n = t.size();
  if (bytes == 0 || n == 1) return;
  const int v = Mod(t.rank() - root, n);
  auto real = [&](int virtual_rank) { return Mod(virtual_rank + root, n); };
  char* buffer = Bytes(data);
  if (bytes <= ctx.small_allreduce_bytes) {
    int mask = 1;
    while (mask < n) {
      if (v & mask) {
        t.Wait(t.Recv(real(v - mask), buffer, bytes));
        break;
      }
      mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1) {
      if (v + mask < n) t.Send(real(v + mask), buffer, bytes);
    }
    t.WaitAll();
    return;
  }
  const size_t segment = std::max<size_t>(1, ctx.segment_bytes);
  const int segments = static_cast<int>((bytes + segment - 1) / segment);
  auto span = [&](int k) {
    size_t begin = k * segment;
    return Span{buffer + begin, std::min(segment, bytes - begin)};
  };
  const bool has_next = v + 1 < n;
  if (v == 0) {
    for (int k = 0; k < segments; ++k) t.Send(real(1), span(k).data, span(k).bytes);
  } else {
    std::vector<Request> received(segments);
    for (int k = 0; k < segments; ++k)
      received[k] = t.Recv(real(v - 1), span(k).data, span(k).bytes);
    for (int k = 0; k < segments; ++k) {
      t.Wait(received[k]);
      if (has_next) t.Send(real(v + 1), span(k).data, span(k).bytes);
    }
  }
  t.WaitAll();
}

void Allgatherv(AlgorithmContext& ctx, const void* input, void* output,
                const std::vector<size_t>& counts, DataType type) {
  Transport& t = ctx.transport;
  const int n = t.size();
  const int r = t.rank();
  const size_t e = ElementSize(type);
  TRAINRUN_ENFORCE(static_cast<int>(counts.size()) == n, "counts has ", counts.size(),
                   " entries for ", n, " ranks");
  std::vector<size_t> offset(n + 1, 0);
  size_t largest = 0;
  for (int b = 0; b < n; ++b) {
    offset[b + 1] = offset[b] + counts[b] * e;
    largest = std::max(largest, counts[b] * e);
  }
  char* out = Bytes(output);
  if (input != out + offset[r] && counts[r] > 0) {
    std::memmove(out + offset[r], input, counts[r] * e);
  }
  if (n == 1 || largest == 0) return;
  if (std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; }) &&
      t.TryAllgather(out + offset[r], out, counts[r] * e)) {
    return;
  }
  const size_t segment = std::max<size_t>(e, ctx.segment_bytes / e * e);
  const int segments = static_cast<int>(std::max<size_t>(1, (largest + segment - 1) / segment));
  auto block_span = [&](int b, int k) {
    size_t length = offset[b + 1] - offset[b];
    size_t begin = std::min(length, k * segment);
    return Span{out + offset[b] + begin, std::min(segment, length - begin)};
  };
  // Step s sends block r-s (received at step s-1, or our own) and receives block r-s-1 in place.
  auto send_span = [&](int s, int k) { return block_span(Mod(r - s, n), k); };
  auto recv_span = [&](int s, int k, int) { return block_span(Mod(r - s - 1, n), k); };
  const int units = (n - 1) * segments;
  RunRing(t, n - 1, segments, units, RingLag(), send_span, recv_span, [](int, int, int) {});
}

void ReduceScatter(AlgorithmContext& ctx, const void* input, void* output, size_t count,
                   DataType type, ReduceOp op) {
  Transport& t = ctx.transport;
  const int n = t.size();
  const int r = t.rank();
  const size_t e = ElementSize(type);
  char* in = Bytes(input);
  char* out = Bytes(output);
  if (count == 0) return;
  if (n == 1) {
    if (input != output) std::memcpy(out, in, count * e);
    return;
  }
  // As the ring allreduce's first half, shifted by one block so rank r ends with block r. Partial
  // sums travel in `work` (one block per step) until the last step reduces into `output`.
  const Blocks blocks(count * n, count, SegmentElements(ctx, e));
  const size_t slot_bytes = blocks.per_segment * e;
  char* tmp = Scratch(ctx, kRingWindow * slot_bytes + count * n * e);
  char* work = tmp + kRingWindow * slot_bytes;
  auto send_span = [&](int s, int k) {
    auto [begin, end] = blocks.Range(Mod(r - s - 1, n), k);
    return Span{(s == 0 ? in : work) + begin * e, (end - begin) * e};
  };
  auto recv_span = [&](int s, int k, int slot) {
    auto [begin, end] = blocks.Range(Mod(r - s - 2, n), k);
    return Span{tmp + slot * slot_bytes, (end - begin) * e};
  };
  auto on_recv = [&](int s, int k, int slot) {
    const int b = Mod(r - s - 2, n);
    auto [begin, end] = blocks.Range(b, k);
    const bool last = s == n - 2;
    char* dst = last ? out + (begin - b * count) * e : work + begin * e;
    Reduce(type, op, dst, in + begin * e, tmp + slot * slot_bytes, end - begin);
    if (last && op == ReduceOp::kAverage) Divide(type, dst, end - begin, n);
  };
  RunRing(t, n - 1, blocks.segments, kRingWindow, RingLag(), send_span, recv_span, on_recv);
}

// Dissemination barrier: in round k every rank signals rank + 2^k and waits for rank - 2^k; after
// ceil(log2 n) rounds every rank has heard, transitively, from all.
// Alltoallv posts every receive, then every send, in rank order starting from this rank's right
// neighbour so that not every rank sends to rank 0 first; the transport moves them all at once.
void Alltoallv(AlgorithmContext& ctx, const void* input, const std::vector<size_t>& send_counts,
               void* output, const std::vector<size_t>& recv_counts, DataType type) {
  Transport& t = ctx.transport;
  const int n = t.size();
  const int r = t.rank();
  const size_t e = ElementSize(type);
  std::vector<size_t> send_offset(n + 1, 0);
  std::vector<size_t> recv_offset(n + 1, 0);
  for (int p = 0; p < n; ++p) {
    send_offset[p + 1] = send_offset[p] + send_counts[p] * e;
    recv_offset[p + 1] = recv_offset[p] + recv_counts[p] * e;
  }
  TRAINRUN_ENFORCE(send_counts[r] == recv_counts[r], "this rank sends itself ", send_counts[r],
                   " elements but expects ", recv_counts[r]);
  if (send_counts[r] > 0) {
    std::memmove(Bytes(output) + recv_offset[r], Bytes(input) + send_offset[r], send_counts[r] * e);
  }
  for (int i = 1; i < n; ++i) {
    const int p = Mod(r - i, n);
    if (recv_counts[p] > 0) t.Recv(p, Bytes(output) + recv_offset[p], recv_counts[p] * e);
  }
  for (int i = 1; i < n; ++i) {
    const int p = Mod(r + i, n);
    if (send_counts[p] > 0) t.Send(p, Bytes(input) + send_offset[p], send_counts[p] * e);
  }
  t.WaitAll();
}

void Barrier(AlgorithmContext& ctx) {
  Transport& t = ctx.transport;
  const int n = t.size();
  char token = 0;
  char sink[64];
  int round = 0;
  for (int distance = 1; distance < n; distance <<= 1, ++round) {
    t.Recv(Mod(t.rank() - distance, n), &sink[round], 1);
    t.Send(Mod(t.rank() + distance, n), &token, 1);
    t.WaitAll();
  }
}

}  // namespace trainrun::collectives::internal
