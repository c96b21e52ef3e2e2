#include "remote/agent_protocol.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace trainrun::launcher::remote {
namespace {

class Writer {
 public:
  Writer& U32(uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out_.push_back(static_cast<char>(v >> shift));
    return *this;
  }
  Writer& U64(uint64_t v) {
    U32(static_cast<uint32_t>(v >> 32));
    return U32(static_cast<uint32_t>(v));
  }
  Writer& Bytes(absl::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
    return *this;
  }
  Writer& List(const std::vector<std::string>& list) {
    U32(static_cast<uint32_t>(list.size()));
    for (const std::string& s : list) Bytes(s);
    return *this;
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// Reader reads what Writer wrote; any overrun sets ok() false and yields zeros.
class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  uint32_t U32() {
    if (in_.size() < 4) return Fail();
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(in_[i]);
    in_.remove_prefix(4);
    return v;
  }
  uint64_t U64() {
    uint64_t high = U32();
    return (high << 32) | U32();
  }
  std::string Bytes() {
    uint32_t n = U32();
    if (!ok_ || in_.size() < n) {
      Fail();
      return "";
    }
    std::string s(in_.substr(0, n));
    in_.remove_prefix(n);
    return s;
  }
  bool AtEnd() const { return in_.empty(); }
  std::vector<std::string> List() {
    uint32_t n = U32();
    std::vector<std::string> list;
    for (uint32_t i = 0; ok_ && i < n; ++i) list.push_back(Bytes());
    return list;
  }
  bool ok() const { return ok_; }
  template <typename T>
  absl::StatusOr<T> Finish(T value, absl::string_view what) {
    if (!ok_ || !in_.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("malformed agent message: ", what));
    }
    return value;
  }

 private:
  uint32_t Fail() {
    ok_ = false;
    in_ = {};
    return 0;
  }
  absl::string_view in_;
  bool ok_ = true;
};

}  // namespace

const char* TrainrunRelease() { return TRAINRUN_VERSION; }

std::string EncodeFrame(MessageType type, absl::string_view payload) {
  std::string frame;
  uint32_t length = static_cast<uint32_t>(payload.size() + 1);
  for (int shift = 24; shift >= 0; shift -= 8) frame.push_back(static_cast<char>(length >> shift));
  frame.push_back(static_cast<char>(type));
  frame.append(payload.data(), payload.size());
  return frame;
}

std::string EncodeHello(const Hello& h) {
  Writer w;
  w.U32(h.version).Bytes(h.hostname).U32(h.pid).Bytes(h.ssh_client_address).U32(h.gpu_count);
  // A Hello is written as its version has it (tests make older agents' Hellos so).
  if (h.version >= 3) w.Bytes(h.release);
  if (h.version >= 4) w.Bytes(h.machine);
  return EncodeFrame(MessageType::kHello, w.Take());
}

std::string EncodeJob(const Job& job) {
  Writer w;
  w.Bytes(job.cwd).List(job.argv).U32(job.grace_period_ms).U32(job.ranks.size());
  for (const RankJob& r : job.ranks) w.U32(r.rank).List(r.env);
  w.U32(job.stdout_pty ? 1 : 0).U32(job.bind_to).U32(job.silence_limit_ms);
  return EncodeFrame(MessageType::kJob, w.Take());
}

std::string EncodeStarted(const Started& started) {
  return EncodeFrame(MessageType::kStarted,
                     Writer().U32(started.rank).Bytes(started.binding).Take());
}

std::string EncodeOutput(const RankOutput& o) {
  return EncodeFrame(MessageType::kOutput,
                     Writer().U32(o.rank).U32(o.stream).Bytes(o.bytes).Take());
}

std::string EncodeExit(const RankExit& e) {
  return EncodeFrame(MessageType::kExit, Writer()
                                             .U32(e.rank)
                                             .U32(static_cast<uint32_t>(e.code))
                                             .U32(static_cast<uint32_t>(e.signal))
                                             .U32(static_cast<uint32_t>(e.exec_errno))
                                             .Take());
}

std::string EncodeError(absl::string_view message) {
  return EncodeFrame(MessageType::kError, Writer().Bytes(message).Take());
}

std::string EncodeJobEnd(const JobEnd& end) {
  return EncodeFrame(MessageType::kJobEnd, Writer()
                                               .U32(static_cast<uint32_t>(end.exit_code))
                                               .Bytes(end.summary)
                                               .U32(end.rejoin ? 1 : 0)
                                               .Take());
}

std::string EncodeSyncOffer(const SyncOffer& offer) {
  Writer w;
  w.Bytes(offer.dir).U32(static_cast<uint32_t>(offer.entries.size()));
  for (const SyncEntry& e : offer.entries) {
    w.Bytes(e.path).U32(e.mode).U64(e.size).U64(static_cast<uint64_t>(e.mtime_ns)).Bytes(e.link);
  }
  return EncodeFrame(MessageType::kSyncOffer, w.Take());
}

std::string EncodeSyncWant(const std::vector<uint32_t>& indices) {
  Writer w;
  w.U32(static_cast<uint32_t>(indices.size()));
  for (uint32_t index : indices) w.U32(index);
  return EncodeFrame(MessageType::kSyncWant, w.Take());
}

std::string EncodeSyncData(uint32_t index, uint64_t offset, absl::string_view bytes) {
  return EncodeFrame(MessageType::kSyncData, Writer().U32(index).U64(offset).Bytes(bytes).Take());
}

std::string EncodeSyncDone(const SyncDone& done) {
  return EncodeFrame(MessageType::kSyncDone, Writer().U32(done.files).U64(done.bytes).Take());
}

absl::StatusOr<SyncOffer> DecodeSyncOffer(absl::string_view payload) {
  Reader r(payload);
  SyncOffer offer;
  offer.dir = r.Bytes();
  uint32_t n = r.U32();
  for (uint32_t i = 0; r.ok() && i < n; ++i) {
    SyncEntry e;
    e.path = r.Bytes();
    e.mode = r.U32();
    e.size = r.U64();
    e.mtime_ns = static_cast<int64_t>(r.U64());
    e.link = r.Bytes();
    offer.entries.push_back(std::move(e));
  }
  return r.Finish(std::move(offer), "SyncOffer");
}

absl::StatusOr<std::vector<uint32_t>> DecodeSyncWant(absl::string_view payload) {
  Reader r(payload);
  std::vector<uint32_t> indices;
  uint32_t n = r.U32();
  for (uint32_t i = 0; r.ok() && i < n; ++i) indices.push_back(r.U32());
  return r.Finish(std::move(indices), "SyncWant");
}

absl::StatusOr<SyncData> DecodeSyncData(absl::string_view payload) {
  Reader r(payload);
  SyncData data;
  data.index = r.U32();
  data.offset = r.U64();
  data.bytes = r.Bytes();
  return r.Finish(std::move(data), "SyncData");
}

absl::StatusOr<SyncDone> DecodeSyncDone(absl::string_view payload) {
  Reader r(payload);
  SyncDone done;
  done.files = r.U32();
  done.bytes = r.U64();
  return r.Finish(done, "SyncDone");
}

absl::StatusOr<JobEnd> DecodeJobEnd(absl::string_view payload) {
  Reader r(payload);
  JobEnd end;
  end.exit_code = static_cast<int32_t>(r.U32());
  end.summary = r.Bytes();
  if (!r.AtEnd()) end.rejoin = r.U32() != 0;
  return r.Finish(end, "JobEnd");
}

absl::StatusOr<Hello> DecodeHello(absl::string_view payload) {
  Reader r(payload);
  Hello h;
  h.version = r.U32();
  h.hostname = r.Bytes();
  h.pid = r.U32();
  h.ssh_client_address = r.Bytes();
  // Version 1 ended here; its Hello still decodes, so that the version check can say what to do.
  if (h.version >= 2) h.gpu_count = r.U32();
  if (h.version >= 3) h.release = r.Bytes();
  if (h.version >= 4 && !r.AtEnd()) h.machine = r.Bytes();
  return r.Finish(h, "Hello");
}

absl::StatusOr<Job> DecodeJob(absl::string_view payload) {
  Reader r(payload);
  Job job;
  job.cwd = r.Bytes();
  job.argv = r.List();
  job.grace_period_ms = r.U32();
  uint32_t n = r.U32();
  // Stops at the first overrun: a count of 2^32 in a 16-byte payload costs nothing.
  for (uint32_t i = 0; r.ok() && i < n && i < (1u << 20); ++i) {
    RankJob rank;
    rank.rank = r.U32();
    rank.env = r.List();
    job.ranks.push_back(std::move(rank));
  }
  // Added after version 2's first release: a Job without it keeps the pty (the default).
  if (!r.AtEnd()) job.stdout_pty = r.U32() != 0;
  if (!r.AtEnd()) job.bind_to = r.U32();
  if (!r.AtEnd()) job.silence_limit_ms = r.U32();
  return r.Finish(job, "Job");
}

absl::StatusOr<Started> DecodeStarted(absl::string_view payload) {
  Reader r(payload);
  Started started;
  started.rank = r.U32();
  started.binding = r.Bytes();
  return r.Finish(started, "Started");
}

absl::StatusOr<RankOutput> DecodeOutput(absl::string_view payload) {
  Reader r(payload);
  RankOutput o;
  o.rank = r.U32();
  o.stream = static_cast<uint8_t>(r.U32());
  o.bytes = r.Bytes();
  return r.Finish(o, "Output");
}

absl::StatusOr<RankExit> DecodeExit(absl::string_view payload) {
  Reader r(payload);
  RankExit e;
  e.rank = r.U32();
  e.code = static_cast<int32_t>(r.U32());
  e.signal = static_cast<int32_t>(r.U32());
  e.exec_errno = static_cast<int32_t>(r.U32());
  return r.Finish(e, "Exit");
}

absl::StatusOr<std::string> DecodeError(absl::string_view payload) {
  Reader r(payload);
  std::string message = r.Bytes();
  return r.Finish(message, "Error");
}

absl::StatusOr<std::optional<Frame>> FrameReader::Next() {
  absl::string_view rest(buffer_);
  rest.remove_prefix(consumed_);
  if (rest.size() < 4) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
    return std::optional<Frame>();
  }
  uint32_t length = 0;
  for (int i = 0; i < 4; ++i) length = (length << 8) | static_cast<uint8_t>(rest[i]);
  if (length == 0 || length > kMaxFrameBytes) {
    return absl::DataLossError(absl::StrCat(
        "the agent stream is corrupt (a frame of ", length,
        " bytes); is something on the remote host printing to stdout at login (.bashrc)?"));
  }
  if (rest.size() < 4 + length) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
    return std::optional<Frame>();
  }
  Frame frame{static_cast<MessageType>(rest[4]), std::string(rest.substr(5, length - 1))};
  consumed_ += 4 + length;
  return std::optional<Frame>(std::move(frame));
}

}  // namespace trainrun::launcher::remote
