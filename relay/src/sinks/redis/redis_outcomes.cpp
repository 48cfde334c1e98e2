#include "sinks/redis/redis_outcomes.hpp"

#include <array>
#include <utility>

namespace outbox::sinks {
namespace {

constexpr std::array<std::pair<std::string_view, RedisErrorCode>, 18> kCodes{{
    {"ERR", RedisErrorCode::kErr},
    {"WRONGTYPE", RedisErrorCode::kWrongType},
    {"NOPERM", RedisErrorCode::kNoPerm},
    {"NOAUTH", RedisErrorCode::kNoAuth},
    {"WRONGPASS", RedisErrorCode::kWrongPass},
    {"OOM", RedisErrorCode::kOom},
    {"LOADING", RedisErrorCode::kLoading},
    {"BUSY", RedisErrorCode::kBusy},
    {"MISCONF", RedisErrorCode::kMisconf},
    {"READONLY", RedisErrorCode::kReadOnly},
    {"MASTERDOWN", RedisErrorCode::kMasterDown},
    {"NOREPLICAS", RedisErrorCode::kNoReplicas},
    {"TRYAGAIN", RedisErrorCode::kTryAgain},
    {"CLUSTERDOWN", RedisErrorCode::kClusterDown},
    {"MOVED", RedisErrorCode::kMoved},
    {"ASK", RedisErrorCode::kAsk},
    {"EXECABORT", RedisErrorCode::kExecAbort},
    {"NOPROTO", RedisErrorCode::kNoProto},
}};

}  // namespace

RedisErrorCode redis_error_code(std::string_view reply) {
  const std::string_view word = reply.substr(0, reply.find(' '));
  for (const auto& [name, code] : kCodes) {
    if (word == name) return code;
  }
  return RedisErrorCode::kOther;
}

const char* to_string(RedisErrorCode code) {
  for (const auto& [name, c] : kCodes) {
    if (c == code) return name.data();  // the table's literals are NUL-terminated
  }
  return "OTHER";  // kOther: every other code has its word in the table
}

RedisErrorClass classify_redis_error(RedisErrorCode code) {
  // Exhaustive, no default: a new code fails the build (-Wswitch, -Werror) until someone decides.
  switch (code) {
    // This event, as it is, cannot be written by this user to its stream key: re-sending it
    // unchanged cannot succeed. Dead-lettered; once the operator fixed the key or the ACL,
    // `outbox-relay failed retry` sends it again.
    case RedisErrorCode::kWrongType:
    case RedisErrorCode::kNoPerm: return RedisErrorClass::kPermanent;

    // Server states that pass (loading, busy, out of memory, failover, resharding), connection
    // settings an operator fixes without touching the row (AUTH), and anything unknown.
    case RedisErrorCode::kErr:
    case RedisErrorCode::kNoAuth:
    case RedisErrorCode::kWrongPass:
    case RedisErrorCode::kOom:
    case RedisErrorCode::kLoading:
    case RedisErrorCode::kBusy:
    case RedisErrorCode::kMisconf:
    case RedisErrorCode::kReadOnly:
    case RedisErrorCode::kMasterDown:
    case RedisErrorCode::kNoReplicas:
    case RedisErrorCode::kTryAgain:
    case RedisErrorCode::kClusterDown:
    case RedisErrorCode::kMoved:
    case RedisErrorCode::kAsk:
    case RedisErrorCode::kExecAbort:
    case RedisErrorCode::kNoProto:
    case RedisErrorCode::kOther: return RedisErrorClass::kRetry;
  }
  return RedisErrorClass::kRetry;  // not reached: every enumerator is listed
}

}  // namespace outbox::sinks
