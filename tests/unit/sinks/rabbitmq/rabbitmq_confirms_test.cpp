// The RabbitMQ sink's delivery tags: two submissions' publishes interleaved on one channel, each
// basic.ack / basic.nack (single or multiple) mapped to the event it confirms.
#include <doctest/doctest.h>

#include <vector>

#include "sinks/rabbitmq/rabbitmq_confirms.hpp"

using outbox::sinks::rabbitmq::Confirms;
using outbox::sinks::rabbitmq::Publish;

namespace {

std::vector<Publish> confirm(Confirms& c, std::uint64_t tag, bool multiple) {
  std::vector<Publish> out;
  c.confirm(tag, multiple, [&](Publish p) { out.push_back(p); });
  return out;
}

}  // namespace

TEST_CASE("rabbitmq confirms: tags count the publishes of every submission on the channel, from 1") {
  Confirms c;
  CHECK(c.add({1, 0}) == 1);
  CHECK(c.add({1, 1}) == 2);
  CHECK(c.add({2, 0}) == 3);  // the next batch, submitted while the first is unconfirmed
  CHECK(c.add({1, 2}) == 4);  // the first batch's next event of a key, after its predecessor's ack
  CHECK(c.add({2, 1}) == 5);
  CHECK(c.outstanding() == 5);

  // A single ack in the middle confirms that publish only.
  CHECK(confirm(c, 3, false) == std::vector<Publish>{{2, 0}});
  CHECK(c.outstanding() == 4);
  // A multiple ack confirms everything up to its tag not confirmed yet, in tag order.
  CHECK(confirm(c, 4, true) == std::vector<Publish>{{1, 0}, {1, 1}, {1, 2}});
  CHECK(c.outstanding() == 1);
  // Answered before, or never sent: ignored.
  CHECK(confirm(c, 2, false).empty());
  CHECK(confirm(c, 4, true).empty());
  CHECK(confirm(c, 9, false).empty());
  CHECK(confirm(c, 0, true).empty());
  CHECK(confirm(c, 5, true) == std::vector<Publish>{{2, 1}});
  CHECK(c.outstanding() == 0);
  CHECK(c.add({3, 0}) == 6);  // the channel's numbering goes on
}

TEST_CASE("rabbitmq confirms: a lost channel hands back every unconfirmed publish in tag order; the next starts at 1") {
  Confirms c;
  for (std::size_t i = 0; i < 4; ++i) c.add({7, i});
  c.add({8, 0});
  CHECK(confirm(c, 2, false) == std::vector<Publish>{{7, 1}});
  CHECK(c.take_all() == std::vector<Publish>{{7, 0}, {7, 2}, {7, 3}, {8, 0}});
  CHECK(c.outstanding() == 0);
  CHECK(confirm(c, 3, true).empty());  // a late answer of the old channel's numbering
  CHECK(c.add({9, 0}) == 1);
  CHECK(confirm(c, 1, false) == std::vector<Publish>{{9, 0}});
}
