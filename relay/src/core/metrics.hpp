#pragma once
// What the loop reports. The Prometheus implementation lives in http/; the default does nothing.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/db_error.hpp"

namespace outbox {

// kPoll: a poll of the table found events (docs/design.md "How wakeups work"); kNotify: a NOTIFY
// on the channel (an opt-in writer trigger, or an operator command); kReload: a reloaded config
// waits for the loop to take it (app/reload.hpp).
// What a transactional sink counts (Kafka exactly once), cumulative since the sink was made.
struct TransactionCounts {
  std::uint64_t committed = 0;          // transactions committed
  std::uint64_t aborted = 0;            // transactions aborted (their events retried)
  std::uint64_t fenced = 0;             // times the sink's producer found itself fenced by a successor
  std::uint64_t marks_read = 0;         // takeovers that read the progress mark back
  std::uint64_t already_committed = 0;  // events found in the mark: marked delivered without producing
};

enum class WakeSource { kNotify, kPoll, kSweep, kRetry, kStartup, kWatch, kReload };

// Why spans of the relay's own tracing were dropped (docs/operations.md "Tracing"): the exporter's
// queue was full, or the collector did not take a batch (down, slow, or answering an error).
enum class SpanDrop { kQueueFull, kExportFailed };

class Metrics {
 public:
  virtual ~Metrics() = default;
  virtual void claimed(std::size_t /*events*/, double /*seconds*/) {}
  virtual void published(const std::string& /*sink*/, std::size_t /*events*/, double /*seconds*/) {}
  virtual void delivered(const std::string& /*sink*/, double /*commit_to_ack_seconds*/) {}
  virtual void retried(const std::string& /*sink*/) {}
  virtual void dead_lettered(const std::string& /*sink*/) {}
  // Row headers not sent to a sink because it reserves their names (Sink::reserves_header).
  virtual void headers_dropped(const std::string& /*sink*/, std::size_t /*headers*/) {}
  virtual void wakeup(WakeSource /*source*/) {}
  virtual void reconnected() {}
  // A failed database operation of any session (work, LISTEN, gauges, retention), by class.
  virtual void db_error(DbErrorClass /*kind*/) {}
  virtual void ready(bool /*is_ready*/) {}
  virtual void lanes_owned(int /*count*/) {}
  // A transactional sink's counts (Sink::transaction_counts), read at each scrape.
  virtual void transactions(const std::string& /*sink*/, const TransactionCounts& /*counts*/) {}
  // Open writer transactions holding back events of this instance's lanes (Store::writer_holds):
  // the committed events they hold back and the age of the oldest of them (0, 0: none).
  virtual void writers_holding(std::size_t /*events*/, double /*oldest_writer_seconds*/) {}
  // How many ids the id sequence hands a session at a time (Health::sequence_cache; 0: not read).
  virtual void sequence_cache(long long /*ids*/) {}
  // The relay's spans (tracing/otlp_exporter.hpp), from the exporter's thread and the loop's.
  virtual void spans_exported(std::size_t /*spans*/) {}
  virtual void spans_dropped(SpanDrop /*reason*/, std::size_t /*spans*/) {}
};

}  // namespace outbox
