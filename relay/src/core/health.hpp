#pragma once
// Liveness facts shared between the loop, the LISTEN thread and the HTTP thread.
#include <atomic>

#include "core/db_error.hpp"

namespace outbox {

struct Health {
  std::atomic<bool> store_up{false};      // the work session is connected
  std::atomic<bool> listener_up{false};   // the LISTEN session is connected and listening
  std::atomic<bool> loop_running{false};  // the loop thread is inside its run loop
  // The last session opened on database.url shared its server backend with another session of
  // ours: a transaction-pooling proxy (postgres/pooler.hpp). The relay claims nothing then.
  std::atomic<bool> transaction_pooler{false};
  // The class of the last failure of each session; read while it is down (/readyz reasons).
  std::atomic<DbErrorClass> store_error{DbErrorClass::kTransient};
  std::atomic<DbErrorClass> listener_error{DbErrorClass::kTransient};
  // How many ids the table's id sequence hands a session at a time (0: not read yet). Above 1 the
  // relay cannot tell which ids may still be drawn (schema/010): it applies no reading of the
  // writers, says so on /readyz and in outbox_relay_sequence_cache.
  std::atomic<long long> sequence_cache{0};
  // The relays of this table (as the last rebalance saw them) divide its lanes in different ways:
  // some with lane groups (a kafka sink with exactly_once), some without. Lanes may then have no
  // owner: every relay of a table needs the same setting (docs/sinks.md, "Exactly once").
  std::atomic<bool> lane_groups_disagree{false};
};

}  // namespace outbox
