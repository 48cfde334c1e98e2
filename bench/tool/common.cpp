#include "common.hpp"

#include <sys/resource.h>

namespace bench {

double self_cpu_seconds() {
  double total = 0;
  for (int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {
    rusage u{};
    getrusage(who, &u);
    total += static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
             static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  }
  return total;
}

namespace {
const char* kPayloadExpr =
    "'order_id', g, 'amount_cents', 1000 + g % 9000, 'currency', 'EUR', 'status', 'paid', "
    "'customer', 'customer-' || (g % 977)";
}

std::string relay_seed_sql(long long count) {
  return "INSERT INTO outbox_events (topic, aggregate_id, payload) "
         "SELECT 'order.paid', 'order-' || (g % 10000), jsonb_build_object(" +
         std::string(kPayloadExpr) +
         ") "
         "FROM generate_series(1, " +
         std::to_string(count) + ") AS g";
}

std::string peer_seed_sql(long long count) {
  return "SELECT count(*) FROM graphile_worker.add_jobs(("
         "  SELECT array_agg(ROW('noop', json_build_object(" +
         std::string(kPayloadExpr) +
         "), "
         "                       NULL, NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec ORDER BY g) "
         "  FROM generate_series(1, " +
         std::to_string(count) + ") AS g))";
}

}  // namespace bench
