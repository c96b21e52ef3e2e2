// Per-node mode's join (torchrun's model: trainrun started once on each node). Node 0's trainrun
// is the job's launcher; every other node's trainrun dials node 0's endpoint, proves the shared
// secret, and then serves as that node's agent over the same connection (the agent protocol,
// remote/agent_protocol.h), so that one supervisor, one summary and one rendezvous serve the job:
//
//   node 0:  trainrun --nnodes 2 --node-rank 0 --rdzv-endpoint head:29400 --nproc-per-node 4 CMD
//              listens at head:29400 (NodeJoinChannel, a HostChannel), greets node 1's agent,
//              then serves the job's rendezvous at head:<a port of its own> and starts every
//              node's ranks
//   node 1:  trainrun --nnodes 2 --node-rank 1 --rdzv-endpoint head:29400 --nproc-per-node 4 CMD
//              DialNodeZero → "ok" → runs the agent over the socket until the job ends
//
// The join is a mutual challenge-response keyed by the shared secret (--rdzv-token), one line
// each way, before the agent protocol begins; the secret never crosses the wire:
//   node 0 → node K:  trainrun-node-challenge 1 <nonce0>\n
//   node K → node 0:  trainrun-node-join 1 <rdzv-id> <node-rank> <nproc> <nonceK> <proofK>\n
//   node 0 → node K:  ok <proof0>\n   or   refused <one sentence>\n
// proofK = HMAC-SHA256(secret, "join" | nonce0 | rdzv-id | node-rank | nproc | nonceK) proves
// node K to node 0; proof0 = HMAC-SHA256(secret, "node0" | nonceK | nonce0) proves node 0 to node K
// (which will run whatever node 0 sends). Without a secret both proofs are "-": anyone may join,
// and node K trusts whoever answers at the endpoint, as with torchrun. The agent protocol that
// follows is in clear except the job's token, which node 0 seals with SealKey (below).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "channel/host_channel.h"
#include "posix/unique_fd.h"
#include "trainrun/launcher/launch_spec.h"

namespace trainrun::launcher::nodes {

// JoinRequest is what a node says when it dials node 0.
struct JoinRequest {
  std::string rdzv_id;
  int node_rank = 0;
  int nproc = 0;
  std::string nonce;  // the joining node's challenge to node 0 (hex)
  std::string proof;  // HMAC over node 0's challenge and the fields above (hex); "-": no secret
};

// JoinProof is proofK for `request` answering `challenge` with `token` ("-" without a token).
std::string JoinProof(const std::string& token, const std::string& challenge,
                      const JoinRequest& request);
// NodeZeroProof is proof0 ("-" without a token).
std::string NodeZeroProof(const std::string& token, const std::string& challenge,
                          const JoinRequest& request);

// SealKey is the key that seals the job's token for the agent protocol that follows this join:
// HMAC-SHA256(secret, "seal" | nonce0 | nonceK), hex; "" without a secret.
std::string SealKey(const std::string& token, const std::string& challenge,
                    const JoinRequest& request);
// Seal hides a job token (64 hex digits) for the wire: its 32 bytes XOR HMAC-SHA256(key, "job
// token"), again 64 hex digits, so the token never crosses the network in clear while the rest of
// the agent protocol does. Its own inverse (Seal(key, Seal(key, t)) == t). Returns `value`
// unchanged with an empty key or a value that is not 64 hex digits.
std::string Seal(const std::string& key, const std::string& value);

std::string EncodeJoinRequest(const JoinRequest& request);
// DecodeJoinRequest reads one request line (without its '\n'); InvalidArgument when it is not one.
absl::StatusOr<JoinRequest> DecodeJoinRequest(absl::string_view line);

// CheckJoin says why node 0 (`spec`), which sent `challenge`, refuses `request` (one sentence
// naming the flag that differs), or OK. `joined[k]`: node k has joined already.
absl::Status CheckJoin(const PerNodeSpec& spec, const std::string& challenge,
                       const JoinRequest& request, const std::vector<bool>& joined);

// MakeNodeJoinChannel is node 0's HostChannel: Start listens at the endpoint's address and port
// and hands host i (node i+1) its stream once that node has joined; nodes that have not joined by
// the deadline get one error naming them all. With --nnodes MIN:MAX it starts once MIN nodes have
// joined and spec.last_call has passed (or all have): the others are channel::HostAbsent, and a
// node that comes later is refused with one sentence. Connections are answered concurrently, each
// under rendezvous::Admission's deadline and caps (a stranger's idle or flooding connections delay
// no node). The port stays open until the channel is destroyed, so that a node started a second
// time is told at once that its node rank has already joined.
std::unique_ptr<channel::HostChannel> MakeNodeJoinChannel(const PerNodeSpec& spec,
                                                          std::chrono::seconds start_timeout);

// DialNodeZero is a joining node's side: it dials node 0's endpoint until `deadline` (node 0 may
// start later), sends its JoinRequest and reads the answer. Returns the connected socket, ready
// for the agent protocol. Errors, one sentence: node 0 never answered (DeadlineExceeded, naming
// the endpoint and --start-timeout), node 0 refused this node (PermissionDenied, with its reason).
// `seal_key`, when given, receives this connection's SealKey. `rejoin`: the job starts again (a
// JobEnd with rejoin), so a refusal is node 0 still ending the last start: dialled again until the
// deadline.
absl::StatusOr<posix::UniqueFd> DialNodeZero(const PerNodeSpec& spec, absl::Time deadline,
                                             std::chrono::seconds start_timeout,
                                             std::string* seal_key = nullptr, bool rejoin = false);

// NnodesText is --nnodes as the user wrote it: "N", or "MIN:MAX" for a range.
std::string NnodesText(const PerNodeSpec& spec);

// EndpointText is "HOST:PORT" as the user would write it ("[v6]:PORT" for IPv6).
std::string EndpointText(const PerNodeSpec& spec);

}  // namespace trainrun::launcher::nodes
