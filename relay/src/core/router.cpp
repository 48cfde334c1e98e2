#include "core/router.hpp"

#include <algorithm>

namespace outbox {

bool glob_match(std::string_view pattern, std::string_view text) {
  // Iterative matcher with single backtrack point: linear in practice, no recursion.
  std::size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

Router::Router(std::vector<Route> routes, std::size_t sink_count)
    : routes_(std::move(routes)), sink_count_(sink_count) {
  for (std::size_t i = 0; i < sink_count_; ++i) all_.push_back(i);
}

std::vector<std::size_t> Router::sinks_for(const std::string& topic) const {
  if (routes_.empty()) return all_;
  if (auto it = cache_.find(topic); it != cache_.end()) return it->second;
  std::vector<bool> hit(sink_count_, false);
  for (const auto& route : routes_) {
    const bool matches = std::any_of(route.topics.begin(), route.topics.end(),
                                     [&](const std::string& g) { return glob_match(g, topic); });
    if (!matches) continue;
    for (std::size_t s : route.sinks) hit[s] = true;
  }
  std::vector<std::size_t> sinks;
  for (std::size_t i = 0; i < sink_count_; ++i) {
    if (hit[i]) sinks.push_back(i);
  }
  if (cache_.size() < 4096) cache_.emplace(topic, sinks);  // bound memory if topics are unbounded
  return sinks;
}

}  // namespace outbox
