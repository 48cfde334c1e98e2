// Drains: seeding, the SQL-only rate of the relay's own statements (and the simple DESIGN
// section 7 shapes), and the real relay binary with its file sink.
#include <pqxx/pqxx>

#include <unistd.h>
#include <fstream>
#include <iostream>
#include <thread>

#include "app/options.hpp"
#include "child.hpp"
#include "commands.hpp"
#include "common.hpp"
#include "postgres/pg_store.hpp"
#include "tailer.hpp"

namespace bench {
namespace {

constexpr const char* kPendingSql =
    "SELECT count(*) FROM outbox_events WHERE processed_at IS NULL AND dead_lettered_at IS NULL";

long long scalar(pqxx::connection& c, const std::string& sql) {
  pqxx::nontransaction tx(c);
  return tx.exec1(sql)[0].as<long long>();
}

// The relay's statements, driven exactly as the relay drives them: claim(batch) then one
// complete() with every event delivered, until expect events are done.
long long drain_with_store(const SqlDrainOptions& o, int& batches) {
  outbox::config::Config config;  // the relay's defaults
  config.database.url = o.url;
  config.relay.on_success = o.delete_on_success ? outbox::config::OnSuccess::kDelete : outbox::config::OnSuccess::kMark;
  outbox::pg::PgStore store(outbox::app::store_options(config, "bench-sql-" + std::to_string(getpid()), nullptr));
  store.connect();
  store.rebalance();  // takes the 64 lanes: it is the only instance
  long long done = 0;
  std::vector<outbox::Completion> completions;
  while (done < o.expect) {
    const auto events = store.claim(static_cast<std::size_t>(o.batch));
    if (events.empty()) break;
    completions.clear();
    for (const auto& e : events) completions.push_back({e.id, outbox::Completion::Kind::kDelivered, {}, {}, {}});
    store.complete(completions);
    done += static_cast<long long>(events.size());
    ++batches;
  }
  return done;
}

// The DESIGN section 7 shapes, with plain partial-index claims (no lanes, no head-of-line check).
long long drain_simple(const SqlDrainOptions& o, int& batches) {
  pqxx::connection c(o.url);
  const std::string pending =
      "FROM outbox_events WHERE processed_at IS NULL AND dead_lettered_at IS NULL "
      "AND (lease_until IS NULL OR lease_until < now()) ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED";
  c.prepare("lock", "SELECT id, topic, aggregate_id, payload::text, headers::text, created_at " + pending);
  c.prepare("lease",
            "UPDATE outbox_events AS e SET lease_owner = 'bench', lease_until = now() + interval '60 s' "
            "FROM (SELECT id " +
                pending +
                ") AS s WHERE e.id = s.id "
                "RETURNING e.id, e.topic, e.aggregate_id, e.payload::text, e.headers::text, e.created_at");
  c.prepare("mark",
            "UPDATE outbox_events SET processed_at = now(), lease_owner = NULL, lease_until = NULL "
            "WHERE id = ANY($1::bigint[]) AND processed_at IS NULL");
  c.prepare("delete", "DELETE FROM outbox_events WHERE id = ANY($1::bigint[])");
  long long done = 0;
  std::vector<long long> ids;
  auto id_array = [&] {
    std::string s = "{";
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i) s += ',';
      s += std::to_string(ids[i]);
    }
    return s + "}";
  };
  while (done < o.expect) {
    ids.clear();
    if (o.variant == "lease-then-mark") {
      pqxx::work claim(c);
      const auto rows = claim.exec_prepared("lease", o.batch);
      claim.commit();
      for (const auto& r : rows) ids.push_back(r[0].as<long long>());
      if (ids.empty()) break;
      pqxx::work mark(c);
      mark.exec_prepared("mark", id_array());
      mark.commit();
    } else {
      pqxx::work tx(c);
      const auto rows = tx.exec_prepared("lock", o.batch);
      for (const auto& r : rows) ids.push_back(r[0].as<long long>());
      if (ids.empty()) break;
      tx.exec_prepared(o.variant == "one-txn-delete" ? "delete" : "mark", id_array());
      tx.commit();
    }
    done += static_cast<long long>(ids.size());
    ++batches;
  }
  return done;
}

}  // namespace

int seed(const SeedOptions& o) {
  pqxx::connection c(o.url);
  pqxx::nontransaction tx(c);
  const auto t0 = Steady::now();
  if (o.target == "relay") {
    tx.exec0("TRUNCATE outbox_events RESTART IDENTITY");
    tx.exec0(relay_seed_sql(o.count));
    tx.exec0("VACUUM (ANALYZE) outbox_events");
  } else {
    tx.exec0("TRUNCATE graphile_worker._private_jobs");
    tx.exec1(peer_seed_sql(o.count));
    tx.exec0("VACUUM (ANALYZE) graphile_worker._private_jobs");
  }
  tx.exec0("CHECKPOINT");  // no checkpoint of the seed's WAL lands inside the timed drain
  std::cout << Json{{"target", o.target}, {"count", o.count}, {"seconds", round_to(seconds(Steady::now() - t0), 3)}}
            << std::endl;
  return 0;
}

int sql_drain(const SqlDrainOptions& o) {
  const double cpu0 = self_cpu_seconds();
  int batches = 0;
  const auto t0 = Steady::now();
  const long long done = o.variant == "relay" ? drain_with_store(o, batches) : drain_simple(o, batches);
  const double wall = seconds(Steady::now() - t0);
  const double cpu = self_cpu_seconds() - cpu0;
  pqxx::connection c(o.url);
  const long long left = o.variant == "one-txn-delete" || o.delete_on_success
                             ? scalar(c, "SELECT count(*) FROM outbox_events")
                             : scalar(c, kPendingSql);
  std::cout << Json{{"variant", o.variant},
                    {"events", done},
                    {"batches", batches},
                    {"seconds", round_to(wall, 4)},
                    {"rate", round_to(static_cast<double>(done) / wall, 1)},
                    {"client_cpu_seconds", round_to(cpu, 3)},
                    {"pending_after", left}}
            << std::endl;
  return done == o.expect && left == 0 ? 0 : 1;
}

int relay_drain(const RelayDrainOptions& o) {
  { std::ofstream(o.sink_file, std::ios::trunc); }  // the sink appends; the tailer needs the file
  pqxx::connection poll_conn(o.url);                // opened before t0: not part of the drain
  const long long max_id = scalar(poll_conn, "SELECT coalesce(max(id), 0) FROM outbox_events");
  std::atomic<long long> lines{0};
  std::atomic<Steady::rep> first_seen{0}, all_seen{0};
  Tailer tailer(o.sink_file, [&](std::string_view, Steady::time_point seen) {
    const long long n = ++lines;
    if (n == 1) first_seen = seen.time_since_epoch().count();
    if (n == o.expect) all_seen = seen.time_since_epoch().count();
  });

  const auto t0 = Steady::now();
  Child relay({o.relay_bin, "run", "--config", o.config}, "/dev/null", o.log_file);
  const auto deadline = t0 + std::chrono::duration_cast<Steady::duration>(std::chrono::duration<double>(o.timeout_s));
  // Passive wait for the file: the tailer counts lines; this thread only sleeps.
  while (all_seen.load() == 0 && Steady::now() < deadline && relay.alive()) {
    std::this_thread::sleep_for(std::chrono::milliseconds{1});
  }
  // Then the completes: the last batch is marked right after its fsync, so this polls a few times.
  // Batches are claimed and completed in id order, one after the other, so the tail of the id
  // range is done last; a primary-key range probe sees that at ~0.1 ms a poll, where a full
  // pending count walks 200,000 dead index entries (tens of ms). The full count follows below.
  long long pending = -1;
  Steady::time_point t_db{};
  const std::string tail_sql = "SELECT count(*) FROM outbox_events WHERE id > " + std::to_string(max_id - 1000) +
                               " AND processed_at IS NULL AND dead_lettered_at IS NULL";
  while (Steady::now() < deadline && relay.alive()) {
    pending = scalar(poll_conn, tail_sql);
    if (pending == 0) {
      t_db = Steady::now();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds{1});
  }
  const auto exit = relay.stop(std::chrono::milliseconds{15000});
  tailer.stop();
  const long long unprocessed = scalar(poll_conn, "SELECT count(*) FROM outbox_events WHERE processed_at IS NULL");

  Json out{{"events", o.expect},
           {"lines", lines.load()},
           {"unprocessed_after", unprocessed},
           {"relay_exit_code", exit.code},
           {"relay_cpu_seconds", round_to(exit.cpu_seconds, 3)}};
  // The full check: nothing pending anywhere, every event in the file exactly once.
  const bool ok = all_seen.load() != 0 && pending == 0 && unprocessed == 0 && lines.load() == o.expect;
  if (ok) {
    const Steady::time_point t_first{Steady::duration{first_seen.load()}};
    const Steady::time_point t_file{Steady::duration{all_seen.load()}};
    const double wall = seconds(t_db - t0);
    out["seconds"] = round_to(wall, 4);
    out["rate"] = round_to(static_cast<double>(o.expect) / wall, 1);
    out["seconds_to_last_line"] = round_to(seconds(t_file - t0), 4);
    out["rate_to_last_line"] = round_to(static_cast<double>(o.expect) / seconds(t_file - t0), 1);
    out["seconds_to_first_line"] = round_to(seconds(t_first - t0), 4);
  }
  std::cout << out << std::endl;
  return ok && exit.code == 0 ? 0 : 1;
}

}  // namespace bench
