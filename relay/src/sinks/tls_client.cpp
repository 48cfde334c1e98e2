#include "sinks/tls_client.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "config/section.hpp"

namespace outbox::sinks {
namespace {

using config::ConfigError;

void check_pem(const config::Section& tls, const std::string& key, const std::string& path, const char* marker) {
  std::ifstream in(path);
  if (!in) throw ConfigError(tls.key_path(key) + ": cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().find(marker) == std::string::npos) {
    throw ConfigError(tls.key_path(key) + ": expected a PEM file (" + marker + "), in " + path);
  }
}

// Keeps the first failure of a chain or name check for the error message; the verdict stays
// OpenSSL's.
int remember_verify_failure(int preverify_ok, X509_STORE_CTX* store) {
  if (preverify_ok) return preverify_ok;
  auto* ssl = static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  auto* out = ssl ? static_cast<std::string*>(SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl))) : nullptr;
  if (out && out->empty()) *out = X509_verify_cert_error_string(X509_STORE_CTX_get_error(store));
  return preverify_ok;
}

}  // namespace

TlsFiles parse_tls_files(config::Section& s, bool tls_url, const std::string& tls_scheme) {
  TlsFiles f;
  auto tls = s.section("tls");
  if (!tls) return f;
  if (!tls_url) throw ConfigError(s.key_path("tls") + ": TLS settings apply to " + tls_scheme + " urls only");
  f.ca_file = tls->string_or("ca_file", "");
  f.cert_file = tls->string_or("cert_file", "");
  f.key_file = tls->string_or("key_file", "");
  f.insecure_skip_verify = tls->boolean_or("insecure_skip_verify", false);
  tls->finish();
  if (!f.ca_file.empty()) check_pem(*tls, "ca_file", f.ca_file, "-----BEGIN CERTIFICATE-----");
  if (f.cert_file.empty() != f.key_file.empty()) {
    throw ConfigError(tls->key_path(f.cert_file.empty() ? "cert_file" : "key_file") +
                      ": cert_file and key_file go together (a client certificate and its key)");
  }
  if (!f.cert_file.empty()) {
    check_pem(*tls, "cert_file", f.cert_file, "-----BEGIN CERTIFICATE-----");
    check_pem(*tls, "key_file", f.key_file, "PRIVATE KEY-----");
  }
  return f;
}

nlohmann::json describe_tls_files(const TlsFiles& f) {
  return {{"ca_file", f.ca_file},
          {"cert_file", f.cert_file},
          {"key_file", f.key_file},
          {"insecure_skip_verify", f.insecure_skip_verify}};
}

std::string configure_client_tls(SSL_CTX* ctx, const TlsFiles& files, const std::string& host,
                                 std::string* verify_error) {
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  if (files.insecure_skip_verify) {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
  } else {
    SSL_CTX_set_app_data(ctx, verify_error);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, verify_error ? &remember_verify_failure : nullptr);
    const int ok = files.ca_file.empty() ? SSL_CTX_set_default_verify_paths(ctx)
                                         : SSL_CTX_load_verify_locations(ctx, files.ca_file.c_str(), nullptr);
    if (ok != 1) return "TLS: cannot load CA certificates: " + ssl_error_text();
    X509_VERIFY_PARAM* param = SSL_CTX_get0_param(ctx);
    const int named = is_ip_literal(host) ? X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str())
                                          : X509_VERIFY_PARAM_set1_host(param, host.c_str(), 0);
    if (named != 1) return "TLS: cannot set the host name to verify";
  }
  if (!files.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx, files.cert_file.c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, files.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
      return "TLS: cannot load the client certificate or key: " + ssl_error_text();
    }
  }
  return {};
}

std::string ssl_error_text() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char text[256] = {};
    ERR_error_string_n(e, text, sizeof text);
    if (!out.empty()) out += "; ";
    out += text;
  }
  return out.empty() ? "unknown TLS error" : out;
}

bool is_ip_literal(const std::string& host) {
  in6_addr a6{};
  in_addr a4{};
  return inet_pton(AF_INET, host.c_str(), &a4) == 1 || inet_pton(AF_INET6, host.c_str(), &a6) == 1;
}

}  // namespace outbox::sinks
