#pragma once
// How the webhook sink turns what happened to one HTTP request into an Outcome. Pure functions,
// no I/O, table-tested: docs/design.md §5 and the issue decide the table.
//   2xx                        delivered
//   408, 429, 5xx              retry, honouring Retry-After (the loop caps it by the backoff max)
//   any other 4xx (410 too)    permanent: "HTTP <status>: <first 512 bytes of the body>"
//   1xx, 3xx, anything else    retry (unknown codes retry; redirects are not followed)
//   no HTTP response at all    retry (connection refused, DNS, TLS, timeout, reset, ...)
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "core/sink.hpp"

namespace outbox::sinks::webhook {

inline constexpr std::size_t kMaxBodyExcerpt = 512;

enum class StatusClass { kDelivered, kRetry, kPermanent };

StatusClass classify_status(long status);

// Retry-After (RFC 9110 §10.2.3): delay-seconds ("120") or an HTTP-date in any of the three
// formats recipients must accept (IMF-fixdate "Sun, 06 Nov 1994 08:49:37 GMT", RFC 850
// "Sunday, 06-Nov-94 08:49:37 GMT", asctime "Sun Nov  6 08:49:37 1994"). Returns the delay from
// `now`; a date in the past gives 0. nullopt for anything else (the header is then ignored).
// Huge values saturate at kMaxRetryAfter.
inline constexpr std::chrono::milliseconds kMaxRetryAfter = std::chrono::hours(24 * 365);
std::optional<std::chrono::milliseconds> parse_retry_after(std::string_view value,
                                                           std::chrono::system_clock::time_point now);

// At most `limit` bytes of a response body, fit for last_error and logs: cut on a UTF-8
// boundary, invalid UTF-8 and control characters (including NUL and newlines) replaced, trailing
// whitespace trimmed.
std::string body_excerpt(std::string_view body, std::size_t limit = kMaxBodyExcerpt);

// The outcome of a request that got an HTTP response.
Outcome classify_response(long status, std::string_view body, std::optional<std::chrono::milliseconds> retry_after);

// What kind of transport failure a libcurl result code is (codes as ints to keep curl out of
// this header). Every kind retries; the kind words the reason and tells whether the endpoint
// looks unreachable.
enum class TransferFailure { kTimeout, kConnect, kTls, kSendReceive, kOther };
TransferFailure classify_transfer_error(int curl_code);
const char* to_string(TransferFailure failure);

// The outcome of a request that got no HTTP response. `detail` is curl's error text.
Outcome transfer_error_outcome(int curl_code, std::string_view detail);

}  // namespace outbox::sinks::webhook
