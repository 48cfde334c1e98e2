#include "sinks/webhook/signature.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <array>
#include <stdexcept>

#include "core/tracing.hpp"

namespace outbox::sinks::webhook {
namespace {

constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
constexpr std::string_view kSecretPrefix = "whsec_";

// 0-63 for alphabet characters, -1 for anything else.
int sextet(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const auto n = (static_cast<unsigned char>(bytes[i]) << 16) | (static_cast<unsigned char>(bytes[i + 1]) << 8) |
                   static_cast<unsigned char>(bytes[i + 2]);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += kAlphabet[n & 63];
  }
  const std::size_t rest = bytes.size() - i;
  if (rest == 1) {
    const auto n = static_cast<unsigned char>(bytes[i]) << 16;
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += "==";
  } else if (rest == 2) {
    const auto n = (static_cast<unsigned char>(bytes[i]) << 16) | (static_cast<unsigned char>(bytes[i + 1]) << 8);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += '=';
  }
  return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
  std::size_t data_len = text.size();
  while (data_len > 0 && text[data_len - 1] == '=') --data_len;
  const std::size_t padding = text.size() - data_len;
  if (padding > 2) return std::nullopt;
  if (padding > 0 && text.size() % 4 != 0) return std::nullopt;  // padded input comes in whole quads
  if (data_len % 4 == 1) return std::nullopt;                    // 6 bits cannot make a byte
  std::string out;
  out.reserve(data_len * 3 / 4);
  unsigned buffer = 0;
  int bits = 0;
  for (std::size_t i = 0; i < data_len; ++i) {
    const int v = sextet(text[i]);
    if (v < 0) return std::nullopt;
    buffer = (buffer << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((buffer >> bits) & 0xff);
    }
  }
  // Canonical encodings leave the unused low bits zero; anything else is a typo, not a key.
  if (bits > 0 && (buffer & ((1u << bits) - 1)) != 0) return std::nullopt;
  return out;
}

std::optional<std::string> decode_whsec_secret(std::string_view secret) {
  if (secret.substr(0, kSecretPrefix.size()) != kSecretPrefix) return std::nullopt;
  auto key = base64_decode(secret.substr(kSecretPrefix.size()));
  if (!key || key->empty()) return std::nullopt;
  return key;
}

std::string batch_message_id(std::span<const std::int64_t> ids) {
  std::string text;
  for (const std::int64_t id : ids) {
    if (!text.empty()) text += ',';
    text += std::to_string(id);
  }
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int length = 0;
  if (EVP_Digest(text.data(), text.size(), digest.data(), &length, EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("SHA-256 failed in OpenSSL");  // only on allocation failure
  }
  return "batch_" + to_hex(digest.data(), 16);
}

std::string hmac_sha256(std::string_view key, std::string_view message) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int length = 0;
  const unsigned char* ok =
      HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest.data(), &length);
  if (ok == nullptr) throw std::runtime_error("HMAC-SHA256 failed in OpenSSL");  // only on allocation failure
  return std::string(reinterpret_cast<const char*>(digest.data()), length);
}

namespace {

std::string signed_content(std::string_view id, std::int64_t timestamp, std::string_view body) {
  const std::string ts = std::to_string(timestamp);
  std::string message;
  message.reserve(id.size() + ts.size() + body.size() + 2);
  message.append(id).append(1, '.').append(ts).append(1, '.').append(body);
  return message;
}

}  // namespace

std::string sign_v1(std::string_view key, std::string_view id, std::int64_t timestamp, std::string_view body) {
  return "v1," + base64_encode(hmac_sha256(key, signed_content(id, timestamp, body)));
}

std::string signature_header(const std::vector<std::string>& keys, std::string_view id, std::int64_t timestamp,
                             std::string_view body) {
  if (keys.empty()) return {};
  const std::string message = signed_content(id, timestamp, body);  // built once for all keys
  std::string out;
  for (const auto& key : keys) {
    if (!out.empty()) out += ' ';
    out += "v1," + base64_encode(hmac_sha256(key, message));
  }
  return out;
}

}  // namespace outbox::sinks::webhook
