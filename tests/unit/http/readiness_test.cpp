// /readyz and /healthz decisions.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "http/readiness.hpp"

using namespace outbox;

namespace {

class FakeSink final : public NamedSink {
 public:
  FakeSink(std::string name, bool usable) : NamedSink(std::move(name)), usable_(usable) {}
  std::vector<Outcome> publish(std::span<const Event* const> events) override {
    return std::vector<Outcome>(events.size(), Outcome::delivered());
  }
  bool usable() const override { return usable_; }

 private:
  bool usable_;
};

}  // namespace

TEST_CASE("ready only with both sessions up and every sink usable") {
  Health h;
  FakeSink good("kafka", true);
  FakeSink bad("hooks", false);
  std::vector<const Sink*> sinks{&good};

  auto r = http::evaluate_readiness(h, sinks, false);
  CHECK_FALSE(r.ready);
  CHECK(r.reasons == std::vector<std::string>{"database session down", "LISTEN session down"});

  h.store_up = true;
  r = http::evaluate_readiness(h, sinks, false);
  CHECK(r.reasons == std::vector<std::string>{"LISTEN session down"});

  h.listener_up = true;
  r = http::evaluate_readiness(h, sinks, false);
  CHECK(r.ready);
  CHECK(r.reasons.empty());
  CHECK(nlohmann::json::parse(r.to_json("ready")) == nlohmann::json{{"ready", true}});

  sinks.push_back(&bad);
  r = http::evaluate_readiness(h, sinks, false);
  CHECK_FALSE(r.ready);
  CHECK(r.reasons == std::vector<std::string>{"sink 'hooks' not usable"});
  CHECK(nlohmann::json::parse(r.to_json("ready")) ==
        nlohmann::json{{"ready", false}, {"reasons", {"sink 'hooks' not usable"}}});

  r = http::evaluate_readiness(h, {&good}, true);
  CHECK_FALSE(r.ready);
  CHECK(r.reasons == std::vector<std::string>{"shutting down"});
}

TEST_CASE("a transaction pooler behind database.url is named, not reported as a lost session") {
  Health h;
  h.listener_up = true;
  h.transaction_pooler = true;
  auto r = http::evaluate_readiness(h, {}, false);
  CHECK_FALSE(r.ready);
  CHECK(r.reasons ==
        std::vector<std::string>{
            "database.url leads to a transaction pooler: the relay needs a direct or session-pooled connection"});
  h.transaction_pooler = false;
  r = http::evaluate_readiness(h, {}, false);
  CHECK(r.reasons == std::vector<std::string>{"database session down"});
}

TEST_CASE("a session down for an error that needs an operator names the class; a transient one does not") {
  Health h;
  h.store_error = DbErrorClass::kTransient;
  h.listener_error = DbErrorClass::kOther;
  auto r = http::evaluate_readiness(h, {}, false);
  CHECK(r.reasons == std::vector<std::string>{"database session down", "LISTEN session down"});

  h.store_error = DbErrorClass::kPrivilege;
  h.listener_error = DbErrorClass::kAuthentication;
  r = http::evaluate_readiness(h, {}, false);
  CHECK(r.reasons ==
        std::vector<std::string>{"database session down: privilege", "LISTEN session down: authentication"});
  h.store_error = DbErrorClass::kUndefinedObject;
  h.listener_error = DbErrorClass::kConfiguration;
  r = http::evaluate_readiness(h, {}, false);
  CHECK(r.reasons ==
        std::vector<std::string>{"database session down: undefined_object", "LISTEN session down: configuration"});

  // Up again: the last error's class no longer shows.
  h.store_up = true;
  h.listener_up = true;
  CHECK(http::evaluate_readiness(h, {}, false).ready);
}

TEST_CASE("alive while the loop runs, whatever the database does") {
  Health h;
  CHECK_FALSE(http::evaluate_liveness(h).ready);
  h.loop_running = true;
  CHECK(http::evaluate_liveness(h).ready);
  CHECK(nlohmann::json::parse(http::evaluate_liveness(h).to_json("alive")) == nlohmann::json{{"alive", true}});
}
