// The sink registry: every type this build knows, read from a config as `run` reads it.
#include <doctest/doctest.h>

#include <filesystem>

#include "app/run.hpp"
#include "sinks/registry.hpp"
#include "support/env.hpp"

using namespace outbox;

TEST_CASE("the registry knows every sink type and builds each entry with its own row") {
  CHECK(sinks::sink_type_names() ==
        std::vector<std::string>{"stdout", "file", "webhook", "kafka", "redis", "nats", "rabbitmq"});
  const auto dir = std::filesystem::temp_directory_path();
  const auto c = config::parse_config(
      "database: {url: 'postgresql://u@h/db'}\n"
      "sinks:\n"
      "  - {name: out, type: stdout}\n"
      "  - {name: audit, type: file, path: '" +
          (dir / "registry-test.jsonl").string() + "', fsync: false}\n",
      testing::env_of({}));
  const auto prepared = app::prepare_sinks(c);
  REQUIRE(prepared.size() == 2);
  CHECK(prepared[1].type == "file");
  const auto described = sinks::describe(prepared);
  CHECK(described[0] == nlohmann::json{{"name", "out"}, {"type", "stdout"}});
  CHECK(described[1]["path"] == (dir / "registry-test.jsonl").string());
  CHECK(described[1]["fsync"] == false);
  const auto sink = prepared[1].spec->make(prepared[1].name);
  CHECK(sink->name() == "audit");
  std::filesystem::remove(dir / "registry-test.jsonl");
}

TEST_CASE("config/ keeps a sink entry as written; the registry names the key it rejects") {
  // config/ alone accepts any type: it knows none.
  const auto c = config::parse_config("database: {url: 'postgresql://u@h/db'}\nsinks: [{name: a, type: pigeon}]",
                                      testing::env_of({}));
  CHECK(c.sinks.at(0).type == "pigeon");
  CHECK(c.sinks.at(0).path == "sinks[0]");
  CHECK_THROWS_WITH_AS(app::prepare_sinks(c),
                       doctest::Contains("sinks[0].type: unsupported value 'pigeon', expected one of: stdout, file, "
                                         "webhook, kafka, redis, nats, rabbitmq"),
                       config::ConfigError);
}
