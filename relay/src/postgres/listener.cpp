#include "postgres/listener.hpp"

#include <poll.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <utility>

#include "core/reconnect.hpp"
#include "log/log.hpp"
#include "postgres/idle_watch.hpp"
#include "postgres/notify_pacer.hpp"
#include "postgres/pooler.hpp"
#include "postgres/session.hpp"

namespace outbox::pg {
namespace {

constexpr const char* kReloadPayload = "reload";  // `outbox-relay reload`

// Counts what arrives; the session rings the bell for them, or asks for a reload, paced
// (NotifyPacer).
class Receiver final : public pqxx::notification_receiver {
 public:
  Receiver(pqxx::connection_base& conn, const std::string& channel) : pqxx::notification_receiver(conn, channel) {}
  void operator()(const std::string& payload, int /*backend_pid*/) override {
    ++(payload == kReloadPayload ? reloads_ : arrived_);
  }
  // How many arrived since the last call: wakeups, and reload requests.
  long long take() { return std::exchange(arrived_, 0); }
  long long take_reloads() { return std::exchange(reloads_, 0); }

 private:
  long long arrived_ = 0;
  long long reloads_ = 0;
};

// The sequence to watch, or why not. A table whose enabled triggers notify (schema 1, or the
// opt-in push trigger) has writers that ring the bell themselves: the session listens only, as
// a watch would hold their notifications back for up to a statement.
struct Watchable {
  std::optional<std::string> sequence;
  std::string why_not;
};

Watchable look_at_table(pqxx::connection_base& conn, const std::string& table) {
  pqxx::nontransaction q(conn);
  const auto r = q.exec_params1(
      "SELECT s.seq, coalesce(has_sequence_privilege(s.seq, 'SELECT') OR has_sequence_privilege(s.seq, 'USAGE'), "
      "                       false), "
      "       EXISTS (SELECT 1 FROM pg_trigger AS t JOIN pg_proc AS p ON p.oid = t.tgfoid "
      "                WHERE t.tgrelid = to_regclass($1) AND NOT t.tgisinternal AND t.tgenabled <> 'D' "
      "                  AND p.prosrc ~* 'notify') "
      "FROM (SELECT CASE WHEN to_regclass($1) IS NULL THEN NULL ELSE pg_get_serial_sequence($1, 'id') END AS seq) AS s",
      table);
  if (r[0].is_null()) return {std::nullopt, "no table " + table + " with an id sequence"};
  if (!r[1].as<bool>()) return {std::nullopt, "no privilege to read the id sequence"};
  if (r[2].as<bool>()) return {std::nullopt, "a trigger on " + table + " notifies: its writers ring the bell"};
  return {r[0].as<std::string>(), {}};
}

// look_at_table, where an SQL error means only no watch (the session itself is fine: listen only);
// a lost connection ends the session.
Watchable look_or_listen_only(pqxx::connection_base& conn, const std::string& table) {
  try {
    return look_at_table(conn, table);
  } catch (const pqxx::broken_connection&) {
    throw;
  } catch (const pqxx::sql_error& e) {
    return {std::nullopt, describe_error(e)};
  }
}

// One statement that returns once the sequence passed $2 (its last value), or after $3 reads
// $4 seconds apart (0 then, if nothing was drawn). The backend sleeps between reads; the sequence
// is read outside any snapshot, so the statement sees ids as they are drawn.
constexpr const char* kWatchSql =
    "SELECT coalesce(pg_sequence_last_value($1::regclass), 0) FROM generate_series(1, $3::int) AS g "
    "WHERE coalesce(pg_sequence_last_value($1::regclass), 0) > $2::int8 OR g = $3::int "
    "   OR pg_sleep($4::float8) IS NULL "
    "LIMIT 1";

// Blocks until the session's socket or the bell's watcher fd is readable, or for at most
// `timeout_ms` (a backstop without a ring held back: the bell's fd is what wakes it).
void wait_readable(int sock, int bell_fd, int timeout_ms) {
  pollfd fds[2] = {{sock, POLLIN, 0}, {bell_fd, POLLIN, 0}};
  if (::poll(fds, 2, timeout_ms) < 0 && errno != EINTR) {
    throw std::system_error(errno, std::generic_category(), "poll");
  }
}

}  // namespace

Listener::Listener(std::string url, std::string channel, Bell& bell, Health& health, Metrics& metrics,
                   BackoffPolicy reconnect, const Clock& clock, WatchOptions watch)
    : url_(std::move(url)),
      channel_(std::move(channel)),
      bell_(bell),
      health_(health),
      metrics_(metrics),
      reconnect_(reconnect),
      clock_(clock),
      watch_(std::move(watch)) {}

Listener::~Listener() { join(); }

void Listener::join() {
  if (thread_.joinable()) thread_.join();
  if (canceller_.joinable()) canceller_.join();
}

bool Listener::join_until(std::chrono::steady_clock::time_point deadline) {
  if (thread_.joinable() && ended_future_.wait_until(deadline) != std::future_status::ready) return false;
  join();
  return true;
}

void Listener::start() {
  thread_ = std::thread([this] {
    run();
    ended_.set_value();
  });
}

void Listener::interrupt() {
  if (canceller_.joinable()) return;
  canceller_ = std::thread([this] {
    // Held while the cancel goes out: the session cannot be closed under it.
    std::lock_guard lock(watching_mutex_);
    if (!watching_) return;
    try {
      watching_->cancel_query();  // reads only what the connection was given at connect
    } catch (const std::exception&) {
      // The statement ends within a second anyway.
    }
  });
}

// One LISTEN session, until the bell stops (returns) or the connection fails (throws): listens,
// and while the relay is idle, watches the id sequence. Tells reconnect once it is connected.
void Listener::session(Reconnect& reconnect, const WatchStatement& statement) {
  auto conn = open_session(url_, "listener");
  ensure_own_backend(*conn, url_);     // LISTEN on a pooled backend would hear nothing for us
  Receiver receiver(*conn, channel_);  // issues LISTEN, committed at once
  if (reconnect.connected() == 0) log::info("listening", {{"channel", channel_}});
  bell_.ring(WakeSource::kStartup);  // catch up on whatever was committed before LISTEN

  struct NoWatcher {  // whatever ends this session
    Bell& bell;
    ~NoWatcher() { bell.set_watcher(false); }
  } no_watcher{bell_};
  if (watch_.enabled) {
    conn->prepare("watch", kWatchSql);
    pqxx::nontransaction(*conn).exec0("SET statement_timeout = 0");  // a watch lasts ~watch.length
  }
  IdleWatch idle(watch_.enabled);
  NotifyPacer pacer(watch_.notify_every);
  NotifyPacer reload_pacer(watch_.notify_every);
  // The notifications libpq has read (with the last statement, or now from the socket): a ring,
  // at once or held (pacer), and a reload, the same way.
  const auto take_notifications = [&] {
    conn->get_notifs();
    if (receiver.take() > 0 && pacer.arrived(clock_.now())) bell_.ring(WakeSource::kNotify);
    if (receiver.take_reloads() > 0 && reload_pacer.arrived(clock_.now())) {
      log::info("reload requested on the channel", {{"channel", channel_}});
      on_reload_();
    }
  };
  for (;;) {
    // Drained before the bell and the offer are read: a stop or an offer made after this makes
    // it readable again, so the wait below cannot miss either.
    bell_.drain_watcher_fd();
    if (bell_.stopped()) break;
    if (idle.look_due(clock_.now())) {
      const Watchable w = look_or_listen_only(*conn, table_names(url_, watch_.table).table);
      if (idle.looked(clock_.now(), w.sequence)) {
        log::debug("no idle watch on this LISTEN session; the relay polls", {{"reason", w.why_not}});
      }
      bell_.set_watcher(idle.watching());
    }
    if (pacer.take_due(clock_.now())) bell_.ring(WakeSource::kNotify);
    if (reload_pacer.take_due(clock_.now())) on_reload_();
    // No watch while a ring or a reload is held: it would wait for the statement's end.
    const auto held = pacer.due() || reload_pacer.due();
    const auto after = idle.watching() && !held ? idle.watch_above(bell_.watch_offer()) : std::nullopt;
    if (!after) {
      take_notifications();  // any that libpq read with the last statement
      std::optional<std::chrono::steady_clock::time_point> due = pacer.due();
      if (const auto reload_due = reload_pacer.due(); reload_due && (!due || *reload_due < *due)) due = reload_due;
      const auto wait =
          due ? std::chrono::ceil<std::chrono::milliseconds>(*due - clock_.now()) : std::chrono::milliseconds(10'000);
      wait_readable(conn->sock(), bell_.watcher_fd(), static_cast<int>(std::max<long long>(0, wait.count())));
      take_notifications();
      continue;
    }
    long long last = 0;
    try {
      {
        std::lock_guard lock(watching_mutex_);
        watching_ = conn.get();
      }
      struct NotWatching {
        Listener& l;
        ~NotWatching() {
          std::lock_guard lock(l.watching_mutex_);
          l.watching_ = nullptr;
        }
      } not_watching{*this};
      if (bell_.stopped()) break;
      pqxx::nontransaction q(*conn);
      last = q.exec_prepared1("watch", *idle.sequence(), *after, statement.checks, statement.check_seconds)[0]
                 .as<long long>();
    } catch (const pqxx::broken_connection&) {
      throw;
    } catch (const pqxx::sql_error& e) {
      if (bell_.stopped()) break;  // interrupt(): the statement was cancelled
      // A sequence dropped, a role's statement_timeout, ...: listen only, look again later.
      log::warn("idle watch failed; the relay polls instead", {{"error", describe_error(e)}});
      idle.watch_failed();
      bell_.set_watcher(false);
      continue;
    }
    take_notifications();  // what arrived during the statement
    if (IdleWatch::new_id(last, *after)) bell_.ring_watch(*after);
  }
}

void Listener::run() {
  std::mt19937 rng{std::random_device{}()};
  std::uniform_real_distribution<double> jitter(0.0, 1.0);
  const HintContext hints{url_user(url_), {}};
  const WatchStatement statement = watch_statement(watch_.check, watch_.length);
  Reconnect reconnect({"listener", "LISTEN session lost, will reconnect", "LISTEN session restored"}, reconnect_, bell_,
                      clock_, metrics_, health_.listener_up, health_.listener_error, [&] { return jitter(rng); });
  reconnect.run([&] {
    translate_errors(
        "LISTEN session", [&] { session(reconnect, statement); }, hints);
  });
  health_.listener_up = false;
}

}  // namespace outbox::pg
