// What a Redis error reply means for an event: the classification table.
#include <doctest/doctest.h>

#include <string>

#include "sinks/redis/redis_outcomes.hpp"

using namespace outbox::sinks;

TEST_CASE("redis errors: the reply's first word is its code") {
  CHECK(redis_error_code("WRONGTYPE Operation against a key holding the wrong kind of value") ==
        RedisErrorCode::kWrongType);
  CHECK(redis_error_code("NOPERM User relay has no permissions to access the 'secret' key") == RedisErrorCode::kNoPerm);
  CHECK(redis_error_code("OOM command not allowed when used memory > 'maxmemory'.") == RedisErrorCode::kOom);
  CHECK(redis_error_code("LOADING Redis is loading the dataset in memory") == RedisErrorCode::kLoading);
  CHECK(redis_error_code("EXECABORT Transaction discarded because of previous errors.") == RedisErrorCode::kExecAbort);
  CHECK(redis_error_code("ERR wrong number of arguments for 'xadd' command") == RedisErrorCode::kErr);
  CHECK(redis_error_code("MOVED 3999 127.0.0.1:6381") == RedisErrorCode::kMoved);
  CHECK(redis_error_code("WRONGPASS invalid username-password pair or user is disabled.") ==
        RedisErrorCode::kWrongPass);
  CHECK(redis_error_code("NOAUTH Authentication required.") == RedisErrorCode::kNoAuth);
  CHECK(redis_error_code("SOMETHINGNEW in redis 9") == RedisErrorCode::kOther);
  CHECK(redis_error_code("") == RedisErrorCode::kOther);
  CHECK(redis_error_code("wrongtype lower case is not a code") == RedisErrorCode::kOther);
  CHECK(std::string(to_string(RedisErrorCode::kWrongType)) == "WRONGTYPE");
  CHECK(std::string(to_string(RedisErrorCode::kOther)) == "OTHER");
}

TEST_CASE("redis errors: only WRONGTYPE and NOPERM are permanent; everything else retries") {
  struct Row {
    RedisErrorCode code;
    RedisErrorClass expected;
  };
  const Row table[] = {
      {RedisErrorCode::kWrongType, RedisErrorClass::kPermanent},
      {RedisErrorCode::kNoPerm, RedisErrorClass::kPermanent},
      {RedisErrorCode::kErr, RedisErrorClass::kRetry},
      {RedisErrorCode::kNoAuth, RedisErrorClass::kRetry},
      {RedisErrorCode::kWrongPass, RedisErrorClass::kRetry},
      {RedisErrorCode::kOom, RedisErrorClass::kRetry},
      {RedisErrorCode::kLoading, RedisErrorClass::kRetry},
      {RedisErrorCode::kBusy, RedisErrorClass::kRetry},
      {RedisErrorCode::kMisconf, RedisErrorClass::kRetry},
      {RedisErrorCode::kReadOnly, RedisErrorClass::kRetry},
      {RedisErrorCode::kMasterDown, RedisErrorClass::kRetry},
      {RedisErrorCode::kNoReplicas, RedisErrorClass::kRetry},
      {RedisErrorCode::kTryAgain, RedisErrorClass::kRetry},
      {RedisErrorCode::kClusterDown, RedisErrorClass::kRetry},
      {RedisErrorCode::kMoved, RedisErrorClass::kRetry},
      {RedisErrorCode::kAsk, RedisErrorClass::kRetry},
      {RedisErrorCode::kExecAbort, RedisErrorClass::kRetry},
      {RedisErrorCode::kNoProto, RedisErrorClass::kRetry},
      {RedisErrorCode::kOther, RedisErrorClass::kRetry},
  };
  for (const auto& row : table) {
    CAPTURE(to_string(row.code));
    CHECK(classify_redis_error(row.code) == row.expected);
  }
}
