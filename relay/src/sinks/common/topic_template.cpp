#include "sinks/common/topic_template.hpp"

#include <string_view>

namespace outbox::sinks {

std::string render_topic_template(const std::string& text, const std::string& topic) {
  constexpr std::string_view kPlaceholder = "{topic}";
  std::string out;
  out.reserve(text.size() + topic.size());
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t at = text.find(kPlaceholder, i);
    if (at == std::string::npos) {
      out.append(text, i);
      break;
    }
    out.append(text, i, at - i);
    out += topic;
    i = at + kPlaceholder.size();
  }
  return out;
}

}  // namespace outbox::sinks
