#pragma once
// Standard Webhooks signing (https://www.standardwebhooks.com): pure functions, no I/O.
//   webhook-signature: v1,<base64(HMAC-SHA256(key, "<id>.<timestamp>.<body>"))> [v1,<...> ...]
// where key is the decoded bytes of a "whsec_<base64>" secret; one entry per configured secret,
// so a receiver can rotate keys without downtime.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace outbox::sinks::webhook {

// The webhook-id of a request that carries several events (events_per_request > 1): "batch_" and
// 32 hex digits of SHA-256 over the ids, in the order given, as decimal text joined by commas.
// The same events give the same id on a retry; two different sets of events never share one
// (a receiver that drops a webhook-id it has seen loses nothing).
std::string batch_message_id(std::span<const std::int64_t> ids);

// Standard base64 (RFC 4648 §4) with '=' padding.
std::string base64_encode(std::string_view bytes);

// Strict standard base64: alphabet A-Z a-z 0-9 + /, padding optional but, when present, correct;
// no whitespace. nullopt on anything else.
std::optional<std::string> base64_decode(std::string_view text);

// The key bytes of a "whsec_<base64>" secret. nullopt when the prefix is missing, the base64 is
// malformed or the key is empty. Never echo the input in an error: it is a secret.
std::optional<std::string> decode_whsec_secret(std::string_view secret);

// Raw 32-byte HMAC-SHA256 of message under key (OpenSSL).
std::string hmac_sha256(std::string_view key, std::string_view message);

// "v1,<base64>" for one key over "<id>.<timestamp>.<body>".
std::string sign_v1(std::string_view key, std::string_view id, std::int64_t timestamp, std::string_view body);

// The webhook-signature header value: sign_v1 for each key, space-separated, in key order.
// Empty when keys is empty (then the header is not sent).
std::string signature_header(const std::vector<std::string>& keys, std::string_view id, std::int64_t timestamp,
                             std::string_view body);

}  // namespace outbox::sinks::webhook
