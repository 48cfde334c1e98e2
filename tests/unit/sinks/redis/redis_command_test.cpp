// The redis sink's RESP formatting: byte for byte what hiredis's redisFormatCommandArgv writes.
#include <doctest/doctest.h>
#include <hiredis/hiredis.h>

#include <string>
#include <string_view>
#include <vector>

#include "sinks/redis/redis_connection.hpp"

namespace {

std::string hiredis_format(const std::vector<std::string_view>& args) {
  std::vector<const char*> argv;
  std::vector<std::size_t> lengths;
  for (const auto& a : args) {
    argv.push_back(a.data());
    lengths.push_back(a.size());
  }
  char* command = nullptr;
  const int n = redisFormatCommandArgv(&command, static_cast<int>(argv.size()), argv.data(), lengths.data());
  REQUIRE(n > 0);
  std::string out(command, static_cast<std::size_t>(n));
  redisFreeCommand(command);
  return out;
}

}  // namespace

TEST_CASE("redis append_command writes what hiredis writes, binary-safe") {
  using namespace std::string_literals;
  const std::string binary = "a\r\nb\0c"s;
  const std::vector<std::vector<std::string_view>> commands{
      {"PING"},
      {"MULTI"},
      {"XADD", "outbox.order", "MAXLEN", "~", "1000", "*", "id", "42", "payload", R"({"n":1})", "headers", "{}"},
      {"XADD", "s", "*", "empty", ""},
      {"SET", "k", binary},
  };
  std::string ours, theirs;
  for (const auto& c : commands) {
    std::string one;
    outbox::sinks::redis::append_command(one, c);
    CHECK(one == hiredis_format(c));
    ours += one;
    theirs += hiredis_format(c);
  }
  CHECK(ours == theirs);  // appended, not replaced
}
