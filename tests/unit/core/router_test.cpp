#include <doctest/doctest.h>

#include "core/router.hpp"

using outbox::glob_match;
using outbox::Route;
using outbox::Router;

TEST_CASE("glob patterns") {
  CHECK(glob_match("order.*", "order.paid"));
  CHECK(glob_match("order.*", "order."));
  CHECK_FALSE(glob_match("order.*", "orders.paid"));
  CHECK(glob_match("*", "anything.at.all"));
  CHECK(glob_match("*.paid", "order.paid"));
  CHECK(glob_match("a*b*c", "axxbyyc"));
  CHECK_FALSE(glob_match("a*b*c", "axxbyy"));
  CHECK(glob_match("order.?aid", "order.paid"));
  CHECK_FALSE(glob_match("order.paid", "order.paid2"));
  CHECK(glob_match("", ""));
  CHECK_FALSE(glob_match("", "x"));
}

TEST_CASE("no routes: every topic to every sink") {
  Router r({}, 3);
  CHECK(r.sinks_for("x") == std::vector<std::size_t>{0, 1, 2});
}

TEST_CASE("routes: union of matching routes, in sink order, no duplicates; unmatched is empty") {
  Router r({Route{{"order.*"}, {2, 0}}, Route{{"*.paid", "user.*"}, {0, 1}}}, 3);
  CHECK(r.sinks_for("order.paid") == std::vector<std::size_t>{0, 1, 2});
  CHECK(r.sinks_for("order.created") == std::vector<std::size_t>{0, 2});
  CHECK(r.sinks_for("user.created") == std::vector<std::size_t>{0, 1});
  CHECK(r.sinks_for("invoice.sent").empty());
  CHECK(r.sinks_for("order.created") == std::vector<std::size_t>{0, 2});  // cached answer
}
