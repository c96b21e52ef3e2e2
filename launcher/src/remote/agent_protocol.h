// The agent protocol: what the launcher and a remote `trainrun --agent` say to each other over the
// SSH channel (the agent's stdin and stdout). The job description, with the job token in its
// environment, travels here and never on a command line.
//
// Every message is one frame: a 4-byte big-endian length, then a 1-byte type, then the payload
// (length counts type and payload). Payload fields are u32 (big-endian), bytes (u32 length + data)
// and lists of bytes.
//
//   launcher                                agent
//      ──────────── (ssh exec: trainrun --agent) ──▶
//      ◀─ Hello{version, host, pid, ssh_client_address, gpu_count, release}
//      ── Job{cwd, executable, argv, ranks[{rank, env}], grace, pty, bind_to} ─▶
//      ◀─ Started{rank, binding} / Output{rank, stream, bytes} / Exit{rank, ...}
//      ── Terminate / Kill ─▶        (the job is ending elsewhere)
//      ◀─ Done                        (every rank of this host has exited)
//      ◀─▶ Heartbeat                  (each side ends the job when the other falls silent)
//      ── JobEnd{exit_code, summary, rejoin} ─▶  (per-node mode only: the job's outcome, which a
//                      joined node's trainrun prints and exits with; or, `rejoin`, that the job
//                      starts again, so it joins node 0 again)
//   Before the Job, --sync-dst-dir (file_sync.h) copies the launcher's files to the host:
//      ── SyncOffer{dir, entries[{path, mode, size, mtime, link}]} ─▶
//      ◀─ SyncWant{indices} | Error    (the files whose size or mtime differ there)
//      ── SyncData{index, offset, bytes} ... SyncEnd ─▶
//      ◀─ SyncDone{files, bytes} | Error
//   End of file on the agent's stdin means the launcher is gone: the agent kills its ranks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainrun/launcher/launch_spec.h"

namespace trainrun::launcher::remote {

// Bumped when a message changes meaning; the launcher refuses an agent of another version.
// 2: Hello carries gpu_count. 3: Hello carries the agent's trainrun release. 4: Job carries
// bind_to, Started the rank's binding. 5: the Sync messages (an older agent would not answer them),
// and Hello's machine.
inline constexpr uint32_t kProtocolVersion = 5;
// Frames larger than this are a protocol error (output comes in pieces far below it).
inline constexpr uint32_t kMaxFrameBytes = 64u << 20;

enum class MessageType : uint8_t {
  kHello = 1,
  kJob = 2,
  kStarted = 3,
  kOutput = 4,
  kExit = 5,
  kTerminate = 6,
  kKill = 7,
  kDone = 8,
  kHeartbeat = 9,
  kError = 10,
  // Sent only to per-node agents (nodes/node_join.h), whose trainrun prints the job's summary;
  // an agent of an older release ignores an unknown type, so the version stays.
  kJobEnd = 11,
  // --sync-dst-dir (file_sync.h), before the Job.
  kSyncOffer = 12,
  kSyncWant = 13,
  kSyncData = 14,
  kSyncEnd = 15,
  kSyncDone = 16,
};

struct Hello {
  uint32_t version = kProtocolVersion;
  std::string hostname;
  uint32_t pid = 0;
  std::string ssh_client_address;  // first word of SSH_CONNECTION: how the host sees the launcher
  uint32_t gpu_count = 0;          // the host's GPUs (CountHostGpus), for CUDA_VISIBLE_DEVICES
  std::string release;             // the agent's trainrun release ("0.1.0"); "" before version 3
  // The host's boot and network namespace ("<boot id> net:[<inode>]"): two names of one machine
  // give the same. At Hello's end ("" when absent, as from a version 4 agent).
  std::string machine;
};

// TrainrunRelease is this build's release, as `trainrun --version` prints it ("0.1.0").
const char* TrainrunRelease();

struct RankJob {
  uint32_t rank = 0;
  std::vector<std::string> env;  // "NAME=value": the whole worker environment
};

struct Job {
  std::string cwd;
  std::vector<std::string> argv;  // the command as typed; the agent resolves argv[0] on its PATH
  std::vector<RankJob> ranks;
  uint32_t grace_period_ms = static_cast<uint32_t>(kDefaultGracePeriod.count());
  bool stdout_pty = true;  // each rank's stdout is a pseudo-terminal (LaunchSpec::stdout_pty)
  uint32_t bind_to = 0;    // LaunchSpec::bind_to (BindTo's value): the agent binds on its CPUs
  // Silence after which the agent gives the launcher up and kills its ranks; 0: kSilenceLimit.
  // An elastic job's launcher heartbeats faster and gives up sooner (agent.h).
  uint32_t silence_limit_ms = 0;
};

// Started says a rank's command runs, and the CPUs the agent bound it to (DescribeBinding's words,
// for --report-bindings).
struct Started {
  uint32_t rank = 0;
  std::string binding;
};

struct RankExit {
  uint32_t rank = 0;
  int32_t code = 0;
  int32_t signal = 0;
  int32_t exec_errno = 0;
};

// JobEnd is the job's outcome as node 0's trainrun decided it: its exit code and the one summary
// ("" when every rank succeeded); `rejoin`: the job starts again (--max-restarts, or a node joined
// a --nnodes MIN:MAX job), so the node dials node 0 again instead of ending. A trailing field,
// which older agents ignore.
struct JobEnd {
  int32_t exit_code = 0;
  std::string summary;
  bool rejoin = false;
};

// SyncEntry is one file, directory or symbolic link under --sync-src-dir.
struct SyncEntry {
  std::string path;   // relative to the source directory, '/'-separated
  uint32_t mode = 0;  // st_mode: the type and permission bits
  uint64_t size = 0;
  int64_t mtime_ns = 0;  // nanoseconds since the epoch
  std::string link;      // a symbolic link's target
};

// SyncOffer is the source's listing and where it goes on the host.
struct SyncOffer {
  std::string dir;
  std::vector<SyncEntry> entries;
};

// SyncData is a piece of file `index` (an entry of the offer) at `offset`.
struct SyncData {
  uint32_t index = 0;
  uint64_t offset = 0;
  std::string bytes;
};

// SyncDone says what the host wrote.
struct SyncDone {
  uint32_t files = 0;
  uint64_t bytes = 0;
};

struct RankOutput {
  uint32_t rank = 0;
  uint8_t stream = 0;  // 0 stdout, 1 stderr
  std::string bytes;
};

// Frame is one decoded message: its type and raw payload.
struct Frame {
  MessageType type;
  std::string payload;
};

// EncodeFrame builds one frame.
std::string EncodeFrame(MessageType type, absl::string_view payload = {});

std::string EncodeHello(const Hello& hello);
std::string EncodeJob(const Job& job);
std::string EncodeStarted(const Started& started);
std::string EncodeOutput(const RankOutput& output);
std::string EncodeExit(const RankExit& exit);
std::string EncodeError(absl::string_view message);
std::string EncodeJobEnd(const JobEnd& end);
std::string EncodeSyncOffer(const SyncOffer& offer);
std::string EncodeSyncWant(const std::vector<uint32_t>& indices);
std::string EncodeSyncData(uint32_t index, uint64_t offset, absl::string_view bytes);
std::string EncodeSyncDone(const SyncDone& done);

// Decode* read a frame's payload; a malformed payload is an InvalidArgument.
absl::StatusOr<Hello> DecodeHello(absl::string_view payload);
absl::StatusOr<Job> DecodeJob(absl::string_view payload);
absl::StatusOr<Started> DecodeStarted(absl::string_view payload);
absl::StatusOr<RankOutput> DecodeOutput(absl::string_view payload);
absl::StatusOr<RankExit> DecodeExit(absl::string_view payload);
absl::StatusOr<std::string> DecodeError(absl::string_view payload);
absl::StatusOr<JobEnd> DecodeJobEnd(absl::string_view payload);
absl::StatusOr<SyncOffer> DecodeSyncOffer(absl::string_view payload);
absl::StatusOr<std::vector<uint32_t>> DecodeSyncWant(absl::string_view payload);
absl::StatusOr<SyncData> DecodeSyncData(absl::string_view payload);
absl::StatusOr<SyncDone> DecodeSyncDone(absl::string_view payload);

// FrameReader cuts a byte stream into frames: Append what arrived, then Next until it is empty.
class FrameReader {
 public:
  void Append(absl::string_view bytes) { buffer_.append(bytes.data(), bytes.size()); }
  // Next returns the next whole frame, nullopt when more bytes are needed, or an error for a frame
  // over kMaxFrameBytes or of length 0 (the stream is then unusable).
  absl::StatusOr<std::optional<Frame>> Next();

 private:
  std::string buffer_;
  size_t consumed_ = 0;
};

}  // namespace trainrun::launcher::remote
