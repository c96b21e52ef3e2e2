#include "handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <array>
#include <cstdint>
#include <cstring>

#include "trainrun/collectives/errors.h"

namespace trainrun::collectives::internal {
namespace {

using ::trainrun::internal::MakeMessage;

constexpr char kMagic[8] = {'T', 'R', 'N', 'R', 'U', 'N', 'D', 'P'};
constexpr uint32_t kVersion = 1;
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
constexpr size_t kHelloBytes = sizeof kMagic + 5 * 4 + kNonceBytes;
constexpr char kAccepted = kHandshakeAccepted;
static_assert(kHelloBytes == kHandshakeHelloBytes);
static_assert(kNonceBytes + kMacBytes == kHandshakeAnswerBytes &&
              kMacBytes == kHandshakeProofBytes);

using Hello = std::array<unsigned char, kHelloBytes>;
using Nonce = std::array<unsigned char, kNonceBytes>;
using Mac = std::array<unsigned char, kMacBytes>;

void PutU32(unsigned char* out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<unsigned char>(value >> (8 * i));
}
uint32_t GetU32(const unsigned char* in) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= static_cast<uint32_t>(in[i]) << (8 * i);
  return value;
}

Nonce RandomNonce() {
  Nonce nonce;
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
    throw IoError("cannot draw a random handshake nonce (OpenSSL RAND_bytes failed)");
  }
  return nonce;
}

// MAC over everything both ends know, so a reply cannot be replayed into another job, communicator,
// pair of ranks or direction.
Mac ComputeMac(const HandshakeParams& params, const char* role, const Hello& hello,
               const Nonce& nonce) {
  std::string message = role;
  auto add_field = [&](const std::string& field) {
    unsigned char length[4];
    PutU32(length, static_cast<uint32_t>(field.size()));
    message.append(reinterpret_cast<const char*>(length), 4);
    message += field;
  };
  add_field(params.job_id);
  add_field(params.name);
  message.append(reinterpret_cast<const char*>(hello.data()), hello.size());
  message.append(reinterpret_cast<const char*>(nonce.data()), nonce.size());
  Mac mac;
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), params.token.data(), static_cast<int>(params.token.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac.data(),
           &length) == nullptr ||
      length != mac.size()) {
    throw IoError("cannot compute the handshake MAC (OpenSSL HMAC failed)");
  }
  return mac;
}

bool SameMac(const Mac& a, const Mac& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

void HandshakeConnect(int fd, const HandshakeParams& params, int from, int to, int index,
                      const WaitLimit& limit) {
  Hello hello{};
  std::memcpy(hello.data(), kMagic, sizeof kMagic);
  unsigned char* p = hello.data() + sizeof kMagic;
  PutU32(p, kVersion);
  PutU32(p + 4, static_cast<uint32_t>(from));
  PutU32(p + 8, static_cast<uint32_t>(to));
  PutU32(p + 12, static_cast<uint32_t>(index));
  PutU32(p + 16, static_cast<uint32_t>(params.size));
  Nonce mine = RandomNonce();
  std::memcpy(p + 20, mine.data(), mine.size());
  WriteFull(fd, hello.data(), hello.size(), limit);

  Nonce theirs;
  Mac their_mac;
  ReadFull(fd, theirs.data(), theirs.size(), limit);
  ReadFull(fd, their_mac.data(), their_mac.size(), limit);
  if (!SameMac(their_mac, ComputeMac(params, "acceptor", hello, theirs))) {
    throw IoError(MakeMessage("the listener at ", PeerName(fd), " is not rank ", to,
                              " of this job (its handshake proof does not match the job token)"));
  }
  Mac proof = ComputeMac(params, "connector", hello, theirs);
  WriteFull(fd, proof.data(), proof.size(), limit);
  char accepted = 0;
  ReadFull(fd, &accepted, 1, limit);
  if (accepted != kAccepted) {
    throw IoError(MakeMessage("rank ", to, " refused the connection"));
  }
}

std::string AnswerHello(const HandshakeParams& params, int self, const unsigned char* hello_bytes,
                        AcceptorChallenge* challenge) {
  Hello& hello = challenge->hello;
  std::memcpy(hello.data(), hello_bytes, hello.size());
  if (std::memcmp(hello.data(), kMagic, sizeof kMagic) != 0) {
    throw IoError("it did not open with trainrun's handshake");
  }
  const unsigned char* p = hello.data() + sizeof kMagic;
  uint32_t version = GetU32(p);
  int from = static_cast<int>(GetU32(p + 4));
  int to = static_cast<int>(GetU32(p + 8));
  int index = static_cast<int>(GetU32(p + 12));
  int size = static_cast<int>(GetU32(p + 16));
  if (version != kVersion) throw IoError(MakeMessage("handshake version ", version, " unknown"));
  if (to != self || size != params.size || from <= self || from >= params.size || index < 0 ||
      index >= params.sockets_per_peer) {
    throw IoError(MakeMessage("it claims to be connection ", index, " from rank ", from, " of ",
                              size, " to rank ", to, ", which this rank does not expect"));
  }
  challenge->nonce = RandomNonce();
  challenge->who = PeerIdentity{from, index};
  Mac my_mac = ComputeMac(params, "acceptor", hello, challenge->nonce);
  std::string answer(reinterpret_cast<const char*>(challenge->nonce.data()),
                     challenge->nonce.size());
  answer.append(reinterpret_cast<const char*>(my_mac.data()), my_mac.size());
  return answer;
}

PeerIdentity CheckProof(const HandshakeParams& params, const AcceptorChallenge& challenge,
                        const unsigned char* proof) {
  Mac their_mac;
  std::memcpy(their_mac.data(), proof, their_mac.size());
  if (!SameMac(their_mac, ComputeMac(params, "connector", challenge.hello, challenge.nonce))) {
    throw IoError(
        MakeMessage("its proof of the job token is wrong (claimed rank ", challenge.who.rank, ")"));
  }
  return challenge.who;
}

PeerIdentity HandshakeAccept(int fd, const HandshakeParams& params, int self,
                             Clock::time_point deadline) {
  Hello hello;
  ReadFull(fd, hello.data(), hello.size(), deadline);
  AcceptorChallenge challenge;
  std::string answer = AnswerHello(params, self, hello.data(), &challenge);
  WriteFull(fd, answer.data(), answer.size(), deadline);
  Mac their_mac;
  ReadFull(fd, their_mac.data(), their_mac.size(), deadline);
  PeerIdentity who = CheckProof(params, challenge, their_mac.data());
  WriteFull(fd, &kAccepted, 1, deadline);
  return who;
}

}  // namespace trainrun::collectives::internal
