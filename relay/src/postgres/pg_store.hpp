#pragma once
// The outbox table in Postgres: claims with a lease and FOR UPDATE SKIP LOCKED, completes in one
// transaction, and divides the 64 ordering lanes among live instances with advisory locks.
#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/health.hpp"
#include "core/store.hpp"

namespace outbox::pg {

using outbox::kLaneCount;  // fixed by the schema's lane column (core/writer_holds.hpp)

// No defaults here: config/config.hpp holds them, app/options.hpp builds these from a Config.
struct PgStoreOptions {
  std::string url;
  std::string table;
  std::string instance_id;
  std::chrono::milliseconds lease;
  bool delete_on_success;
  // A writer that has held events back for this long is named in a warning (then at most once a
  // minute while it goes on).
  std::chrono::milliseconds writer_hold_warning;
  // Where connect() reports whether database.url leads to a transaction pooler (readiness); may
  // be null. Must outlive the store.
  Health* health;
  // Lane groups (docs/sinks.md, "Exactly once"): 0 = lanes one by one (lane = index mod N); G (a
  // divisor of 64) = group(lane) = lane % G, whole groups to each instance (group = index mod N),
  // and lanes claimed only while every lane of their group is held.
  int lane_groups = 0;
};

// Two sessions: one for claims, lanes and membership, one for complete() (so that a batch's
// outcomes are written while the next batch is claimed). Loop thread only, except complete()
// (one thread at a time, beside the others) and lanes_owned() (any thread).
// Lane membership (lane_membership.cpp), pure: the lanes instance `index` of `instances` aims for
// (groups 0: lane mod instances; G: whole groups, group lane % G to instance group mod instances),
// and of the lanes just gained, those whose group is not complete with owned (given back).
std::set<int> lane_targets(int index, int instances, int groups);
std::vector<int> incomplete_group_lanes(const std::set<int>& owned, const std::vector<int>& gained, int groups);

class PgStore final : public Store {
 public:
  explicit PgStore(PgStoreOptions options);
  ~PgStore() override;

  void connect() override;
  bool failed_session_open() const override;
  void close_failed_session() override;
  bool rebalance() override;
  std::vector<Event> claim(std::size_t limit) override;
  // Above floor when the table is at schema 3 or later (its claim function takes a floor).
  std::vector<Event> claim_above(std::size_t limit, long long floor) override;
  void limit_claim_bytes(std::size_t bytes) override;
  // Writes the completions and polls in one round trip and one transaction (schema 2).
  std::vector<Event> probe_claim(std::size_t limit, std::span<const Completion> completions) override;
  void complete(std::span<const Completion> completions) override;
  std::optional<std::chrono::milliseconds> retry_due_in() override;
  bool waiting_for_writers() const override;
  std::optional<long long> watch_from() const override;
  bool reading_pending() const override;
  WriterHolds writer_holds() const override;
  std::optional<long long> sweep_upto() const override;
  std::optional<long long> first_claimable(long long after, long long upto) override;
  std::vector<EventId> still_pending(std::span<const EventId> ids) override;

  // Clears the leases this instance still holds (shutdown: peers take those rows at once).
  // Best effort: logs and returns false when the database is unreachable.
  bool release_leases();
  // Closes the session, which releases every lane.
  void disconnect();
  int lanes_owned() const override;
  std::string identity() const override;

 private:
  std::vector<Event> claim_or_probe(std::size_t limit, bool probe, std::span<const Completion> completions,
                                    long long floor);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The schema version this relay runs on (schema/NNN_*.sql; migrations_test checks it is the last).
// `run` refuses an older one: `migrate` first.
inline constexpr int kSchemaVersion = 14;

// The table's schema is older than kSchemaVersion (or the table is not migrated). At start `run`
// exits with this message; at a later connect the runner retries, /readyz says why.
class SchemaTooOld : public StoreUnavailable {
 public:
  SchemaTooOld(const std::string& table, int version);
};

// database.table is ambiguous: an unqualified name that several schemas of the role's search_path
// hold (one of them may be a writer's, made to shadow the outbox). table_names() throws it.
class AmbiguousTable : public StoreUnavailable {
 public:
  // A hint of its own: translate_errors passes it on as it is (run.cpp tells it apart).
  explicit AmbiguousTable(const std::string& message)
      : StoreUnavailable(message, DbErrorClass::kUndefinedObject, "set database.table to a schema-qualified name") {}
};

// Deterministic 31-bit key for advisory locks, from a text (FNV-1a).
int advisory_key(const std::string& text);

// Microseconds since the epoch as RFC 3339 in UTC with microseconds ("2026-11-30T06:32:22.123456Z"),
// the form of Event::created_at.
std::string rfc3339_utc(long long epoch_us);

// The 22-bit tag in the high bits of the writers' fence locks of a table (see schema/001).
long long fence_tag(const std::string& table);

// The advisory-lock namespaces (first key) of the writers' lane marks and statement marks of a
// table (schema/005).
struct WriterMarkKeys {
  int lanes = 0;
  int statements = 0;
};
WriterMarkKeys writer_mark_keys(const std::string& table);

}  // namespace outbox::pg
