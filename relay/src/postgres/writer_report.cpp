// What holds events back, read and told: the writers' reading ({prefix}_writers), the id
// sequence's cache, and the writers named in the log, the metrics and `status`.
#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "log/log.hpp"
#include "postgres/pg_store_impl.hpp"

namespace outbox::pg {
namespace {

// Warnings about a writer holding events back: this long after the previous one, at most.
constexpr auto kWriterWarningEvery = std::chrono::minutes(1);
// The held events are counted at most this often (a walk of the pending index over their range).
constexpr auto kHeldCountEvery = std::chrono::seconds(1);

}  // namespace

void PgStore::Impl::read_writers(pqxx::nontransaction& tx, std::chrono::steady_clock::time_point now) {
  const auto rows = tx.exec_prepared("writers");
  WriterReading reading;
  // Schema 10's columns: a prepared transaction's gid, owner and database; the sequence's cache.
  const bool named = rows.columns() >= 15;
  const auto text = [](const pqxx::field& f) { return f.is_null() ? std::string() : f.as<std::string>(); };
  for (const auto& row : rows) {
    reading.last_id = row[0].as<long long>();
    if (row[1].is_null()) {
      if (named && !row[14].is_null()) reading.sequence_cache = row[14].as<long long>();
      continue;
    }
    OpenWriter w;
    w.vxid = row[1].as<std::string>();
    w.pid = row[2].is_null() ? 0 : row[2].as<int>();
    w.complete = row[3].as<bool>();
    w.lanes = static_cast<LaneMask>(row[4].as<long long>());
    w.state = row[5].is_null() ? "" : row[5].as<std::string>();
    w.xact_age_seconds = row[6].is_null() ? 0.0 : row[6].as<double>();
    w.application = row[7].is_null() ? "" : row[7].as<std::string>();
    w.client_addr = row[8].is_null() ? "" : row[8].as<std::string>();
    w.query = row[9].is_null() ? "" : row[9].as<std::string>();
    w.wait_event = row[10].is_null() ? "" : row[10].as<std::string>();
    if (named) {
      w.gid = text(row[11]);
      w.owner = text(row[12]);
      w.database = text(row[13]);
    }
    reading.writers.push_back(std::move(w));
  }
  sequence_cache_seen(reading.sequence_cache, now);
  // At debug level, every reading: tests/fuzz tells from these which writers a relay could not
  // yet tell from those open at an event's commit (a writer first seen by a reading is known to
  // have drawn only ids above the last id of the reading before).
  if (log::enabled(log::Level::kDebug)) {
    log::debug("writers read", {{"last_id", reading.last_id},
                                {"writers", reading.writers.size()},
                                {"sequence_cache", reading.sequence_cache}});
  }
  state.writers_read(now, reading);
}

void PgStore::Impl::sequence_cache_seen(long long cache, std::chrono::steady_clock::time_point now) {
  const long long before = opt.health ? opt.health->sequence_cache.exchange(cache) : cache_seen;
  cache_seen = cache;
  if (cache > 1 && (before <= 1 || now - cache_warned_at >= kWriterWarningEvery)) {
    cache_warned_at = now;
    log::error(
        "the id sequence hands out blocks of ids (CACHE > 1): a session may draw an id below the last one drawn "
        "at any later time, so events wait for every lower id to be committed (no writer reading applies); fix it "
        "with ALTER SEQUENCE " +
            sequence + " CACHE 1, then restart the writers' sessions (their cached ids) (schema/010)",
        {{"table", opt.table}, {"sequence", sequence}, {"cache", cache}});
  } else if (cache <= 1 && before > 1) {
    log::warn(
        "the id sequence draws one id at a time again; sessions connected while it cached more may still draw "
        "ids from their blocks: restart them, or their events may go out of order (schema/010)",
        {{"table", opt.table}, {"sequence", sequence}});
  }
}

void PgStore::Impl::report_holds(pqxx::nontransaction& tx, std::chrono::steady_clock::time_point now) {
  const LaneBounds& lanes = state.lanes();
  const LaneMask held = state.held();
  const auto holding = writers_holding(lanes.last_reading(), held);
  if (holding.empty()) {
    holds = {};
    warned.clear();
    return;
  }
  // Per lane, the committed events above its bound, counted now and then.
  std::map<int, std::size_t> per_lane;
  const bool count = now - counted_at >= kHeldCountEvery;
  if (count) {
    counted_at = now;
    std::vector<int> lanes_held;
    long long low = -1;
    for (int lane = 0; lane < kLaneCount; ++lane) {
      if ((held & lane_bit(lane)) == 0) continue;
      lanes_held.push_back(lane);
      low = low < 0 ? lanes.covered()[lane] : std::min(low, lanes.covered()[lane]);
    }
    for (const auto& row :
         tx.exec_prepared("held_count", int_array(lanes_held.data(), lanes_held.data() + lanes_held.size()), low,
                          lanes.last_id(), lane_literal(lanes.covered()))) {
      per_lane[row[0].as<int>()] = row[1].as<std::size_t>();
    }
  }
  WriterHolds next;
  std::map<std::string, Warned> still;
  for (const OpenWriter* w : holding) {
    WriterHold h{*w, w->holds() & held, 0};
    if (count) {
      for (const auto& [lane, n] : per_lane) {
        if ((h.lanes & lane_bit(lane)) != 0) h.events += n;
      }
    } else {
      for (const auto& old : holds.writers) {
        if (old.writer.vxid == w->vxid) h.events = old.events;
      }
    }
    next.oldest_writer_seconds = std::max(next.oldest_writer_seconds, w->xact_age_seconds);
    auto seen = warned.find(w->vxid);
    Warned mark = seen == warned.end() ? Warned{now, std::nullopt} : seen->second;
    if (now - mark.first_seen >= opt.writer_hold_warning &&
        (!mark.warned_at || now - *mark.warned_at >= kWriterWarningEvery)) {
      mark.warned_at = now;
      log::warn(
          "an open writer transaction holds back events; it ends when the writer commits or rolls back "
          "(docs/operations.md, \"An event stream stalled: find the writer\")",
          {{"pid", w->pid},
           {"application_name", w->application},
           {"client_addr", w->client_addr},
           {"state", w->state.empty() ? "not visible (see schema/005: pg_read_all_stats)" : w->state},
           {"transaction_age_seconds", w->xact_age_seconds},
           {"query", w->query},
           {"lanes", describe_lanes(h.lanes)},
           {"events_held", h.events},
           {"lanes_known", w->complete},
           {"gid", w->gid},
           {"owner", w->owner},
           {"database", w->database}});
    }
    still.emplace(w->vxid, mark);
    next.writers.push_back(std::move(h));
  }
  if (count) {
    for (const auto& [lane, n] : per_lane) next.events += n;
  } else {
    next.events = holds.events;
  }
  holds = std::move(next);
  warned = std::move(still);
}

}  // namespace outbox::pg
