// outbox-bench: the measuring half of bench/run.sh. Each subcommand prints one JSON object.
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>

#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"outbox-bench: drains and wakeup latency for bench/run.sh"};
  app.require_subcommand(1);
  std::string url;
  app.add_option("--url", url, "Postgres URL of the benchmark database")->required();

  bench::SeedOptions seed;
  auto* seed_cmd = app.add_subcommand("seed", "Empty the table, insert pending events or jobs, VACUUM, CHECKPOINT");
  seed_cmd->add_option("--target", seed.target, "relay | peer")->check(CLI::IsMember({"relay", "peer"}));
  seed_cmd->add_option("--count", seed.count, "events to insert");

  bench::SqlDrainOptions sql;
  auto* sql_cmd = app.add_subcommand("sql-drain", "Drain with SQL only, no sink");
  sql_cmd->add_option("--variant", sql.variant, "relay | one-txn-mark | lease-then-mark | one-txn-delete")
      ->check(CLI::IsMember({"relay", "one-txn-mark", "lease-then-mark", "one-txn-delete"}));
  sql_cmd->add_option("--expect", sql.expect, "events to drain");
  sql_cmd->add_option("--batch", sql.batch, "claim size");
  sql_cmd->add_flag("--delete", sql.delete_on_success, "relay variant: complete by DELETE (on_success: delete)");

  bench::RelayDrainOptions relay;
  auto* relay_cmd = app.add_subcommand("relay-drain", "Drain with the real relay binary and its file sink");
  relay_cmd->add_option("--relay-bin", relay.relay_bin)->required();
  relay_cmd->add_option("--config", relay.config)->required();
  relay_cmd->add_option("--sink-file", relay.sink_file, "the file sink's path in the config")->required();
  relay_cmd->add_option("--log-file", relay.log_file)->required();
  relay_cmd->add_option("--expect", relay.expect);
  relay_cmd->add_option("--timeout", relay.timeout_s, "seconds");

  bench::LatencyOptions lat;
  auto* lat_cmd = app.add_subcommand("latency", "Commit-to-sink latency of an idle relay or peer");
  lat_cmd->add_option("--mode", lat.mode, "relay | peer")->check(CLI::IsMember({"relay", "peer"}));
  lat_cmd->add_option("--file", lat.file, "the file the child appends to")->required();
  lat_cmd->add_option("--log-file", lat.log_file)->required();
  lat_cmd->add_option("--count", lat.count);
  lat_cmd->add_option("--rate", lat.rate, "inserts per second");
  lat_cmd->add_option("--warmup", lat.warmup);
  lat_cmd->add_option("command", lat.command, "the child to start, after --")->required();

  CLI11_PARSE(app, argc, argv);
  try {
    if (*seed_cmd) return seed.url = url, bench::seed(seed);
    if (*sql_cmd) return sql.url = url, bench::sql_drain(sql);
    if (*relay_cmd) return relay.url = url, bench::relay_drain(relay);
    if (*lat_cmd) return lat.url = url, bench::latency(lat);
  } catch (const std::exception& e) {
    std::cerr << "outbox-bench: " << e.what() << "\n";
    return 1;
  }
  return 2;
}
