#pragma once
// What /healthz and /readyz answer, as pure functions of the shared health facts and the sinks,
// so that the HTTP layer only moves bytes.
#include <string>
#include <vector>

#include "core/health.hpp"
#include "core/sink.hpp"

namespace outbox::http {

struct Readiness {
  bool ready = false;
  std::vector<std::string> reasons;  // empty when ready; short, fixed texts plus sink names

  // {"<key>":true} or {"<key>":false,"reasons":[...]}: the /readyz ("ready") and /healthz
  // ("alive") bodies.
  std::string to_json(const char* key) const;
};

// Ready = the work session is up, the LISTEN session is up, every sink is usable, and the relay
// is not shutting down. A session down for a class of error that needs an operator names the
// class ("database session down: privilege"). Thread-safe (reads atomics and Sink::usable()).
Readiness evaluate_readiness(const Health& health, const std::vector<const Sink*>& sinks, bool stopping);

// Live = the loop thread is inside its run loop.
Readiness evaluate_liveness(const Health& health);

}  // namespace outbox::http
