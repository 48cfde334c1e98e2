// Lane membership: one advisory lock per live instance, counted by every peer; about 64/N lanes
// each, taken and released between batches (docs/design.md, "Lanes").
#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "log/log.hpp"
#include "postgres/pg_store_impl.hpp"

namespace outbox::pg {

std::set<int> lane_targets(int index, int instances, int groups) {
  std::set<int> target;
  for (int lane = 0; lane < kLaneCount; ++lane) {
    // Whole groups: group g (the lanes l with l % groups == g) to the instance g mod n.
    const int unit = groups > 0 ? lane % groups : lane;
    if (unit % instances == index) target.insert(lane);
  }
  return target;
}

std::vector<int> incomplete_group_lanes(const std::set<int>& owned, const std::vector<int>& gained, int groups) {
  std::vector<int> partial;
  if (groups <= 0) return partial;
  std::set<int> held = owned;
  held.insert(gained.begin(), gained.end());
  for (int lane : gained) {
    bool complete = true;
    for (int other = lane % groups; other < kLaneCount; other += groups) complete = complete && held.count(other) > 0;
    if (!complete) partial.push_back(lane);
  }
  return partial;
}

void PgStore::Impl::lane_groups_seen(const std::set<long long>& held) {
  std::string seen;
  for (const long long g : held) seen += (seen.empty() ? "" : ", ") + std::to_string(g);
  const bool disagree = held.size() > 1;
  if (opt.health) opt.health->lane_groups_disagree = disagree;
  if (seen == groups_seen) return;
  if (disagree) {
    // Relays with lane groups give whole groups to one member, the others single lanes by index:
    // lanes may have no owner, their events wait. Not something a relay can settle by itself.
    log::error(
        "the relays of this table divide its lanes in different ways: some have a kafka sink with exactly_once "
        "(lane groups), some not; some lanes may have no owner and their events wait. Give every relay of the "
        "table the same exactly_once setting (stop them all to switch)",
        {{"lane_groups_held", seen}, {"this_relay", opt.lane_groups}});
  } else if (groups_seen.find(',') != std::string::npos) {
    log::info("the relays of this table divide its lanes the same way again", {{"lane_groups", seen}});
  }
  groups_seen = seen;
}

bool PgStore::rebalance() {
  connect();
  auto& im = *impl_;
  return im.on_worker("rebalance", [&] {
    // A scope of its own: its transaction ends before find_claim_function() opens one.
    const bool gained_any = [&] {
      pqxx::nontransaction tx(*im.conn);
      const auto locks = tx.exec_params(R"(
        SELECT classid::int8 = $1 AS member, objid::int8 FROM pg_locks
         WHERE locktype = 'advisory' AND objsubid = 2 AND granted
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND classid::int8 IN ($1, $2)
         ORDER BY objid)",
                                        im.member_ns, im.groups_ns);
      int index = -1, n = 0;
      std::set<long long> groups_held;
      for (const auto& row : locks) {
        const long long objid = row[1].as<long long>();
        if (!row[0].as<bool>()) {
          groups_held.insert(objid);
          continue;
        }
        if (objid == im.member_id) index = n;
        ++n;
      }
      if (index < 0) throw StoreUnavailable("this instance's membership lock is gone");
      const int groups = im.opt.lane_groups;
      im.lane_groups_seen(groups_held);
      const std::set<int> target = lane_targets(index, n, groups);

      std::vector<int> release, wanted;
      std::set_difference(im.owned.begin(), im.owned.end(), target.begin(), target.end(), std::back_inserter(release));
      std::set_difference(target.begin(), target.end(), im.owned.begin(), im.owned.end(), std::back_inserter(wanted));
      std::set<int> owned = im.owned;
      if (!release.empty()) {
        tx.exec_params("SELECT pg_advisory_unlock($1, l) FROM unnest($2::int[]) AS l", im.lane_ns,
                       int_array(release.data(), release.data() + release.size()));
        for (int lane : release) owned.erase(lane);
      }
      std::vector<int> gained;
      if (!wanted.empty()) {
        const auto got = tx.exec_params("SELECT l FROM unnest($2::int[]) AS l WHERE pg_try_advisory_lock($1, l)",
                                        im.lane_ns, int_array(wanted.data(), wanted.data() + wanted.size()));
        for (const auto& row : got) gained.push_back(row[0].as<int>());
      }
      // A group is claimed in only once all its lanes are held (one producer per group, fenced as
      // a unit, docs/sinks.md): the lanes of a group still held by the previous owner are given
      // back, and the whole group is asked for again at the next rebalance.
      if (const auto partial = incomplete_group_lanes(owned, gained, groups); !partial.empty()) {
        tx.exec_params("SELECT pg_advisory_unlock($1, l) FROM unnest($2::int[]) AS l", im.lane_ns,
                       int_array(partial.data(), partial.data() + partial.size()));
        std::erase_if(gained,
                      [&](int lane) { return std::find(partial.begin(), partial.end(), lane) != partial.end(); });
      }
      if (!gained.empty()) {
        // The gained lanes may hold pending rows below what this instance resolved so far (the
        // previous owner's released batch, events committed during the handover): the next claim,
        // even a poll, looks from the start again (claim_with_function: resolved < 0).
        im.state.lanes_gained();
        // Whoever held these lanes before has lost its lock (it died or handed them over between
        // batches): its leases are stale, and keeping them would let later events of a key
        // overtake the leased ones. Clear them so the rows are claimable now, in order.
        tx.exec_params("UPDATE " + im.names.table +
                           " SET lease_owner = NULL, lease_until = NULL WHERE lane = ANY($1::smallint[]) "
                           "AND processed_at IS NULL AND dead_lettered_at IS NULL AND lease_until IS NOT NULL" +
                           kNoFlushWait,
                       int_array(gained.data(), gained.data() + gained.size()));
        owned.insert(gained.begin(), gained.end());
      }
      if (!release.empty() || !gained.empty()) {
        log::info("ordering lanes rebalanced", {{"instances", n},
                                                {"lanes_owned", owned.size()},
                                                {"lanes_gained", gained.size()},
                                                {"lanes_released", release.size()}});
      }
      im.set_owned(std::move(owned));
      im.look_at_sequence_cache(tx);
      return !gained.empty();
    }();
    return gained_any;
  });
}

}  // namespace outbox::pg
