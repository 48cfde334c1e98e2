#pragma once
// Operator queries and the relay's maintenance sessions:
// - `status`, `failed list|retry|purge`, `replay` (one short-lived session per command);
// - BacklogProbe (the gauges behind /metrics) and RetentionSweeper (relay.retention), each on a
//   dedicated session of its own, never the loop's.
//
// Every write works in batches of at most kAdminBatch rows, one short transaction each, so that
// no command holds row locks on a large part of the table; the relay's claims skip rows an
// operator command has locked (FOR UPDATE SKIP LOCKED) and take them once it commits.
// Retry and replay NOTIFY the relay's channel in each batch's transaction, so a running relay
// picks the rows up at once.
//
// Errors: DbError (a std::runtime_error) with the password masked, the failure's class and, for a
// class that needs an operator (docs/operations.md "Database errors"), the hint, which the
// operator commands' messages end with ("; hint: ...").
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/db_error.hpp"

namespace outbox::pg {

// The DbError the functions below throw: "<what> failed: <error>[; hint: <hint>]" (BacklogProbe
// and RetentionSweeper leave the hint out of the message: the relay logs it as a field).
DbError admin_failure(const char* what, const std::exception& e, const std::string& url, const std::string& table,
                      bool hint_in_message = true);

inline constexpr std::size_t kAdminBatch = 5000;

struct TopicStatus {
  std::string topic;
  long long pending = 0;
  double oldest_pending_age_seconds = 0;  // 0 when nothing is pending
  long long dead_lettered = 0;
};

// An open transaction that holds ROW EXCLUSIVE on the table and may hold events back (schema/005):
// it marked lanes, or its lanes are not known (a statement still inserting, activity not visible).
struct OpenWriterStatus {
  int pid = 0;
  std::string application_name;
  std::string client_addr;
  std::string state;       // pg_stat_activity.state; empty when not visible
  std::string query;       // the first 200 characters
  std::string wait_event;  // "type:event", or empty
  double xact_age_seconds = 0;
  bool lanes_known = false;   // false: it may hold any lane
  std::vector<int> lanes;     // its lane marks
  long long events_held = 0;  // pending events of its lanes committed since it began
  // A prepared transaction (schema/010; pid 0, state "prepared"): its global id, owner, database.
  std::string gid;
  std::string owner;
  std::string database;
};

struct StatusReport {
  std::vector<TopicStatus> topics;
  long long pending = 0;
  double oldest_pending_age_seconds = 0;
  long long dead_lettered = 0;
  std::vector<OpenWriterStatus> open_writers;  // oldest first; empty before schema 5
};

StatusReport query_status(const std::string& url, const std::string& table);

// Ids touched by a command, kept as ascending ranges: a replay of a million rows stays small.
class IdRanges {
 public:
  // Ids must come in ascending order for ranges to merge; any order is still correct.
  void add(long long id);
  long long count() const { return count_; }
  const std::vector<std::pair<long long, long long>>& ranges() const { return ranges_; }
  // "3-7, 9, 12-13"; after max_ranges ranges: ", ... (N more ranges)". "none" when empty.
  std::string describe(std::size_t max_ranges = 20) const;

 private:
  std::vector<std::pair<long long, long long>> ranges_;
  long long count_ = 0;
};

struct DeadLetter {
  long long id = 0;
  std::string topic;
  std::string key;
  int attempts = 0;
  std::string dead_lettered_at;  // RFC 3339, UTC
  std::string last_error;
};

struct DeadLetterPage {
  std::vector<DeadLetter> rows;  // ascending id, at most the limit
  long long total = 0;           // all dead letters matching the filter
};

// Dead letters (dead_lettered_at set, not processed), oldest id first.
DeadLetterPage list_dead_letters(const std::string& url, const std::string& table,
                                 const std::optional<std::string>& topic, long long limit);

// Which dead letters `failed retry` puts back. Exactly one of ids, topic, all.
struct RetrySelection {
  std::vector<long long> ids;
  std::optional<std::string> topic;
  bool all = false;
};

// Puts dead letters back to pending: dead_lettered_at NULL, attempts 0, next_attempt_at
// -infinity, lease cleared. last_error is kept (the last failure stays visible until a new
// attempt overwrites it) and so is sinks_done (a sink that acknowledged gets no duplicate).
IdRanges retry_dead_letters(const std::string& url, const std::string& table, const std::string& channel,
                            const RetrySelection& selection);

// Deletes dead letters whose dead_lettered_at is older than now - older_than (optionally of one
// topic). Never touches pending or processed rows.
IdRanges purge_dead_letters(const std::string& url, const std::string& table, std::chrono::milliseconds older_than,
                            const std::optional<std::string>& topic);

// Makes processed events with from_id <= id <= to_id (optionally of one topic) pending again:
// processed_at NULL, sinks_done '{}', attempts 0, next_attempt_at -infinity. Pending and
// dead-lettered rows in the range are left alone.
IdRanges replay_processed(const std::string& url, const std::string& table, const std::string& channel,
                          long long from_id, std::optional<long long> to_id, const std::optional<std::string>& topic);

// `outbox-relay reload`: NOTIFY channel, 'reload'. Every relay listening on the channel re-reads
// its own config file (postgres/listener.hpp). `table` only names the failure.
void request_reload(const std::string& url, const std::string& table, const std::string& channel);

// The backlog gauges: one statement on a dedicated session, opened on first use and reopened
// after a failure. One thread at a time.
class BacklogProbe {
 public:
  struct Reading {
    long long pending = 0;
    double oldest_pending_age_seconds = 0;
    double notification_queue_usage = 0;
  };

  BacklogProbe(std::string url, const std::string& table);
  ~BacklogProbe();
  BacklogProbe(const BacklogProbe&) = delete;
  BacklogProbe& operator=(const BacklogProbe&) = delete;

  Reading read();  // throws DbError; the session is dropped and reopened next time

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// relay.retention: deletes processed rows older than the bound, kRetentionBatch ids per short
// transaction (commits not waiting for the WAL flush: a delete lost in a crash of Postgres is done
// again by the next pass), skipping rows another session has locked. Dead-lettered and pending
// rows are never deleted. A pass walks the processed_at index from where its previous batch ended
// (the entries of rows it deleted stay in the index until vacuum). Dedicated session, one thread
// at a time.
inline constexpr std::size_t kRetentionBatch = 1000;

class RetentionSweeper {
 public:
  RetentionSweeper(std::string url, const std::string& table, std::size_t batch = kRetentionBatch);
  ~RetentionSweeper();
  RetentionSweeper(const RetentionSweeper&) = delete;
  RetentionSweeper& operator=(const RetentionSweeper&) = delete;

  // A new pass: the next batch starts from the oldest processed row.
  void begin_pass();
  // Deletes one batch; returns the rows deleted (less than the batch size: nothing more is due).
  // Throws DbError; the session is dropped and reopened next time.
  std::size_t delete_batch(std::chrono::milliseconds older_than);
  // How long until the oldest processed row is older than the bound (zero if it already is);
  // nullopt when no processed row is kept. Throws DbError.
  std::optional<std::chrono::milliseconds> next_due(std::chrono::milliseconds older_than);
  std::size_t batch_size() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::pg
