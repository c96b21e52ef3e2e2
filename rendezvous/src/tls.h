// TLS for the rendezvous: the server and every client (a rank, a host's relay) prove the job's
// token to each other inside a TLS handshake, so that the token never crosses the network and a
// stranger's connection ends before the server reads any request from it.
//
// The job's certificate is made from the token: an Ed25519 key whose seed is
// HMAC-SHA256(token, kKeyLabel), in a self-signed certificate whose every field is fixed (and
// Ed25519 signatures are deterministic), so every holder of the token makes the same certificate,
// byte for byte, and nothing else has to reach the ranks: no CA, no file, no fingerprint to pass
// (the token already reaches them in TRAINRUN_JOB_TOKEN). The server presents it and requires it
// of each client (mutual TLS, the job's certificate as the only root); a client pins it the same
// way. Whoever lacks the token can neither finish a handshake with the server nor impersonate it.
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

// ServerCredentials: TLS with the job's certificate, requiring it of every client.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const std::string& token);
// AddTlsAcceptor adds to `builder` an acceptor of connections accepted elsewhere (listener.h)
// that serves them with ServerCredentials(token).
absl::StatusOr<std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor>> AddTlsAcceptor(
    grpc::ServerBuilder& builder, const std::string& token);
// ClientCredentials: TLS presenting the job's certificate and accepting only it from the server
// (with the target name kTlsServerName).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientCredentials(
    const std::string& token);

}  // namespace trainrun::rendezvous::internal
