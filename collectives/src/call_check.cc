#include "call_check.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <type_traits>

#include "trainrun/collectives/errors.h"

namespace trainrun::collectives::internal {
using ::trainrun::internal::MakeMessage;

const char* KindName(uint32_t kind) {
  switch (static_cast<CollectiveKind>(kind)) {
    case CollectiveKind::kAllreduce:
      return "allreduce";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kAllgather:
      return "allgather";
    case CollectiveKind::kReduceScatter:
      return "reducescatter";
    case CollectiveKind::kBarrier:
      return "barrier";
    case CollectiveKind::kAlltoall:
      return "alltoall";
    case CollectiveKind::kJoin:
      return "join";
    case CollectiveKind::kRefused:
      return "a refused call";
  }
  return "an unknown collective";
}

namespace {

constexpr uint32_t kJoinedKind = static_cast<uint32_t>(CollectiveKind::kJoin);

bool HasOp(uint32_t kind) {
  return kind == static_cast<uint32_t>(CollectiveKind::kAllreduce) ||
         kind == static_cast<uint32_t>(CollectiveKind::kReduceScatter);
}

// Same reports whether two records describe calls that can run together.
bool Same(const CallRecord& a, const CallRecord& b) {
  if (a.magic != b.magic || a.kind != b.kind || a.dtype != b.dtype ||
      a.op_or_root != b.op_or_root || a.count_varies != b.count_varies || a.detail != b.detail ||
      a.name_hash != b.name_hash || a.ndim != b.ndim) {
    return false;
  }
  if (!a.count_varies && a.count != b.count) return false;
  return std::equal(std::begin(a.dims), std::end(a.dims), std::begin(b.dims));
}

}  // namespace

CallRecord DescribeCall(CollectiveKind kind, DataType type, uint64_t count, int op_or_root,
                        const CallCheck& check, bool count_varies, uint64_t detail) {
  CallRecord r;
  r.kind = static_cast<uint32_t>(kind);
  r.dtype = kind == CollectiveKind::kBarrier ? -1 : static_cast<int32_t>(type);
  r.op_or_root = op_or_root;
  r.count_varies = count_varies ? 1 : 0;
  r.count = count;
  r.detail = detail;
  if (!check.name.empty()) {
    r.name_hash = std::hash<std::string>{}(check.name) | 1;
    std::memcpy(r.name, check.name.data(),
                std::min<size_t>(check.name.size(), CallRecord::kNameBytes - 1));
  }
  if (check.has_shape) {
    const auto& shape = check.shape;
    size_t first = count_varies && !shape.empty() ? 1 : 0;
    r.ndim = static_cast<int32_t>(shape.size());
    for (size_t i = first, d = 0; i < shape.size(); ++i) {
      // Fold dimensions past the last slot into it, so a difference there still shows.
      if (d < CallRecord::kMaxDims) {
        r.dims[d++] = shape[i];
      } else {
        // Unsigned: a grouped allreduce's many counts wrap instead of overflowing.
        r.dims[CallRecord::kMaxDims - 1] =
            static_cast<int64_t>(static_cast<uint64_t>(r.dims[CallRecord::kMaxDims - 1]) *
                                 static_cast<uint64_t>(shape[i]));
      }
    }
  }
  return r;
}

std::vector<CallRecord> ExchangeRecords(AlgorithmContext& ctx, const CallRecord& mine) {
  const int n = ctx.transport.size();
  std::vector<CallRecord> all(n);
  all[ctx.transport.rank()] = mine;
  Allgatherv(ctx, &all[ctx.transport.rank()], all.data(),
             std::vector<size_t>(n, sizeof(CallRecord)), DataType::kUInt8);
  return all;
}

std::string Describe(const CallRecord& r) {
  if (r.magic != CallRecord::kMagic) return "something that is not a trainrun collective";
  std::string out = KindName(r.kind);
  if (r.name[0] != '\0') {
    out +=
        MakeMessage(" '", std::string(r.name, strnlen(r.name, sizeof(r.name))),
                    strnlen(r.name, sizeof(r.name)) == CallRecord::kNameBytes - 1 ? "...'" : "'");
  }
  if (r.kind == static_cast<uint32_t>(CollectiveKind::kRefused)) {
    std::string refused = KindName(static_cast<uint32_t>(r.op_or_root));
    return refused + out.substr(std::strlen(KindName(r.kind))) +
           " with arguments it refused (that rank's own error says which)";
  }
  if (r.kind == static_cast<uint32_t>(CollectiveKind::kBarrier)) return out;
  out += " of ";
  out += DataTypeName(static_cast<DataType>(r.dtype));
  if (r.ndim >= 0) {
    out += "[";
    const int shown =
        std::min<int>(r.ndim - (r.count_varies && r.ndim > 0 ? 1 : 0), CallRecord::kMaxDims);
    if (r.count_varies && r.ndim > 0) out += shown > 0 ? "*, " : "*";
    for (int d = 0; d < shown; ++d) out += MakeMessage(d ? ", " : "", r.dims[d]);
    out += "]";
  } else {
    out += MakeMessage(" x ", r.count);
  }
  if (HasOp(r.kind)) {
    out += MakeMessage(" (op ", ReduceOpName(static_cast<ReduceOp>(r.op_or_root)), ")");
  } else if (r.kind == static_cast<uint32_t>(CollectiveKind::kBroadcast)) {
    out += MakeMessage(" from root ", r.op_or_root);
  }
  return out;
}

std::string Disagreement(const std::vector<CallRecord>& records, const std::string& set) {
  // Ranks that have joined take part in whatever the others agree on; they are not compared.
  auto joined = [&](size_t r) { return records[r].kind == kJoinedKind; };
  size_t first = 0;
  while (first < records.size() && joined(first)) ++first;
  if (first == records.size()) return "";
  std::vector<size_t> differing;
  for (size_t r = first + 1; r < records.size(); ++r) {
    if (!joined(r) && !Same(records[first], records[r])) differing.push_back(r);
  }
  std::vector<size_t> joiners;
  for (size_t r = 0; r < records.size(); ++r) {
    if (joined(r)) joiners.push_back(r);
  }
  const CallRecord& call = records[first];
  const bool join_compatible = call.kind == static_cast<uint32_t>(CollectiveKind::kBarrier) ||
                               (call.kind == static_cast<uint32_t>(CollectiveKind::kAllreduce) &&
                                (call.op_or_root == static_cast<int>(ReduceOp::kSum) ||
                                 call.op_or_root == static_cast<int>(ReduceOp::kAverage)));
  if (differing.empty() && (joiners.empty() || join_compatible)) return "";
  std::string message = MakeMessage("mismatched collectives", set.empty() ? "" : " in ", set,
                                    ": rank ", first, " called ", Describe(call));
  for (size_t i = 0; i < differing.size() && i < 3; ++i) {
    message += MakeMessage(i + 1 == differing.size() && i > 0 ? " and" : (i ? "," : " but"),
                           " rank ", differing[i], " called ", Describe(records[differing[i]]));
  }
  if (differing.size() > 3) message += MakeMessage(" (and ", differing.size() - 3, " more)");
  if (differing.empty()) {
    message += MakeMessage(" but rank ", joiners[0], joiners.size() > 1 ? " (and others)" : "",
                           " has joined (join()); while a rank has joined, only allreduce with "
                           "sum or average and barrier can run, as in Horovod (this call did "
                           "nothing; the next one can go on)");
    return message;
  }
  message +=
      "; every rank must call the same collectives in the same order, with the same name, "
      "element type, shape, op and root (this call did nothing; the next one can go on)";
  return message;
}

// Equal calls are equal bytes: no padding, and DescribeCall zeroes what it does not set.
static_assert(std::has_unique_object_representations_v<CallRecord>);

bool Unanimous(const CallRecord* records, size_t n) {
  if (n == 0 || records[0].kind == kJoinedKind) return false;
  for (size_t r = 1; r < n; ++r) {
    if (std::memcmp(&records[0], &records[r], sizeof(CallRecord)) != 0) return false;
  }
  return true;
}

bool NamesDiffer(const std::vector<CallRecord>& records) {
  const CallRecord* first = nullptr;
  bool differ = false;
  for (const CallRecord& r : records) {
    if (r.magic != CallRecord::kMagic) return false;
    if (r.kind == kJoinedKind) continue;  // a joined rank takes part in what the others agree on
    if (first == nullptr) first = &r;
    differ |= r.name_hash != first->name_hash;
  }
  return differ;
}

void CheckAgreement(const std::vector<CallRecord>& records, const std::string& set) {
  std::string message = Disagreement(records, set);
  if (message.empty()) return;
  if (NamesDiffer(records)) throw OrderError(message);
  throw MismatchError(message);
}

}  // namespace trainrun::collectives::internal
