#pragma once
// Operator queries: status now; failed/replay tools build on the same session helpers.
#include <string>
#include <vector>

namespace outbox::pg {

struct TopicStatus {
  std::string topic;
  long long pending = 0;
  double oldest_pending_age_seconds = 0;  // 0 when nothing is pending
  long long dead_lettered = 0;
};

struct StatusReport {
  std::vector<TopicStatus> topics;
  long long pending = 0;
  double oldest_pending_age_seconds = 0;
  long long dead_lettered = 0;
};

// Throws std::runtime_error (password masked).
StatusReport query_status(const std::string& url, const std::string& table);

}  // namespace outbox::pg
