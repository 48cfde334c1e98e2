#include "postgres/admin.hpp"

#include <algorithm>
#include <stdexcept>

#include "postgres/session.hpp"

namespace outbox::pg {

StatusReport query_status(const std::string& url, const std::string& table) {
  try {
    auto conn = open_session(url, "status");
    pqxx::read_transaction tx(*conn);
    const auto rows = tx.exec(
        "SELECT topic, count(*) FILTER (WHERE dead_lettered_at IS NULL), "
        "  coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE dead_lettered_at IS NULL)), 0)::float8, "
        "  count(*) FILTER (WHERE dead_lettered_at IS NOT NULL) "
        "FROM " + table + " WHERE processed_at IS NULL GROUP BY topic ORDER BY topic");
    StatusReport report;
    for (const auto& row : rows) {
      TopicStatus t;
      t.topic = row[0].as<std::string>();
      t.pending = row[1].as<long long>();
      t.oldest_pending_age_seconds = row[2].as<double>();
      t.dead_lettered = row[3].as<long long>();
      report.pending += t.pending;
      report.dead_lettered += t.dead_lettered;
      report.oldest_pending_age_seconds = std::max(report.oldest_pending_age_seconds, t.oldest_pending_age_seconds);
      report.topics.push_back(std::move(t));
    }
    return report;
  } catch (const std::exception& e) {
    throw std::runtime_error("status failed: " + describe_error(e));
  }
}

}  // namespace outbox::pg
