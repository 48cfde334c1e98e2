#include "sinks/factory.hpp"

#include "sinks/file/file_sink.hpp"

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
      },
      config.settings);
}

}  // namespace outbox::sinks
