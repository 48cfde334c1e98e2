#include "config/config.hpp"

#include <yaml-cpp/yaml.h>
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <sstream>

#include "config/duration.hpp"

namespace outbox::config {
namespace {

DatabaseConfig parse_database(Section& s) {
  DatabaseConfig c;
  c.url = s.string_or("url", "");
  c.channel = s.string_or("channel", c.channel);
  c.table = s.string_or("table", c.table);
  c.roles = s.string_or("roles", c.roles);
  if (auto b = s.section("reconnect")) {
    c.reconnect.initial = b->duration_or("initial", c.reconnect.initial);
    c.reconnect.max = b->duration_or("max", c.reconnect.max);
    if (c.reconnect.initial < std::chrono::milliseconds{1}) {
      throw ConfigError(b->key_path("initial") + ": expected a duration of at least 1ms, got " +
                        format_duration(c.reconnect.initial));
    }
    if (c.reconnect.max < c.reconnect.initial) {
      throw ConfigError(b->key_path("max") + ": must not be shorter than " + b->key_path("initial"));
    }
    b->finish();
  }
  static const std::regex kIdentifier("[a-z_][a-z0-9_]{0,62}");
  if (!std::regex_match(c.channel, kIdentifier)) {
    throw ConfigError(s.key_path("channel") + ": expected a lower-case SQL identifier, got '" + c.channel + "'");
  }
  static const std::regex kRolePrefix("[a-z_][a-z0-9_]{0,55}");  // + "_writer" fits Postgres's 63
  if (!std::regex_match(c.roles, kRolePrefix)) {
    throw ConfigError(s.key_path("roles") + ": expected a lower-case SQL identifier of at most 56 characters, got '" +
                      c.roles + "'");
  }
  check_table_name(c.table, s.key_path("table"));
  s.finish();
  return c;
}

RelaySection parse_relay(Section& s) {
  RelaySection c;
  c.batch_size_given = s.has("batch_size");
  c.batch_size = static_cast<std::size_t>(s.integer_or("batch_size", static_cast<long long>(c.batch_size), 1, 10'000));
  c.in_flight_bytes = static_cast<std::size_t>(
      s.integer_or("in_flight_bytes", static_cast<long long>(c.in_flight_bytes), 1LL << 20, 64LL << 30));
  c.lease = s.duration_or("lease", c.lease);
  c.writer_hold_warning = s.duration_or("writer_hold_warning", c.writer_hold_warning);
  c.sweep_interval = s.duration_or("sweep_interval", c.sweep_interval);
  c.poll_interval = s.duration_or("poll_interval", c.poll_interval);
  c.idle_poll_interval = s.duration_or("idle_poll_interval", c.idle_poll_interval);
  // Left out: 8ms, within [poll_interval, idle_poll_interval] (an inverted pair is refused below).
  c.light_poll_interval = s.duration_or(
      "light_poll_interval",
      std::clamp(c.light_poll_interval, c.poll_interval, std::max(c.poll_interval, c.idle_poll_interval)));
  for (const auto& [key, value] : {std::pair{"poll_interval", c.poll_interval},
                                   {"light_poll_interval", c.light_poll_interval},
                                   {"idle_poll_interval", c.idle_poll_interval}}) {
    if (value < std::chrono::milliseconds{1} || value > std::chrono::milliseconds{10'000}) {
      throw ConfigError(s.key_path(key) + ": expected a duration from 1ms to 10s, got " + format_duration(value));
    }
  }
  if (c.light_poll_interval < c.poll_interval) {
    throw ConfigError(s.key_path("light_poll_interval") + ": must not be shorter than " + s.key_path("poll_interval"));
  }
  if (c.idle_poll_interval < c.poll_interval) {
    throw ConfigError(s.key_path("idle_poll_interval") + ": must not be shorter than " + s.key_path("poll_interval"));
  }
  if (c.light_poll_interval > c.idle_poll_interval) {
    throw ConfigError(s.key_path("light_poll_interval") + ": must not be longer than " +
                      s.key_path("idle_poll_interval"));
  }
  c.light_poll_events = static_cast<int>(s.integer_or("light_poll_events", c.light_poll_events, 1, 10'000));
  c.idle_watch = s.boolean_or("idle_watch", c.idle_watch);
  c.max_attempts = static_cast<int>(s.integer_or("max_attempts", c.max_attempts, 1, 1'000'000));
  if (auto b = s.section("backoff")) {
    c.backoff.initial = b->duration_or("initial", c.backoff.initial);
    c.backoff.max = b->duration_or("max", c.backoff.max);
    if (c.backoff.max < c.backoff.initial) {
      throw ConfigError(b->key_path("max") + ": must not be shorter than " + b->key_path("initial"));
    }
    b->finish();
  }
  c.on_success =
      s.choice_or("on_success", "mark", {"mark", "delete"}) == "delete" ? OnSuccess::kDelete : OnSuccess::kMark;
  c.shutdown_timeout = s.duration_or("shutdown_timeout", c.shutdown_timeout);
  c.rebalance_interval = s.duration_or("rebalance_interval", c.rebalance_interval);
  c.instance_id = s.string_or("instance_id", "");
  if (auto retention = s.optional_string("retention"); retention && *retention != "off") {
    c.retention = parse_duration(*retention);
    if (!c.retention || *c.retention < std::chrono::seconds{1}) {
      throw ConfigError(s.key_path("retention") +
                        ": expected a duration of at least 1s such as 168h or 7d, or off, got '" + *retention + "'");
    }
  }
  c.retention_interval = s.duration_or("retention_interval", c.retention_interval);
  if (c.retention_interval < std::chrono::seconds{1}) {
    throw ConfigError(s.key_path("retention_interval") + ": must be at least 1s, got " +
                      format_duration(c.retention_interval));
  }
  for (const auto& [key, value] : {std::pair{"lease", c.lease},
                                   {"sweep_interval", c.sweep_interval},
                                   {"rebalance_interval", c.rebalance_interval}}) {
    if (value < std::chrono::milliseconds{100}) {
      throw ConfigError(s.key_path(key) + ": must be at least 100ms, got " + format_duration(value));
    }
  }
  s.finish();
  return c;
}

HttpConfig parse_http(Section& s) {
  HttpConfig c;
  c.enabled = s.boolean_or("enabled", c.enabled);
  c.listen = s.string_or("listen", c.listen);
  static const std::regex kListen("(\\[[0-9a-fA-F:.]+\\]|[A-Za-z0-9.-]+):[0-9]{1,5}");
  if (!std::regex_match(c.listen, kListen) || std::stoi(c.listen.substr(c.listen.rfind(':') + 1)) > 65535) {
    throw ConfigError(s.key_path("listen") + ": expected host:port such as 127.0.0.1:9187, got '" + c.listen + "'");
  }
  c.refresh_interval = s.duration_or("refresh_interval", c.refresh_interval);
  if (c.refresh_interval < std::chrono::milliseconds{100}) {
    throw ConfigError(s.key_path("refresh_interval") + ": must be at least 100ms, got " +
                      format_duration(c.refresh_interval));
  }
  s.finish();
  return c;
}

TracingConfig parse_tracing(Section& s) {
  TracingConfig c;
  c.otlp_endpoint = s.string_or("otlp_endpoint", "");
  // Credentials belong in headers (secret), never in the URL (which is logged).
  static const std::regex kEndpoint("https?://[^/@?#\\s]+(/[^?#\\s]*)?");
  if (!c.otlp_endpoint.empty() && !std::regex_match(c.otlp_endpoint, kEndpoint)) {
    throw ConfigError(s.key_path("otlp_endpoint") +
                      ": expected an http:// or https:// URL such as http://127.0.0.1:4318 (no user or password: "
                      "put credentials in tracing.headers), got '" +
                      c.otlp_endpoint + "'");
  }
  static const std::regex kHeaderName("[A-Za-z0-9!#$%&'*+.^_`|~-]+");
  for (auto& [name, value] : s.string_map("headers")) {
    const std::string key = s.key_path("headers") + "." + name;
    if (!std::regex_match(name, kHeaderName)) {
      throw ConfigError(key + ": not a valid HTTP header name (letters, digits and !#$%&'*+-.^_`|~ only)");
    }
    if (value.find_first_of(std::string("\r\n\0", 3)) != std::string::npos) {
      throw ConfigError(key + ": header values must not contain CR, LF or NUL");
    }
    if (name.size() == 12 && std::equal(name.begin(), name.end(), "content-type", [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) == b;
        })) {
      throw ConfigError(key + ": the exporter sets content-type itself (application/json)");
    }
    c.headers.emplace(name, std::move(value));
  }
  c.timeout = s.duration_or("timeout", c.timeout, std::chrono::milliseconds{10}, std::chrono::milliseconds{60'000});
  c.queue_size =
      static_cast<std::size_t>(s.integer_or("queue_size", static_cast<long long>(c.queue_size), 1, 1'000'000));
  c.batch_size = static_cast<std::size_t>(s.integer_or("batch_size", static_cast<long long>(c.batch_size), 1, 100'000));
  if (c.batch_size > c.queue_size) {
    throw ConfigError(s.key_path("batch_size") + ": must not be larger than " + s.key_path("queue_size") + " (" +
                      std::to_string(c.queue_size) + "), got " + std::to_string(c.batch_size));
  }
  c.export_interval = s.duration_or("export_interval", c.export_interval, std::chrono::milliseconds{10},
                                    std::chrono::milliseconds{60'000});
  c.service_name = s.string_or("service_name", c.service_name);
  if (c.service_name.empty()) throw ConfigError(s.key_path("service_name") + ": expected a non-empty name");
  c.root_spans = s.boolean_or("root_spans", c.root_spans);
  s.finish();
  return c;
}

// A YAML value as JSON, every scalar interpolated (as written where that fails: the sink's own
// parse names the error) and mappings sorted by key.
nlohmann::json canonical(const YAML::Node& node, const std::string& key, const EnvLookup& env) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar: try { return interpolate(node.Scalar(), key, env);
      } catch (const ConfigError&) {
        return node.Scalar();
      }
    case YAML::NodeType::Sequence: {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& item : node) out.push_back(canonical(item, key, env));
      return out;
    }
    case YAML::NodeType::Map: {
      nlohmann::json out = nlohmann::json::object();  // sorted: the order keys are written in does not count
      for (const auto& kv : node) {
        const std::string name = kv.first.IsScalar() ? kv.first.Scalar() : YAML::Dump(kv.first);
        out[name] = canonical(kv.second, key + "." + name, env);
      }
      return out;
    }
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: return nullptr;
  }
  return nullptr;
}

SinkConfig parse_sink(Section& s, std::set<std::string>& names, const EnvLookup& env) {
  SinkConfig c;
  c.name = s.required_string("name");
  static const std::regex kName("[A-Za-z0-9_.-]{1,64}");
  if (!std::regex_match(c.name, kName)) {
    throw ConfigError(s.key_path("name") + ": expected letters, digits, '_', '-' or '.', got '" + c.name + "'");
  }
  if (!names.insert(c.name).second) {
    throw ConfigError(s.key_path("name") + ": duplicate sink name '" + c.name + "'");
  }
  c.type = s.string_or("type", "");
  c.section = s.node();
  c.path = s.path();
  c.env = env;
  c.fingerprint = canonical(*c.section, c.path, env).dump();
  return c;  // the rest of the entry is the registry's (no finish() here)
}

}  // namespace

void check_table_name(const std::string& table, const std::string& key) {
  static const std::regex kTable("([a-z_][a-z0-9_]{0,62}\\.)?[a-z_][a-z0-9_]{0,62}");
  if (!std::regex_match(table, kTable)) {
    throw ConfigError(key + ": expected a lower-case table name (optionally schema.table), got '" + table + "'");
  }
}

std::string table_option(const std::string& value) {
  std::string name = value;
  if (name.size() >= 2 && (name.front() == '"' || name.front() == '\'') && name.back() == name.front()) {
    name = name.substr(1, name.size() - 2);
  }
  check_table_name(name, "--table");
  return name;
}

namespace {

RouteConfig parse_route(Section& s, const std::set<std::string>& names) {
  RouteConfig r;
  r.topics = s.string_list("topics");
  r.sinks = s.string_list("sinks");
  if (r.topics.empty()) throw ConfigError(s.key_path("topics") + ": expected a non-empty list of topic patterns");
  if (r.sinks.empty()) throw ConfigError(s.key_path("sinks") + ": expected a non-empty list of sink names");
  for (std::size_t i = 0; i < r.sinks.size(); ++i) {
    if (!names.count(r.sinks[i])) {
      std::string all;
      for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
      throw ConfigError(s.key_path("sinks") + "[" + std::to_string(i) + "]: unknown sink '" + r.sinks[i] +
                        "' (sinks defined: " + all + ")");
    }
  }
  s.finish();
  return r;
}

}  // namespace

Config parse_config(const std::string& yaml_text, const EnvLookup& env, const std::string& database_url_override,
                    std::vector<std::string>* errors) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(std::string("config: not valid YAML: ") + e.what());
  }
  Section top(std::make_shared<YAML::Node>(root), "", env);
  Config c;
  const bool database_read = collect_errors(errors, [&] {
    if (auto s = top.section("database")) c.database = parse_database(*s);
  });
  collect_errors(errors, [&] {
    if (auto s = top.section("relay")) c.relay = parse_relay(*s);
  });
  collect_errors(errors, [&] {
    if (auto s = top.section("http")) c.http = parse_http(*s);
  });
  collect_errors(errors, [&] {
    if (auto s = top.section("log")) {
      c.log_level = s->choice_or("level", c.log_level, {"debug", "info", "warn", "error"});
      s->finish();
    }
  });
  collect_errors(errors, [&] {
    if (auto s = top.section("tracing")) c.tracing = parse_tracing(*s);
  });
  std::set<std::string> names;
  std::vector<Section> sinks, routes;
  collect_errors(errors, [&] { sinks = top.section_list("sinks"); });
  for (auto& s : sinks) collect_errors(errors, [&] { c.sinks.push_back(parse_sink(s, names, env)); });
  collect_errors(errors, [&] { routes = top.section_list("routes"); });
  for (auto& s : routes) collect_errors(errors, [&] { c.routes.push_back(parse_route(s, names)); });
  collect_errors(errors, [&] { top.finish(); });

  if (!database_url_override.empty()) {
    c.database.url = database_url_override;
  } else if (c.database.url.empty()) {
    c.database.url = env("DATABASE_URL").value_or("");
  }
  collect_errors(errors, [&] {
    if (c.database.url.empty() && database_read) {  // else the section's own error says why
      throw ConfigError(
          "database.url: required, but missing (set it in the file, pass --database-url or set DATABASE_URL)");
    }
  });
  return c;
}

std::string with_line(const std::string& yaml_text, const std::string& message) {
  const auto colon = message.find(": ");
  if (colon == std::string::npos) return message;
  YAML::Node node;
  try {
    node = YAML::Load(yaml_text);
  } catch (const YAML::Exception&) {
    return message;
  }
  // "sinks[1].brokers" -> sinks, 1, brokers; a key that is not there keeps its parent's line.
  const std::string path = message.substr(0, colon);
  std::optional<int> line;
  std::size_t pos = 0;
  while (pos < path.size() && node.IsDefined()) {
    const auto end = path.find_first_of(".[", pos + 1);
    std::string part = path.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    pos = end == std::string::npos ? path.size() : end;
    if (!part.empty() && part.front() == '.') part.erase(0, 1);
    YAML::Node next;
    if (!part.empty() && part.front() == '[') {
      if (!node.IsSequence()) break;
      const auto index = static_cast<std::size_t>(std::strtoull(part.c_str() + 1, nullptr, 10));
      if (index >= node.size()) break;
      next.reset(node[index]);
      line = next.Mark().line + 1;
    } else {
      if (!node.IsMap()) break;
      bool found = false;
      for (const auto& kv : node) {
        if (kv.first.IsScalar() && kv.first.Scalar() == part) {
          line = kv.first.Mark().line + 1;
          next.reset(kv.second);
          found = true;
          break;
        }
      }
      if (!found) break;
    }
    node.reset(next);
  }
  return line ? "line " + std::to_string(*line) + ": " + message : message;
}

Config load_config(const std::string& path, const EnvLookup& env, const std::string& database_url_override) {
  std::ifstream in(path);
  if (!in) throw ConfigError("--config: cannot read " + path);
  std::stringstream buf;
  buf << in.rdbuf();
  return parse_config(buf.str(), env, database_url_override);
}

nlohmann::json describe(const TracingConfig& c) {
  nlohmann::json headers = nlohmann::json::object();
  for (const auto& [name, value] : c.headers) headers[name] = "*****";
  return {{"otlp_endpoint", c.enabled() ? c.otlp_endpoint : "off"},
          {"headers", headers},
          {"timeout", format_duration(c.timeout)},
          {"queue_size", c.queue_size},
          {"batch_size", c.batch_size},
          {"export_interval", format_duration(c.export_interval)},
          {"service_name", c.service_name},
          {"root_spans", c.root_spans}};
}

nlohmann::json describe(const Config& c) {
  nlohmann::json sinks = nlohmann::json::array();
  for (const auto& s : c.sinks) sinks.push_back({{"name", s.name}, {"type", s.type}});
  nlohmann::json routes = nlohmann::json::array();
  for (const auto& r : c.routes) routes.push_back({{"topics", r.topics}, {"sinks", r.sinks}});
  return {{"database",
           {{"url", "*****"},
            {"channel", c.database.channel},
            {"table", c.database.table},
            {"roles", c.database.roles},
            {"reconnect",
             {{"initial", format_duration(c.database.reconnect.initial)},
              {"max", format_duration(c.database.reconnect.max)}}}}},
          {"relay",
           {{"batch_size", c.relay.batch_size},
            {"in_flight_bytes", c.relay.in_flight_bytes},
            {"lease", format_duration(c.relay.lease)},
            {"writer_hold_warning", format_duration(c.relay.writer_hold_warning)},
            {"sweep_interval", format_duration(c.relay.sweep_interval)},
            {"poll_interval", format_duration(c.relay.poll_interval)},
            {"light_poll_interval", format_duration(c.relay.light_poll_interval)},
            {"light_poll_events", c.relay.light_poll_events},
            {"idle_poll_interval", format_duration(c.relay.idle_poll_interval)},
            {"idle_watch", c.relay.idle_watch},
            {"max_attempts", c.relay.max_attempts},
            {"backoff",
             {{"initial", format_duration(c.relay.backoff.initial)}, {"max", format_duration(c.relay.backoff.max)}}},
            {"on_success", c.relay.on_success == OnSuccess::kDelete ? "delete" : "mark"},
            {"shutdown_timeout", format_duration(c.relay.shutdown_timeout)},
            {"rebalance_interval", format_duration(c.relay.rebalance_interval)},
            {"retention", c.relay.retention ? format_duration(*c.relay.retention) : "off"},
            {"retention_interval", format_duration(c.relay.retention_interval)}}},
          {"http",
           {{"enabled", c.http.enabled},
            {"listen", c.http.listen},
            {"refresh_interval", format_duration(c.http.refresh_interval)}}},
          {"tracing", describe(c.tracing)},
          {"sinks", sinks},
          {"routes", routes}};
}

}  // namespace outbox::config
