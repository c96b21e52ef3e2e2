#include "tcp_transport.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "acceptor.h"
#include "reduce.h"
#include "store_calls.h"
#include "trainrun/collectives/errors.h"

namespace trainrun::collectives::internal {
namespace {

using ::trainrun::internal::MakeMessage;

// Messages smaller than this per socket go whole over the first connection: striping them would
// cost more in system calls than it gains.
constexpr size_t kMinStripeBytes = 64 << 10;
// One send(2) moves at most this much, so a rank alternates between sending and receiving often
// enough that both directions of a connection stay busy.
constexpr size_t kMaxSendBytes = 256 << 10;
// At most this many queued sends go out in one sendmsg(2).
constexpr size_t kMaxSendParts = 8;
// SendFrame copies a frame whose data is at most this into one buffer.
constexpr size_t kCopyFrameBytes = 1024;
constexpr char kBye = 'B';
constexpr char kAbort = 'A';
// FailTimeout's question to every peer (whom it waits on), and the answer: [u32 count][u32 ranks].
constexpr char kQuery = 'Q';
constexpr char kWaits = 'W';
// How long a lost data connection waits for the abort its peer may have sent just before.
constexpr int kAbortGraceMs = 50;

// The gather of the ranks' listening addresses; rank r's is also the key "<it>/<r>".
std::string AddressGather(const std::string& name) {
  return MakeMessage("collectives/", name, "/addr");
}

}  // namespace

TcpTransport::TcpTransport(rendezvous::Store& store, int rank, int size, TcpOptions options)
    : rank_(rank), size_(size), options_(std::move(options)) {
  TRAINRUN_ENFORCE(options_.sockets_per_peer >= 1, "sockets per peer ", options_.sockets_per_peer);
  params_ = HandshakeParams{options_.token, options_.job_id, options_.name, size_,
                            options_.sockets_per_peer + 1};
  conns_.resize(static_cast<size_t>(size_) * options_.sockets_per_peer);
  controls_.resize(size_);
  for (int peer = 0; peer < size_; ++peer) {
    for (int i = 0; i < options_.sockets_per_peer; ++i) DataConn(peer, i).peer = peer;
  }
  if (size_ > 1) Establish(store);
}

void TcpTransport::Establish(rendezvous::Store& store) {
  const auto deadline = Clock::now() + options_.timeout;
  const WaitLimit limit(deadline, &options_.interrupt);
  const int per_peer = options_.sockets_per_peer + 1;  // data connections, then control
  SocketAddress bound;
  Fd listener = Listen(options_.listen_host, options_.buffer_bytes, &bound);

  std::mutex mutex;
  std::condition_variable arrived;
  int accepted = 0;
  const int expected = (size_ - 1 - rank_) * per_peer;
  auto place = [&](PeerIdentity who, Fd fd) {
    std::lock_guard<std::mutex> lock(mutex);
    Fd& slot = who.index < options_.sockets_per_peer ? DataConn(who.rank, who.index).fd
                                                     : controls_[who.rank].fd;
    if (slot.valid()) return false;
    slot = std::move(fd);
    ++accepted;
    arrived.notify_all();
    return true;
  };
  Acceptor acceptor(std::move(listener), params_, rank_, deadline, place);
  // One call gives every rank's address (the server builds the answer once for all ranks); this
  // rank connects to the lower ones and accepts the higher ones.
  const rendezvous::GatherTable addresses =
      StoreAllgather(store, AddressGather(options_.name), rank_, size_, bound.ToString(), limit,
                     MakeMessage("rank ", rank_, " exchanged addresses with the other ranks"));

  if (rank_ > 0) {
    for (int peer = 0; peer < rank_; ++peer) {
      SocketAddress address = SocketAddress::Parse(std::string(addresses[peer]));
      for (int index = 0; index < per_peer; ++index) {
        Fd fd;
        try {
          fd = Connect(address, options_.buffer_bytes, limit);
          HandshakeConnect(fd.get(), params_, rank_, peer, index, limit);
        } catch (const InterruptedError& e) {
          throw InterruptedError(MakeMessage("rank ", rank_, " connecting to rank ", peer, " at ",
                                             address.ToString(), ": ", e.what()));
        } catch (const TimeoutError& e) {
          failed_peer_ = peer;
          throw TimeoutError(MakeMessage("rank ", rank_, " could not connect to rank ", peer,
                                         " at ", address.ToString(), ": ", e.what()));
        } catch (const Error& e) {
          failed_peer_ = peer;
          throw IoError(MakeMessage("rank ", rank_, " could not connect to rank ", peer, " at ",
                                    address.ToString(), ": ", e.what()));
        }
        std::lock_guard<std::mutex> lock(mutex);
        (index < options_.sockets_per_peer ? DataConn(peer, index).fd : controls_[peer].fd) =
            std::move(fd);
      }
    }
  }

  std::unique_lock<std::mutex> lock(mutex);
  const auto all_arrived = [&] { return accepted == expected; };
  while (!arrived.wait_for(lock, limit.Slice(), all_arrived) && Clock::now() < deadline) {
    lock.unlock();
    limit.Poll(MakeMessage("rank ", rank_, " waiting for ranks above it to connect"));
    lock.lock();
  }
  if (!all_arrived()) {
    std::string missing;
    for (int peer = rank_ + 1; peer < size_; ++peer) {
      if (!controls_[peer].fd.valid() || !DataConn(peer, 0).fd.valid()) {
        missing += MakeMessage(missing.empty() ? "" : ", ", peer);
      }
    }
    throw TimeoutError(MakeMessage(
        "rank ", rank_, " timed out after ", options_.timeout.count(), " ms waiting for ranks ",
        missing, " to connect; did they start, and can they reach ", bound.ToString(), "?"));
  }
  lock.unlock();
  for (Conn& conn : conns_) {
    if (conn.fd.valid()) ConfigureDataSocket(conn.fd.get(), options_.buffer_bytes);
  }
}

TcpTransport::~TcpTransport() {
  for (Control& control : controls_) {
    if (!control.fd.valid()) continue;
    ::send(control.fd.get(), &kBye, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    // Drain what the peer sent, so closing does not answer with a reset that could overtake our
    // bye.
    char sink[256];
    while (::recv(control.fd.get(), sink, sizeof sink, MSG_DONTWAIT) > 0) {
    }
    ::shutdown(control.fd.get(), SHUT_WR);
  }
}

void TcpTransport::Abort(int peer, const std::string& message) {
  std::string text = message.substr(0, 4000);
  std::string packet(1, kAbort);
  uint32_t fields[2] = {static_cast<uint32_t>(peer), static_cast<uint32_t>(text.size())};
  packet.append(reinterpret_cast<const char*>(fields), sizeof fields);
  packet += text;
  for (Control& control : controls_) {
    if (!control.fd.valid()) continue;
    ::send(control.fd.get(), packet.data(), packet.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    control.fd.Reset();
  }
  for (Conn& conn : conns_) conn.fd.Reset();
}

Request TcpTransport::NewRequest(int parts) {
  remaining_.push_back(static_cast<uint32_t>(parts));
  if (parts > 0) ++pending_requests_;
  return remaining_.size() - 1;
}

void TcpTransport::Post(std::deque<Op> Conn::*queue, int peer, char* data, size_t bytes,
                        Request request) {
  const int k = options_.sockets_per_peer;
  if (k == 1 || bytes < k * kMinStripeBytes) {
    (DataConn(peer, 0).*queue).push_back(Op{data, bytes, request});
    return;
  }
  size_t part = ((bytes + k - 1) / k + 4095) & ~size_t{4095};
  for (int i = 0; i < k && bytes > 0; ++i) {
    size_t n = std::min(part, bytes);
    (DataConn(peer, i).*queue).push_back(Op{data, n, request});
    data += n;
    bytes -= n;
  }
}

namespace {
int Parts(size_t bytes, int k) {
  if (bytes == 0) return 0;
  if (k == 1 || bytes < k * kMinStripeBytes) return 1;
  size_t part = ((bytes + k - 1) / k + 4095) & ~size_t{4095};
  return static_cast<int>((bytes + part - 1) / part);
}
}  // namespace

Request TcpTransport::Send(int peer, const void* data, size_t bytes) {
  TRAINRUN_ENFORCE(peer >= 0 && peer < size_ && peer != rank_, "bad peer ", peer);
  Request request = NewRequest(Parts(bytes, options_.sockets_per_peer));
  if (bytes > 0) {
    Post(&Conn::sends, peer, static_cast<char*>(const_cast<void*>(data)), bytes, request);
  }
  return request;
}

Request TcpTransport::Recv(int peer, void* data, size_t bytes) {
  TRAINRUN_ENFORCE(peer >= 0 && peer < size_ && peer != rank_, "bad peer ", peer);
  Request request = NewRequest(Parts(bytes, options_.sockets_per_peer));
  if (bytes > 0) Post(&Conn::recvs, peer, static_cast<char*>(data), bytes, request);
  return request;
}

void TcpTransport::CompletePart(Request request) {
  if (--remaining_[request] == 0) --pending_requests_;
}

bool TcpTransport::ProgressSends(Conn& conn) {
  bool moved = false;
  while (!conn.sends.empty() && conn.maybe_writable) {
    // The queued sends go out together, up to kMaxSendBytes: one system call for a frame's head and
    // its data (TryCheckedAllreduce), no copy into one buffer.
    iovec parts[kMaxSendParts];
    size_t count = 0, total = 0;
    for (const Op& op : conn.sends) {
      if (count == kMaxSendParts || total == kMaxSendBytes) break;
      const size_t take = std::min(op.left, kMaxSendBytes - total);
      parts[count++] = {op.data, take};
      total += take;
    }
    msghdr message{};
    message.msg_iov = parts;
    message.msg_iovlen = count;
    // One part goes by send(2), which spares the kernel importing an iovec.
    ssize_t n = count == 1 ? ::send(conn.fd.get(), parts[0].iov_base, parts[0].iov_len,
                                    MSG_DONTWAIT | MSG_NOSIGNAL)
                           : ::sendmsg(conn.fd.get(), &message, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      moved = true;
      size_t sent = static_cast<size_t>(n);
      while (sent > 0) {
        Op& op = conn.sends.front();
        const size_t k = std::min(sent, op.left);
        op.data += k;
        op.left -= k;
        sent -= k;
        if (op.left == 0) {
          CompletePart(op.request);
          conn.sends.pop_front();
        }
      }
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      conn.maybe_writable = false;
    } else if (errno != EINTR) {
      FailLost(conn.peer,
               MakeMessage("sending to rank ", conn.peer, " failed (", std::strerror(errno),
                           "): rank ", conn.peer, " exited or its connection broke"));
    }
  }
  return moved;
}

bool TcpTransport::ProgressRecvs(Conn& conn) {
  bool moved = false;
  // Bytes a frame head's receive took past its frame come before the socket's.
  while (!conn.recvs.empty() && conn.stash_from < conn.stash.size()) {
    Op& op = conn.recvs.front();
    const size_t k = std::min(op.left, conn.stash.size() - conn.stash_from);
    std::memcpy(op.data, conn.stash.data() + conn.stash_from, k);
    conn.stash_from += k;
    op.data += k;
    op.left -= k;
    moved = true;
    if (op.left == 0) {
      conn.overread = 0;
      CompletePart(op.request);
      conn.recvs.pop_front();
    }
  }
  while (!conn.recvs.empty() && conn.maybe_readable) {
    Op& op = conn.recvs.front();
    ssize_t n = ::recv(conn.fd.get(), op.data, op.left + op.extra, MSG_DONTWAIT);
    if (n > 0) {
      moved = true;
      const auto got = static_cast<size_t>(n);
      if (got >= op.left) {
        conn.overread = got - op.left;
        CompletePart(op.request);
        conn.recvs.pop_front();
      } else {
        op.data += got;
        op.left -= got;
      }
    } else if (n == 0) {
      FailLost(conn.peer, controls_[conn.peer].said_bye
                              ? MakeMessage("rank ", conn.peer,
                                            " closed its communicator while this rank still "
                                            "expected data from it (mismatched collectives?)")
                              : MakeMessage("the connection to rank ", conn.peer, " closed: rank ",
                                            conn.peer, " exited or was killed"));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      conn.maybe_readable = false;
    } else if (errno != EINTR) {
      FailLost(conn.peer,
               MakeMessage("receiving from rank ", conn.peer, " failed (", std::strerror(errno),
                           "): rank ", conn.peer, " exited or its connection broke"));
    }
  }
  return moved;
}

bool TcpTransport::Progress() {
  bool moved = false;
  for (Conn& conn : conns_) {
    if (!conn.sends.empty()) moved |= ProgressSends(conn);
    if (!conn.recvs.empty()) moved |= ProgressRecvs(conn);
  }
  return moved;
}

bool TcpTransport::PollOnce(int timeout_ms) {
  std::vector<pollfd>& fds = poll_fds_;
  std::vector<int>& owner = poll_owner_;
  fds.clear();
  owner.clear();
  for (size_t i = 0; i < conns_.size(); ++i) {
    Conn& conn = conns_[i];
    short events = 0;
    if (!conn.sends.empty() && !conn.maybe_writable) events |= POLLOUT;
    if (!conn.recvs.empty() && !conn.maybe_readable) events |= POLLIN;
    if (events == 0) continue;
    fds.push_back(pollfd{conn.fd.get(), events, 0});
    owner.push_back(static_cast<int>(i));
  }
  for (int peer = 0; peer < size_; ++peer) {
    if (!controls_[peer].fd.valid()) continue;
    fds.push_back(pollfd{controls_[peer].fd.get(), POLLIN, 0});
    owner.push_back(-(peer + 1));
  }
  int n = ::poll(fds.data(), fds.size(), timeout_ms);
  if (n < 0) {
    if (errno == EINTR) return false;
    throw IoError(MakeMessage("rank ", rank_, ": poll failed: ", std::strerror(errno)));
  }
  if (n == 0) return false;
  for (size_t i = 0; i < fds.size(); ++i) {
    short revents = fds[i].revents;
    if (revents == 0) continue;
    if (owner[i] < 0) {
      ReadControl(-owner[i] - 1);
      continue;
    }
    Conn& conn = conns_[owner[i]];
    if (revents & (POLLIN | POLLHUP | POLLERR)) conn.maybe_readable = true;
    if (revents & (POLLOUT | POLLHUP | POLLERR)) conn.maybe_writable = true;
  }
  return true;
}

void TcpTransport::FailLost(int peer, const std::string& message) {
  // A peer that failed because of another rank sends an abort naming it on its control
  // connection just before it closes its data connections; read it first, so the blame goes to
  // the rank that failed first rather than to the peer that passed the failure on.
  Control& control = controls_[peer];
  if (control.fd.valid()) {
    pollfd readable{control.fd.get(), POLLIN, 0};
    if (::poll(&readable, 1, kAbortGraceMs) > 0) ReadControl(peer);  // throws on an abort
  }
  Fail(peer, message);
}

void TcpTransport::ReadControl(int peer) {
  Control& control = controls_[peer];
  char buffer[4096];
  ssize_t n = ::recv(control.fd.get(), buffer, sizeof buffer, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0) {
    if (control.said_bye) {
      control.fd.Reset();  // a clean close; data still buffered from it stays readable
      return;
    }
    Fail(peer, MakeMessage("rank ", peer, " exited or was killed (its connection closed)"));
  }
  control.received.append(buffer, static_cast<size_t>(n));
  while (!control.received.empty()) {
    const char kind = control.received[0];
    if (kind == kBye) {
      control.said_bye = true;
      control.received.erase(0, 1);
      continue;
    }
    if (kind == kQuery) {  // a peer timed out and asks whom this rank waits on
      control.received.erase(0, 1);
      AnswerQuery(peer);
      continue;
    }
    if (kind == kWaits) {  // the answer to this rank's query (FailTimeout)
      uint32_t count = 0;
      if (control.received.size() < 1 + sizeof count) return;
      std::memcpy(&count, control.received.data() + 1, sizeof count);
      if (count > static_cast<uint32_t>(size_)) {
        Fail(peer, MakeMessage("rank ", peer, " answered that it waits on ", count,
                               " ranks, more than the ", size_,
                               " there are (a different trainrun build?)"));
      }
      const size_t length = 1 + sizeof count + count * sizeof(uint32_t);
      if (control.received.size() < length) return;
      control.waits.resize(count);
      for (uint32_t i = 0; i < count; ++i) {
        uint32_t word = 0;
        std::memcpy(&word, control.received.data() + 1 + sizeof count + i * sizeof word,
                    sizeof word);
        control.waits[i] = static_cast<int>(word);
      }
      control.answered = true;
      control.received.erase(0, length);
      continue;
    }
    if (kind != kAbort) {
      Fail(peer, MakeMessage("rank ", peer, " sent garbage on its control connection"));
    }
    uint32_t fields[2];
    if (control.received.size() < 1 + sizeof fields) return;
    std::memcpy(fields, control.received.data() + 1, sizeof fields);
    if (control.received.size() < 1 + sizeof fields + fields[1]) return;
    std::string text = control.received.substr(1 + sizeof fields, fields[1]);
    control.received.erase(0, 1 + sizeof fields + fields[1]);
    int culprit = static_cast<int>(fields[0]);
    if (culprit < 0 || culprit >= size_) culprit = peer;
    if (culprit == rank_) {
      // A peer that timed out waiting on this rank blames it (it got no answer in time), but this
      // rank is alive and waiting too: pass the blame on to whoever this rank waits on. The peer
      // closed its connections after its abort: it waits on nobody now and is not the one to
      // blame (FailTimeout must neither wait for its answer nor read its closed connection as a
      // death). While this rank works that out already, the peer's word adds nothing more.
      control.answered = true;
      control.waits.clear();
      control.fd.Reset();
      if (resolving_) return;
      FailTimeout();
    }
    Fail(culprit, MakeMessage("rank ", culprit, " failed, as rank ", peer, " reports: ", text));
  }
}

void TcpTransport::Fail(int peer, const std::string& message) {
  failed_peer_ = peer;
  throw IoError(MakeMessage("rank ", rank_, ": ", message));
}

std::vector<int> TcpTransport::WaitedOn() const {
  // The peers this rank waits to hear from; only when it waits on none, those it cannot send to.
  std::set<int> receiving, sending;
  for (const Conn& conn : conns_) {
    if (!conn.recvs.empty()) receiving.insert(conn.peer);
    if (!conn.sends.empty()) sending.insert(conn.peer);
  }
  const std::set<int>& waited = receiving.empty() ? sending : receiving;
  return std::vector<int>(waited.begin(), waited.end());
}

void TcpTransport::AnswerQuery(int peer) {
  const std::vector<int> waited = WaitedOn();
  const uint32_t count = static_cast<uint32_t>(waited.size());
  std::string packet(1, kWaits);
  packet.append(reinterpret_cast<const char*>(&count), sizeof count);
  for (int rank : waited) {
    const uint32_t word = static_cast<uint32_t>(rank);
    packet.append(reinterpret_cast<const char*>(&word), sizeof word);
  }
  ::send(controls_[peer].fd.get(), packet.data(), packet.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

void TcpTransport::AskWhomPeersWait() {
  const char query = kQuery;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_ || !controls_[peer].fd.valid()) continue;
    ::send(controls_[peer].fd.get(), &query, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  }
  // Every peer inside a collective reads its control connection while it waits (PollOnce) and
  // answers at once; a tenth of the timeout (50 ms to 1 s) leaves room for a loaded machine.
  const int grace_ms =
      static_cast<int>(std::clamp<int64_t>(options_.timeout.count() / 10, kAbortGraceMs, 1000));
  const auto grace_end = Clock::now() + std::chrono::milliseconds(grace_ms);
  for (auto now = Clock::now(); now < grace_end; now = Clock::now()) {
    std::vector<pollfd> fds;
    std::vector<int> peers;
    bool all_answered = true;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_ || !controls_[peer].fd.valid()) continue;
      all_answered &= controls_[peer].answered;
      // Every peer's connection is read, the answered ones too: a peer that times out meanwhile
      // asks this rank in turn, and an abort naming the rank that failed ends the wait (throws).
      fds.push_back(pollfd{controls_[peer].fd.get(), POLLIN, 0});
      peers.push_back(peer);
    }
    if (all_answered) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(grace_end - now);
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(left.count()) + 1);
    if (ready < 0 && errno != EINTR) break;
    for (size_t i = 0; ready > 0 && i < fds.size(); ++i) {
      if (fds[i].revents != 0 && controls_[peers[i]].fd.valid()) ReadControl(peers[i]);
    }
  }
}

void TcpTransport::FailTimeout() {
  const std::vector<int> waited = WaitedOn();
  // A peer this rank waits on may be alive and itself waiting inside the collective on another
  // rank (recursive doubling's second step waits on a partner that waits on the first step's;
  // a ring's neighbour on its own): naming it would blame a rank that only passed the stall on.
  // So every peer is asked whom it waits on, and the waits are followed from the peers this rank
  // waits on to a rank that did not answer: one in no collective (stopped, or stuck outside the
  // collectives), the rank the others wait for.
  resolving_ = true;
  AskWhomPeersWait();
  std::vector<int> from(size_, -2);  // the rank whose wait led to each rank; -2: not reached
  std::vector<int> queue;
  for (int peer : waited) {
    from[peer] = -1;
    queue.push_back(peer);
  }
  from[rank_] = rank_;  // this rank's own waits are `waited`
  std::vector<int> culprits;
  for (size_t i = 0; i < queue.size(); ++i) {
    const int q = queue[i];
    if (!controls_[q].answered) {
      culprits.push_back(q);
      continue;
    }
    for (int next : controls_[q].waits) {
      if (next < 0 || next >= size_ || from[next] != -2) continue;
      from[next] = q;
      queue.push_back(next);
    }
  }
  std::sort(culprits.begin(), culprits.end());
  std::string how, chain_text;
  if (culprits.empty()) {
    // Every rank waited on answered from inside a collective: they wait on each other (calls
    // that do not match, or a rank in another collective).
    culprits = waited;
    how = "stalled, or not calling the same collective";
  } else {
    how = MakeMessage(culprits.size() == 1 ? "it is" : "they are",
                      " in no collective (no answer from one): stalled, or stuck outside the "
                      "collectives");
    // The chain of waits from this rank to the first culprit, when it passes through others.
    std::vector<int> chain;
    for (int q = culprits.front(); q >= 0; q = from[q]) chain.push_back(q);
    std::reverse(chain.begin(), chain.end());
    if (chain.size() > 1) {
      chain_text = MakeMessage("; rank ", rank_, " waited on rank ", chain[0]);
      for (size_t i = 1; i < chain.size(); ++i) {
        chain_text += MakeMessage(", which waits in the collective for rank ", chain[i]);
      }
    }
  }
  std::string names;
  for (int peer : culprits) names += MakeMessage(names.empty() ? "" : ", ", peer);
  failed_peer_ = culprits.empty() ? -1 : culprits.front();
  throw TimeoutError(MakeMessage("rank ", rank_, ": ", culprits.size() == 1 ? "rank " : "ranks ",
                                 names, " moved no data for ", options_.timeout.count(), " ms: ",
                                 how, " (raise TRAINRUN_TIMEOUT if it is just slow)", chain_text));
}

void TcpTransport::Wait(Request request) {
  if (request >= remaining_.size() || remaining_[request] == 0) return;
  if (Progress() && remaining_[request] == 0) return;  // no wait: spinning neither paid nor failed
  auto last_progress = Clock::now();
  auto last_interrupt_check = last_progress;
  // Spin only while spinning pays (see spin_skip_): a wait whose spin ran out makes the next
  // 2^k - 1 waits sleep at once, k the spins that ran out in a row (at most 6).
  const bool spin = options_.spin.count() > 0 && spin_skip_ == 0;
  if (spin_skip_ > 0) --spin_skip_;
  bool spin_ran_out = false;
  while (remaining_[request] > 0) {
    if (Progress()) {
      if (remaining_[request] == 0) break;
      last_progress = Clock::now();
      continue;
    }
    auto now = Clock::now();
    if (now - last_progress >= options_.timeout) FailTimeout();
    if (options_.interrupt && now - last_progress >= kInterruptCheck &&
        now - last_interrupt_check >= kInterruptCheck) {
      last_interrupt_check = now;
      if (options_.interrupt()) {
        failed_peer_ = -1;
        ThrowInterrupted(MakeMessage("rank ", rank_, ": waiting in a collective"));
      }
    }
    int wait_ms = 0;
    if (!spin || now - last_progress >= options_.spin) {
      spin_ran_out = spin;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(options_.timeout -
                                                                        (now - last_progress));
      wait_ms = static_cast<int>(
          std::clamp<int64_t>(left.count() + 1, 1, options_.interrupt ? 100 : 1000));
    }
    PollOnce(wait_ms);
  }
  if (spin) {
    spin_misses_ = spin_ran_out ? std::min(spin_misses_ + 1, 6) : 0;
    spin_skip_ = (1 << spin_misses_) - 1;
  }
}

void TcpTransport::WaitAll() {
  for (Request r = 0; r < remaining_.size(); ++r) Wait(r);
  remaining_.clear();
  pending_requests_ = 0;
}

// --- Framed exchanges: records, and a small allreduce's data with them
// ------------------------------------

char* TcpTransport::SendBuffer(size_t bytes) {
  // Grown, never shrunk: a resize that grows value-initializes.
  if (frame_send_.size() < bytes) frame_send_.resize(bytes);
  return frame_send_.data();
}

void TcpTransport::SendFrame(int peer, const char* all, size_t record_bytes, int first, int end,
                             const void* data, size_t bytes) {
  const size_t records = (end - first) * record_bytes;
  if (bytes <= kCopyFrameBytes) {
    // A small frame is copied into one buffer: one queued send instead of three, which at
    // several ranks a core (each rank's CPU on the others' path) costs more than the copy.
    const uint64_t length = bytes;
    const size_t frame = sizeof length + records + bytes;
    char* at = SendBuffer(frame);
    std::memcpy(at, &length, sizeof length);
    std::memcpy(at + sizeof length, all + first * record_bytes, records);
    if (bytes > 0) std::memcpy(at + sizeof length + records, data, bytes);
    Send(peer, at, frame);
    return;
  }
  length_out_ = bytes;
  // Length, records and data leave in one sendmsg (ProgressSends), without a copy.
  Send(peer, &length_out_, sizeof length_out_);
  Send(peer, all + first * record_bytes, records);
  Send(peer, data, bytes);
}

uint64_t TcpTransport::RecvHead(int peer, char* all, size_t record_bytes, int first, int end,
                                size_t expected) {
  const size_t records = (end - first) * record_bytes;
  RecvFrameHead(peer, sizeof(uint64_t) + records, expected);
  const uint64_t theirs = AnnouncedBytes(peer);
  std::memcpy(all + first * record_bytes, FrameHead() + sizeof theirs, records);
  return theirs;
}

void TcpTransport::RecvFrameHead(int peer, size_t head, size_t expected) {
  frame_at_ = (16 - head % 16) % 16;
  frame_head_ = head;
  frame_got_ = 0;
  const int k = options_.sockets_per_peer;
  Conn& conn = DataConn(peer, 0);
  // Grown, never shrunk: a resize that grows value-initializes, and head + expected varies.
  if (frame_in_.size() < frame_at_ + head + expected) frame_in_.resize(frame_at_ + head + expected);
  char* into = frame_in_.data() + frame_at_;
  // The head and the data after it arrive together (the peer sent them in one sendmsg), so one
  // recv takes both when the data is as long as this rank's; when it is shorter, what the recv
  // took of the peer's next frame goes back to the connection (RecvData).
  if (expected > 0 && conn.recvs.empty() && (k == 1 || head + expected < k * kMinStripeBytes)) {
    const Request request = NewRequest(1);
    conn.recvs.push_back(Op{into, head, request, expected});
    conn.overread = 0;
    Wait(request);
    frame_got_ = conn.overread;
  } else {
    Wait(Recv(peer, into, head));
  }
}

uint64_t TcpTransport::AnnouncedBytes(int peer) {
  uint64_t theirs = 0;
  std::memcpy(&theirs, FrameHead(), sizeof theirs);
  if (theirs > FoldBytes(size_)) {
    Fail(peer, MakeMessage("rank ", peer, " sent a frame announcing ", theirs,
                           " bytes of data, more than the ", FoldBytes(size_),
                           " any rank sends (a different trainrun build?)"));
  }
  return theirs;
}

void TcpTransport::RecvData(int peer, uint64_t theirs, char* into) {
  const char* got = FrameHead() + frame_head_;
  const size_t have = std::min<size_t>(frame_got_, theirs);
  if (frame_got_ > theirs) {
    Conn& conn = DataConn(peer, 0);
    TRAINRUN_ENFORCE(conn.stash_from == conn.stash.size(), "rank ", rank_, ": bytes from rank ",
                     peer, " left unread before a frame's");
    conn.stash.assign(got + theirs, got + frame_got_);
    conn.stash_from = 0;
  }
  frame_got_ = 0;
  if (into != nullptr) {
    std::memcpy(into, got, have);
    if (theirs > have) Recv(peer, into + have, theirs - have);
    payload_ = into;
  } else if (frame_in_.size() - (got - frame_in_.data()) >= theirs) {
    // Where the head's receive put its part: the rest after it (nothing to receive, often).
    if (theirs > have) Recv(peer, const_cast<char*>(got) + have, theirs - have);
    payload_ = got;
  } else {
    payload_in_.resize(std::max<size_t>(payload_in_.size(), theirs));
    std::memcpy(payload_in_.data(), got, have);
    Recv(peer, payload_in_.data() + have, theirs - have);
    payload_ = payload_in_.data();
  }
  WaitAll();
}

void TcpTransport::FramedExchange(const char* input, char* output, size_t count, DataType type,
                                  ReduceOp op, char* all, size_t record_bytes,
                                  FunctionRef<bool(bool)>* reduce) {
  const int n = size_;
  const int r = rank_;
  const size_t bytes = reduce != nullptr ? count * ElementSize(type) : 0;
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int extra = n - p;
  // Virtual rank v of the doubling stands for ranks [First(v), End(v)): a folded pair or one rank.
  auto first_of = [&](int v) { return v < extra ? 2 * v : v + extra; };
  auto end_of = [&](int v) { return v < extra ? 2 * v + 2 : v + extra + 1; };
  auto decide = [&] {
    const char* mine = all + r * record_bytes;
    bool same = true;
    for (int q = 0; q < n && same; ++q) {
      same = q == r || std::memcmp(all + q * record_bytes, mine, record_bytes) == 0;
    }
    return reduce != nullptr && (*reduce)(same);
  };
  // The reduction of the data of the ranks whose records this rank holds: `input` until it has
  // reduced something, then sum_; `valid` false once a peer's frame lacked its data (a rank in a
  // different call: the records will disagree and nothing is reduced into `output`).
  const char* sum = input;
  bool valid = bytes > 0;
  if (bytes > 0 && sum_.size() < bytes) sum_.resize(bytes);
  // Folded pairs: the even rank hands its record and data to the odd one, and waits for the end.
  if (r < 2 * extra && r % 2 == 0) {
    SendFrame(r + 1, all, record_bytes, r, r + 1, input, bytes);
    WaitAll();
    const uint64_t theirs = RecvHead(r + 1, all, record_bytes, 0, n, bytes);
    const bool reduced = decide();
    if (reduced) {
      TRAINRUN_ENFORCE(theirs == bytes, "rank ", r + 1, " sent ", theirs,
                       " bytes for an allreduce of ", bytes);
    }
    RecvData(r + 1, theirs, reduced ? output : nullptr);
    return;
  }
  int v = r - extra;
  if (r < 2 * extra) {
    v = r / 2;
    const uint64_t theirs = RecvHead(r - 1, all, record_bytes, r - 1, r, bytes);
    RecvData(r - 1, theirs, nullptr);
    if (valid && theirs == bytes) {
      Reduce(type, op, sum_.data(), payload_, input, count);  // the lower rank first
      sum = sum_.data();
    } else {
      valid = false;
    }
  }
  bool reduced = false;
  for (int mask = 1; mask < p; mask <<= 1) {
    const int pv = v ^ mask;
    const int peer = first_of(pv) + (pv < extra ? 1 : 0);
    const int mine = v & ~(mask - 1);
    const int theirs_from = pv & ~(mask - 1);
    SendFrame(peer, all, record_bytes, first_of(mine), end_of(mine + mask - 1), sum,
              valid ? bytes : 0);
    const uint64_t theirs = RecvHead(peer, all, record_bytes, first_of(theirs_from),
                                     end_of(theirs_from + mask - 1), bytes);
    const bool usable = valid && theirs == bytes;
    const bool last = mask * 2 == p;
    if (last) reduced = decide();  // every record is here now
    RecvData(peer, theirs, nullptr);
    if (!usable) {
      valid = false;
      if (reduced) {
        TRAINRUN_ENFORCE(false, "rank ", peer, " sent ", theirs, " bytes for an allreduce of ",
                         bytes);
      }
      continue;
    }
    // The lower ranks' sum first, on both sides, so that both compute the same bits.
    const char* lower = (v & mask) != 0 ? payload_ : sum;
    const char* upper = (v & mask) != 0 ? sum : payload_;
    if (!last) {
      Reduce(type, op, sum_.data(), lower, upper, count);
      sum = sum_.data();
    } else if (reduced) {
      Reduce(type, op, output, lower, upper, count);
      if (op == ReduceOp::kAverage) Divide(type, output, count, n);
    }
  }
  if (r < 2 * extra) {  // the odd rank of a pair hands the result back
    SendFrame(r - 1, all, record_bytes, 0, n, output, reduced ? bytes : 0);
    WaitAll();
  }
}

uint64_t TcpTransport::ExchangeFrames(const void* data, size_t bytes) {
  const int peer = 1 - rank_;
  const size_t head = frame_out_.size();
  if (bytes <= kCopyFrameBytes) {  // one queued send, as SendFrame's small frames
    char* at = SendBuffer(head + bytes);
    std::memcpy(at, frame_out_.data(), head);
    if (bytes > 0) std::memcpy(at + head, data, bytes);
    Send(peer, at, head + bytes);
  } else {
    // The head and the data leave in one sendmsg (ProgressSends), without a copy.
    Send(peer, frame_out_.data(), head);
    Send(peer, data, bytes);
  }
  RecvFrameHead(peer, head, bytes);
  const uint64_t theirs = AnnouncedBytes(peer);
  RecvData(peer, theirs, nullptr);
  return theirs;
}

bool TcpTransport::TryAllgather(const void* input, void* output, size_t bytes) {
  if (size_ < 2 || bytes == 0 || bytes > kFrameRecordBytes) return false;
  char* all = static_cast<char*>(output);
  if (size_ == 2) {
    const uint64_t none = 0;
    frame_out_.resize(sizeof none + bytes);
    std::memcpy(frame_out_.data(), &none, sizeof none);
    std::memcpy(frame_out_.data() + sizeof none, input, bytes);
    ExchangeFrames(nullptr, 0);  // a peer's allreduce data, if its frame has any, is drained
    std::memmove(all + rank_ * bytes, frame_out_.data() + sizeof none, bytes);
    std::memcpy(all + (1 - rank_) * bytes, FrameHead() + sizeof none, bytes);
    return true;
  }
  if (input != all + rank_ * bytes) std::memmove(all + rank_ * bytes, input, bytes);
  // A peer's allreduce data, if its frames carry any, is drained.
  FramedExchange(nullptr, nullptr, 0, DataType::kUInt8, ReduceOp::kSum, all, bytes, nullptr);
  return true;
}

bool TcpTransport::TryCheckedAllreduce(const void* input, void* output, size_t count, DataType type,
                                       ReduceOp op, const void* record, size_t record_bytes,
                                       void* records, FunctionRef<bool(bool)> reduce) {
  const size_t bytes = count * ElementSize(type);
  if (size_ < 2 || count == 0 || bytes > FoldBytes(size_) || record_bytes > kFrameRecordBytes ||
      op == ReduceOp::kAdasum) {
    return false;
  }
  char* all = static_cast<char*>(records);
  if (size_ > 2) {
    std::memcpy(all + rank_ * record_bytes, record, record_bytes);
    FramedExchange(static_cast<const char*>(input), static_cast<char*>(output), count, type, op,
                   all, record_bytes, &reduce);
    return true;
  }
  const uint64_t length = bytes;
  frame_out_.resize(sizeof length + record_bytes);
  std::memcpy(frame_out_.data(), &length, sizeof length);
  std::memcpy(frame_out_.data() + sizeof length, record, record_bytes);
  // Both frames are whole once this returns: the input went out (output may be the input).
  const uint64_t theirs = ExchangeFrames(input, bytes);
  const char* their_record = FrameHead() + sizeof length;
  const bool same = std::memcmp(their_record, record, record_bytes) == 0;
  if (!same) {
    std::memcpy(all + rank_ * record_bytes, record, record_bytes);
    std::memcpy(all + (1 - rank_) * record_bytes, their_record, record_bytes);
  }
  if (reduce(same)) {
    TRAINRUN_ENFORCE(theirs == bytes, "rank ", 1 - rank_, " sent ", theirs,
                     " bytes for an allreduce of ", bytes);
    // Rank 0's data first on both ranks, so that both compute the same bits.
    const char* mine = static_cast<const char*>(input);
    const char* first = rank_ == 0 ? mine : payload_;
    const char* second = rank_ == 0 ? payload_ : mine;
    Reduce(type, op, output, first, second, count);
    if (op == ReduceOp::kAverage) Divide(type, output, count, 2);
  }
  return true;
}

}  // namespace trainrun::collectives::internal
