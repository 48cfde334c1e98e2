#include "sinks/factory.hpp"

#include "sinks/file/file_sink.hpp"
#include "sinks/kafka/kafka_sink.hpp"
#include "sinks/webhook/webhook_sink.hpp"

namespace outbox::sinks {
namespace {

template <class... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};

}  // namespace

std::unique_ptr<Sink> make_sink(const config::SinkConfig& config) {
  return std::visit(
      Overloaded{
          [&](const StdoutSinkConfig&) -> std::unique_ptr<Sink> { return std::make_unique<StdoutSink>(config.name); },
          [&](const FileSinkConfig& c) -> std::unique_ptr<Sink> { return std::make_unique<FileSink>(config.name, c); },
          [&](const WebhookSinkConfig& c) -> std::unique_ptr<Sink> { return std::make_unique<WebhookSink>(config.name, c); },
          [&](const KafkaSinkConfig& c) -> std::unique_ptr<Sink> { return std::make_unique<KafkaSink>(config.name, c); },
      },
      config.settings);
}

}  // namespace outbox::sinks
