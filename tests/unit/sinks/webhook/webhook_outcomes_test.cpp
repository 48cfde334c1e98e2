#include <curl/curl.h>
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include "sinks/webhook/webhook_outcomes.hpp"

using namespace outbox;
using namespace outbox::sinks::webhook;
using std::chrono::milliseconds;

namespace {

// 2015-10-21T07:28:00Z, a Wednesday, plus a sub-second part.
const auto kNow = std::chrono::system_clock::time_point(std::chrono::seconds(1445412480)) + milliseconds(250);

}  // namespace

TEST_CASE("HTTP status classes follow the issue's table") {
  struct Row {
    long status;
    StatusClass expected;
  };
  const std::vector<Row> table{
      {200, StatusClass::kDelivered},
      {201, StatusClass::kDelivered},
      {202, StatusClass::kDelivered},
      {204, StatusClass::kDelivered},
      {299, StatusClass::kDelivered},
      {408, StatusClass::kRetry},
      {429, StatusClass::kRetry},
      {500, StatusClass::kRetry},
      {502, StatusClass::kRetry},
      {503, StatusClass::kRetry},
      {504, StatusClass::kRetry},
      {599, StatusClass::kRetry},
      {400, StatusClass::kPermanent},
      {401, StatusClass::kPermanent},
      {403, StatusClass::kPermanent},
      {404, StatusClass::kPermanent},
      {405, StatusClass::kPermanent},
      {409, StatusClass::kPermanent},
      {410, StatusClass::kPermanent},
      {413, StatusClass::kPermanent},
      {422, StatusClass::kPermanent},
      {499, StatusClass::kPermanent},
      // Unknown codes retry: redirects are not followed, informational codes are not an answer.
      {100, StatusClass::kRetry},
      {199, StatusClass::kRetry},
      {301, StatusClass::kRetry},
      {302, StatusClass::kRetry},
      {304, StatusClass::kRetry},
      {307, StatusClass::kRetry},
      {600, StatusClass::kRetry},
      {0, StatusClass::kRetry},
      {-1, StatusClass::kRetry},
  };
  for (const auto& row : table) {
    CAPTURE(row.status);
    CHECK(classify_status(row.status) == row.expected);
  }
}

TEST_CASE("responses become outcomes with status, body and Retry-After") {
  CHECK(classify_response(200, "ok", std::nullopt).kind == OutcomeKind::kDelivered);
  CHECK(classify_response(204, "", milliseconds(5000)).kind == OutcomeKind::kDelivered);

  const Outcome poison = classify_response(400, R"({"error":"bad amount"})", milliseconds(1000));
  CHECK(poison.kind == OutcomeKind::kPermanent);
  CHECK(poison.reason == R"(HTTP 400: {"error":"bad amount"})");
  CHECK_FALSE(poison.retry_after.has_value());  // a permanent failure has no next attempt

  const Outcome gone = classify_response(410, "", std::nullopt);
  CHECK(gone.kind == OutcomeKind::kPermanent);
  CHECK(gone.reason == "HTTP 410 (empty body)");

  const Outcome busy = classify_response(429, "slow down", milliseconds(2000));
  CHECK(busy.kind == OutcomeKind::kRetry);
  CHECK(busy.retry_after == milliseconds(2000));
  CHECK(busy.reason == "HTTP 429: slow down (Retry-After 2000ms)");

  const Outcome down = classify_response(503, "maintenance", std::nullopt);
  CHECK(down.kind == OutcomeKind::kRetry);
  CHECK_FALSE(down.retry_after.has_value());
  CHECK(down.reason == "HTTP 503: maintenance");

  // At most 512 bytes of the body reach last_error.
  const Outcome big = classify_response(422, std::string(2000, 'x'), std::nullopt);
  CHECK(big.reason == "HTTP 422: " + std::string(512, 'x'));
}

TEST_CASE("Retry-After: delay-seconds") {
  struct Row {
    const char* value;
    std::optional<milliseconds> expected;
  };
  const std::vector<Row> table{
      {"0", milliseconds(0)},
      {"2", milliseconds(2000)},
      {"120", milliseconds(120'000)},
      {" 7 ", milliseconds(7000)},  // optional whitespace around the value
      {"007", milliseconds(7000)},
      {"99999999999999999999999", kMaxRetryAfter},  // saturates, does not overflow
      {"", std::nullopt},
      {"   ", std::nullopt},
      {"-1", std::nullopt},
      {"1.5", std::nullopt},
      {"2s", std::nullopt},
      {"+3", std::nullopt},
      {"soon", std::nullopt},
  };
  for (const auto& row : table) {
    const std::string value = row.value;
    CAPTURE(value);
    const auto got = parse_retry_after(value, kNow);
    CHECK(got.has_value() == row.expected.has_value());
    if (got && row.expected) CHECK(got->count() == row.expected->count());
  }
}

TEST_CASE("Retry-After: HTTP dates in the three formats") {
  struct Row {
    const char* value;
    std::optional<milliseconds> expected;
  };
  // kNow is 07:28:00.250, so a date at 07:28:02 is 1750 ms away.
  const std::vector<Row> table{
      {"Wed, 21 Oct 2015 07:28:02 GMT", milliseconds(1750)},  // IMF-fixdate
      {"Wed, 21 Oct 2015 08:28:00 GMT", milliseconds(3'599'750)},
      {"Thu, 22 Oct 2015 07:28:00 GMT", milliseconds(86'399'750)},
      {"Wednesday, 21-Oct-15 07:28:02 GMT", milliseconds(1750)},  // RFC 850
      {"Wed Oct 21 07:28:02 2015", milliseconds(1750)},           // asctime
      {"Thu Oct 22 07:28:00 2015", milliseconds(86'399'750)},
      {"Sun Nov  6 08:49:37 2033", kMaxRetryAfter},        // saturates
      {"Wed, 21 Oct 2015 07:27:00 GMT", milliseconds(0)},  // in the past: now
      {"Sun, 06 Nov 1994 08:49:37 GMT", milliseconds(0)},
      {"Sunday, 06-Nov-94 08:49:37 GMT", milliseconds(0)},  // 94 is 1994
      {"Wed, 21 Oct 2015 07:28:02 UTC", std::nullopt},      // only GMT is allowed
      {"Wed, 21 Oct 2015 07:28:02", std::nullopt},
      {"Wed, 31 Feb 2015 07:28:02 GMT", std::nullopt},  // no such day
      {"Wed, 21 Foo 2015 07:28:02 GMT", std::nullopt},
      {"Wed, 21 Oct 2015 25:28:02 GMT", std::nullopt},
      {"Xyz, 21 Oct 2015 07:28:02 GMT", std::nullopt},
      {"2015-10-21T07:28:02Z", std::nullopt},  // not an HTTP date
      {"Wed, 21 Oct 2015 07:28:02 GMT trailing", std::nullopt},
  };
  for (const auto& row : table) {
    const std::string value = row.value;
    CAPTURE(value);
    const auto got = parse_retry_after(value, kNow);
    CHECK(got.has_value() == row.expected.has_value());
    if (got && row.expected) CHECK(got->count() == row.expected->count());
  }
}

TEST_CASE("body excerpts are short, one line and valid UTF-8") {
  CHECK(body_excerpt("plain") == "plain");
  CHECK(body_excerpt("line one\r\nline two\n") == "line one  line two");
  CHECK(body_excerpt(std::string("nul\0byte", 8)) == "nul byte");
  CHECK(body_excerpt("caf\xc3\xa9") == "caf\xc3\xa9");          // valid UTF-8 stays
  CHECK(body_excerpt("bad \xff\xfe bytes") == "bad ?? bytes");  // invalid bytes replaced
  CHECK(body_excerpt("\xed\xa0\x80") == "???");                 // a UTF-16 surrogate is not UTF-8
  CHECK(body_excerpt("\xc0\xaf") == "??");                      // overlong
  CHECK(body_excerpt(std::string(600, 'a')).size() == 512);
  CHECK(body_excerpt("abcdef", 4) == "abcd");
  // A multi-byte character cut by the limit is dropped whole, not garbled.
  CHECK(body_excerpt("ab\xe2\x82\xac", 4) == "ab");
  CHECK(body_excerpt("ab\xe2\x82\xac", 5) == "ab\xe2\x82\xac");
  CHECK(body_excerpt("abc\xf0\x9f\x98\x80", 6) == "abc");
}

TEST_CASE("transfer errors all retry, worded by kind") {
  struct Row {
    int code;
    TransferFailure kind;
  };
  const std::vector<Row> table{
      {CURLE_OPERATION_TIMEDOUT, TransferFailure::kTimeout},
      {CURLE_COULDNT_CONNECT, TransferFailure::kConnect},
      {CURLE_COULDNT_RESOLVE_HOST, TransferFailure::kConnect},
      {CURLE_PEER_FAILED_VERIFICATION, TransferFailure::kTls},
      {CURLE_SSL_CONNECT_ERROR, TransferFailure::kTls},
      {CURLE_SSL_CACERT_BADFILE, TransferFailure::kTls},
      {CURLE_SEND_ERROR, TransferFailure::kSendReceive},
      {CURLE_RECV_ERROR, TransferFailure::kSendReceive},
      {CURLE_GOT_NOTHING, TransferFailure::kSendReceive},
      {CURLE_PARTIAL_FILE, TransferFailure::kSendReceive},
      {CURLE_WRITE_ERROR, TransferFailure::kOther},
      {CURLE_OUT_OF_MEMORY, TransferFailure::kOther},
      {9999, TransferFailure::kOther},  // a code from a newer libcurl
  };
  for (const auto& row : table) {
    CAPTURE(row.code);
    CHECK(classify_transfer_error(row.code) == row.kind);
    const Outcome o = transfer_error_outcome(row.code, "");
    CHECK(o.kind == OutcomeKind::kRetry);
    CHECK_FALSE(o.retry_after.has_value());
  }
  CHECK(transfer_error_outcome(CURLE_OPERATION_TIMEDOUT, "Operation timed out after 10001 milliseconds").reason ==
        "timeout: Operation timed out after 10001 milliseconds (curl 28)");
  CHECK(transfer_error_outcome(CURLE_COULDNT_CONNECT, "").reason ==
        "connection failed: no detail from libcurl (curl 7)");
}
