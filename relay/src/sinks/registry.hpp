#pragma once
// The sink types this build knows. Each sink folder describes its type in one row (its name, how
// it parses its section of the config, how the start-up log shows it, how it is built) and
// registry.cpp lists the rows: a new sink is a new folder plus one line there. config/ keeps each
// sink's section as it was written and knows no sink type.
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "config/section.hpp"
#include "core/sink.hpp"
#include "sinks/envelope.hpp"

namespace outbox::sinks {

// One sink entry, parsed and checked: what the start-up log shows and how to build the sink.
class SinkSpec {
 public:
  virtual ~SinkSpec() = default;
  virtual nlohmann::json describe() const = 0;  // secrets masked
  virtual std::unique_ptr<Sink> make(const std::string& name) const = 0;
  // The relay.batch_size this sink asks for when the config leaves it out; 0: the relay's default.
  // A sink whose cost is per batch rather than per event asks for more (Kafka exactly once).
  virtual std::size_t preferred_batch_size() const { return 0; }
};

struct SinkType {
  std::string name;
  // Reads the type's keys from the entry (name, type, format and cloudevents_source are read
  // already: `envelope`); throws config::ConfigError naming the key.
  std::function<std::unique_ptr<SinkSpec>(config::Section&, const Envelope& envelope)> parse;
};

// The row of a sink whose settings are a plain struct: parse(section) -> Settings,
// describe(settings) -> JSON for the log, and the sink's factory make_sink(name, settings) (its
// folder's make_<type>_sink). A sink supports `format: cloudevents` by giving its Settings an
// `Envelope envelope` member; for the others that format is a config error naming `sinks[N].format`.
template <auto make_sink, class Settings>
SinkType sink_type(std::string name, Settings (*parse)(config::Section&), nlohmann::json (*describe)(const Settings&)) {
  class Spec final : public SinkSpec {
   public:
    Spec(Settings settings, nlohmann::json description)
        : settings_(std::move(settings)), description_(std::move(description)) {}
    nlohmann::json describe() const override { return description_; }
    std::unique_ptr<Sink> make(const std::string& sink_name) const override { return make_sink(sink_name, settings_); }
    std::size_t preferred_batch_size() const override {
      if constexpr (requires { settings_.preferred_batch_size(); }) {
        return settings_.preferred_batch_size();
      } else {
        return 0;
      }
    }

   private:
    Settings settings_;
    nlohmann::json description_;
  };
  return {name,
          [name, parse, describe](config::Section& section, const Envelope& envelope) -> std::unique_ptr<SinkSpec> {
            Settings settings = parse(section);
            if constexpr (requires { settings.envelope; }) {
              settings.envelope = envelope;
            } else if (envelope.format != EnvelopeFormat::kJson) {
              throw config::ConfigError(section.key_path("format") + ": the " + name +
                                        " sink supports only json, got 'cloudevents'");
            }
            nlohmann::json description = describe(settings);
            if (envelope.format == EnvelopeFormat::kCloudEvents) {
              description["format"] = "cloudevents";
              description["cloudevents_source"] = envelope.source;
            }
            return std::make_unique<Spec>(std::move(settings), std::move(description));
          }};
}

// Every type this build knows, in the order error messages list them.
const std::vector<SinkType>& sink_types();
std::vector<std::string> sink_type_names();

struct PreparedSink {
  std::string name;
  std::string type;
  std::unique_ptr<SinkSpec> spec;
};

// Parses every entry of config.sinks with its type's row, after the keys every sink has (format,
// cloudevents_source, which defaults to `default_cloudevents_source`: the app derives it from the
// database, app/run.hpp). Throws config::ConfigError naming the key (sinks[N].type for a type this
// build does not know, sinks[N].<key> for its settings). errors: when given, each sink's error is
// kept there and the other sinks are parsed on (`config check`).
std::vector<PreparedSink> prepare_sinks(const config::Config& config, const std::string& default_cloudevents_source,
                                        std::vector<std::string>* errors = nullptr);

// The sinks as the start-up log shows them: name, type and each type's description.
nlohmann::json describe(const std::vector<PreparedSink>& sinks);

}  // namespace outbox::sinks
