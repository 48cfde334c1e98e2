#pragma once
// type: redis. The Redis Streams sink's typed settings and its strict YAML reader. No hiredis or
// OpenSSL types here.
//   url: redis://[user[:password]@]host[:port][/db]   required; rediss:// for TLS
//   stream: "outbox.{topic}"      the stream key; {topic} is the row's topic (default "{topic}")
//   maxlen: 1000000               optional: XADD ... MAXLEN ~ N (approximate trimming)
//   timeout: 5s                   bounds connecting and each batch (100ms..10m)
//   tls: {ca_file, cert_file, key_file, insecure_skip_verify}   only with rediss://
#include <chrono>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

#include "sinks/tls_client.hpp"

namespace outbox::config {
class Section;
}

namespace outbox::sinks {

struct RedisSinkConfig {
  std::string url;           // as configured; may carry a password: log url_for_logs instead
  std::string url_for_logs;  // url with the password replaced by *****
  bool tls = false;          // rediss://
  std::string host;          // without brackets for IPv6 literals
  int port = 6379;
  std::string username;  // empty: AUTH with the password only (the default user)
  std::string password;  // empty: no AUTH. Secret: registered with the log redactor
  int db = 0;            // SELECT db after connecting (from the URL path)
  // The stream key for an event: literal text plus the placeholder {topic}, the row's topic.
  std::string stream = "{topic}";
  std::optional<std::int64_t> maxlen;  // MAXLEN ~ N on every XADD
  std::chrono::milliseconds timeout{5'000};
  TlsFiles tls_files;
  std::string key_path;  // the config path of this sink (e.g. "sinks[1]"), for errors
};

// Reads url, stream, maxlen, timeout and tls from a sink entry. Throws config::ConfigError naming
// the key (never echoing the URL, which may hold a password). Registers the URL's password with
// log::add_secret before anything can log it.
RedisSinkConfig parse_redis_sink(config::Section& section);

// The effective settings for the startup log, the password masked as *****.
nlohmann::json describe_redis_sink(const RedisSinkConfig& config);

// The template check the parser applies: nullopt when valid, else what is wrong. Any text is a
// valid Redis key; only braces other than the placeholder {topic} are refused (a typo such as
// {topc} would otherwise become part of every key).
std::optional<std::string> check_stream_template(const std::string& t);

// The stream key for an event topic: every {topic} replaced by event_topic.
std::string render_stream(const std::string& stream_template, const std::string& event_topic);

}  // namespace outbox::sinks
