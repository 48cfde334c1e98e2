#pragma once
// The benchmark's commands. Each prints one JSON object on stdout and returns an exit code;
// bench/bench.py runs them, alternating, and aggregates.
#include <string>
#include <vector>

namespace bench {

struct SeedOptions {
  std::string url;
  std::string target = "relay";  // relay | peer
  long long count = 200000;
};
// Empties the target's table, inserts count pending events/jobs, VACUUM ANALYZE, CHECKPOINT.
int seed(const SeedOptions& o);

struct SqlDrainOptions {
  std::string url;
  // relay: the relay's own PgStore statements (claim with lanes + lease, then mark), no sink.
  // one-txn-mark | lease-then-mark | one-txn-delete: the simple DESIGN section 7 shapes.
  std::string variant = "relay";
  long long expect = 200000;
  int batch = 500;
  bool delete_on_success = false;  // relay variant: the relay's on_success: delete
};
int sql_drain(const SqlDrainOptions& o);

struct RelayDrainOptions {
  std::string url;
  std::string relay_bin;
  std::string config;
  std::string sink_file;
  std::string log_file;
  long long expect = 200000;
  double timeout_s = 600;
};
// Starts the real relay on a seeded table and times it until every line is in the sink file and
// no row is pending any more.
int relay_drain(const RelayDrainOptions& o);

struct LatencyOptions {
  std::string url;
  std::string mode = "relay";  // relay: lines are the file sink's JSON; peer: "seq monotonic_ns"
  std::string file;            // the file the child appends to
  std::string log_file;
  std::vector<std::string> command;  // the child: the relay or the peer's worker
  int count = 1000;
  double rate = 200;
  int warmup = 20;
};
// Idle child; count single-row inserts at rate/s; commit-to-sink latency per event.
int latency(const LatencyOptions& o);

}  // namespace bench
