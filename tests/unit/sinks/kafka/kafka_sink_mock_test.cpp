// The Kafka sink against librdkafka's in-process mock cluster (rdkafka_mock.h): the real
// protocol over loopback sockets, with injected faults. Some cases drive the sink directly and
// assert every outcome; the others run it under the real RelayLoop with an in-memory outbox
// (head-of-line per key, backoff, dead letters) and then read the topic back with a consumer.
// No Postgres. Waits are bounded waits for a condition or a due retry, never sleeps that a
// result depends on.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "core/loop.hpp"
#include "log/log.hpp"
#include "sinks/kafka/kafka_sink.hpp"
#include "sinks/kafka/rdkafka.hpp"
#include "support/options.hpp"
// after rdkafka.hpp
#include <librdkafka/rdkafka_mock.h>

using namespace outbox;
using sinks::KafkaSinkConfig;
using sinks::make_kafka_sink;
using std::chrono::milliseconds;
using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

namespace {

constexpr std::int16_t kApiProduce = 0;  // Kafka protocol ApiKey of ProduceRequest

// The faults below make librdkafka and the sink warn a lot; keep the test output readable.
struct QuietLogs {
  QuietLogs() { log::set_level(log::Level::kError); }
  ~QuietLogs() { log::set_level(log::Level::kInfo); }
};

struct KafkaDeleter {
  void operator()(rd_kafka_t* rk) const { rd_kafka_destroy(rk); }
};
struct MockDeleter {
  void operator()(rd_kafka_mock_cluster_t* m) const { rd_kafka_mock_cluster_destroy(m); }
};
struct MessageDeleter {
  void operator()(rd_kafka_message_t* m) const { rd_kafka_message_destroy(m); }
};
struct PartitionListDeleter {
  void operator()(rd_kafka_topic_partition_list_t* l) const { rd_kafka_topic_partition_list_destroy(l); }
};
using KafkaPtr = std::unique_ptr<rd_kafka_t, KafkaDeleter>;

rd_kafka_conf_t* quiet_conf() {
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  char err[256];
  REQUIRE(rd_kafka_conf_set(conf, "log_level", "0", err, sizeof err) == RD_KAFKA_CONF_OK);
  return conf;
}

// A mock cluster hosted by a client handle of its own.
class MockCluster {
 public:
  explicit MockCluster(int brokers) : brokers_(brokers) {
    char err[256];
    rd_kafka_conf_t* conf = quiet_conf();
    host_.reset(rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err));
    if (!host_) rd_kafka_conf_destroy(conf);
    REQUIRE(host_);
    mock_.reset(rd_kafka_mock_cluster_new(host_.get(), brokers));
    REQUIRE(mock_);
  }
  ~MockCluster() {
    mock_.reset();  // before its host handle
  }
  std::string bootstraps() const { return rd_kafka_mock_cluster_bootstraps(mock_.get()); }
  void create_topic(const std::string& topic, int partitions) {
    REQUIRE(rd_kafka_mock_topic_create(mock_.get(), topic.c_str(), partitions, std::min(3, brokers_)) == 0);
  }
  void all_brokers(bool up) {
    for (int id = 1; id <= brokers_; ++id) {
      REQUIRE((up ? rd_kafka_mock_broker_set_up(mock_.get(), id) : rd_kafka_mock_broker_set_down(mock_.get(), id)) ==
              0);
    }
  }
  void push_produce_errors(const std::vector<rd_kafka_resp_err_t>& errors) {
    rd_kafka_mock_push_request_errors_array(mock_.get(), kApiProduce, errors.size(), errors.data());
  }
  void topic_error(const std::string& topic, rd_kafka_resp_err_t err) {
    rd_kafka_mock_topic_set_error(mock_.get(), topic.c_str(), err);
  }

 private:
  int brokers_;
  KafkaPtr host_;  // destroyed after mock_ (reverse declaration order)
  std::unique_ptr<rd_kafka_mock_cluster_t, MockDeleter> mock_;
};

struct Record {
  std::int32_t partition = 0;
  std::int64_t offset = 0;
  std::string key;
  std::string value;
  std::vector<Header> headers;
  std::string header(const std::string& name) const {
    for (const auto& [n, v] : headers) {
      if (n == name) return v;
    }
    return "(absent)";
  }
  EventId id() const { return std::stoll(header("outbox-id")); }
};

// Reads every partition of topic from the beginning up to its high watermark.
std::vector<Record> read_topic(const std::string& bootstraps, const std::string& topic, int partitions) {
  char err[256];
  rd_kafka_conf_t* conf = quiet_conf();
  for (auto [k, v] : {std::pair{"bootstrap.servers", bootstraps.c_str()},
                      {"group.id", "outbox-test-reader"},
                      {"enable.auto.commit", "false"},
                      {"enable.partition.eof", "false"}}) {
    REQUIRE(rd_kafka_conf_set(conf, k, v, err, sizeof err) == RD_KAFKA_CONF_OK);
  }
  KafkaPtr consumer(rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err));
  REQUIRE(consumer);
  std::vector<std::int64_t> high(static_cast<std::size_t>(partitions), 0), next(high.size(), 0);
  std::unique_ptr<rd_kafka_topic_partition_list_t, PartitionListDeleter> list(
      rd_kafka_topic_partition_list_new(partitions));
  for (int p = 0; p < partitions; ++p) {
    std::int64_t low = 0;
    REQUIRE(rd_kafka_query_watermark_offsets(consumer.get(), topic.c_str(), p, &low, &high[static_cast<std::size_t>(p)],
                                             10000) == RD_KAFKA_RESP_ERR_NO_ERROR);
    rd_kafka_topic_partition_list_add(list.get(), topic.c_str(), p)->offset = RD_KAFKA_OFFSET_BEGINNING;
  }
  REQUIRE(rd_kafka_assign(consumer.get(), list.get()) == RD_KAFKA_RESP_ERR_NO_ERROR);
  std::vector<Record> out;
  const auto deadline = SteadyClock::now() + seconds{30};
  auto done = [&] {
    for (std::size_t p = 0; p < high.size(); ++p) {
      if (next[p] < high[p]) return false;
    }
    return true;
  };
  while (!done()) {
    REQUIRE(SteadyClock::now() < deadline);
    std::unique_ptr<rd_kafka_message_t, MessageDeleter> m(rd_kafka_consumer_poll(consumer.get(), 200));
    if (!m || m->err) continue;
    Record r;
    r.partition = m->partition;
    r.offset = m->offset;
    r.key.assign(static_cast<const char*>(m->key), m->key_len);
    r.value.assign(static_cast<const char*>(m->payload), m->len);
    rd_kafka_headers_t* headers = nullptr;
    if (rd_kafka_message_headers(m.get(), &headers) == RD_KAFKA_RESP_ERR_NO_ERROR) {
      const char* name = nullptr;
      const void* value = nullptr;
      size_t size = 0;
      for (size_t i = 0; rd_kafka_header_get_all(headers, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; ++i) {
        r.headers.emplace_back(name, std::string(static_cast<const char*>(value), size));
      }
    }
    next[static_cast<std::size_t>(m->partition)] = m->offset + 1;
    out.push_back(std::move(r));
  }
  rd_kafka_consumer_close(consumer.get());
  return out;
}

// What the topic holds, checked against the outbox: every expected id at least once, per key
// the first occurrences in id order. Returns the number of duplicates (at-least-once re-sends).
std::size_t check_topic(const std::vector<Record>& records, const std::map<EventId, std::string>& expected_keys) {
  std::map<EventId, int> seen;
  std::map<std::string, EventId> last_first_of_key;
  std::vector<Record> sorted = records;
  std::sort(sorted.begin(), sorted.end(), [](const Record& a, const Record& b) {
    return std::tie(a.partition, a.offset) < std::tie(b.partition, b.offset);
  });
  for (const auto& r : sorted) {
    const EventId id = r.id();
    REQUIRE(expected_keys.count(id));
    CHECK(r.key == expected_keys.at(id));
    if (seen[id]++ > 0) continue;  // a duplicate: only first occurrences carry the order
    auto& last = last_first_of_key[r.key];
    CHECK_MESSAGE(id > last, "key " << r.key << ": id " << id << " after " << last);
    last = id;
  }
  CHECK(seen.size() == expected_keys.size());
  return records.size() - seen.size();
}

// An outbox in memory with the store's semantics: claims in id order, a key whose earliest
// pending event waits for a retry is held back entirely, completions as the SQL store does.
class MemoryStore final : public Store {
 public:
  struct Row {
    Event event;
    bool done = false;
    bool dead = false;
    int attempts = 0;
    SteadyClock::time_point due{};
    std::string last_error;
  };

  EventId add(const std::string& topic, const std::string& key, std::string payload, std::string headers_json = "{}") {
    Row row;
    row.event.id = next_id_++;
    row.event.topic = topic;
    row.event.key = key;
    row.event.payload = std::move(payload);
    row.event.headers_json = std::move(headers_json);
    row.event.created_at = "2026-11-30T06:32:22.123456Z";
    row.event.created_at_us = 1'800'000'000'000'000;
    rows[row.event.id] = row;
    return row.event.id;
  }

  std::vector<Event> claim(std::size_t limit) override {
    const auto now = SteadyClock::now();
    std::set<std::string> blocked;
    std::vector<Event> out;
    for (auto& [id, row] : rows) {
      if (out.size() >= limit) break;
      if (row.done || row.dead || blocked.count(row.event.key)) continue;
      if (row.due > now) {
        blocked.insert(row.event.key);
        continue;
      }
      Event e = row.event;
      e.attempts = row.attempts;
      out.push_back(std::move(e));
    }
    return out;
  }

  void complete(std::span<const Completion> completions) override {
    const auto now = SteadyClock::now();
    for (const auto& c : completions) {
      Row& row = rows.at(c.id);
      switch (c.kind) {
        case Completion::Kind::kDelivered: row.done = true; break;
        case Completion::Kind::kRetry:
          ++row.attempts;
          ++retries;
          row.due = now + c.delay;
          row.last_error = c.error;
          break;
        case Completion::Kind::kDeadLetter:
          ++row.attempts;
          row.dead = true;
          row.last_error = c.error;
          break;
        case Completion::Kind::kRelease: break;
      }
    }
  }

  std::size_t pending() const {
    return static_cast<std::size_t>(
        std::count_if(rows.begin(), rows.end(), [](const auto& r) { return !r.second.done && !r.second.dead; }));
  }
  std::size_t done_count() const {
    return static_cast<std::size_t>(
        std::count_if(rows.begin(), rows.end(), [](const auto& r) { return r.second.done; }));
  }
  std::optional<SteadyClock::time_point> earliest_due() const {
    std::optional<SteadyClock::time_point> due;
    for (const auto& [id, row] : rows) {
      if (!row.done && !row.dead && (!due || row.due < *due)) due = row.due;
    }
    return due;
  }

  std::map<EventId, Row> rows;
  std::size_t retries = 0;

 private:
  EventId next_id_ = 1;
};

// The real loop over a MemoryStore and one sink.
struct Harness {
  explicit Harness(Sink& sink, std::size_t batch_size = 200)
      : loop(store, {&sink}, router, clock, metrics,
             outbox::testing::loop_options(batch_size, 50, BackoffPolicy{milliseconds{50}, milliseconds{500}}),
             [] { return 0.5; }) {}

  // Runs batches until nothing is pending; tick runs before each batch (fault schedules).
  void drain(seconds limit, const std::function<void()>& tick = {}) {
    const auto deadline = SteadyClock::now() + limit;
    while (store.pending() > 0) {
      REQUIRE_MESSAGE(SteadyClock::now() < deadline, store.pending() << " events still pending");
      if (tick) tick();
      if (loop.run_once().claimed == 0) {
        // Everything left waits for its backoff: wait until the earliest is due.
        std::this_thread::sleep_until(
            std::min(store.earliest_due().value_or(SteadyClock::now()), SteadyClock::now() + milliseconds{100}));
      }
    }
  }

  std::map<EventId, std::string> keys_of_delivered() const {
    std::map<EventId, std::string> out;
    for (const auto& [id, row] : store.rows) {
      if (row.done) out[id] = row.event.key;
    }
    return out;
  }

  MemoryStore store;
  Router router{{}, 1};
  SystemClock clock;
  Metrics metrics;
  RelayLoop loop;
};

KafkaSinkConfig sink_config(const MockCluster& cluster, milliseconds delivery_timeout = milliseconds{1000}) {
  KafkaSinkConfig c;
  c.brokers = cluster.bootstraps();
  c.topic = "outbox.{topic}";
  c.delivery_timeout = delivery_timeout;
  c.key_path = "sinks[0]";
  c.properties = {{"reconnect.backoff.max.ms", "500"}, {"log_level", "2"}};
  return c;
}

std::vector<const Event*> pointers(const std::vector<Event>& events) {
  std::vector<const Event*> out;
  for (const auto& e : events) out.push_back(&e);
  return out;
}

Event event(EventId id, const std::string& key, std::string payload = R"({"n":1})", std::string topic = "orders") {
  Event e;
  e.id = id;
  e.topic = std::move(topic);
  e.key = key;
  e.payload = std::move(payload);
  e.created_at = "2026-11-30T06:32:22.123456Z";
  return e;
}

bool wait_for(const std::function<bool()>& condition, seconds limit) {
  const auto deadline = SteadyClock::now() + limit;
  while (SteadyClock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(milliseconds{50});
  }
  return condition();
}

}  // namespace

TEST_SUITE("kafka-mock") {
  TEST_CASE("kafka mock: a batch is delivered with key, value and headers; usable() follows the brokers") {
    QuietLogs quiet;
    MockCluster cluster(3);
    cluster.create_topic("outbox.orders", 4);
    const auto sink = make_kafka_sink("kafka", sink_config(cluster));
    CHECK(wait_for([&] { return sink->usable(); }, seconds{10}));

    std::vector<Event> events{event(1, "a", R"({"amount": 12.5})"), event(2, "b"), event(3, "a")};
    events[0].headers = {{"trace", "t-1"}, {"tenant", "acme"}};
    const auto outcomes = sink->publish(pointers(events));
    REQUIRE(outcomes.size() == 3);
    for (const auto& o : outcomes) CHECK(o.kind == OutcomeKind::kDelivered);

    const auto records = read_topic(cluster.bootstraps(), "outbox.orders", 4);
    REQUIRE(records.size() == 3);
    const auto first = *std::find_if(records.begin(), records.end(), [](const Record& r) { return r.id() == 1; });
    CHECK(first.key == "a");
    CHECK(first.value == R"({"amount": 12.5})");
    REQUIRE(first.headers.size() == 5);
    CHECK(first.headers[0] == Header{"outbox-id", "1"});
    CHECK(first.headers[1] == Header{"outbox-topic", "orders"});
    CHECK(first.headers[2] == Header{"outbox-created-at", "2026-11-30T06:32:22.123456Z"});
    CHECK(first.headers[3] == Header{"trace", "t-1"});
    CHECK(first.headers[4] == Header{"tenant", "acme"});

    cluster.all_brokers(false);
    CHECK(wait_for([&] { return !sink->usable(); }, seconds{10}));
    cluster.all_brokers(true);
    CHECK(wait_for([&] { return sink->usable(); }, seconds{15}));
  }

  TEST_CASE("kafka mock: brokers down for several seconds during a backlog: nothing lost, per-key order kept") {
    QuietLogs quiet;
    MockCluster cluster(3);
    cluster.create_topic("outbox.orders", 4);
    const auto sink = make_kafka_sink("kafka", sink_config(cluster));
    Harness h(*sink);
    for (int i = 0; i < 4000; ++i)
      h.store.add("orders", "key-" + std::to_string(i % 40), R"({"i":)" + std::to_string(i) + "}");

    std::optional<SteadyClock::time_point> went_down;
    bool came_up = false;
    std::size_t done_when_down = 0;
    h.drain(seconds{90}, [&] {
      if (!went_down && h.store.done_count() >= 600) {
        cluster.all_brokers(false);
        went_down = SteadyClock::now();
        done_when_down = h.store.done_count();
      } else if (went_down && !came_up && SteadyClock::now() - *went_down >= seconds{4}) {
        // Rows marked done while the brokers were down would be rows Kafka never acknowledged.
        CHECK(h.store.done_count() == done_when_down);
        cluster.all_brokers(true);
        came_up = true;
      }
    });
    REQUIRE(came_up);
    for (const auto& [id, row] : h.store.rows) {
      CAPTURE(id);
      CHECK(row.done);
      CHECK_FALSE(row.dead);
    }
    CHECK(h.store.retries > 0);  // the outage was seen as retries, not as losses
    CHECK(sink->producer_replacements() > 0);
    const auto duplicates = check_topic(read_topic(cluster.bootstraps(), "outbox.orders", 4), h.keys_of_delivered());
    MESSAGE("broker outage: " << h.store.retries << " retry outcomes, " << duplicates << " duplicates in the topic, "
                              << sink->producer_replacements() << " producer replacements");
  }

  TEST_CASE("kafka mock: injected retriable produce errors end delivered, in order") {
    QuietLogs quiet;
    MockCluster cluster(3);
    cluster.create_topic("outbox.orders", 4);
    const auto sink = make_kafka_sink("kafka", sink_config(cluster));
    Harness h(*sink);
    for (int i = 0; i < 2000; ++i) h.store.add("orders", "key-" + std::to_string(i % 25), "{}");
    // Enough errors that librdkafka's own retries outlast a batch deadline, so some surface to the
    // relay as kRetry too.
    std::vector<rd_kafka_resp_err_t> errors;
    for (int i = 0; i < 150; ++i) {
      errors.push_back(std::array{RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
                                  RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND}[i % 3]);
    }
    cluster.push_produce_errors(errors);
    h.drain(seconds{90});
    for (const auto& [id, row] : h.store.rows) {
      CAPTURE(id);
      CHECK(row.done);
    }
    const auto duplicates = check_topic(read_topic(cluster.bootstraps(), "outbox.orders", 4), h.keys_of_delivered());
    MESSAGE("retriable errors: " << h.store.retries << " retry outcomes, " << duplicates << " duplicates");
  }

  TEST_CASE("kafka mock: permanent errors dead-letter exactly their events, with the error name; the rest flow") {
    QuietLogs quiet;
    MockCluster cluster(3);
    cluster.create_topic("outbox.orders", 4);
    const auto sink = make_kafka_sink("kafka", sink_config(cluster));
    Harness h(*sink);
    // Deterministic: every 50th event is over message.max.bytes (librdkafka refuses it locally).
    const std::string big = "\"" + std::string(1'100'000, 'x') + "\"";
    std::set<EventId> oversized;
    for (int i = 0; i < 600; ++i) {
      const bool too_big = i % 50 == 7;
      const EventId id = h.store.add("orders", "key-" + std::to_string(i % 12), too_big ? big : "{}");
      if (too_big) oversized.insert(id);
    }
    // Injected: once the first batch is through, one ProduceRequest is refused with
    // TOPIC_AUTHORIZATION_FAILED, so the events it carried (whichever they are) are permanent.
    bool injected = false;
    h.drain(seconds{60}, [&] {
      if (!injected && h.store.done_count() > 0) {
        cluster.push_produce_errors({RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED});
        injected = true;
      }
    });
    std::size_t refused = 0;
    std::set<EventId> dead;
    for (const auto& [id, row] : h.store.rows) {
      CAPTURE(id);
      CHECK(row.done != row.dead);
      if (oversized.count(id)) {
        CHECK(row.dead);
        CHECK(row.last_error.find("kafka: MSG_SIZE_TOO_LARGE") == 0);
      }
      if (row.dead) {
        dead.insert(id);
        CHECK(row.attempts == 1);  // dead-lettered at once, not after max_attempts
        if (!oversized.count(id)) {
          CHECK(row.last_error.find("kafka: TOPIC_AUTHORIZATION_FAILED") == 0);
          ++refused;
        }
      }
    }
    CHECK(refused > 0);
    // Exactly the delivered rows are in the topic, and no dead-lettered one.
    const auto records = read_topic(cluster.bootstraps(), "outbox.orders", 4);
    const auto delivered = h.keys_of_delivered();
    CHECK(delivered.size() + dead.size() == 600);
    const auto duplicates = check_topic(records, delivered);
    for (const auto& r : records) CHECK(!dead.count(r.id()));
    MESSAGE("permanent errors: " << oversized.size() << " oversized, " << refused << " refused by the broker, "
                                 << duplicates << " duplicates, " << sink->producer_replacements()
                                 << " producer replacements");
  }

  TEST_CASE("kafka mock: a fatal producer error marks nothing delivered and replaces the producer") {
    QuietLogs quiet;
    MockCluster cluster(3);
    cluster.create_topic("outbox.orders", 4);
    const auto sink = make_kafka_sink("kafka", sink_config(cluster, milliseconds{5000}));
    std::vector<Event> events;
    for (int i = 1; i <= 100; ++i) events.push_back(event(i, "key-" + std::to_string(i % 7)));
    // A head-of-line sequence error is unrecoverable for the idempotent producer: librdkafka raises
    // RD_KAFKA_RESP_ERR__FATAL.
    cluster.push_produce_errors({RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER});
    const auto failed = sink->publish(pointers(events));
    REQUIRE(failed.size() == 100);
    for (const auto& o : failed) {
      CHECK(o.kind == OutcomeKind::kRetry);
      CHECK(o.reason.find("fatal Kafka producer error") == 0);
    }
    CHECK(failed[0].reason.find("OUT_OF_ORDER_SEQUENCE_NUMBER") != std::string::npos);
    CHECK(sink->producer_replacements() == 1);

    const auto retried = sink->publish(pointers(events));
    for (const auto& o : retried) CHECK(o.kind == OutcomeKind::kDelivered);
    CHECK(sink->producer_replacements() == 1);
    std::map<EventId, std::string> keys;
    for (const auto& e : events) keys[e.id] = e.key;
    check_topic(read_topic(cluster.bootstraps(), "outbox.orders", 4), keys);
  }

  TEST_CASE("kafka mock: pipelined, two batches in flight are collected in order, each with its own outcomes") {
    QuietLogs quiet;
    MockCluster cluster(3);
    cluster.create_topic("outbox.orders", 4);
    const auto sink = make_kafka_sink("kafka", sink_config(cluster, milliseconds{5000}));
    REQUIRE(sink->pipelined());
    std::vector<Event> first, second;
    for (int i = 1; i <= 300; ++i) first.push_back(event(i, "a-" + std::to_string(i % 7)));
    for (int i = 301; i <= 500; ++i) second.push_back(event(i, "b-" + std::to_string(i % 5)));
    second[17].topic = "bad topic";  // a permanent outcome in the second batch, at its own index
    sink->submit(pointers(first));
    sink->submit(pointers(second));
    const auto a = sink->collect();
    const auto b = sink->collect();
    CHECK(sink->collect().empty());
    REQUIRE(a.size() == 300);
    REQUIRE(b.size() == 200);
    for (const auto& o : a) CHECK(o.kind == OutcomeKind::kDelivered);
    for (std::size_t i = 0; i < b.size(); ++i) {
      CAPTURE(i);
      CHECK(b[i].kind == (i == 17 ? OutcomeKind::kPermanent : OutcomeKind::kDelivered));
    }
    std::map<EventId, std::string> keys;
    for (const auto* batch : {&first, &second}) {
      for (const auto& e : *batch) {
        if (e.id != 318) keys[e.id] = e.key;
      }
    }
    CHECK(check_topic(read_topic(cluster.bootstraps(), "outbox.orders", 4), keys) == 0);
    CHECK(sink->producer_replacements() == 0);
  }

  TEST_CASE(
      "kafka mock: a key's events go to one topic per batch; from its first event for another topic on, "
      "the key waits") {
    QuietLogs quiet;
    MockCluster cluster(1);
    cluster.create_topic("outbox.orders", 2);
    cluster.create_topic("outbox.payments", 2);
    const auto sink = make_kafka_sink("kafka", sink_config(cluster, milliseconds{5000}));
    std::vector<Event> events{event(1, "a"), event(2, "b"), event(3, "a", "{}", "payments"),
                              event(4, "b"), event(5, "a"), event(6, "c", "{}", "payments")};
    const auto outcomes = sink->publish(pointers(events));
    REQUIRE(outcomes.size() == 6);
    const std::vector<OutcomeKind> expected{OutcomeKind::kDelivered, OutcomeKind::kDelivered, OutcomeKind::kDeferred,
                                            OutcomeKind::kDelivered, OutcomeKind::kDeferred,  OutcomeKind::kDelivered};
    for (std::size_t i = 0; i < 6; ++i) {
      CAPTURE(i);
      CHECK(outcomes[i].kind == expected[i]);
    }
    CHECK(outcomes[2].reason.find("goes to topic outbox.orders") != std::string::npos);
  }

  TEST_CASE("kafka mock: pipelined, a fatal error voids every batch in flight whole and replaces the producer once") {
    QuietLogs quiet;
    MockCluster cluster(3);
    cluster.create_topic("outbox.orders", 4);
    const auto sink = make_kafka_sink("kafka", sink_config(cluster, milliseconds{5000}));
    std::vector<Event> first, second;
    for (int i = 1; i <= 100; ++i) first.push_back(event(i, "a-" + std::to_string(i % 7)));
    for (int i = 101; i <= 200; ++i) second.push_back(event(i, "b-" + std::to_string(i % 7)));
    cluster.push_produce_errors({RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER});
    bool error_before_second_submit = false;
    SUBCASE("submitted back to back") {}
    SUBCASE("the error comes before the second submit") { error_before_second_submit = true; }
    sink->submit(pointers(first));
    if (error_before_second_submit) std::this_thread::sleep_for(milliseconds{1000});
    sink->submit(pointers(second));
    const auto started = SteadyClock::now();
    const auto older = sink->collect();
    const auto newer = sink->collect();
    REQUIRE(older.size() == 100);
    REQUIRE(newer.size() == 100);
    const auto voided = [](const std::vector<Outcome>& outcomes) {
      return std::all_of(outcomes.begin(), outcomes.end(), [](const Outcome& o) {
        return o.kind == OutcomeKind::kRetry && o.reason.find("fatal Kafka producer error") == 0;
      });
    };
    const auto delivered = [](const std::vector<Outcome>& outcomes) {
      return std::all_of(outcomes.begin(), outcomes.end(),
                         [](const Outcome& o) { return o.kind == OutcomeKind::kDelivered; });
    };
    // Every batch in flight when the error is seen is voided whole; a batch is never part
    // delivered. Which batches were in flight depends on timing, all three ways are right:
    //  - both, the usual case: the error is seen while collecting;
    //  - only the newer one: every report of the older came before the error (seen under ASan);
    //  - only the older one: the error came before the second submit, which replaced the
    //    producer before its batch opened, so the newer batch went to the new producer (seen in
    //    CI once).
    CHECK((voided(older) || delivered(older)));
    CHECK((voided(newer) || delivered(newer)));
    CHECK((voided(older) || voided(newer)));
    if (error_before_second_submit) {
      CHECK(voided(older));
      CHECK(delivered(newer));
    }
    MESSAGE("older batch " << std::string(voided(older) ? "voided" : "delivered") << ", newer batch "
                           << std::string(voided(newer) ? "voided" : "delivered"));
    CHECK(SteadyClock::now() - started < seconds{4});  // no wait for a deadline
    CHECK(sink->producer_replacements() == 1);
    const auto retried = sink->publish(pointers(first));
    for (const auto& o : retried) CHECK(o.kind == OutcomeKind::kDelivered);
  }

  TEST_CASE("kafka mock: pipelined, brokers down: the first batch's deadline retries both, one replacement") {
    QuietLogs quiet;
    MockCluster cluster(3);
    cluster.create_topic("outbox.orders", 4);
    const auto sink = make_kafka_sink("kafka", sink_config(cluster, milliseconds{1500}));
    std::vector<Event> warm{event(1, "w")};
    REQUIRE(sink->publish(pointers(warm))[0].kind == OutcomeKind::kDelivered);
    cluster.all_brokers(false);
    std::vector<Event> first, second;
    for (int i = 2; i <= 50; ++i) first.push_back(event(i, "a-" + std::to_string(i % 7)));
    for (int i = 51; i <= 100; ++i) second.push_back(event(i, "b-" + std::to_string(i % 7)));
    sink->submit(pointers(first));
    sink->submit(pointers(second));
    const auto a = sink->collect();
    const auto after_first = SteadyClock::now();
    const auto b = sink->collect();
    CHECK(SteadyClock::now() - after_first < milliseconds{500});  // settled by the replacement, not its own deadline
    for (const auto& o : a) {
      CHECK(o.kind == OutcomeKind::kRetry);
      CHECK(o.reason.find("no delivery report within delivery_timeout") == 0);
    }
    for (const auto& o : b) {
      CHECK(o.kind == OutcomeKind::kRetry);
      CHECK(o.reason.find("the Kafka producer was replaced") == 0);
    }
    CHECK(sink->producer_replacements() == 1);
    cluster.all_brokers(true);
  }

  TEST_CASE("kafka mock: a message over message.max.bytes is permanent at once; its key and others flow") {
    QuietLogs quiet;
    MockCluster cluster(1);
    cluster.create_topic("outbox.orders", 2);
    const auto sink = make_kafka_sink("kafka", sink_config(cluster));
    const std::string big = "\"" + std::string(1'200'000, 'x') + "\"";
    std::vector<Event> events{event(1, "a"), event(2, "a", big), event(3, "a"), event(4, "b")};
    const auto outcomes = sink->publish(pointers(events));
    REQUIRE(outcomes.size() == 4);
    CHECK(outcomes[0].kind == OutcomeKind::kDelivered);
    CHECK(outcomes[1].kind == OutcomeKind::kPermanent);
    CHECK(outcomes[1].reason.find("MSG_SIZE_TOO_LARGE") == 0);
    CHECK(outcomes[2].kind == OutcomeKind::kDelivered);
    CHECK(outcomes[3].kind == OutcomeKind::kDelivered);
    CHECK(sink->producer_replacements() == 0);
  }

  TEST_CASE("kafka mock: a full producer queue is served, never dropped") {
    QuietLogs quiet;
    MockCluster cluster(1);
    cluster.create_topic("outbox.orders", 2);
    auto config = sink_config(cluster, milliseconds{10000});
    config.properties["queue.buffering.max.messages"] = "10";
    const auto sink = make_kafka_sink("kafka", config);
    std::vector<Event> events;
    for (int i = 1; i <= 500; ++i) events.push_back(event(i, "key-" + std::to_string(i % 5)));
    const auto outcomes = sink->publish(pointers(events));
    for (const auto& o : outcomes) CHECK(o.kind == OutcomeKind::kDelivered);
    std::map<EventId, std::string> keys;
    for (const auto& e : events) keys[e.id] = e.key;
    CHECK(check_topic(read_topic(cluster.bootstraps(), "outbox.orders", 2), keys) == 0);
  }

  TEST_CASE("kafka mock: brokers down with a full queue: nothing delivered, later events of a held key not produced") {
    QuietLogs quiet;
    MockCluster cluster(1);
    cluster.create_topic("outbox.orders", 2);
    auto config = sink_config(cluster, milliseconds{500});
    config.properties["queue.buffering.max.messages"] = "10";
    const auto sink = make_kafka_sink("kafka", config);
    REQUIRE(wait_for([&] { return sink->usable(); }, seconds{10}));
    cluster.all_brokers(false);

    std::vector<Event> events;
    for (int i = 0; i < 30; ++i) events.push_back(event(i + 1, "key-" + std::to_string(i % 4)));
    const auto outcomes = sink->publish(pointers(events));
    REQUIRE(outcomes.size() == 30);
    // 0..9 were enqueued and never acknowledged (retry). 10 found the queue full until the deadline
    // (retry, its key held); after it, the first event of each other key tries once more (queue
    // still full: retry) and every later event of a held key is not produced (deferred).
    std::set<std::string> held;
    for (std::size_t i = 0; i < outcomes.size(); ++i) {
      CAPTURE(i);
      const auto& key = events[i].key;
      if (i < 10) {
        CHECK(outcomes[i].kind == OutcomeKind::kRetry);
        CHECK(outcomes[i].reason.find("no delivery report within delivery_timeout") == 0);
      } else if (!held.count(key)) {
        CHECK(outcomes[i].kind == OutcomeKind::kRetry);
        CHECK(outcomes[i].reason.find("_QUEUE_FULL") == 0);
        held.insert(key);
      } else {
        CHECK(outcomes[i].kind == OutcomeKind::kDeferred);
      }
    }
    CHECK(held.size() == 4);
    CHECK(sink->producer_replacements() == 1);  // the unacknowledged ten are purged with it

    cluster.all_brokers(true);
    REQUIRE(wait_for([&] { return sink->usable(); }, seconds{10}));
    const auto retried = sink->publish(pointers(events));
    for (const auto& o : retried) CHECK(o.kind == OutcomeKind::kDelivered);
  }

}  // TEST_SUITE
