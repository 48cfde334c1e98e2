#pragma once
// type: redis. Appends each event to a Redis stream with XADD and counts it as delivered only when
// Redis answered that XADD with the new entry's id.
//
// Entry: XADD <stream> [MAXLEN ~ N] * id <event id> topic <topic> key <aggregate_id>
//        payload <payload JSON text> headers <the row's headers as a JSON object> created_at <RFC 3339>
// Stream = the config's template with {topic} replaced by the row's topic.
//
// One connection, one transaction per batch: MULTI, the batch's XADDs in id order, EXEC, written
// at once and answered in order. Redis runs the XADDs of one EXEC in that order and all or none of
// them: a server that is loading, out of memory, read-only or busy refuses the whole transaction
// (every event retries), and a connection lost before EXEC's answer leaves either all of them
// written or none (every event retries; duplicates at worst). One XADD may still fail at run time
// while the others run (ERR: the stream exhausted its ids; WRONGTYPE; NOPERM): the same for every
// XADD to that stream, so a key whose events in a batch go to two streams has them in two
// transactions, the second sent after the first's answer. So no later event of a key reaches a
// stream while an earlier one of that key is retried. See docs/sinks.md "redis sink".
//
// Pipelined (Sink::pipelined()): submit() writes a batch's transaction and returns; collect()
// reads its answer. The next batch's transaction is written behind one still unanswered, on the
// same connection; the loop never puts a key's events in two batches in the sink at once, so the
// sink does not rely on Redis keeping order between transactions (a refused EXEC followed by one
// that runs would break it).
#include <memory>
#include <string>

#include "core/sink.hpp"
#include "sinks/redis/redis_config.hpp"

namespace outbox::sinks {

// Starts a helper thread that connects in the background and PINGs an idle connection every
// second (feeds usable()); destroying the sink stops and joins it. Never throws for an unreachable
// server.
// publish(): submit() then collect(). submit(): connects if needed and writes the transaction;
// collect(): its outcomes. Each blocks at most about config.timeout from the submit() (connecting
// included). Downstream failures are outcomes, never exceptions.
// usable(): true while the last connection attempt, PING or batch reached the server. Thread-safe.
std::unique_ptr<Sink> make_redis_sink(std::string name, RedisSinkConfig config);

}  // namespace outbox::sinks
