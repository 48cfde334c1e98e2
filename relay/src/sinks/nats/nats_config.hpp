#pragma once
// type: nats (JetStream). The sink's typed settings and its strict YAML reader. No nats.c types
// here.
#include <chrono>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace outbox::config {
class Section;
}

namespace outbox::sinks {

// What a publish that no stream answers (NATS "no responders": no stream captures the subject)
// means for the event.
enum class NatsNoStream {
  kRetry,      // default: a stream being created, a JetStream server restarting or a cluster
               // electing a leader are passing states; retry with backoff (max_attempts still ends it)
  kPermanent,  // dead-letter at once: nothing will ever create the stream on its own
};

constexpr int kMaxNatsInFlight = 65'536;

struct NatsSinkConfig {
  // "nats://[user:password@]host:port", several separated by commas (one cluster). tls:// asks
  // for TLS (the system's CA store). Required.
  std::string url;
  // url with the password (or a token) replaced by *****, for logs and errors.
  std::string url_for_logs;
  // The subject for an event: subject characters plus the placeholder {topic}, the row's topic.
  // E.g. "outbox.{topic}". Checked at startup; a rendered subject is checked per event.
  std::string subject = "{topic}";
  // A batch's PubAcks are awaited this long from its submit(); events still without one then
  // retry. Also the connect timeout.
  std::chrono::milliseconds timeout{5'000};
  // Publishes without a PubAck yet, at most, of every batch in the sink (different keys; one key
  // has at most one).
  int max_in_flight = 1'024;
  NatsNoStream no_stream = NatsNoStream::kRetry;
  // The config path of this sink (e.g. "sinks[1]"), for errors that name the key.
  std::string key_path;
};

// Reads url, subject, timeout, max_in_flight and no_stream from a sink entry. Registers the URL's
// password or token with the log redactor before anything can echo it. Throws config::ConfigError.
NatsSinkConfig parse_nats_sink(config::Section& section);

// The effective settings for the startup log, credentials as *****.
nlohmann::json describe_nats_sink(const NatsSinkConfig& config);

// The URL check the parser applies: nullopt when valid, else what is wrong (never the URL itself).
// Fills url_for_logs and secrets (passwords and tokens found) when given.
std::optional<std::string> check_nats_url(const std::string& url, std::string* url_for_logs = nullptr,
                                          std::vector<std::string>* secrets = nullptr);

// The template check the parser applies: nullopt when valid, else what is wrong.
std::optional<std::string> check_subject_template(const std::string& t);

// The subject for an event: every {topic} replaced by event_topic.
std::string render_subject(const std::string& subject_template, const std::string& event_topic);

// NATS's rule for a subject one publishes to: tokens separated by '.', none empty, no whitespace
// or control characters, no wildcard token ('*' or '>').
bool valid_nats_subject(const std::string& subject);

// A header NATS can carry: a name of printable ASCII without ':' or spaces, a value without CR
// or LF.
bool valid_nats_header_name(const std::string& name);
bool valid_nats_header_value(const std::string& value);
// The row headers the sink never passes on (Sink::reserves_header): outbox-*, Nats-* (they steer
// JetStream: Nats-Msg-Id, which the sink sets, Nats-Expected-*, Nats-Rollup, ...) and ce-*
// (CloudEvents' NATS binding). Any case.
bool is_reserved_nats_header(std::string_view name);

}  // namespace outbox::sinks
