#pragma once
// Small helpers shared by the benchmark commands. Everything here runs on 127.0.0.1 against the
// benchmark's own throwaway cluster.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace bench {

using Json = nlohmann::json;
using Steady = std::chrono::steady_clock;

inline double seconds(Steady::duration d) { return std::chrono::duration<double>(d).count(); }
inline double millis(Steady::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Nearest-rank percentile of an unsorted sample (q in [0, 1]); NaN for an empty sample.
inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::clamp<std::size_t>(rank, 1, v.size()) - 1];
}

inline double round_to(double x, int digits) {
  const double f = std::pow(10.0, digits);
  return std::round(x * f) / f;
}

// CPU seconds (user + system) this process and its reaped children used so far.
double self_cpu_seconds();

// The events the drains work on: one statement, so the relay gets one NOTIFY at most.
// Payload ~90 bytes of JSON, 10,000 distinct keys (the ordering lanes all get work).
std::string relay_seed_sql(long long count);
// The same payloads as graphile-worker jobs of the task 'noop', inserted with add_jobs().
std::string peer_seed_sql(long long count);

}  // namespace bench
