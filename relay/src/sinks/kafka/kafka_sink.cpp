#include "sinks/kafka/kafka_sink.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "config/duration.hpp"
#include "config/section.hpp"
#include "core/key_holds.hpp"
#include "core/periodic_thread.hpp"
#include "log/log.hpp"
#include "sinks/common/batch_log.hpp"
#include "sinks/common/c_handle.hpp"
#include "sinks/kafka/kafka_outcomes.hpp"
#include "sinks/kafka/rdkafka.hpp"

namespace outbox::sinks {
namespace {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::size_t kMaxTopicHandles = 1024;   // bounds the cache if event topics are unbounded
constexpr milliseconds kIdlePollInterval{200};   // between batches: serve stats and errors
constexpr milliseconds kQueueFullPoll{50};       // queue full: serve reports, then produce again
constexpr milliseconds kRecreateInterval{1000};  // a failed producer re-creation is retried this often

void purge_and_destroy(rd_kafka_t* rk) {
  // Whatever is still queued belongs to a batch that was already reported (kRetry): it must not
  // go out later, behind the retry. In-flight requests may still have reached the broker; that
  // is a duplicate at worst (at-least-once), never a loss.
  rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT | RD_KAFKA_PURGE_F_NON_BLOCKING);
  rd_kafka_destroy(rk);
}
using ConfPtr = CHandle<rd_kafka_conf_t, &rd_kafka_conf_destroy>;
using TopicPtr = CHandle<rd_kafka_topic_t, &rd_kafka_topic_destroy>;
using HeadersPtr = CHandle<rd_kafka_headers_t, &rd_kafka_headers_destroy>;
using ProducerPtr = CHandle<rd_kafka_t, &purge_and_destroy>;
using ErrorPtr = CHandle<rd_kafka_error_t, &rd_kafka_error_destroy>;
using ConsumerPtr = CHandle<rd_kafka_t, &rd_kafka_destroy>;
using PartitionsPtr = CHandle<rd_kafka_topic_partition_list_t, &rd_kafka_topic_partition_list_destroy>;
using MessagePtr = CHandle<rd_kafka_message_t, &rd_kafka_message_destroy>;
using NewTopicPtr = CHandle<rd_kafka_NewTopic_t, &rd_kafka_NewTopic_destroy>;
using QueuePtr = CHandle<rd_kafka_queue_t, &rd_kafka_queue_destroy>;
using EventPtr = CHandle<rd_kafka_event_t, &rd_kafka_event_destroy>;

constexpr int kProgressPartitions = 64;          // one per lane (marks of lane groups: their group's)
constexpr milliseconds kTakeoverInterval{1000};  // a failed takeover is tried again this often
constexpr std::int32_t kGroupPartition = 0;      // lane_groups 1: one group, its mark in partition 0
constexpr const char* kGroupKey = "g1.0";        // the group's mark key

struct EosCounters {
  std::atomic<std::uint64_t> committed{0}, aborted{0}, fenced{0}, marks_read{0}, already_committed{0};
};

// A producer whose transactional.id another instance initialised since: it must publish nothing.
bool is_fence(rd_kafka_resp_err_t err) {
  return err == RD_KAFKA_RESP_ERR__FENCED || err == RD_KAFKA_RESP_ERR_PRODUCER_FENCED ||
         err == RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH;
}

// Test-only switches (tests/integration/test_kafka_exactly_once.py), read once and warned at start.
bool test_no_readback() {
  static const bool set = std::getenv("OUTBOX_RELAY_TEST_EOS_NO_READBACK") != nullptr;
  return set;
}
std::string test_hold_point() {
  static const std::string point = [] {
    const char* v = std::getenv("OUTBOX_RELAY_TEST_EOS_HOLD");
    return std::string(v ? v : "");
  }();
  return point;
}

// A producer and the topic handles made from it. Members are destroyed in reverse order: the
// topic handles first, then the producer.
struct Producer {
  ProducerPtr rk;
  std::unordered_map<std::string, TopicPtr> topics;
};

// The per-message opaque: the batch generation in the high 32 bits, the index in the batch in
// the low 32 bits. A report that arrives after its batch was decided is recognised and ignored.
static_assert(sizeof(std::uintptr_t) >= sizeof(std::uint64_t), "the message tag needs 64 bits");
void* message_tag(std::uint32_t generation, std::size_t index) {
  // librdkafka carries the tag as a void* and never dereferences it; neither does on_delivery.
  // NOLINTNEXTLINE(performance-no-int-to-ptr)
  return reinterpret_cast<void*>((static_cast<std::uintptr_t>(generation) << 32) |
                                 static_cast<std::uintptr_t>(index & 0xffffffffu));
}

std::string error_text(rd_kafka_resp_err_t err) {
  return std::string(rd_kafka_err2name(err)) + ": " + rd_kafka_err2str(err);
}

int clamp_ms(SteadyClock::duration d) {
  const auto ms = std::chrono::duration_cast<milliseconds>(d).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, 3'600'000));
}

// librdkafka logs with syslog levels. Its errors are outside-world failures: warn (STYLE).
log::Level level_for(int syslog_level) {
  if (syslog_level <= 4) return log::Level::kWarn;
  if (syslog_level <= 6) return log::Level::kInfo;
  return log::Level::kDebug;
}

// The sink kafka_sink.hpp describes (file-local; make_kafka_sink() creates its producer and
// starts its poller). librdkafka's threads read name() (log callback) until the producer is
// gone: the name lives in the base, which outlives every member.
struct KafkaSinkImpl final : public KafkaSink {
  KafkaSinkImpl(std::string sink_name, KafkaSinkConfig sink_config)
      : KafkaSink(std::move(sink_name)),
        config(std::move(sink_config)),
        txn_id(effective_transactional_id(config, name())),
        progress_topic(effective_progress_topic(config, name())) {
    const auto auto_create = config.properties.find("allow.auto.create.topics");
    topic_auto_create = auto_create == config.properties.end() || auto_create->second == "true";
  }

  bool reserves_header(std::string_view header) const override { return is_reserved_kafka_header(header); }
  const char* messaging_system() const override { return "kafka"; }
  std::string destination(const Event& event) const override { return render_topic(config.topic, event.topic); }

  const KafkaSinkConfig config;
  const std::string txn_id;          // exactly_once: the first producer's transactional.id
  const std::string progress_topic;  // exactly_once: where the marks go
  bool topic_auto_create = true;
  // exactly_once: the transactional ids of the two producers that take turns (see spare).
  std::array<std::string, 2> txn_ids() const { return {txn_id, txn_id + ".1"}; }

  // Held by publish(), flush() and the idle poller. librdkafka runs our callbacks only inside
  // rd_kafka_poll()/rd_kafka_flush(), which are called only under this mutex, so the batch state
  // below needs no other lock. (The log callback runs on librdkafka's threads; it reads only name.)
  std::mutex mutex;
  std::unique_ptr<Producer> producer;  // null only after a failed re-creation
  // Exactly once: the second transactional producer (transactional.id txn_id + ".1"). The two take
  // turns, one transaction each: the broker writes a transaction's commit markers after EndTxn has
  // returned, and until it has, the coordinator answers the same id's next AddPartitionsToTxn with
  // CONCURRENT_TRANSACTIONS, which librdkafka retries after 20 ms (measured: 6 of 10 drain batches,
  // 1 of 10 steady transactions). Both exist or neither; a takeover initialises (fences) both.
  std::unique_ptr<Producer> spare;
  std::string producer_error;  // why producer is null (at least once)
  SteadyClock::time_point last_create_attempt{};
  std::string fatal_reason;

  // Readable from any thread (usable(), producer_replacements()).
  std::atomic<bool> producer_ok{false};
  std::atomic<bool> reachable{false};
  std::atomic<std::uint64_t> replacements{0};

  // A batch in flight: produced, its delivery reports outstanding.
  struct Batch {
    std::uint32_t generation = 0;
    std::vector<std::optional<Outcome>> results;
    std::size_t awaiting = 0;                                      // produced events without a delivery report yet
    rd_kafka_resp_err_t mark_report = RD_KAFKA_RESP_ERR_NO_ERROR;  // the progress mark's report, if it failed
    SteadyClock::time_point started, produced, deadline;
    // Set: nothing of this batch counts as delivered (a fatal error voided the producer's
    // guarantees), or it never reached a producer; every event retries with this reason.
    std::string voided;
    // Exactly once: the events' ids, which of them went into the transaction, and the outcomes
    // its end decided (set: the batch is out of its transaction, and its late reports are ignored).
    std::vector<EventId> ids;
    std::vector<std::int64_t> created;  // each event's created_at (microseconds)
    std::vector<bool> sent;
    std::optional<std::vector<Outcome>> settled;
  };
  // Oldest first. publish(): one at a time. Pipelined: up to the loop's window, two batches
  // (submit(), collect()) and a second submission of the newer one; exactly once: every batch not
  // yet settled is in the open transaction.
  std::deque<Batch> batches;
  std::uint32_t generation = 0;
  // Exactly once: a transaction is open on `producer` (submit_transaction()), and its first fatal
  // producer error, after which nothing more goes into it.
  bool txn_open = false;
  std::string txn_fatal;

  // Exactly once (config.exactly_once). needs_takeover: no producer may publish until the runner's
  // take_over() made one and read the mark back; set at start and by a fatal error or a fence.
  std::atomic<bool> needs_takeover{true};
  // This relay owns every lane of the group, as the last take_over() found; true until then, so
  // that a sink made by a reload asks the runner for a takeover at once.
  std::atomic<bool> owns_group{true};
  SteadyClock::time_point last_takeover_attempt{};
  bool takeover_failed = false;
  // Store::identity() as the runner last gave it (under mutex), written into every mark; a mark
  // read back that names another table stops this sink for good (foreign_mark): never
  // takes another table's ids as its own, nor fences that table's relays again.
  std::string store_id;
  std::string foreign_mark;
  // The ledger: ids committed to Kafka whose outcome the store may not have (every mark carries
  // them), and the highest id ever committed. Its own mutex: outcomes_written() trims it on the
  // loop thread while publish() runs on a helper thread.
  // id -> the row's created_at (microseconds; 0: not known, from a mark of a relay before it was
  // written). An id names a row only until the table's ids are reused (TRUNCATE ... RESTART
  // IDENTITY, the sequence set back): a claimed row is skipped as already in Kafka only if its
  // created_at is the one listed (0: by its id alone).
  std::mutex ledger_mutex;
  std::map<EventId, std::int64_t> ledger;
  EventId high_water = 0;
  EosCounters eos;

  // Between batches: serves statistics and errors, re-creates a failed producer (poll_idle).
  PeriodicThread poller;

  ~KafkaSinkImpl() override {
    poller.stop();
    producer.reset();  // before the batch state above, which its last callbacks may touch
    spare.reset();
  }

  // --- librdkafka callbacks (C linkage compatible, opaque = KafkaSinkImpl*) ---

  static void on_delivery(rd_kafka_t* /*rk*/, const rd_kafka_message_t* message, void* opaque) {
    static_cast<KafkaSinkImpl*>(opaque)->delivery_report(message);
  }
  static void on_error(rd_kafka_t* rk, int err, const char* reason, void* opaque) {
    static_cast<KafkaSinkImpl*>(opaque)->client_error(rk, static_cast<rd_kafka_resp_err_t>(err), reason);
  }
  static int on_stats(rd_kafka_t* /*rk*/, char* json, size_t length, void* opaque) {
    static_cast<KafkaSinkImpl*>(opaque)->statistics(json, length);
    return 0;  // librdkafka frees json
  }
  static void on_log(const rd_kafka_t* rk, int level, const char* facility, const char* message) {
    const auto* self = static_cast<const KafkaSinkImpl*>(rd_kafka_opaque(rk));
    log::write(level_for(level), std::string("librdkafka: ") + message,
               {{"sink", self ? self->name() : std::string()}, {"facility", facility}});
  }

  void delivery_report(const rd_kafka_message_t* message) {
    const auto tag = reinterpret_cast<std::uintptr_t>(message->_private);
    const auto tag_generation = static_cast<std::uint32_t>(tag >> 32);
    const auto index = static_cast<std::size_t>(tag & 0xffffffffu);
    const auto batch =
        std::find_if(batches.begin(), batches.end(), [&](const Batch& b) { return b.generation == tag_generation; });
    if (batch == batches.end() || batch->settled) return;  // its batch was decided already
    auto& results = batch->results;
    if (index == results.size()) {
      batch->mark_report = message->err;  // the progress mark (exactly once): index n of a batch of n
      return;
    }
    if (index >= results.size() || results[index]) return;
    --batch->awaiting;
    if (message->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      results[index] = Outcome::delivered();
      reachable = true;
      return;
    }
    results[index] = outcome_for(message->err, message->rkt ? rd_kafka_topic_name(message->rkt) : "?");
  }

  void client_error(rd_kafka_t* rk, rd_kafka_resp_err_t err, const char* reason) {
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
      check_fatal(rk);
      return;
    }
    if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN) {
      reachable = false;
      log::warn("kafka: all brokers are down", {{"sink", name()}, {"error", reason}});
    }
    // Other client errors (connection refused, timeouts) also reach the log callback; they need
    // no second line here.
  }

  void statistics(const char* json, std::size_t length) {
    const auto doc = nlohmann::json::parse(json, json + length, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded()) return;
    bool up = false;
    if (const auto brokers = doc.find("brokers"); brokers != doc.end() && brokers->is_object()) {
      for (const auto& broker : *brokers) {
        if (broker.value("source", "") != "internal" && broker.value("state", "") == "UP") up = true;
      }
    }
    reachable = up;
  }

  // --- producer lifecycle (under mutex) ---

  // exactly_once: slot 0 or 1 picks the transactional id (txn_ids()).
  std::unique_ptr<Producer> create_producer(std::string& error, int slot = 0) {
    ConfPtr conf(rd_kafka_conf_new());
    char text[512] = {};
    bool ok = true;
    auto set = [&](const std::string& key, const std::string& value, const std::string& where) {
      if (!ok) return;
      if (rd_kafka_conf_set(conf.get(), key.c_str(), value.c_str(), text, sizeof text) != RD_KAFKA_CONF_OK) {
        error = where + ": " + text;
        ok = false;
      }
    };
    auto user_sets = [&](const char* key) { return config.properties.count(key) > 0; };
    const std::string here = config.key_path.empty() ? name() : config.key_path;

    set("bootstrap.servers", config.brokers, here + ".brokers");
    set("enable.idempotence", "true", here);
    if (config.exactly_once) {
      // librdkafka caps message.timeout.ms at transaction.timeout.ms itself; a message it times
      // out only aborts its transaction, which leaves no gap a reader could see.
      set("transactional.id", txn_ids()[static_cast<std::size_t>(slot)], here + ".transactional_id");
      set("transaction.timeout.ms", std::to_string(effective_transaction_timeout(config).count()),
          here + ".transaction_timeout");
      // librdkafka registers a transaction's partitions with the coordinator after linger.ms (to
      // batch them): on a steady stream every transaction waits it out. publish() flushes anyway.
      if (!user_sets("linger.ms") && !user_sets("queue.buffering.max.ms")) set("linger.ms", "1", here);
      // librdkafka doubles its reconnect backoff per failed attempt, up to 10 s, for the bootstrap
      // and the coordinator connection each: a restarted broker is found up to 10 s late, while
      // every lane waits on this producer's commit, abort or init (measured: events flowed again
      // 3.5-10.7 s after the broker served again, "Delaying next reconnect by 9999ms"). Not with
      // the user's reconnect.backoff.ms, which librdkafka requires to be at most the max.
      if (!user_sets("reconnect.backoff.max.ms") && !user_sets("reconnect.backoff.ms"))
        set("reconnect.backoff.max.ms", "1000", here);
    } else {
      // Infinite in librdkafka: a message it times out leaves a gap in its partition's sequence
      // (1, 4, 5), which could let a later event of a key land while an earlier one is retried.
      // The batch deadline is ours (delivery_timeout); when it passes the producer is replaced.
      set("message.timeout.ms", "0", here);
      // Pipelined, a batch queued behind another is not flushed (collect() polls): it waits out
      // linger.ms before it is sent (librdkafka's default 5 ms, measured: 7.5 ms per batch in the
      // sink against 3.0 with a flush). A whole batch is produced within it anyway.
      if (!user_sets("linger.ms") && !user_sets("queue.buffering.max.ms")) set("linger.ms", "1", here);
    }
    if (!user_sets("acks") && !user_sets("request.required.acks")) set("acks", "all", here);
    if (!user_sets("partitioner")) set("partitioner", "murmur2_random", here);
    if (!user_sets("statistics.interval.ms")) set("statistics.interval.ms", "1000", here);
    if (!user_sets("topic.metadata.propagation.max.ms")) {
      const auto half = std::min<long long>(30'000, config.delivery_timeout.count() / 2);
      set("topic.metadata.propagation.max.ms", std::to_string(half), here);
    }
    if (!user_sets("client.id")) set("client.id", "outbox-relay", here);
    for (const auto& [key, value] : config.properties) set(key, value, here + ".properties." + key);
    if (!ok) return nullptr;

    rd_kafka_conf_set_opaque(conf.get(), this);
    rd_kafka_conf_set_dr_msg_cb(conf.get(), &KafkaSinkImpl::on_delivery);
    rd_kafka_conf_set_error_cb(conf.get(), &KafkaSinkImpl::on_error);
    rd_kafka_conf_set_stats_cb(conf.get(), &KafkaSinkImpl::on_stats);
    rd_kafka_conf_set_log_cb(conf.get(), &KafkaSinkImpl::on_log);

    rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf.get(), text, sizeof text);
    if (!rk) {
      error = here + ": cannot create the Kafka producer: " + text;
      return nullptr;  // the conf is still ours: ConfPtr frees it
    }
    static_cast<void>(conf.release());  // rd_kafka_new succeeded: librdkafka owns the conf now
    auto created = std::make_unique<Producer>();
    created->rk.reset(rk);
    return created;
  }

  // Records a fatal error of rk, if it has one. Thread: under mutex.
  bool check_fatal(rd_kafka_t* rk) {
    char text[512] = {};
    const rd_kafka_resp_err_t err = rd_kafka_fatal_error(rk, text, sizeof text);
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR) return false;
    if (fatal_reason.empty()) {
      fatal_reason = std::string(rd_kafka_err2name(err)) + ": " + text;
      log::error("kafka producer hit a fatal error; it will be replaced and its batch retried",
                 {{"sink", name()}, {"error", fatal_reason}});
    }
    producer_ok = false;
    return true;
  }

  // The batches in flight when their producer goes (at least once): a fatal error voids them
  // whole (its guarantees are gone: nothing counts as delivered); otherwise the reports that came
  // stand and the undecided events retry (the purge keeps their stale copies from going out
  // behind the retry; a request already in flight may still land: a duplicate at worst).
  void settle_for_replacement(const std::string& why) {
    for (Batch& b : batches) {
      if (!b.voided.empty()) continue;
      if (!fatal_reason.empty()) {
        b.voided = "fatal Kafka producer error, batch retried: " + fatal_reason;
        continue;
      }
      for (auto& result : b.results) {
        if (!result) result = Outcome::retry("the Kafka producer was replaced: " + why);
      }
      b.awaiting = 0;
    }
  }

  void replace_producer(const std::string& why) {
    settle_for_replacement(why);
    producer.reset();  // purges and destroys: nothing of it is sent or reported after this
    producer_ok = false;
    reachable = false;
    fatal_reason.clear();
    ++replacements;
    last_create_attempt = SteadyClock::now();
    producer = create_producer(producer_error);
    if (producer) {
      producer_ok = true;
      log::warn("kafka producer replaced", {{"sink", name()}, {"reason", why}});
    } else {
      log::error("kafka producer could not be re-created; events retry until it can",
                 {{"sink", name()}, {"error", producer_error}});
    }
  }

  // A healthy producer, replacing a failed one. False (with producer_error) when there is none.
  bool ensure_producer() {
    if (config.exactly_once) {
      // Only a takeover (Sink::take_over, from the runner) makes a transactional producer: one made
      // here could fence the relay that holds the lanes now (a resumed zombie).
      for (const auto* p : {&producer, &spare}) {
        if (*p && check_fatal((*p)->rk.get())) {
          drop_transactional("fatal error: " + fatal_reason);
          break;
        }
      }
      return producer != nullptr && spare != nullptr && !needs_takeover.load();
    }
    if (producer && check_fatal(producer->rk.get())) replace_producer("fatal error: " + fatal_reason);
    if (!producer && SteadyClock::now() - last_create_attempt >= kRecreateInterval) {
      last_create_attempt = SteadyClock::now();
      producer = create_producer(producer_error);
      if (producer) {
        producer_ok = true;
        log::info("kafka producer re-created", {{"sink", name()}});
      }
    }
    return producer != nullptr;
  }

  // The poller's tick.
  void poll_idle() {
    std::lock_guard lock(mutex);
    if (!ensure_producer()) return;
    rd_kafka_poll(producer->rk.get(), 0);
    if (spare) rd_kafka_poll(spare->rk.get(), 0);
  }

  // --- publishing (under mutex) ---

  Outcome outcome_for(rd_kafka_resp_err_t err, const std::string& topic) const {
    std::string reason = error_text(err) + " (topic " + topic + ")";
    switch (classify_kafka_error(err, topic_auto_create)) {
      case KafkaErrorClass::kPermanent: return Outcome::permanent(std::move(reason));
      case KafkaErrorClass::kRetry:
      case KafkaErrorClass::kFatal: return Outcome::retry(std::move(reason));
    }
    return Outcome::retry(std::move(reason));
  }

  rd_kafka_topic_t* topic_handle(const std::string& topic) {
    auto& topics = producer->topics;
    if (auto it = topics.find(topic); it != topics.end()) return it->second.get();
    if (topics.size() >= kMaxTopicHandles) topics.clear();  // librdkafka keeps its own references
    TopicPtr handle(rd_kafka_topic_new(producer->rk.get(), topic.c_str(), nullptr));
    if (!handle) return nullptr;
    return topics.emplace(topic, std::move(handle)).first->second.get();
  }

  // format: json: outbox-id, outbox-topic, outbox-created-at and the row's headers. format:
  // cloudevents (Kafka protocol binding, binary content mode): ce_<attribute> headers and
  // content-type; the key and the value (the payload) stay as they are.
  HeadersPtr message_headers(const Event& event) const {
    const auto add = [](rd_kafka_headers_t* headers, const std::string& header, const std::string& value) {
      rd_kafka_header_add(headers, header.data(), static_cast<ssize_t>(header.size()), value.data(),
                          static_cast<ssize_t>(value.size()));
    };
    if (config.envelope.format == EnvelopeFormat::kCloudEvents) {
      const auto attributes = cloudevents_attributes(event, config.envelope);
      HeadersPtr headers(rd_kafka_headers_new(attributes.size() + 1));
      for (const auto& [attribute, value] : attributes) add(headers.get(), "ce_" + attribute, value);
      add(headers.get(), "content-type", "application/json");
      return headers;
    }
    HeadersPtr headers(rd_kafka_headers_new(3 + event.headers.size()));
    add(headers.get(), "outbox-id", std::to_string(event.id));
    add(headers.get(), "outbox-topic", event.topic);
    add(headers.get(), "outbox-created-at", event.created_at);
    for (const auto& [header, value] : event.headers) add(headers.get(), header, value);
    return headers;
  }

  // Enqueues one event. On a full queue it serves delivery reports and tries again until the
  // deadline: events are never dropped. Returns librdkafka's error for this event.
  rd_kafka_resp_err_t produce(const Batch& batch, std::size_t index, const Event& event, const std::string& topic) {
    const auto deadline = batch.deadline;
    rd_kafka_t* rk = producer->rk.get();
    rd_kafka_topic_t* rkt = topic_handle(topic);
    if (!rkt) return rd_kafka_last_error();

    HeadersPtr headers = message_headers(event);

    for (;;) {
      // RD_KAFKA_MSG_F_COPY: librdkafka copies key and value, so the const_cast never leads to a
      // write (the C API takes void* for the value).
      const rd_kafka_resp_err_t err = rd_kafka_producev(
          rk, RD_KAFKA_V_RKT(rkt), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
          RD_KAFKA_V_KEY(event.key.data(), event.key.size()),
          RD_KAFKA_V_VALUE(const_cast<char*>(event.payload.data()), event.payload.size()),
          RD_KAFKA_V_HEADERS(headers.get()), RD_KAFKA_V_OPAQUE(message_tag(batch.generation, index)), RD_KAFKA_V_END);
      if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        static_cast<void>(headers.release());  // producev succeeded: librdkafka owns the headers now
        return err;
      }
      if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL || SteadyClock::now() >= deadline) return err;
      rd_kafka_poll(rk, clamp_ms(std::min<SteadyClock::duration>(kQueueFullPoll, deadline - SteadyClock::now())));
      if (check_fatal(rk)) return RD_KAFKA_RESP_ERR__FATAL;
    }
  }

  // Produces every event of the batch without an outcome yet, holding a key after an event of it
  // could not be enqueued (rule 2 in submit()). Marks produced[i] when given. Returns true on
  // a fatal producer error. Thread: under mutex, batch open.
  bool produce_events(Batch& batch, std::span<const Event* const> events, std::vector<bool>* produced) {
    auto& results = batch.results;
    rd_kafka_t* rk = producer->rk.get();
    const std::size_t n = events.size();
    bool fatal = false;
    KeyHolds held;
    // At least once: the Kafka topic of each key's first produced event (rule 4 in submit()).
    std::unordered_map<std::string_view, std::string> topic_of_key;
    for (std::size_t i = 0; i < n && !fatal; ++i) {
      const Event& event = *events[i];
      if (results[i]) continue;  // decided before producing (exactly once: already in Kafka)
      if (held.holds(event.key)) {
        results[i] = Outcome::deferred();
        continue;
      }
      std::string topic = render_topic(config.topic, event.topic);
      if (!valid_kafka_topic_name(topic)) {
        results[i] = Outcome::permanent("invalid Kafka topic name '" + topic + "' from topic template '" +
                                        config.topic + "' (1 to 249 of letters, digits, '.', '_', '-')");
        continue;
      }
      if (!config.exactly_once) {
        const auto [first, inserted] = topic_of_key.try_emplace(event.key, topic);
        if (!inserted && first->second != topic) {
          results[i] = Outcome::deferred("an earlier event of its key goes to topic " + first->second +
                                         " in this batch; sent once that one is acknowledged");
          held.hold(event.key, event.id);
          continue;
        }
      }
      const rd_kafka_resp_err_t err = produce(batch, i, event, topic);
      if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        ++batch.awaiting;
        if (produced) (*produced)[i] = true;
      } else if (err == RD_KAFKA_RESP_ERR__FATAL || check_fatal(rk)) {
        fatal = true;
      } else {
        results[i] = err == RD_KAFKA_RESP_ERR__QUEUE_FULL
                         ? Outcome::retry(error_text(err) + ": the producer queue stayed full for delivery_timeout")
                         : outcome_for(err, topic);
        if (results[i]->kind == OutcomeKind::kRetry) held.hold(event.key, event.id);
      }
    }

    return fatal;
  }

  // A new batch of n events in flight (the newest): the reports of batches closed before it are
  // ignored from now on.
  Batch& open_batch(std::size_t n) {
    Batch& batch = batches.emplace_back();
    batch.generation = ++generation;
    batch.results.assign(n, std::nullopt);
    batch.started = SteadyClock::now();
    batch.produced = batch.started;
    batch.deadline = batch.started + config.delivery_timeout;
    return batch;
  }
  // The oldest batch, decided: its late reports are ignored from now on.
  Batch close_batch() {
    Batch batch = std::move(batches.front());
    batches.pop_front();
    return batch;
  }

  // At least once: submit() produces a batch and returns; collect() waits for the oldest batch's
  // reports. Exactly once: submit() produces a batch into the open transaction; collect() ends it
  // (submit_transaction()). publish() is the two at once.
  bool pipelined() const override { return true; }

  std::vector<Outcome> publish(std::span<const Event* const> events) override {
    submit(events);
    return collect();
  }

  void submit(std::span<const Event* const> events) override {
    std::unique_lock lock(mutex);
    if (config.exactly_once) return submit_transaction(events);
    // Before the batch opens: a producer replaced here settles the batches already in flight, not
    // this one, which goes to the new producer.
    const bool have_producer = ensure_producer();
    Batch& batch = open_batch(events.size());
    if (!have_producer) {
      batch.voided = "no Kafka producer: " + producer_error;
      return;
    }
    // Per-key order within the batch. The whole batch is produced at once (one round trip, not
    // one per key), so events of one key travel together, and three rules keep them in order:
    //  1. The idempotent producer writes a partition's messages in produce order, retrying
    //     internally without reordering; a key always maps to one partition. With librdkafka's
    //     message timeout infinite, a retriable failure never surfaces as a report for one
    //     message while a later one of its partition succeeds: the only reports are success, a
    //     permanent error (which dead-letters the event and so releases its key,
    //     docs/design.md §4), a fatal error (the whole batch retries) or our own deadline (the
    //     undecided events retry and the producer is replaced, which purges them so no stale copy
    //     is sent behind the retry).
    //  2. An event that cannot even be enqueued with a retriable error (the queue stayed full)
    //     holds its key: the later events of that key in this batch are not produced (kDeferred).
    //  3. Defence in depth, for whatever breaks rule 1 (e.g. a partition count change while a
    //     batch is in flight): the loop applies hold_back_after_failures() (core/key_holds.hpp)
    //     to every sink's answer, which turns a kDelivered that follows a kRetry/kDeferred of
    //     the same key into kRetry. Its row is then re-sent after the earlier one succeeds: a
    //     duplicate in Kafka, never an outbox row marked done ahead of an earlier event of its
    //     key.
    //  4. Rule 1 orders one partition. A key's events bound for two topics (the topic template's
    //     {topic}) land in two partitions, which Kafka does not order against each other: an event
    //     for the second topic could be appended while an earlier one for the first is still being
    //     retried, or fail. So the events of a key in a batch go to one topic only, the topic of its
    //     first event; from its first event for another topic on, the key's events are deferred
    //     (released unsent, claimed again once the earlier ones are acknowledged): one topic change
    //     per key and batch. (Exactly once needs no such rule: a transaction is visible whole or not
    //     at all.)
    // Not producing later events of a key until the earlier one is acknowledged would serialise
    // every key to one round trip per event; rules 1-3 give the same outbox-side guarantee.
    // Across batches (pipelined): the loop never submits an event while an earlier event of its key
    // is in a batch not collected yet (docs/design.md, "Pipelined sinks"), so rules 1-3 are about
    // one batch; a batch's failure never holds the next batch's keys here. A fatal error voids
    // every batch in flight when the producer is replaced (settle_for_replacement()).
    produce_events(batch, events, nullptr);
    batch.produced = SteadyClock::now();
  }

  // Serves delivery reports until the oldest batch has them all, its deadline passes or the
  // producer fails. rd_kafka_flush() sends at once (ignoring linger.ms) and serves reports until
  // nothing is outstanding: used when the oldest batch is the only one, as publish() has it; with a
  // newer batch behind it, polls instead (a flush would wait for the newer one too).
  void await_reports(Batch& batch) {
    rd_kafka_t* rk = producer->rk.get();
    if (batches.size() == 1) {
      rd_kafka_flush(rk, clamp_ms(batch.deadline - SteadyClock::now()));
      rd_kafka_poll(rk, 0);  // reports queued between flush's last poll and its return
      return;
    }
    while (batch.awaiting > 0 && SteadyClock::now() < batch.deadline && !check_fatal(rk)) {
      rd_kafka_poll(rk, clamp_ms(batch.deadline - SteadyClock::now()));
    }
  }

  std::vector<Outcome> collect() override {
    std::unique_lock lock(mutex);
    if (config.exactly_once) return collect_transaction();
    if (batches.empty()) return {};
    Batch& oldest = batches.front();
    const std::size_t n = oldest.results.size();
    if (oldest.voided.empty() && oldest.awaiting > 0 && producer) await_reports(oldest);
    if (producer && check_fatal(producer->rk.get())) {
      replace_producer("fatal error: " + fatal_reason);
    } else if (oldest.voided.empty() && oldest.awaiting > 0) {
      reachable = false;
      const std::string late =
          "no delivery report within delivery_timeout " + config::format_duration(config.delivery_timeout);
      const std::string why = std::to_string(oldest.awaiting) + " of " + std::to_string(n) + " events had " + late;
      for (auto& result : oldest.results) {
        if (!result) result = Outcome::retry(late);
      }
      oldest.awaiting = 0;
      replace_producer(why);  // the undecided events of a newer batch retry too
    }
    Batch batch = close_batch();
    std::vector<Outcome> outcomes;
    outcomes.reserve(n);
    if (!batch.voided.empty()) {
      outcomes.assign(n, Outcome::retry(batch.voided));
    } else {
      for (auto& result : batch.results)
        outcomes.push_back(result ? std::move(*result) : Outcome::retry("not produced"));
    }
    log_batch("kafka", name(), outcomes);
    log::debug("kafka batch published",
               {{"sink", name()},
                {"events", n},
                {"produce_ms", std::chrono::duration<double, std::milli>(batch.produced - batch.started).count()},
                {"acks_ms", std::chrono::duration<double, std::milli>(SteadyClock::now() - batch.produced).count()}});
    return outcomes;
  }

  // --- exactly once (config.exactly_once) ---

  // One lane group (all 64 lanes, one transactional id): one relay of those sharing the table
  // publishes, the others stand by.
  int lane_groups() const override { return config.exactly_once ? 1 : 0; }
  bool wants_takeover() const override { return config.exactly_once && needs_takeover.load() && owns_group.load(); }

  std::optional<TransactionCounts> transaction_counts() const override {
    if (!config.exactly_once) return std::nullopt;
    return TransactionCounts{eos.committed.load(), eos.aborted.load(), eos.fenced.load(), eos.marks_read.load(),
                             eos.already_committed.load()};
  }

  // The producer is done for: nothing more of it is sent, and only a takeover makes the next one.
  void drop_transactional(const std::string& why, rd_kafka_resp_err_t code = RD_KAFKA_RESP_ERR_NO_ERROR) {
    bool fenced = is_fence(code);
    for (const auto* p : {&producer, &spare}) {
      char text[512] = {};
      if (*p && is_fence(rd_kafka_fatal_error((*p)->rk.get(), text, sizeof text))) fenced = true;
    }
    if (fenced) note_fenced(why);
    producer.reset();
    spare.reset();
    producer_ok = false;
    needs_takeover = true;
    fatal_reason.clear();
    ++replacements;
    log::warn("kafka transactional producer dropped; the lanes are taken over again before anything is published",
              {{"sink", name()}, {"reason", why}});
  }

  void note_fenced(const std::string& why) {
    ++eos.fenced;
    log::error("kafka producer fenced: another relay initialised transactional id " + txn_id + " or " + txn_ids()[1] +
                   " (it took these lanes over); this relay publishes nothing more with it",
               {{"sink", name()}, {"reason", why}});
  }

  // A transactional call's error: the text, freed.
  static std::string describe(const rd_kafka_error_t* error) {
    return std::string(rd_kafka_error_name(error)) + ": " + rd_kafka_error_string(error);
  }

  // Creates the progress topic if it does not exist (64 partitions, compacted). False with error.
  bool ensure_progress_topic(rd_kafka_t* rk, std::string& error) {
    char text[512] = {};
    NewTopicPtr topic(rd_kafka_NewTopic_new(progress_topic.c_str(), kProgressPartitions, -1, text, sizeof text));
    if (!topic) {
      error = text;
      return false;
    }
    rd_kafka_NewTopic_set_config(topic.get(), "cleanup.policy", "compact");
    QueuePtr queue(rd_kafka_queue_new(rk));
    rd_kafka_NewTopic_t* topics[] = {topic.get()};
    rd_kafka_CreateTopics(rk, topics, 1, nullptr, queue.get());
    EventPtr event(rd_kafka_queue_poll(queue.get(), clamp_ms(config.delivery_timeout * 2)));
    if (!event) {
      error = "no answer to CreateTopics for " + progress_topic;
      return false;
    }
    if (rd_kafka_event_error(event.get()) != RD_KAFKA_RESP_ERR_NO_ERROR) {
      error = rd_kafka_event_error_string(event.get());
      return false;
    }
    const rd_kafka_CreateTopics_result_t* result = rd_kafka_event_CreateTopics_result(event.get());
    std::size_t count = 0;
    const rd_kafka_topic_result_t** results_of = rd_kafka_CreateTopics_result_topics(result, &count);
    for (std::size_t i = 0; i < count; ++i) {
      const rd_kafka_resp_err_t err = rd_kafka_topic_result_error(results_of[i]);
      if (err != RD_KAFKA_RESP_ERR_NO_ERROR && err != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) {
        error = "cannot create the progress topic " + progress_topic + ": " + error_text(err);
        return false;
      }
      if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
        log::info("kafka progress topic created", {{"sink", name()}, {"topic", progress_topic}});
    }
    return true;
  }

  struct Mark {
    EventId high_water = 0;
    std::vector<EventId> ids;
    std::vector<std::int64_t> created;  // parallel to ids (0: the mark did not say)
    std::string table;                  // Store::identity() of the relay that wrote it (empty: it did not say)
  };

  // Reads the group's last committed mark (read_committed): nullopt on failure (error set), an
  // empty Mark when the group never committed one. Only after this instance's init_transactions:
  // nothing older can commit afterwards, so what it reads is final.
  std::optional<Mark> read_mark(std::string& error) {
    ConfPtr conf(rd_kafka_conf_new());
    char text[512] = {};
    const auto set = [&](const char* key, const std::string& value) {
      return rd_kafka_conf_set(conf.get(), key, value.c_str(), text, sizeof text) == RD_KAFKA_CONF_OK;
    };
    // The user's properties first (security, client settings); producer-only ones are ignored.
    for (const auto& [key, value] : config.properties) static_cast<void>(set(key.c_str(), value));
    if (!set("bootstrap.servers", config.brokers) || !set("group.id", txn_id + ".readback") ||
        !set("isolation.level", "read_committed") || !set("enable.partition.eof", "true") ||
        !set("enable.auto.commit", "false") || !set("enable.auto.offset.store", "false")) {
      error = std::string("mark reader configuration: ") + text;
      return std::nullopt;
    }
    rd_kafka_conf_set_opaque(conf.get(), this);
    rd_kafka_conf_set_log_cb(conf.get(), &KafkaSinkImpl::on_log);
    rd_kafka_t* raw = rd_kafka_new(RD_KAFKA_CONSUMER, conf.get(), text, sizeof text);
    if (!raw) {
      error = std::string("cannot create the mark reader: ") + text;
      return std::nullopt;
    }
    static_cast<void>(conf.release());
    ConsumerPtr rk(raw);
    std::int64_t low = 0;
    std::int64_t high = 0;
    // With read_committed, high is the last stable offset. A progress topic created moments ago
    // may have no leader yet: asked again until the reader's deadline, not after a failed takeover's
    // kTakeoverInterval (a second lost at a first start, measured).
    const auto offsets_deadline = SteadyClock::now() + config.delivery_timeout * 2;
    rd_kafka_resp_err_t offsets_err = RD_KAFKA_RESP_ERR_NO_ERROR;
    for (;;) {
      offsets_err = rd_kafka_query_watermark_offsets(rk.get(), progress_topic.c_str(), kGroupPartition, &low, &high,
                                                     clamp_ms(offsets_deadline - SteadyClock::now()));
      const bool leader_pending = offsets_err == RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION ||
                                  offsets_err == RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE ||
                                  offsets_err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;
      if (!leader_pending || SteadyClock::now() + milliseconds(50) >= offsets_deadline) break;
      std::this_thread::sleep_for(milliseconds(50));
    }
    if (offsets_err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      error = "cannot read the offsets of " + progress_topic + ": " + error_text(offsets_err);
      return std::nullopt;
    }
    Mark mark;
    if (low >= high) return mark;
    // Each transaction adds the mark and a commit marker: the last mark is near the end.
    for (const std::int64_t back : {std::int64_t{8}, std::int64_t{64}, high - low}) {
      const std::int64_t start = std::max(low, high - back);
      PartitionsPtr list(rd_kafka_topic_partition_list_new(1));
      rd_kafka_topic_partition_list_add(list.get(), progress_topic.c_str(), kGroupPartition)->offset = start;
      if (const auto err = rd_kafka_assign(rk.get(), list.get()); err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        error = "cannot assign the mark partition: " + error_text(err);
        return std::nullopt;
      }
      std::optional<std::string> last;
      const auto deadline = SteadyClock::now() + config.delivery_timeout * 2;
      bool eof = false;
      while (!eof) {
        if (SteadyClock::now() >= deadline) {
          error = "timed out reading the mark from " + progress_topic;
          return std::nullopt;
        }
        MessagePtr message(rd_kafka_consumer_poll(rk.get(), 200));
        if (!message) continue;
        if (message->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
          eof = true;
        } else if (message->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
          error = "reading the mark: " + error_text(message->err);
          return std::nullopt;
        } else if (message->key_len == std::char_traits<char>::length(kGroupKey) &&
                   std::string_view(static_cast<const char*>(message->key), message->key_len) == kGroupKey) {
          last.emplace(static_cast<const char*>(message->payload), message->len);
        }
      }
      rd_kafka_assign(rk.get(), nullptr);
      if (!last) continue;
      const auto doc = nlohmann::json::parse(*last, nullptr, /*allow_exceptions=*/false);
      if (!doc.is_object() || doc.value("v", 0) != 1 || !doc.contains("ids") || !doc["ids"].is_array()) {
        error = "the last mark in " + progress_topic + " is not a mark of version 1: " + *last;
        return std::nullopt;
      }
      mark.high_water = doc.value("hw", EventId{0});
      mark.table = doc.value("table", std::string{});
      for (const auto& id : doc["ids"]) mark.ids.push_back(id.get<EventId>());
      mark.created.assign(mark.ids.size(), 0);
      // "created" (since 2026-12-07): each id's created_at; relays before it ignore it.
      if (const auto created = doc.find("created");
          created != doc.end() && created->is_array() && created->size() == mark.ids.size()) {
        for (std::size_t i = 0; i < mark.ids.size(); ++i) mark.created[i] = (*created)[i].get<std::int64_t>();
      }
      return mark;
    }
    return mark;
  }

  std::string progress_location() const override {
    return config.exactly_once ? "transactional id " + txn_id + ", progress topic " + progress_topic : std::string();
  }

  void store_identity(const std::string& identity) override {
    if (!config.exactly_once) return;
    std::lock_guard lock(mutex);
    store_id = identity;
  }

  std::vector<EventId> take_over(int lanes_owned, bool gained) override {
    if (!config.exactly_once) return {};
    std::lock_guard lock(mutex);
    if (!foreign_mark.empty()) return {};  // stopped: see below
    owns_group = lanes_owned == kLaneCount;
    if (!owns_group.load()) {
      // Another relay owns (or is about to own) the group: its producer fences this one anyway;
      // never init here, which would fence it.
      if (producer || spare) {
        producer.reset();
        spare.reset();
        producer_ok = false;
        log::info("kafka transactional producer closed: this relay no longer owns the lanes", {{"sink", name()}});
      }
      needs_takeover = true;
      return {};
    }
    if (gained) needs_takeover = true;  // whoever held them meanwhile may have committed
    if (!needs_takeover.load()) return {};
    const auto now = SteadyClock::now();
    if (takeover_failed && now - last_takeover_attempt < kTakeoverInterval) return {};
    last_takeover_attempt = now;
    takeover_failed = true;  // until it succeeds below
    producer.reset();
    spare.reset();
    producer_ok = false;
    std::string error;
    std::array<std::unique_ptr<Producer>, 2> made;
    const auto deadline = now + 2 * effective_transaction_timeout(config);
    for (int slot = 0; slot < 2; ++slot) {
      auto& p = made[static_cast<std::size_t>(slot)];
      p = create_producer(error, slot);
      if (!p) {
        log::error("kafka takeover: cannot create the transactional producer", {{"sink", name()}, {"error", error}});
        return {};
      }
      // Fences every earlier instance of this transactional id and completes (aborts, or rolls
      // forward if it was already committing) its open transaction. Retriable errors: call again.
      // Both ids are initialised before the mark is read: a zombie can commit on neither after it.
      for (;;) {
        ErrorPtr failed(rd_kafka_init_transactions(p->rk.get(), clamp_ms(effective_transaction_timeout(config))));
        if (!failed) break;
        if (!rd_kafka_error_is_retriable(failed.get()) || SteadyClock::now() >= deadline) {
          log::error("kafka takeover: init_transactions failed; retried",
                     {{"sink", name()},
                      {"transactional_id", txn_ids()[static_cast<std::size_t>(slot)]},
                      {"error", describe(failed.get())}});
          return {};
        }
      }
    }
    if (!ensure_progress_topic(made[0]->rk.get(), error)) {
      log::error("kafka takeover: no progress topic; retried", {{"sink", name()}, {"error", error}});
      return {};
    }
    // Each producer learns the progress topic's partitions now: a mark produced to a topic the
    // producer has no metadata for waits in librdkafka for its next metadata refresh (measured:
    // ~1 s in the first transaction of each producer). Best effort: a failure only costs that wait.
    for (const auto& p : made) {
      TopicPtr rkt(rd_kafka_topic_new(p->rk.get(), progress_topic.c_str(), nullptr));
      const rd_kafka_metadata_t* metadata = nullptr;
      if (rkt && rd_kafka_metadata(p->rk.get(), 0, rkt.get(), &metadata, clamp_ms(config.delivery_timeout)) ==
                     RD_KAFKA_RESP_ERR_NO_ERROR) {
        rd_kafka_metadata_destroy(metadata);
      }
    }
    Mark mark;
    if (test_no_readback()) {
      log::warn("kafka takeover: OUTBOX_RELAY_TEST_EOS_NO_READBACK is set: the mark is not read (test only)",
                {{"sink", name()}});
    } else {
      auto read = read_mark(error);
      if (!read) {
        log::error("kafka takeover: cannot read the mark back; retried", {{"sink", name()}, {"error", error}});
        return {};
      }
      mark = std::move(*read);
      ++eos.marks_read;
    }
    if (!mark.table.empty() && !store_id.empty() && mark.table != store_id) {
      // Another table's relays (another database, or a table of the same name elsewhere) commit
      // under this transactional id: its ids are not this table's. This relay publishes nothing
      // with it and does not try again (each try would fence them): a new transactional_id is
      // needed, or a restart once the identity is explained (docs/sinks.md, "Exactly once").
      foreign_mark = mark.table;
      log::error("kafka takeover refused: the progress mark under transactional id " + txn_id +
                     " was written for another table; set a transactional_id of its own on this sink (or, after "
                     "pg_upgrade or a restore from a dump, stop every relay of this sink with SIGTERM first); "
                     "this relay publishes nothing to this sink until restarted or reloaded",
                 {{"sink", name()}, {"mark_table", mark.table}, {"this_table", store_id}});
      return {};
    }
    {
      std::lock_guard ledger_lock(ledger_mutex);
      ledger.clear();
      for (std::size_t i = 0; i < mark.ids.size(); ++i) ledger.emplace(mark.ids[i], mark.created[i]);
      high_water = std::max(high_water, mark.high_water);
    }
    producer = std::move(made[0]);
    spare = std::move(made[1]);
    txn_open = false;  // nothing is in flight at a takeover (Sink::take_over)
    txn_fatal.clear();
    producer_ok = true;
    needs_takeover = false;
    takeover_failed = false;
    log::info("kafka takeover: producer initialised, mark read back",
              {{"sink", name()},
               {"transactional_ids", txn_id + ", " + txn_ids()[1]},
               {"high_water", mark.high_water},
               {"committed_not_marked", mark.ids.size()}});
    return mark.ids;
  }

  void keep_pending(std::span<const EventId> still_pending) override {
    std::lock_guard ledger_lock(ledger_mutex);
    std::map<EventId, std::int64_t> kept;
    for (const EventId id : still_pending) {
      if (const auto it = ledger.find(id); it != ledger.end()) kept.insert(*it);
    }
    ledger = std::move(kept);
  }

  void outcomes_written(std::span<const Completion> completions) override {
    if (!config.exactly_once) return;
    std::lock_guard ledger_lock(ledger_mutex);
    if (ledger.empty()) return;
    for (const Completion& c : completions) {
      // Only an outcome that ends this sink's part: a retry for another sink, or held back by the
      // loop, comes again and must be skipped then.
      const bool done = c.kind == Completion::Kind::kDelivered || c.kind == Completion::Kind::kDeadLetter ||
                        std::find(c.sinks_done.begin(), c.sinks_done.end(), name()) != c.sinks_done.end();
      if (done) ledger.erase(c.id);
    }
  }

  std::string mark_value(const std::vector<EventId>& ids, const std::vector<std::int64_t>& created, EventId hw) const {
    return nlohmann::json{{"v", 1},      {"hw", hw},      {"ids", ids},       {"created", created},
                          {"groups", 1}, {"txn", txn_id}, {"table", store_id}}
        .dump();
  }

  // The producer is dropped (a fatal error, a fence, a commit in doubt), or was dropped meanwhile
  // (the idle poller found it failed: `drop` false): every batch of the transaction goes back
  // without costing an attempt (the takeover's mark says which of them Kafka has; the loop claims
  // nothing until a takeover succeeded), so that no event is dead-lettered for a broker's or a
  // coordinator's trouble, nor one Kafka already has.
  void settle_dropped(std::span<Batch* const> in_transaction, const std::string& why,
                      rd_kafka_resp_err_t code = RD_KAFKA_RESP_ERR_NO_ERROR, bool drop = true) {
    if (drop) drop_transactional(why, code);
    for (Batch* b : in_transaction) {
      b->settled.emplace(b->results.size(),
                         Outcome::deferred("kafka transaction not completed, the lanes are taken over again: " + why));
    }
  }
  void settle_failed(std::span<Batch* const> in_transaction, const std::string& where, const rd_kafka_error_t* error) {
    settle_dropped(in_transaction, where + ": " + describe(error), rd_kafka_error_code(error));
  }

  // Holds the first transaction of at least 50 events (and of at least
  // OUTBOX_RELAY_TEST_EOS_HOLD_BATCHES batches, default 1) at `point`.
  void test_hold(const char* point, std::size_t n, std::size_t batches_in) {
    static std::atomic<bool> held{false};
    static const std::size_t min_batches = [] {
      const char* v = std::getenv("OUTBOX_RELAY_TEST_EOS_HOLD_BATCHES");
      return v ? static_cast<std::size_t>(std::max(1, std::atoi(v))) : std::size_t{1};
    }();
    if (test_hold_point() != point || n < 50 || batches_in < min_batches || held.exchange(true)) return;
    const char* seconds = std::getenv("OUTBOX_RELAY_TEST_EOS_HOLD_SECONDS");
    const int hold = seconds ? std::atoi(seconds) : 120;
    log::warn(std::string("eos test hold ") + point,
              {{"sink", name()}, {"events", n}, {"batches", batches_in}, {"seconds", hold}});
    std::this_thread::sleep_for(std::chrono::seconds(hold));
  }

  // When a transaction's phases ended (debug log).
  struct TransactionTimes {
    SteadyClock::time_point started, produced, flushed, committed;
  };
  void log_committed(const Batch& first, const Batch& last, std::size_t n, std::size_t batches_in,
                     const TransactionTimes& t) const {
    const auto ms = [](SteadyClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
    log::debug("kafka transaction committed", {{"sink", name()},
                                               {"events", n},
                                               {"batches", batches_in},
                                               {"first_id", first.ids.front()},
                                               {"last_id", last.ids.back()},
                                               {"produce_ms", ms(t.produced - t.started)},
                                               {"flush_ms", ms(t.flushed - t.produced)},
                                               {"commit_ms", ms(t.committed - t.flushed)}});
  }

  // A batch of a committed transaction: its produced events are in Kafka (and in the ledger from
  // now on). Thread: under mutex.
  void settle_committed(Batch& batch) {
    auto& results = batch.results;
    std::vector<Outcome> outcomes;
    outcomes.reserve(results.size());
    {
      std::lock_guard ledger_lock(ledger_mutex);
      for (std::size_t i = 0; i < results.size(); ++i) {
        if (batch.sent[i]) {
          ledger[batch.ids[i]] = batch.created[i];
          outcomes.push_back(Outcome::delivered());
        } else {
          outcomes.push_back(results[i] ? std::move(*results[i]) : Outcome::retry("not produced"));
        }
      }
    }
    log_batch("kafka", name(), outcomes);
    batch.settled = std::move(outcomes);
  }

  // A batch of an aborted transaction: nothing of it is visible. An event its delivery report
  // called permanent is dead-lettered; the others retry. Thread: under mutex.
  void settle_aborted(Batch& batch, const std::string& why) {
    auto& results = batch.results;
    std::vector<Outcome> outcomes;
    outcomes.reserve(results.size());
    for (std::size_t i = 0; i < results.size(); ++i) {
      const bool keep = results[i] && (!batch.sent[i] || results[i]->kind == OutcomeKind::kPermanent);
      outcomes.push_back(keep ? std::move(*results[i]) : Outcome::retry("kafka transaction aborted: " + why));
    }
    log_batch("kafka", name(), outcomes);
    batch.settled = std::move(outcomes);
  }

  // Exactly once: a batch goes into the open transaction, begun by the first submit() after the
  // last one ended. In a drain the loop submits batch k+1 before it collects k (its window of two
  // batches), so one transaction carries both: half the transactions, each of which costs the
  // broker 4-10 ms of CPU and the sink about four round trips (bench/RESULTS.md, "Kafka exactly
  // once, where the time went"). The first collect() of a batch in it ends the transaction for all
  // of them (end_transaction()). Keys: the loop never submits an event while an earlier event of
  // its key is uncollected, so no key has events in two submissions of one transaction; the next
  // transaction begins after this one's commit returned (docs/design.md, "Exactly once into
  // Kafka", 6).
  void submit_transaction(std::span<const Event* const> events) {
    const std::size_t n = events.size();
    // A producer found failed between transactions is dropped here; inside one, end_transaction()
    // finds it failed and settles the whole transaction.
    const bool have_producer = txn_open || ensure_producer();
    Batch& batch = open_batch(n);
    if (!have_producer) {
      needs_takeover = true;
      batch.settled.emplace(n, Outcome::deferred("kafka exactly once: waiting for the takeover of the lanes"));
      return;
    }
    batch.ids.reserve(n);
    batch.created.reserve(n);
    for (const Event* e : events) {
      batch.ids.push_back(e->id);
      batch.created.push_back(e->created_at_us);
    }
    batch.sent.assign(n, false);
    std::size_t skipped = 0;
    {
      std::lock_guard ledger_lock(ledger_mutex);
      for (std::size_t i = 0; i < n; ++i) {
        const auto listed = ledger.find(batch.ids[i]);
        if (listed != ledger.end() && (listed->second == 0 || listed->second == batch.created[i])) {
          batch.results[i] = Outcome::delivered();  // committed in an earlier transaction, not yet marked
          ++skipped;
        }
      }
    }
    eos.already_committed += skipped;
    if (skipped == n) {
      batch.settled.emplace(n, Outcome::delivered());
      return;
    }
    if (!txn_open) {
      if (ErrorPtr failed(rd_kafka_begin_transaction(producer->rk.get())); failed) {
        Batch* only[] = {&batch};
        settle_failed(only, "begin_transaction", failed.get());
        return;
      }
      txn_open = true;
    }
    // A producer dropped meanwhile, or a fatal error in this transaction: nothing more goes in; its
    // end settles every batch of it.
    if (!producer || !txn_fatal.empty()) return;
    if (produce_events(batch, events, &batch.sent)) txn_fatal = "fatal producer error: " + fatal_reason;
    batch.produced = SteadyClock::now();
  }

  // Commits the open transaction of rk, its records all acknowledged: null, or the error. Bounded
  // by `until` (delivery_timeout from the call: a relay paused between the flush and the commit
  // still gets its answer, a fence among them), not -1 (the remaining transaction time): only
  // EndTxn is left, and a coordinator that does not answer (its broker restarting) would hold every
  // lane until transaction_timeout. A retriable error leaves the commit going on: called again,
  // never aborted; past `until` its outcome is in doubt and the caller drops the producer (rdkafka.h
  // advises -1 because a timed-out call may leave the producer's state desynchronised: this one is
  // not used again). Thread: under mutex.
  static ErrorPtr commit_until(rd_kafka_t* rk, SteadyClock::time_point until) {
    for (;;) {
      ErrorPtr failed(rd_kafka_commit_transaction(rk, std::max(1, clamp_ms(until - SteadyClock::now()))));
      if (!failed || !rd_kafka_error_is_retriable(failed.get()) || SteadyClock::now() >= until) return failed;
    }
  }

  // The progress mark of a transaction of these batches: the ledger and every id they produced,
  // each with its created_at; hw: the highest id in it. Thread: under mutex.
  std::string transaction_mark(std::span<Batch* const> in_transaction, EventId& hw) {
    std::map<EventId, std::int64_t> listed;
    {
      std::lock_guard ledger_lock(ledger_mutex);
      listed = ledger;
      hw = high_water;
    }
    for (const Batch* b : in_transaction) {
      for (std::size_t i = 0; i < b->ids.size(); ++i) {
        if (!b->sent[i]) continue;
        listed[b->ids[i]] = b->created[i];
        hw = std::max(hw, b->ids[i]);
      }
    }
    std::vector<EventId> ids;
    std::vector<std::int64_t> created;
    ids.reserve(listed.size());
    created.reserve(listed.size());
    for (const auto& [id, at] : listed) {
      ids.push_back(id);
      created.push_back(at);
    }
    return mark_value(ids, created, hw);
  }

  // Ends the open transaction: the progress mark, a flush, the commit (or the abort); settles every
  // batch in it. Thread: under mutex.
  void end_transaction() {
    std::vector<Batch*> in_transaction;
    std::size_t n = 0;
    for (Batch& b : batches) {
      if (b.settled) continue;
      in_transaction.push_back(&b);
      n += b.results.size();
    }
    txn_open = false;
    const std::string fatal_why = std::exchange(txn_fatal, {});
    if (in_transaction.empty()) return;
    if (!producer) {
      settle_dropped(in_transaction, "the transactional producer was dropped (a fatal error or a fence)",
                     RD_KAFKA_RESP_ERR_NO_ERROR, /*drop=*/false);
      return;
    }
    rd_kafka_t* rk = producer->rk.get();
    Batch& first = *in_transaction.front();
    Batch& last = *in_transaction.back();
    const auto deadline = first.deadline;
    EventId hw = 0;
    bool fatal = !fatal_why.empty();
    std::string mark_error;
    if (!fatal) {
      const std::string value = transaction_mark(in_transaction, hw);
      rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
      do {
        // A full queue (the events just produced fill it): serve delivery reports and try again.
        if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL) rd_kafka_poll(rk, 10);
        err = rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(progress_topic.c_str()), RD_KAFKA_V_PARTITION(kGroupPartition),
                                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                RD_KAFKA_V_KEY(kGroupKey, std::char_traits<char>::length(kGroupKey)),
                                RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()),
                                // index n of the newest batch of n: not an event
                                RD_KAFKA_V_OPAQUE(message_tag(last.generation, last.results.size())), RD_KAFKA_V_END);
      } while (err == RD_KAFKA_RESP_ERR__QUEUE_FULL && SteadyClock::now() < deadline);
      fatal = err != RD_KAFKA_RESP_ERR_NO_ERROR;
      if (fatal) {
        check_fatal(rk);
        mark_error = "producing the progress mark: " + error_text(err);
      }
    }
    // Sends at once (ignoring linger.ms) and serves the delivery reports; the commit then only
    // ends the transaction.
    const auto produced_at = SteadyClock::now();
    const bool flushed =
        !fatal && rd_kafka_flush(rk, clamp_ms(deadline - SteadyClock::now())) == RD_KAFKA_RESP_ERR_NO_ERROR;
    const auto flushed_at = SteadyClock::now();
    if (!fatal && !flushed) {
      // Not all acknowledged by the first batch's deadline: the broker is down or unreachable (a
      // restart). The commit would wait for them until librdkafka times them out (the message
      // timeout is transaction_timeout), and then the abort for the coordinator; the lanes would
      // stand still meanwhile (measured: 10 s, then the abort until the broker was back). No EndTxn
      // was sent, so the transaction cannot commit: the producer is dropped, and the takeover's
      // init_transactions aborts the transaction once the broker answers and reads the mark. As
      // for an aborted transaction, its events retry at a cost of an attempt: a broker too slow
      // for delivery_timeout (events too large for it) must end in dead letters, as with the
      // at-least-once sink, not in takeovers without end.
      const std::string why = "not every record of the transaction was acknowledged within delivery_timeout";
      drop_transactional(why + "; the takeover aborts it");
      ++eos.aborted;
      for (Batch* b : in_transaction) settle_aborted(*b, why);
      return;
    }
    test_hold("before_commit", n, in_transaction.size());
    ErrorPtr failed;
    if (!fatal) failed = commit_until(rk, SteadyClock::now() + config.delivery_timeout);
    if (!fatal && !failed) {
      test_hold("after_commit", n, in_transaction.size());
      ++eos.committed;
      std::swap(producer, spare);  // the next transaction on the other id: no wait for this one's markers
      log_committed(first, last, n, in_transaction.size(),
                    {first.started, produced_at, flushed_at, SteadyClock::now()});
      for (Batch* b : in_transaction) settle_committed(*b);
      {
        std::lock_guard ledger_lock(ledger_mutex);
        high_water = std::max(high_water, hw);
      }
      reachable = true;
      return;
    }
    if (fatal || !rd_kafka_error_txn_requires_abort(failed.get())) {
      // Fatal, or a commit whose outcome is in doubt: the takeover's mark says which.
      if (failed) return settle_failed(in_transaction, "commit_transaction", failed.get());
      return settle_dropped(in_transaction, mark_error.empty() ? fatal_why : mark_error);
    }
    const std::string why = describe(failed.get());
    // Bounded as the commit: an abort that times out drops the producer, and the takeover's init
    // aborts the transaction.
    if (ErrorPtr abort_failed(rd_kafka_abort_transaction(rk, clamp_ms(config.delivery_timeout))); abort_failed) {
      return settle_failed(in_transaction, "abort_transaction", abort_failed.get());
    }
    ++eos.aborted;
    if (last.mark_report != RD_KAFKA_RESP_ERR_NO_ERROR) {
      // Not the events' fault (the progress topic deleted, not writable): the sink's, until a
      // takeover finds the topic again.
      return settle_dropped(in_transaction, "the progress mark was not delivered: " + error_text(last.mark_report));
    }
    std::swap(producer, spare);
    log::warn("kafka transaction aborted; its events retry", {{"sink", name()}, {"error", why}, {"events", n}});
    for (Batch* b : in_transaction) settle_aborted(*b, why);
  }

  // Exactly once: the oldest batch's outcomes, ending its transaction first if it is still open.
  std::vector<Outcome> collect_transaction() {
    if (batches.empty()) return {};
    if (!batches.front().settled) end_transaction();
    Batch batch = close_batch();
    return std::move(*batch.settled);
  }

  bool usable() const override {
    // Exactly once, standing by (another relay owns the lane group): no producer, nothing to
    // publish; the relay is ready to take over.
    if (config.exactly_once && !owns_group.load()) return true;
    return producer_ok.load() && reachable.load();
  }
  std::uint64_t producer_replacements() const override { return replacements.load(); }

  void flush(milliseconds timeout) override {
    std::lock_guard lock(mutex);
    if (!producer) return;
    if (rd_kafka_flush(producer->rk.get(), clamp_ms(timeout)) != RD_KAFKA_RESP_ERR_NO_ERROR) {
      log::warn(
          "kafka flush timed out; messages still queued are dropped (their events were already "
          "reported for retry)",
          {{"sink", name()}, {"queued", rd_kafka_outq_len(producer->rk.get())}});
    }
  }
};

}  // namespace

std::unique_ptr<KafkaSink> make_kafka_sink(std::string name, KafkaSinkConfig config) {
  auto sink = std::make_unique<KafkaSinkImpl>(std::move(name), std::move(config));
  KafkaSinkImpl& s = *sink;
  std::string error;
  if (s.config.exactly_once) {
    // Checks the configuration now (exit 2 naming the key); the producer that publishes is made by
    // the runner's takeover, once this relay holds the lanes.
    if (!s.create_producer(error)) throw config::ConfigError(error);
    if (test_no_readback()) log::warn("OUTBOX_RELAY_TEST_EOS_NO_READBACK is set: takeovers skip the mark (test only)");
    if (!test_hold_point().empty())
      log::warn("OUTBOX_RELAY_TEST_EOS_HOLD is set (test only)", {{"point", test_hold_point()}});
  } else {
    s.producer = s.create_producer(error);
    if (!s.producer) throw config::ConfigError(error);
    s.producer_ok = true;
  }
  s.last_create_attempt = SteadyClock::now();
  s.poller.start(kIdlePollInterval, [&s] { s.poll_idle(); });  // ~KafkaSinkImpl stops it first
  log::info("kafka producer created", {{"sink", s.name()},
                                       {"brokers", s.config.brokers},
                                       {"topic", s.config.topic},
                                       {"librdkafka", rd_kafka_version_str()}});
  return sink;
}

}  // namespace outbox::sinks
