#include "sinks/kafka/kafka_sink.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
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
      : KafkaSink(std::move(sink_name)), config(std::move(sink_config)) {
    const auto auto_create = config.properties.find("allow.auto.create.topics");
    topic_auto_create = auto_create == config.properties.end() || auto_create->second == "true";
  }

  bool reserves_header(std::string_view header) const override { return is_reserved_kafka_header(header); }
  const char* messaging_system() const override { return "kafka"; }
  std::string destination(const Event& event) const override { return render_topic(config.topic, event.topic); }

  const KafkaSinkConfig config;
  bool topic_auto_create = true;

  // Held by publish(), flush() and the idle poller. librdkafka runs our callbacks only inside
  // rd_kafka_poll()/rd_kafka_flush(), which are called only under this mutex, so the batch state
  // below needs no other lock. (The log callback runs on librdkafka's threads; it reads only name.)
  std::mutex mutex;
  std::unique_ptr<Producer> producer;  // null only after a failed re-creation
  std::string producer_error;          // why producer is null
  SteadyClock::time_point last_create_attempt{};
  std::string fatal_reason;

  // Readable from any thread (usable(), producer_replacements()).
  std::atomic<bool> producer_ok{false};
  std::atomic<bool> reachable{false};
  std::atomic<std::uint64_t> replacements{0};

  // The batch in flight.
  std::uint32_t generation = 0;
  bool batch_open = false;
  std::vector<std::optional<Outcome>> results;
  std::size_t awaiting = 0;  // produced events of this batch without a delivery report yet

  // Between batches: serves statistics and errors, re-creates a failed producer (poll_idle).
  PeriodicThread poller;

  ~KafkaSinkImpl() override {
    poller.stop();
    producer.reset();  // before the batch state above, which its last callbacks may touch
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
    if (!batch_open || tag_generation != generation || index >= results.size() || results[index]) return;
    --awaiting;
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

  std::unique_ptr<Producer> create_producer(std::string& error) {
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
    // Infinite in librdkafka: a message it times out leaves a gap in its partition's sequence
    // (1, 4, 5), which could let a later event of a key land while an earlier one is retried.
    // The batch deadline is ours (delivery_timeout); when it passes the producer is replaced.
    set("message.timeout.ms", "0", here);
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

  void replace_producer(const std::string& why) {
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
    if (ensure_producer()) rd_kafka_poll(producer->rk.get(), 0);
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
  rd_kafka_resp_err_t produce(std::size_t index, const Event& event, const std::string& topic,
                              SteadyClock::time_point deadline) {
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
          RD_KAFKA_V_HEADERS(headers.get()), RD_KAFKA_V_OPAQUE(message_tag(generation, index)), RD_KAFKA_V_END);
      if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        static_cast<void>(headers.release());  // producev succeeded: librdkafka owns the headers now
        return err;
      }
      if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL || SteadyClock::now() >= deadline) return err;
      rd_kafka_poll(rk, clamp_ms(std::min<SteadyClock::duration>(kQueueFullPoll, deadline - SteadyClock::now())));
      if (check_fatal(rk)) return RD_KAFKA_RESP_ERR__FATAL;
    }
  }

  std::vector<Outcome> publish(std::span<const Event* const> events) override {
    std::unique_lock lock(mutex);
    const std::size_t n = events.size();
    if (!ensure_producer()) return std::vector<Outcome>(n, Outcome::retry("no Kafka producer: " + producer_error));
    rd_kafka_t* rk = producer->rk.get();
    const auto started = SteadyClock::now();
    const auto deadline = started + config.delivery_timeout;

    ++generation;
    batch_open = true;
    results.assign(n, std::nullopt);
    awaiting = 0;
    bool fatal = false;

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
    // Not producing later events of a key until the earlier one is acknowledged would serialise
    // every key to one round trip per event; rules 1-3 give the same outbox-side guarantee.
    KeyHolds held;
    for (std::size_t i = 0; i < n && !fatal; ++i) {
      const Event& event = *events[i];
      if (held.holds(event.key)) {
        results[i] = Outcome::deferred();
        continue;
      }
      const std::string topic = render_topic(config.topic, event.topic);
      if (!valid_kafka_topic_name(topic)) {
        results[i] = Outcome::permanent("invalid Kafka topic name '" + topic + "' from topic template '" +
                                        config.topic + "' (1 to 249 of letters, digits, '.', '_', '-')");
        continue;
      }
      const rd_kafka_resp_err_t err = produce(i, event, topic, deadline);
      if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        ++awaiting;
      } else if (err == RD_KAFKA_RESP_ERR__FATAL || check_fatal(rk)) {
        fatal = true;
      } else {
        results[i] = err == RD_KAFKA_RESP_ERR__QUEUE_FULL
                         ? Outcome::retry(error_text(err) + ": the producer queue stayed full for delivery_timeout")
                         : outcome_for(err, topic);
        if (results[i]->kind == OutcomeKind::kRetry) held.hold(event.key, event.id);
      }
    }

    // rd_kafka_flush() sends at once (ignoring linger.ms) and serves delivery reports until
    // nothing is outstanding. Only this batch can be outstanding: an earlier batch either got
    // all its reports or had its producer replaced.
    const auto produced = SteadyClock::now();
    if (!fatal && awaiting > 0) {
      rd_kafka_flush(rk, clamp_ms(deadline - SteadyClock::now()));
      // Reports queued between flush's last poll and its return.
      rd_kafka_poll(rk, 0);
    }
    fatal = fatal || check_fatal(rk);
    batch_open = false;

    std::vector<Outcome> outcomes;
    outcomes.reserve(n);
    std::string replace_reason;
    if (fatal) {
      // A fatal error voids the producer's guarantees: count nothing of this batch as delivered,
      // even events with a successful report (re-sending them is a duplicate, never a loss).
      outcomes.assign(n, Outcome::retry("fatal Kafka producer error, batch retried: " + fatal_reason));
      replace_reason = "fatal error: " + fatal_reason;
    } else {
      const std::string late =
          "no delivery report within delivery_timeout " + config::format_duration(config.delivery_timeout);
      for (auto& result : results) outcomes.push_back(result ? std::move(*result) : Outcome::retry(late));
      if (awaiting > 0) {
        replace_reason = std::to_string(awaiting) + " of " + std::to_string(n) +
                         " events had no delivery report within delivery_timeout";
        reachable = false;
      }
    }
    log_batch("kafka", name(), outcomes);
    log::debug("kafka batch published",
               {{"sink", name()},
                {"events", n},
                {"produce_ms", std::chrono::duration<double, std::milli>(produced - started).count()},
                {"acks_ms", std::chrono::duration<double, std::milli>(SteadyClock::now() - produced).count()}});
    if (!replace_reason.empty()) replace_producer(replace_reason);
    return outcomes;
  }

  bool usable() const override { return producer_ok.load() && reachable.load(); }
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
  s.producer = s.create_producer(error);
  if (!s.producer) throw config::ConfigError(error);
  s.producer_ok = true;
  s.last_create_attempt = SteadyClock::now();
  s.poller.start(kIdlePollInterval, [&s] { s.poll_idle(); });  // ~KafkaSinkImpl stops it first
  log::info("kafka producer created", {{"sink", s.name()},
                                       {"brokers", s.config.brokers},
                                       {"topic", s.config.topic},
                                       {"librdkafka", rd_kafka_version_str()}});
  return sink;
}

}  // namespace outbox::sinks
