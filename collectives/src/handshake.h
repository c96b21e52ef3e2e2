// The handshake every data connection opens with, so that only ranks of this job (who know its
// token) are read as peers. Mutual challenge-response with HMAC-SHA256 keyed by the job token:
//
//   connector -> acceptor  hello: magic, version, from rank, to rank, socket index, world size,
//                          connector nonce
//   acceptor  -> connector acceptor nonce, HMAC(token, "acceptor" | job | name | hello | nonce)
//                          (hello holds the connector nonce, so both MACs answer a fresh challenge)
//   connector -> acceptor  HMAC(token, "connector" | job | name | hello | nonce)
//   acceptor  -> connector one byte 'K'
//
// The token never crosses the wire; MACs are compared in constant time; a connection that sends
// anything else, or nothing before the deadline, is refused.
#pragma once

#include <array>
#include <string>

#include "socket.h"

namespace trainrun::collectives::internal {

// HandshakeParams is what both ends must agree on.
struct HandshakeParams {
  std::string token;
  std::string job_id;
  std::string name;          // the communicator's name
  int size = 0;              // ranks in the communicator
  int sockets_per_peer = 0;  // connections between each pair of ranks
};

// PeerIdentity is who a proven connection comes from.
struct PeerIdentity {
  int rank = -1;
  int index = -1;  // which of the pair's connections this is
};

// The acceptor's side in steps, for a poll loop that serves many connections on one thread:
// read kHelloBytes, AnswerHello, send the answer, read kProofBytes, CheckProof, send kAccepted.
inline constexpr size_t kHandshakeHelloBytes = 8 + 5 * 4 + 32;
inline constexpr size_t kHandshakeAnswerBytes = 32 + 32;
inline constexpr size_t kHandshakeProofBytes = 32;
inline constexpr char kHandshakeAccepted = 'K';

// AcceptorChallenge is what the acceptor keeps between a connector's hello and its proof.
struct AcceptorChallenge {
  std::array<unsigned char, kHandshakeHelloBytes> hello{};
  std::array<unsigned char, 32> nonce{};
  PeerIdentity who;
};

// AnswerHello checks a connector's hello (kHandshakeHelloBytes) for rank `self` and returns the
// answer to send (kHandshakeAnswerBytes); `challenge` keeps what CheckProof needs. Throws IoError
// saying why the connection is refused.
std::string AnswerHello(const HandshakeParams& params, int self, const unsigned char* hello,
                        AcceptorChallenge* challenge);

// CheckProof checks the connector's proof (kHandshakeProofBytes) and returns who connected.
// Throws IoError when the proof does not match the job token.
PeerIdentity CheckProof(const HandshakeParams& params, const AcceptorChallenge& challenge,
                        const unsigned char* proof);

// HandshakeConnect runs the connector's side on `fd` as rank `from` for connection `index` to rank
// `to`. Throws IoError (the other end is not that rank of this job), TimeoutError or
// InterruptedError (wait_limit.h).
void HandshakeConnect(int fd, const HandshakeParams& params, int from, int to, int index,
                      const WaitLimit& limit);

// HandshakeAccept runs the acceptor's side on `fd` for rank `self`, and returns who connected.
// Throws IoError saying why the connection was refused, or TimeoutError.
PeerIdentity HandshakeAccept(int fd, const HandshakeParams& params, int self,
                             Clock::time_point deadline);

}  // namespace trainrun::collectives::internal
