#pragma once
// Topic routing: glob patterns to sink indexes. Pure.
#include <cstddef>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace outbox {

// Shell-style glob: '*' matches any run of characters (dots included), '?' one character.
bool glob_match(std::string_view pattern, std::string_view text);

struct Route {
  std::vector<std::string> topics;  // glob patterns
  std::vector<std::size_t> sinks;   // indexes into the sink list
};

class Router {
 public:
  // With no routes, every topic goes to every sink.
  Router(std::vector<Route> routes, std::size_t sink_count);
  // The sinks for a topic, in sink-list order, without duplicates. Empty: no route matches.
  std::vector<std::size_t> sinks_for(const std::string& topic) const;

 private:
  std::vector<Route> routes_;
  std::size_t sink_count_;
  std::vector<std::size_t> all_;
  mutable std::unordered_map<std::string, std::vector<std::size_t>> cache_;  // loop thread only
};

}  // namespace outbox
