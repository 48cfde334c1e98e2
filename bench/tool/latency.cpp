// Wakeup latency: an idle relay (or the peer's worker), single-row inserts at a steady rate, and
// for each event the time from "COMMIT returned to the writer" to "the event reached the sink"
// (relay: its line appears in the sink file; peer: its task function runs). One clock for both
// sides: CLOCK_MONOTONIC (steady_clock here, process.hrtime in Node).
#include <pqxx/pqxx>

#include <charconv>
#include <fstream>
#include <iostream>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "child.hpp"
#include "commands.hpp"
#include "common.hpp"
#include "tailer.hpp"

namespace bench {
namespace {

struct Arrival {
  Steady::time_point reached;  // relay: line read from the file; peer: task start (its own stamp)
  Steady::time_point read;     // when the tailer read the line
};

bool parse_int(std::string_view text, long long& out) {
  const auto r = std::from_chars(text.data(), text.data() + text.size(), out);
  return r.ec == std::errc{};
}

// relay: {"id":123,...}  ->  key 123, reached = read time.
// peer:  "seq monotonic_ns" ->  key seq, reached = the task's own stamp.
bool parse_line(const std::string& mode, std::string_view line, Steady::time_point read, long long& key, Arrival& a) {
  a.read = read;
  if (mode == "relay") {
    constexpr std::string_view kPrefix = "{\"id\":";
    if (line.substr(0, kPrefix.size()) != kPrefix) return false;
    line.remove_prefix(kPrefix.size());
    a.reached = read;
    return parse_int(line.substr(0, line.find(',')), key);
  }
  const auto space = line.find(' ');
  long long ns = 0;
  if (space == std::string_view::npos || !parse_int(line.substr(0, space), key) ||
      !parse_int(line.substr(space + 1), ns)) {
    return false;
  }
  a.reached = Steady::time_point{std::chrono::duration_cast<Steady::duration>(std::chrono::nanoseconds{ns})};
  return true;
}

}  // namespace

int latency(const LatencyOptions& o) {
  { std::ofstream(o.file, std::ios::trunc); }
  std::mutex mu;
  std::unordered_map<long long, Arrival> arrived;
  long long bad_lines = 0;
  Tailer tailer(o.file, [&](std::string_view line, Steady::time_point read) {
    long long key = 0;
    Arrival a;
    const bool ok = parse_line(o.mode, line, read, key, a);
    std::lock_guard lock(mu);
    if (!ok) {
      ++bad_lines;
      return;
    }
    arrived.emplace(key, a);  // first arrival counts (a redelivery would come later)
  });
  auto arrived_count = [&](const std::vector<long long>& keys) {
    std::lock_guard lock(mu);
    long long n = 0;
    for (long long k : keys) n += arrived.count(k);
    return n;
  };

  pqxx::connection c(o.url);
  if (o.mode == "relay") {
    c.prepare(
        "insert",
        "INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES ('order.paid', $1, $2::jsonb) RETURNING id");
  } else {
    c.prepare("insert", "SELECT id FROM graphile_worker.add_job('noop', $1::json)");
  }
  long long seq = 0;
  auto insert = [&](std::vector<long long>& keys) {
    ++seq;
    const std::string payload = "{\"seq\":" + std::to_string(seq) + ",\"order_id\":" + std::to_string(seq) +
                                ",\"amount_cents\":1999,\"currency\":\"EUR\"}";
    pqxx::nontransaction tx(c);  // autocommit: exec returns after the COMMIT
    if (o.mode == "relay") {
      keys.push_back(tx.exec_prepared1("insert", "order-" + std::to_string(seq % 100), payload)[0].as<long long>());
    } else {
      tx.exec_prepared1("insert", payload);
      keys.push_back(seq);
    }
  };

  Child child(o.command, "/dev/null", o.log_file);
  auto wait_all = [&](const std::vector<long long>& keys, double timeout_s) {
    const auto until =
        Steady::now() + std::chrono::duration_cast<Steady::duration>(std::chrono::duration<double>(timeout_s));
    while (arrived_count(keys) < static_cast<long long>(keys.size()) && Steady::now() < until && child.alive()) {
      std::this_thread::sleep_for(std::chrono::milliseconds{2});
    }
    return arrived_count(keys) == static_cast<long long>(keys.size());
  };

  // Warm-up: waits out the child's start-up and warms its connections; not measured.
  std::vector<long long> warm;
  for (int i = 0; i < o.warmup; ++i) {
    insert(warm);
    std::this_thread::sleep_for(std::chrono::milliseconds{20});
  }
  if (!wait_all(warm, 60)) {
    std::cout << Json{{"mode", o.mode}, {"error", "warm-up events never arrived"}} << std::endl;
    return 1;
  }
  std::this_thread::sleep_for(std::chrono::seconds{1});  // idle again

  std::vector<long long> keys;
  std::vector<Steady::time_point> committed;
  std::vector<std::int64_t> committed_wall_us;
  keys.reserve(o.count);
  const auto period = std::chrono::duration_cast<Steady::duration>(std::chrono::duration<double>(1.0 / o.rate));
  const auto start = Steady::now();
  for (int i = 0; i < o.count; ++i) {
    std::this_thread::sleep_until(start + i * period);
    insert(keys);
    committed.push_back(Steady::now());
    committed_wall_us.push_back(
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count());
  }
  const double insert_seconds = seconds(Steady::now() - start);
  const bool all = wait_all(keys, 30);

  std::vector<double> lat, read_lat;
  {
    std::lock_guard lock(mu);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const auto it = arrived.find(keys[i]);
      if (it == arrived.end()) continue;
      lat.push_back(millis(it->second.reached - committed[i]));
      read_lat.push_back(millis(it->second.read - committed[i]));
    }
  }
  Json out{{"mode", o.mode},
           {"count", o.count},
           {"arrived", lat.size()},
           {"all_arrived", all},
           {"bad_lines", bad_lines},
           {"insert_rate", round_to(o.count / insert_seconds, 1)},
           {"p50_ms", round_to(percentile(lat, 0.50), 3)},
           {"p90_ms", round_to(percentile(lat, 0.90), 3)},
           {"p99_ms", round_to(percentile(lat, 0.99), 3)},
           {"max_ms", round_to(percentile(lat, 1.0), 3)},
           {"min_ms", round_to(percentile(lat, 0.0), 3)}};
  if (o.mode == "peer") {
    // The peer's own stamp is the figure; this adds the write to its log and our read of it.
    out["read_p50_ms"] = round_to(percentile(read_lat, 0.50), 3);
    out["read_p99_ms"] = round_to(percentile(read_lat, 0.99), 3);
  } else {
    // The line is visible before the sink's fdatasync returns; the ack (processed_at, which is the
    // start of the completing transaction) comes after it. Same machine, so the wall clocks agree.
    std::string ids = "{";
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (i > 0) ids += ',';
      ids += std::to_string(keys[i]);
    }
    ids += "}";
    std::vector<double> acked;
    for (int tries = 0; tries < 200; ++tries) {
      pqxx::nontransaction tx(c);
      const auto rows = tx.exec_params(
          "SELECT id, (extract(epoch FROM processed_at) * 1000000)::int8 FROM outbox_events "
          "WHERE id = ANY($1::bigint[]) AND processed_at IS NOT NULL ORDER BY id",
          ids);
      if (rows.size() == keys.size()) {
        std::unordered_map<long long, std::int64_t> at;
        for (const auto& r : rows) at[r[0].as<long long>()] = r[1].as<std::int64_t>();
        for (std::size_t i = 0; i < keys.size(); ++i)
          acked.push_back(static_cast<double>(at[keys[i]] - committed_wall_us[i]) / 1000.0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds{10});
    }
    out["acked_p50_ms"] = round_to(percentile(acked, 0.50), 3);
    out["acked_p99_ms"] = round_to(percentile(acked, 0.99), 3);
  }
  std::vector<double> rounded;
  for (double v : lat) rounded.push_back(round_to(v, 3));
  out["samples_ms"] = rounded;
  const auto exit = child.stop(std::chrono::milliseconds{15000});
  out["child_exit_code"] = exit.code;
  out["child_cpu_seconds"] = round_to(exit.cpu_seconds, 3);
  tailer.stop();
  std::cout << out << std::endl;
  return all ? 0 : 1;
}

}  // namespace bench
