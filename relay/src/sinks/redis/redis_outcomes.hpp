#pragma once
// A pure decision of the Redis sink, kept apart from hiredis so it is table-tested: what an error
// reply from Redis means for an event.
#include <string_view>

namespace outbox::sinks {

// The error code of a Redis error reply: its first word ("WRONGTYPE Operation against a key
// holding the wrong kind of value" -> kWrongType). Codes Redis 7 sends for the commands this sink
// uses (HELLO/AUTH, SELECT, MULTI, XADD, EXEC, PING), plus kOther for any other word.
enum class RedisErrorCode {
  kErr,          // ERR: generic (bad arguments, size limits, unknown command, ...)
  kWrongType,    // the stream key holds another type (a string, a list, ...)
  kNoPerm,       // ACL: the user may not run the command or touch the key
  kNoAuth,       // authentication required
  kWrongPass,    // wrong user name or password
  kOom,          // maxmemory reached and the policy evicts nothing
  kLoading,      // the server is loading its dataset after a start
  kBusy,         // a script or function is running
  kMisconf,      // writes refused: the last RDB save failed
  kReadOnly,     // connected to a replica
  kMasterDown,   // a replica whose master link is down
  kNoReplicas,   // min-replicas-to-write not met
  kTryAgain,     // cluster: multi-key operation during resharding
  kClusterDown,  // cluster: hash slot not served
  kMoved,        // cluster: the slot lives on another node (cluster mode is not supported)
  kAsk,          // cluster: the slot is migrating
  kExecAbort,    // EXEC refused: a command of the transaction was refused when queued
  kNoProto,      // HELLO: protocol version not supported
  kOther,        // a code this table does not know
};

RedisErrorCode redis_error_code(std::string_view reply);

enum class RedisErrorClass {
  kRetry,      // transient, a server state, or not this event's fault: retry with backoff
  kPermanent,  // this event can never be written as it is (to this key, by this user): dead-letter
};

// Only the listed codes are permanent; kOther and kErr retry (max_attempts still dead-letters an
// event that never gets through).
RedisErrorClass classify_redis_error(RedisErrorCode code);

const char* to_string(RedisErrorCode code);

}  // namespace outbox::sinks
