#pragma once
// The client side of TLS that sinks share: the `tls` section of a sink's config and how an OpenSSL
// context verifies the server with it. Verification is on unless insecure_skip_verify says so.
//   tls:
//     ca_file: /etc/ssl/ca.pem         only these CAs (default: the system CA store)
//     cert_file: /etc/outbox/client.pem  a client certificate, with key_file
//     key_file: /etc/outbox/client.key
//     insecure_skip_verify: false      no certificate or host name check (never in production)
#include <nlohmann/json_fwd.hpp>
#include <string>

typedef struct ssl_ctx_st SSL_CTX;

namespace outbox::config {
class Section;
}

namespace outbox::sinks {

struct TlsFiles {
  std::string ca_file;                // empty: the system's CA store; set: only the CAs in this PEM file
  std::string cert_file;              // client certificate (PEM)
  std::string key_file;               // its private key (PEM); required with cert_file
  bool insecure_skip_verify = false;  // true: no certificate or host name check (never in production)
};

// Reads the sink's optional `tls` section (absent: the defaults). tls_url: the sink's url asks for
// TLS; a tls section without it is an error that names tls_scheme (e.g. "rediss://"). Checks that
// the files are readable PEM. Throws config::ConfigError naming the key.
TlsFiles parse_tls_files(config::Section& sink, bool tls_url, const std::string& tls_scheme);

nlohmann::json describe_tls_files(const TlsFiles& files);

// Prepares a client context: TLS 1.2 or later; unless insecure_skip_verify, the server's chain
// against ca_file (or the system store) and its name against host (a DNS name or an IP literal),
// so that a mismatch fails the handshake; the client certificate if any. verify_error, when given,
// receives the first verification failure's text (X509_verify_cert_error_string) during a
// handshake with an SSL made from ctx afterwards. Returns "" or what failed.
std::string configure_client_tls(SSL_CTX* ctx, const TlsFiles& files, const std::string& host,
                                 std::string* verify_error = nullptr);

// OpenSSL's error queue as text (and emptied), "unknown TLS error" when empty.
std::string ssl_error_text();

bool is_ip_literal(const std::string& host);

}  // namespace outbox::sinks
