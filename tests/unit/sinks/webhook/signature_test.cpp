#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "sinks/webhook/signature.hpp"

using namespace outbox::sinks::webhook;

namespace {

std::string hex(const std::string& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

}  // namespace

TEST_CASE("base64 encodes the RFC 4648 test vectors") {
  const std::vector<std::pair<std::string, std::string>> table{
      {"", ""},
      {"f", "Zg=="},
      {"fo", "Zm8="},
      {"foo", "Zm9v"},
      {"foob", "Zm9vYg=="},
      {"fooba", "Zm9vYmE="},
      {"foobar", "Zm9vYmFy"},
      {std::string("\xfb\xff\xbf", 3), "+/+/"},
  };
  for (const auto& [plain, encoded] : table) {
    CAPTURE(encoded);
    CHECK(base64_encode(plain) == encoded);
    REQUIRE(base64_decode(encoded).has_value());
    CHECK(*base64_decode(encoded) == plain);
  }
}

TEST_CASE("base64 decoding is strict") {
  CHECK(base64_decode("Zm9vYg").value() == "foob");  // padding may be left out
  CHECK(base64_decode("Zm8").value() == "fo");
  const std::vector<std::string> bad{
      "Zm9vYg=",     // wrong padding length for a padded quad
      "Zg===",       // too much padding
      "Z",           // 6 bits make no byte
      "Zm9v Yg==",   // whitespace
      "Zm9v\nYg==",  // newline
      "Zm-_",        // URL-safe alphabet is not the standard one
      "Zh==",        // non-canonical: unused bits set
      "Zm=v",        // padding in the middle
  };
  for (const auto& text : bad) {
    CAPTURE(text);
    CHECK_FALSE(base64_decode(text).has_value());
  }
}

TEST_CASE("whsec_ secrets decode to their key bytes") {
  CHECK(decode_whsec_secret("whsec_Zm9vYmFy").value() == "foobar");
  CHECK(decode_whsec_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").value().size() == 24);
  CHECK_FALSE(decode_whsec_secret("Zm9vYmFy").has_value());        // no prefix
  CHECK_FALSE(decode_whsec_secret("WHSEC_Zm9vYmFy").has_value());  // the prefix is case-sensitive
  CHECK_FALSE(decode_whsec_secret("whsec_").has_value());          // empty key
  CHECK_FALSE(decode_whsec_secret("whsec_not base64!").has_value());
}

TEST_CASE("HMAC-SHA256 matches RFC 4231") {
  // Test case 2.
  CHECK(hex(hmac_sha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 1: key 0x0b * 20.
  CHECK(hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
}

TEST_CASE("signatures match the Standard Webhooks reference example") {
  // The example of the Standard Webhooks spec and its reference libraries.
  const std::string key = decode_whsec_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").value();
  CHECK(sign_v1(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, R"({"test": 2432232314})") ==
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
}

TEST_CASE("one signature per key, space-separated, in key order") {
  const std::string a = decode_whsec_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").value();
  const std::string b = "another key";
  const std::string body = R"({"amount": 10})";
  CHECK(signature_header({}, "42", 1700000000, body).empty());
  CHECK(signature_header({a}, "42", 1700000000, body) == sign_v1(a, "42", 1700000000, body));
  CHECK(signature_header({a, b}, "42", 1700000000, body) ==
        sign_v1(a, "42", 1700000000, body) + " " + sign_v1(b, "42", 1700000000, body));
  // Every part of the signed content matters.
  const std::string base = sign_v1(a, "42", 1700000000, body);
  CHECK(sign_v1(a, "43", 1700000000, body) != base);
  CHECK(sign_v1(a, "42", 1700000001, body) != base);
  CHECK(sign_v1(a, "42", 1700000000, R"({"amount": 11})") != base);
  CHECK(sign_v1(b, "42", 1700000000, body) != base);
}

TEST_CASE("a request of several events is named by a digest of their ids") {
  const std::vector<std::int64_t> ids{1, 2, 3};
  // printf '1,2,3' | sha256sum
  CHECK(batch_message_id(ids) == "batch_8a6ae15122001229edb8866f56e342af");
  CHECK(batch_message_id(ids) == batch_message_id(std::vector<std::int64_t>{1, 2, 3}));  // a retry: the same id
  // Any other set or order of ids: another id (a receiver that skips ids it has seen loses nothing).
  CHECK(batch_message_id(std::vector<std::int64_t>{1, 2, 4}) != batch_message_id(ids));
  CHECK(batch_message_id(std::vector<std::int64_t>{12, 3}) != batch_message_id(std::vector<std::int64_t>{1, 23}));
  CHECK(batch_message_id(std::vector<std::int64_t>{3, 2, 1}) != batch_message_id(ids));
  CHECK(batch_message_id(std::vector<std::int64_t>{42}).size() == 6 + 32);
}
