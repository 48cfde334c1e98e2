#include "http/readiness.hpp"

#include <nlohmann/json.hpp>
#include <string>

namespace outbox::http {
namespace {

// "database session down" while a reconnect may cure it (or before the first connect);
// "database session down: privilege" when the last failure was of a class that needs an operator.
std::string session_down(const char* text, DbErrorClass last_error) {
  std::string reason = text;
  if (needs_operator(last_error)) reason += std::string(": ") + db_error_label(last_error);
  return reason;
}

}  // namespace

std::string Readiness::to_json(const char* key) const {
  nlohmann::json body{{key, ready}};
  if (!reasons.empty()) body["reasons"] = reasons;
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Readiness evaluate_readiness(const Health& health, const std::vector<const Sink*>& sinks, bool stopping) {
  Readiness r;
  if (stopping) r.reasons.emplace_back("shutting down");
  if (health.transaction_pooler.load()) {
    r.reasons.emplace_back(
        "database.url leads to a transaction pooler: the relay needs a direct or session-pooled connection");
  } else if (!health.store_up.load()) {
    r.reasons.push_back(session_down("database session down", health.store_error.load()));
  }
  if (const long long cache = health.sequence_cache.load(); cache > 1) {
    r.reasons.push_back("the id sequence caches " + std::to_string(cache) +
                        " ids per session: events wait for every lower id (ALTER SEQUENCE ... CACHE 1 fixes it)");
  }
  if (health.lane_groups_disagree.load()) {
    r.reasons.emplace_back(
        "the relays of this table divide its lanes in different ways (exactly_once on some kafka sinks only): "
        "lanes may have no owner; give every relay of the table the same setting");
  }
  if (!health.listener_up.load())
    r.reasons.push_back(session_down("LISTEN session down", health.listener_error.load()));
  for (const Sink* sink : sinks) {
    if (!sink->usable()) r.reasons.push_back("sink '" + sink->name() + "' not usable");
  }
  r.ready = r.reasons.empty();
  return r;
}

Readiness evaluate_liveness(const Health& health) {
  Readiness r;
  if (!health.loop_running.load()) r.reasons.emplace_back("relay loop not running");
  r.ready = r.reasons.empty();
  return r;
}

}  // namespace outbox::http
