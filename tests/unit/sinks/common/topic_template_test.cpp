// The {topic} placeholder of the sinks' destination templates (sinks/common/topic_template.hpp).
#include <doctest/doctest.h>

#include "sinks/common/topic_template.hpp"

using namespace outbox::sinks;

TEST_CASE("topic template: every {topic} is replaced, the rest is kept, the topic is not scanned again") {
  CHECK(render_topic_template("outbox.{topic}", "orders") == "outbox.orders");
  CHECK(render_topic_template("{topic}.{topic}", "a") == "a.a");
  CHECK(render_topic_template("fixed", "orders") == "fixed");
  CHECK(render_topic_template("{topic}", "") == "");
  CHECK(render_topic_template("x{topic", "orders") == "x{topic");
  CHECK(render_topic_template("{topic}", "{topic}") == "{topic}");
}
