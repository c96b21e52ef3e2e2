#include "tls.h"

#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "wire.h"

namespace trainrun::rendezvous::internal {
namespace {

// What the key's seed is made from; a new label makes new certificates (never reuse one).
constexpr char kKeyLabel[] = "trainrun rendezvous TLS key, version 1";
// Fixed, so that every holder of the token makes the same certificate.
constexpr char kNotBefore[] = "20000101000000Z";
constexpr char kNotAfter[] = "99991231235959Z";

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct X509Free {
  void operator()(X509* p) const { X509_free(p); }
};
struct BioFree {
  void operator()(BIO* p) const { BIO_free(p); }
};
struct ExtensionFree {
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
};
struct AsnTimeFree {
  void operator()(ASN1_TIME* p) const { ASN1_TIME_free(p); }
};

absl::Status OpenSslError(const char* what) {
  return absl::InternalError(absl::StrCat("cannot make the job's TLS certificate (", what, ")"));
}

std::string BioText(BIO* bio) {
  char* data = nullptr;
  const long length = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(length));
}

absl::StatusOr<JobCertificate> Make(const std::string& token) {
  unsigned char seed[32];
  unsigned int seed_length = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
           reinterpret_cast<const unsigned char*>(kKeyLabel), sizeof(kKeyLabel) - 1, seed,
           &seed_length) == nullptr ||
      seed_length != sizeof(seed)) {
    return OpenSslError("HMAC");
  }
  std::unique_ptr<EVP_PKEY, PkeyFree> key(
      EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, seed, sizeof(seed)));
  if (key == nullptr) return OpenSslError("Ed25519 key");
  std::unique_ptr<X509, X509Free> cert(X509_new());
  std::unique_ptr<ASN1_TIME, AsnTimeFree> not_before(ASN1_TIME_new());
  std::unique_ptr<ASN1_TIME, AsnTimeFree> not_after(ASN1_TIME_new());
  if (cert == nullptr || not_before == nullptr || not_after == nullptr ||
      X509_set_version(cert.get(), 2) != 1 ||
      ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1) != 1 ||
      ASN1_TIME_set_string(not_before.get(), kNotBefore) != 1 ||
      ASN1_TIME_set_string(not_after.get(), kNotAfter) != 1 ||
      X509_set1_notBefore(cert.get(), not_before.get()) != 1 ||
      X509_set1_notAfter(cert.get(), not_after.get()) != 1 ||
      X509_set_pubkey(cert.get(), key.get()) != 1) {
    return OpenSslError("certificate fields");
  }
  X509_NAME* name = X509_get_subject_name(cert.get());
  if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                 reinterpret_cast<const unsigned char*>(kTlsServerName), -1, -1,
                                 0) != 1 ||
      X509_set_issuer_name(cert.get(), name) != 1) {
    return OpenSslError("certificate name");
  }
  const std::string alt_name = absl::StrCat("DNS:", kTlsServerName);
  std::unique_ptr<X509_EXTENSION, ExtensionFree> san(
      X509V3_EXT_conf_nid(nullptr, nullptr, NID_subject_alt_name, alt_name.c_str()));
  if (san == nullptr || X509_add_ext(cert.get(), san.get(), -1) != 1) {
    return OpenSslError("subject alternative name");
  }
  if (X509_sign(cert.get(), key.get(), nullptr) <= 0) return OpenSslError("signature");
  std::unique_ptr<BIO, BioFree> key_bio(BIO_new(BIO_s_mem()));
  std::unique_ptr<BIO, BioFree> cert_bio(BIO_new(BIO_s_mem()));
  if (key_bio == nullptr || cert_bio == nullptr ||
      PEM_write_bio_PrivateKey(key_bio.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) !=
          1 ||
      PEM_write_bio_X509(cert_bio.get(), cert.get()) != 1) {
    return OpenSslError("PEM");
  }
  OPENSSL_cleanse(seed, sizeof(seed));
  return JobCertificate{BioText(key_bio.get()), BioText(cert_bio.get())};
}

// TokenCheck refuses a call whose metadata lacks the job's token. gRPC runs it as the call's
// headers arrive, before the server reads the call's message; the service checks the token again
// (service.cc), as it must over plain text.
class TokenCheck final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenCheck(std::string token) : token_(std::move(token)) {}

  // Cheap, so gRPC runs it inline rather than handing it to a thread of its own.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* /*context*/,
                       OutputMetadata* /*consumed*/, OutputMetadata* /*response*/) override {
    auto token = metadata.find(kTokenMetadata);
    if (token != metadata.end() &&
        ConstantTimeEquals(token_, std::string_view(token->second.data(), token->second.size()))) {
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the rendezvous refused a call without this job's token "
                        "(TRAINRUN_JOB_TOKEN); is the worker from another job?");
  }

 private:
  const std::string token_;
};

}  // namespace

absl::StatusOr<JobCertificate> MakeJobCertificate(const std::string& token) {
  // One process may hold many channels (ranks as threads, a relay, the benchmark): made once.
  static std::mutex mutex;
  static auto* made = new std::map<std::string, JobCertificate>;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = made->find(token); it != made->end()) return it->second;
  absl::StatusOr<JobCertificate> cert = Make(token);
  if (cert.ok()) made->emplace(token, *cert);
  return cert;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const std::string& token) {
  absl::StatusOr<JobCertificate> cert = MakeJobCertificate(token);
  if (!cert.ok()) return cert.status();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({cert->key_pem, cert->cert_pem});
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(options);
  credentials->SetAuthMetadataProcessor(std::make_shared<TokenCheck>(token));
  return credentials;
}

absl::StatusOr<std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor>> AddTlsAcceptor(
    grpc::ServerBuilder& builder, const std::string& token) {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = ServerCredentials(token);
  if (!credentials.ok()) return credentials.status();
  return builder.experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, *credentials);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientCredentials(
    const std::string& token) {
  // One credentials object per token and process: it holds gRPC's TLS context (OpenSSL's
  // SSL_CTX, the parsed key and certificates), which every channel of a relay, or of the ranks run
  // as threads, then shares instead of building its own (milliseconds each with OpenSSL 3).
  static std::mutex mutex;
  static auto* made = new std::map<std::string, std::shared_ptr<grpc::ChannelCredentials>>;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = made->find(token); it != made->end()) return it->second;
  }
  absl::StatusOr<JobCertificate> cert = MakeJobCertificate(token);
  if (!cert.ok()) return cert.status();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = cert->cert_pem;
  // Shown only to a server that asks for it: a launcher of an earlier release (mutual TLS) does,
  // this one does not (its handshake stays as short as a server-only one).
  options.pem_private_key = cert->key_pem;
  options.pem_cert_chain = cert->cert_pem;
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(options);
  std::lock_guard<std::mutex> lock(mutex);
  return made->emplace(token, std::move(credentials)).first->second;
}

}  // namespace trainrun::rendezvous::internal
