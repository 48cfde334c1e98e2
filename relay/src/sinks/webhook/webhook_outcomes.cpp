#include "sinks/webhook/webhook_outcomes.hpp"

#include <curl/curl.h>

#include <array>
#include <cctype>
#include <limits>

namespace outbox::sinks::webhook {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr std::array<std::string_view, 7> kDays{"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
constexpr std::array<std::string_view, 7> kLongDays{"Sunday",   "Monday", "Tuesday", "Wednesday",
                                                    "Thursday", "Friday", "Saturday"};
constexpr std::array<std::string_view, 12> kMonths{"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                   "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

bool is_ows(char c) { return c == ' ' || c == '\t'; }

std::string_view trim(std::string_view text) {
  while (!text.empty() && is_ows(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_ows(text.back())) text.remove_suffix(1);
  return text;
}

// A tiny cursor over the date text; every take_* returns false on a mismatch.
class Cursor {
 public:
  explicit Cursor(std::string_view text) : text_(text) {}
  bool done() const { return text_.empty(); }

  bool literal(std::string_view expected) {
    if (text_.substr(0, expected.size()) != expected) return false;
    text_.remove_prefix(expected.size());
    return true;
  }
  // Exactly `count` digits.
  bool digits(int count, int& out) {
    out = 0;
    for (int i = 0; i < count; ++i) {
      if (text_.empty() || !std::isdigit(static_cast<unsigned char>(text_.front()))) return false;
      out = out * 10 + (text_.front() - '0');
      text_.remove_prefix(1);
    }
    return true;
  }
  template <std::size_t N>
  bool one_of(const std::array<std::string_view, N>& names, int& index) {
    for (std::size_t i = 0; i < N; ++i) {
      if (literal(names[i])) {
        index = static_cast<int>(i);
        return true;
      }
    }
    return false;
  }
  // asctime pads a one-digit day with a space: " 6" or "06" or "16".
  bool day_space_padded(int& out) {
    if (literal(" ")) return digits(1, out);
    return digits(2, out);
  }

 private:
  std::string_view text_;
};

bool time_of_day(Cursor& c, int& h, int& m, int& s) {
  return c.digits(2, h) && c.literal(":") && c.digits(2, m) && c.literal(":") && c.digits(2, s) && h <= 23 && m <= 59 &&
         s <= 60;  // 60: a leap second is still a valid date
}

std::optional<std::chrono::sys_seconds> to_time(int year, int month0, int day, int h, int m, int s) {
  const std::chrono::year_month_day ymd{std::chrono::year{year}, std::chrono::month{static_cast<unsigned>(month0 + 1)},
                                        std::chrono::day{static_cast<unsigned>(day)}};
  if (!ymd.ok()) return std::nullopt;
  return std::chrono::sys_days{ymd} + std::chrono::hours{h} + std::chrono::minutes{m} + seconds{s};
}

// The three HTTP-date formats. Weekday names are checked for spelling, not against the date.
std::optional<std::chrono::sys_seconds> parse_http_date(std::string_view text) {
  int wday = 0, day = 0, month = 0, year = 0, h = 0, m = 0, s = 0;
  {  // IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
    Cursor c(text);
    if (c.one_of(kDays, wday) && c.literal(", ") && c.digits(2, day) && c.literal(" ") && c.one_of(kMonths, month) &&
        c.literal(" ") && c.digits(4, year) && c.literal(" ") && time_of_day(c, h, m, s) && c.literal(" GMT") &&
        c.done()) {
      return to_time(year, month, day, h, m, s);
    }
  }
  {  // RFC 850: Sunday, 06-Nov-94 08:49:37 GMT (two-digit years: 70-99 are 19xx, the rest 20xx)
    Cursor c(text);
    if (c.one_of(kLongDays, wday) && c.literal(", ") && c.digits(2, day) && c.literal("-") &&
        c.one_of(kMonths, month) && c.literal("-") && c.digits(2, year) && c.literal(" ") && time_of_day(c, h, m, s) &&
        c.literal(" GMT") && c.done()) {
      return to_time(year >= 70 ? 1900 + year : 2000 + year, month, day, h, m, s);
    }
  }
  {  // asctime: Sun Nov  6 08:49:37 1994
    Cursor c(text);
    if (c.one_of(kDays, wday) && c.literal(" ") && c.one_of(kMonths, month) && c.literal(" ") &&
        c.day_space_padded(day) && c.literal(" ") && time_of_day(c, h, m, s) && c.literal(" ") && c.digits(4, year) &&
        c.done()) {
      return to_time(year, month, day, h, m, s);
    }
  }
  return std::nullopt;
}

// Appends one valid UTF-8 sequence starting at text[i] and returns its length, or 0 when the
// bytes there are not valid UTF-8 (overlongs, surrogates and code points past U+10FFFF included).
std::size_t utf8_sequence(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b0 = byte(i);
  std::size_t len = 0;
  unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + len > text.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < len; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return len;
}

std::string status_reason(long status, std::string_view body) {
  std::string reason = "HTTP " + std::to_string(status);
  const std::string excerpt = body_excerpt(body);
  reason += excerpt.empty() ? std::string(" (empty body)") : ": " + excerpt;
  return reason;
}

}  // namespace

StatusClass classify_status(long status) {
  if (status >= 200 && status <= 299) return StatusClass::kDelivered;
  if (status == 408 || status == 429) return StatusClass::kRetry;  // timeout, rate limit: the receiver is busy
  if (status >= 400 && status <= 499) return StatusClass::kPermanent;
  return StatusClass::kRetry;  // 5xx, and unknown codes retry: only listed codes are permanent
}

std::optional<milliseconds> parse_retry_after(std::string_view value, std::chrono::system_clock::time_point now) {
  value = trim(value);
  if (value.empty()) return std::nullopt;
  if (std::isdigit(static_cast<unsigned char>(value.front()))) {
    long long secs = 0;
    for (char ch : value) {
      if (!std::isdigit(static_cast<unsigned char>(ch))) return std::nullopt;
      secs = secs * 10 + (ch - '0');
      if (secs > kMaxRetryAfter.count() / 1000) return kMaxRetryAfter;  // saturate before overflow
    }
    return milliseconds(secs * 1000);
  }
  const auto date = parse_http_date(value);
  if (!date) return std::nullopt;
  const auto delta = std::chrono::ceil<milliseconds>(*date - now);
  if (delta <= milliseconds{0}) return milliseconds{0};
  return std::min(delta, kMaxRetryAfter);
}

std::string body_excerpt(std::string_view body, std::size_t limit) {
  if (body.size() > limit) {
    body = body.substr(0, limit);
    // The cut may have split the last character: drop its start rather than garble it.
    std::size_t start = body.size();
    while (start > 0 && body.size() - start < 3 && (static_cast<unsigned char>(body[start - 1]) & 0xC0) == 0x80) {
      --start;
    }
    if (start > 0) {
      const auto lead = static_cast<unsigned char>(body[start - 1]);
      const std::size_t want = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
      if (want > body.size() - (start - 1)) body = body.substr(0, start - 1);
    }
  }
  std::string out;
  out.reserve(body.size());
  std::size_t i = 0;
  while (i < body.size()) {
    const std::size_t len = utf8_sequence(body, i);
    if (len == 0) {
      out += '?';
      ++i;
    } else if (len == 1) {
      const auto c = static_cast<unsigned char>(body[i]);
      out += (c < 0x20 || c == 0x7F) ? ' ' : static_cast<char>(c);
      ++i;
    } else {
      out.append(body.substr(i, len));
      i += len;
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

Outcome classify_response(long status, std::string_view body, std::optional<milliseconds> retry_after) {
  switch (classify_status(status)) {
    case StatusClass::kDelivered: return Outcome::delivered();
    case StatusClass::kPermanent: return Outcome::permanent(status_reason(status, body));
    case StatusClass::kRetry: {
      std::string reason = status_reason(status, body);
      if (retry_after) reason += " (Retry-After " + std::to_string(retry_after->count()) + "ms)";
      return Outcome::retry(std::move(reason), retry_after);
    }
  }
  return Outcome::retry("HTTP " + std::to_string(status));  // unreachable: the switch is exhaustive
}

TransferFailure classify_transfer_error(int curl_code) {
  switch (curl_code) {  // an int: codes from a newer libcurl may lie outside the enum
    case CURLE_OPERATION_TIMEDOUT: return TransferFailure::kTimeout;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT: return TransferFailure::kConnect;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ENGINE_NOTFOUND:
    case CURLE_SSL_ENGINE_SETFAILED:
    case CURLE_SSL_ENGINE_INITFAILED:
    case CURLE_SSL_CRL_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_SHUTDOWN_FAILED:
    case CURLE_SSL_CLIENTCERT: return TransferFailure::kTls;
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY: return TransferFailure::kSendReceive;
    default: return TransferFailure::kOther;  // still a retry: only listed HTTP statuses are permanent
  }
}

const char* to_string(TransferFailure failure) {
  switch (failure) {
    case TransferFailure::kTimeout: return "timeout";
    case TransferFailure::kConnect: return "connection failed";
    case TransferFailure::kTls: return "TLS error";
    case TransferFailure::kSendReceive: return "send/receive failed";
    case TransferFailure::kOther: return "transfer failed";
  }
  return "transfer failed";
}

Outcome transfer_error_outcome(int curl_code, std::string_view detail) {
  std::string reason = to_string(classify_transfer_error(curl_code));
  reason += ": ";
  const std::string text = body_excerpt(detail, 256);
  reason += text.empty() ? std::string("no detail from libcurl") : text;
  reason += " (curl " + std::to_string(curl_code) + ")";
  return Outcome::retry(std::move(reason));
}

}  // namespace outbox::sinks::webhook
