// TLS for the rendezvous: every client (a rank, a host's relay) checks that the server holds the
// job's token before it sends anything, and then proves the token itself inside the encrypted
// channel, so that the token never crosses the network in the clear and a stranger's calls end
// before the server reads their messages.
//
// The job's certificate is made from the token: an Ed25519 key whose seed is
// HMAC-SHA256(token, kKeyLabel), in a self-signed certificate whose every field is fixed (and
// Ed25519 signatures are deterministic), so every holder of the token makes the same certificate,
// byte for byte, and nothing else has to reach the ranks: no CA, no file, no fingerprint to pass
// (the token already reaches them in TRAINRUN_JOB_TOKEN). The server presents it; a client pins it
// (the job's certificate as the only root), so whoever lacks the token cannot impersonate the
// server, and a worker of another job fails its handshake.
//
// The server does not ask for a client certificate (server-only TLS): in TLS 1.3 it would verify
// one after the client already counts itself connected, a millisecond of the server's CPU per
// connection inside a job's start. A client proves the token instead with every call, in its
// metadata (wire.h's kTokenMetadata), inside the channel; ServerCredentials checks it as a call's
// headers arrive, before gRPC reads the call's message, so a stranger that completes a handshake
// can make the server read no more than a call's headers and the flow-control window of its
// message (64 KiB) before it is refused. The listener (listener.h) counts a connection as the job's
// at its first call that passes, and closes one that has passed none within its deadline.
//
//   auto creds = ClientCredentials(token);                      // a worker's channel
//   grpc::ChannelArguments args; args.SetSslTargetNameOverride(kTlsServerName);
//   auto server_creds = ServerCredentials(token);               // the server's acceptor
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace grpc {
class ChannelCredentials;
class ServerBuilder;
class ServerCredentials;
namespace experimental {
class ExternalConnectionAcceptor;
}
}  // namespace grpc

namespace trainrun::rendezvous::internal {

// The name in the job's certificate; a client checks the server's certificate against it.
inline constexpr char kTlsServerName[] = "trainrun-rendezvous";

// JobCertificate is the job's key and certificate, PEM.
struct JobCertificate {
  std::string key_pem;
  std::string cert_pem;
};

// MakeJobCertificate makes (once per token, then from a cache) the job's certificate for
// `token` (an empty token makes one too, which no server of a job has). INTERNAL when OpenSSL
// fails.
absl::StatusOr<JobCertificate> MakeJobCertificate(const std::string& token);

// ServerCredentials: TLS with the job's certificate, asking none of the client, and refusing
// (UNAUTHENTICATED, before its message is read) every call whose metadata lacks `token`.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const std::string& token);
// AddTlsAcceptor adds to `builder` an acceptor of connections accepted elsewhere (listener.h)
// that serves them with ServerCredentials(token).
absl::StatusOr<std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor>> AddTlsAcceptor(
    grpc::ServerBuilder& builder, const std::string& token);
// ClientCredentials: TLS accepting only the job's certificate from the server (with the target
// name kTlsServerName); the token itself goes in each call's metadata. It presents the job's
// certificate to a server that asks for one (a launcher of an earlier release, which required it).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientCredentials(
    const std::string& token);

}  // namespace trainrun::rendezvous::internal
