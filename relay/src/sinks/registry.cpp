#include "sinks/registry.hpp"

#include <memory>

namespace outbox::sinks {

// Each row is defined in its sink's folder (sinks/<type>/<type>_type.cpp).
SinkType stdout_sink_type();
SinkType file_sink_type();
SinkType webhook_sink_type();
SinkType kafka_sink_type();
SinkType redis_sink_type();
SinkType nats_sink_type();
SinkType rabbitmq_sink_type();

const std::vector<SinkType>& sink_types() {
  // One line per sink type (its folder defines the row).
  static const std::vector<SinkType> kTypes{
      stdout_sink_type(), file_sink_type(), webhook_sink_type(),  kafka_sink_type(),
      redis_sink_type(),  nats_sink_type(), rabbitmq_sink_type(),
  };
  return kTypes;
}

std::vector<std::string> sink_type_names() {
  std::vector<std::string> names;
  for (const auto& t : sink_types()) names.push_back(t.name);
  return names;
}

namespace {

PreparedSink prepare_sink(const config::SinkConfig& entry, const std::string& default_cloudevents_source) {
  config::Section section(entry.section, entry.path, entry.env);
  section.required_string("name");  // checked by config/
  const std::string type = section.choice_or("type", "", sink_type_names());
  if (type.empty()) {
    std::string all;
    for (const auto& t : sink_type_names()) all += (all.empty() ? "" : ", ") + t;
    throw config::ConfigError(section.key_path("type") + ": required, expected one of: " + all);
  }
  Envelope envelope;
  if (section.choice_or("format", "json", {"json", "cloudevents"}) == "cloudevents") {
    envelope.format = EnvelopeFormat::kCloudEvents;
  }
  envelope.source = section.string_or("cloudevents_source", default_cloudevents_source);
  if (envelope.source.empty()) {
    throw config::ConfigError(section.key_path("cloudevents_source") + ": must not be empty");
  }
  PreparedSink prepared;
  for (const auto& t : sink_types()) {
    if (t.name == type) prepared = {entry.name, type, t.parse(section, envelope)};
  }
  section.finish();
  return prepared;
}

}  // namespace

std::vector<PreparedSink> prepare_sinks(const config::Config& config, const std::string& default_cloudevents_source,
                                        std::vector<std::string>* errors) {
  std::vector<PreparedSink> prepared;
  for (const auto& entry : config.sinks) {
    config::collect_errors(errors, [&] { prepared.push_back(prepare_sink(entry, default_cloudevents_source)); });
  }
  return prepared;
}

nlohmann::json describe(const std::vector<PreparedSink>& sinks) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : sinks) {
    nlohmann::json j{{"name", s.name}, {"type", s.type}};
    j.update(s.spec->describe());
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace outbox::sinks
