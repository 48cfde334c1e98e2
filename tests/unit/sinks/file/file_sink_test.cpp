#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sinks/file/file_sink.hpp"

using namespace outbox;
namespace fs = std::filesystem;

namespace {

Event sample(EventId id) {
  Event e;
  e.id = id;
  e.topic = "order.\"paid\"";
  e.key = "k\n1";
  e.payload = R"({"amount": 12.5, "items": [1, 2]})";
  e.headers_json = R"({"trace": "t-1"})";
  e.created_at = "2026-11-30T06:32:22.123456Z";
  return e;
}

fs::path temp_dir() {
  auto dir = fs::temp_directory_path() / ("outbox-file-sink-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

}  // namespace

TEST_CASE("a JSON line holds exactly id, topic, key, payload, headers, created_at") {
  std::string line;
  sinks::append_json_line(sample(7), line);
  REQUIRE(line.back() == '\n');
  const auto j = nlohmann::json::parse(line);
  CHECK(j.size() == 6);
  CHECK(j["id"] == 7);
  CHECK(j["topic"] == "order.\"paid\"");
  CHECK(j["key"] == "k\n1");
  CHECK(j["payload"]["items"][1] == 2);
  CHECK(j["headers"]["trace"] == "t-1");
  CHECK(j["created_at"] == "2026-11-30T06:32:22.123456Z");
}

TEST_CASE("the file sink retries while its directory is missing, then appends every event") {
  const auto dir = temp_dir();
  sinks::FileSink sink("f", sinks::FileSinkConfig{(dir / "events.jsonl").string(), true, {}});
  const Event e1 = sample(1), e2 = sample(2);
  std::vector<const Event*> batch{&e1, &e2};

  auto outcomes = sink.publish(batch);
  REQUIRE(outcomes.size() == 2);
  CHECK(outcomes[0].kind == OutcomeKind::kRetry);
  CHECK(outcomes[0].reason.find("No such file or directory") != std::string::npos);
  CHECK_FALSE(sink.usable());

  fs::create_directories(dir);
  outcomes = sink.publish(batch);
  CHECK(outcomes[0].kind == OutcomeKind::kDelivered);
  CHECK(outcomes[1].kind == OutcomeKind::kDelivered);
  CHECK(sink.usable());
  sink.publish(batch);

  std::ifstream in(dir / "events.jsonl");
  std::vector<long long> ids;
  for (std::string line; std::getline(in, line);) ids.push_back(nlohmann::json::parse(line)["id"]);
  CHECK(ids == std::vector<long long>{1, 2, 1, 2});
  fs::remove_all(dir);
}
