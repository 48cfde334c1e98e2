#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "config/section.hpp"
#include "sinks/file/file_sink.hpp"

using namespace outbox;
namespace fs = std::filesystem;

namespace {

Event sample(EventId id) {
  Event e;
  e.id = id;
  e.topic = "order.\"paid\"";
  e.key = "k\n1";
  e.payload = R"({"amount": 12.5, "items": [1, 2]})";
  e.headers_json = R"({"trace": "t-1"})";
  e.created_at = "2026-11-30T06:32:22.123456Z";
  return e;
}

std::string line_of(EventId id) {
  std::string line;
  sinks::append_json_line(sample(id), line);
  return line;
}

// A fresh, empty directory of this test process; removed by the destructor.
struct TempDir {
  fs::path path = fs::temp_directory_path() / ("outbox-file-sink-" + std::to_string(::getpid()));
  TempDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::permissions(path, fs::perms::owner_all, ignored);
    fs::remove_all(path, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

sinks::FileSinkConfig config_for(const fs::path& path) { return {path.string(), true, "sinks[3]", {}}; }

// The ConfigError message of constructing a file sink on path; empty if it opened.
std::string open_error(const fs::path& path) {
  try {
    const auto sink = sinks::make_file_sink("f", config_for(path));
    return {};
  } catch (const config::ConfigError& e) {
    return e.what();
  }
}

// open_error() as an unprivileged user. Root writes past permission bits, so as root it runs in a
// child process that dropped to uid/gid 65534 (nobody), as a relay run by a service user would.
std::string open_error_unprivileged(const fs::path& path) {
  if (::geteuid() != 0) return open_error(path);
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    const std::string error = open_error(path);
    const bool written = ::write(pipe_fds[1], error.data(), error.size()) == static_cast<ssize_t>(error.size());
    ::_exit(written ? 0 : 4);
  }
  ::close(pipe_fds[1]);
  std::string error;
  char chunk[512];
  for (ssize_t n; (n = ::read(pipe_fds[0], chunk, sizeof chunk)) > 0;) error.append(chunk, static_cast<std::size_t>(n));
  ::close(pipe_fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return error;
}

}  // namespace

TEST_CASE("a JSON line holds exactly id, topic, key, payload, headers, created_at") {
  const std::string line = line_of(7);
  REQUIRE(line.back() == '\n');
  const auto j = nlohmann::json::parse(line);
  CHECK(j.size() == 6);
  CHECK(j["id"] == 7);
  CHECK(j["topic"] == "order.\"paid\"");
  CHECK(j["key"] == "k\n1");
  CHECK(j["payload"]["items"][1] == 2);
  CHECK(j["headers"]["trace"] == "t-1");
  CHECK(j["created_at"] == "2026-11-30T06:32:22.123456Z");
}

TEST_CASE("a file sink that cannot open its file refuses at start, naming sinks[N].path and why") {
  const TempDir dir;
  const fs::path missing = dir.path / "not-yet" / "events.jsonl";
  CHECK(open_error(missing) ==
        "sinks[3].path: cannot open " + missing.string() + " for appending: No such file or directory");
  CHECK_FALSE(fs::exists(missing.parent_path()));

  write_file(dir.path / "a-file", "x");
  const fs::path under_a_file = dir.path / "a-file" / "events.jsonl";
  CHECK(open_error(under_a_file) ==
        "sinks[3].path: cannot open " + under_a_file.string() + " for appending: Not a directory");

  CHECK(open_error(dir.path) == "sinks[3].path: cannot open " + dir.path.string() + " for appending: Is a directory");

  // A directory that exists but the relay's user may not write to.
  const fs::path read_only = dir.path / "read-only";
  fs::create_directories(read_only);
  fs::permissions(read_only, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                                 fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  CHECK(open_error_unprivileged(read_only / "events.jsonl") ==
        "sinks[3].path: cannot open " + (read_only / "events.jsonl").string() + " for appending: Permission denied");
  CHECK_FALSE(fs::exists(read_only / "events.jsonl"));

  // Without a key path (a sink built outside a config file) the error names the sink.
  try {
    const auto sink = sinks::make_file_sink("audit", sinks::FileSinkConfig{missing.string(), true, "", {}});
    FAIL("opened a file in a missing directory");
  } catch (const config::ConfigError& e) {
    CHECK(std::string(e.what()).rfind("sink 'audit'.path: cannot open ", 0) == 0);
  }
}

TEST_CASE("the file sink creates its file at start and appends every event") {
  const TempDir dir;
  const fs::path path = dir.path / "events.jsonl";
  const auto sink = sinks::make_file_sink("f", config_for(path));
  CHECK(fs::exists(path));
  CHECK(fs::file_size(path) == 0);
  const Event e1 = sample(1), e2 = sample(2);
  std::vector<const Event*> batch{&e1, &e2};
  auto outcomes = sink->publish(batch);
  REQUIRE(outcomes.size() == 2);
  CHECK(outcomes[0].kind == OutcomeKind::kDelivered);
  CHECK(outcomes[1].kind == OutcomeKind::kDelivered);
  sink->publish(batch);
  CHECK(read_file(path) == line_of(1) + line_of(2) + line_of(1) + line_of(2));
  CHECK(sink->usable());
}

TEST_CASE("opening a file cuts an incomplete last line and keeps every whole one") {
  const TempDir dir;
  const fs::path path = dir.path / "events.jsonl";
  const Event e3 = sample(3);
  std::vector<const Event*> batch{&e3};

  SUBCASE("a torn line after whole lines") {
    write_file(path, line_of(1) + line_of(2).substr(0, 25));
    const auto sink = sinks::make_file_sink("f", config_for(path));
    CHECK(read_file(path) == line_of(1));
    REQUIRE(sink->publish(batch)[0].kind == OutcomeKind::kDelivered);
    CHECK(read_file(path) == line_of(1) + line_of(3));
  }
  SUBCASE("a torn line longer than one read chunk") {
    const std::string torn = "{\"id\":2,\"payload\":\"" + std::string(40'000, 'x');
    write_file(path, line_of(1) + torn);
    const auto sink = sinks::make_file_sink("f", config_for(path));
    REQUIRE(sink->publish(batch)[0].kind == OutcomeKind::kDelivered);
    CHECK(read_file(path) == line_of(1) + line_of(3));
  }
  SUBCASE("a file that is all one torn line") {
    write_file(path, std::string(20'000, 'y'));
    const auto sink = sinks::make_file_sink("f", config_for(path));
    REQUIRE(sink->publish(batch)[0].kind == OutcomeKind::kDelivered);
    CHECK(read_file(path) == line_of(3));
  }
  SUBCASE("a file that ends with a newline is left as it is") {
    const std::string whole = line_of(1) + std::string(30'000, 'z') + "\n" + line_of(2);
    write_file(path, whole);
    const auto sink = sinks::make_file_sink("f", config_for(path));
    REQUIRE(sink->publish(batch)[0].kind == OutcomeKind::kDelivered);
    CHECK(read_file(path) == whole + line_of(3));
  }
}

TEST_CASE("a disk that fails after start makes batches retry; the reopen cuts a torn line too") {
  const TempDir dir;
  const fs::path path = dir.path / "events.jsonl";
  const fs::path real = dir.path / "real.jsonl";
  // The path leads to /dev/full: it opens, but every write fails with ENOSPC, as on a full disk.
  fs::create_symlink("/dev/full", path);
  const auto sink = sinks::make_file_sink("f", config_for(path));
  const Event e1 = sample(1), e2 = sample(2);
  std::vector<const Event*> batch{&e1, &e2};

  auto outcomes = sink->publish(batch);
  REQUIRE(outcomes.size() == 2);
  CHECK(outcomes[0].kind == OutcomeKind::kRetry);
  CHECK(outcomes[1].kind == OutcomeKind::kRetry);
  CHECK(outcomes[0].reason == "write: No space left on device");
  CHECK_FALSE(sink->usable());

  // The disk is back, holding a line torn by the failure: the next batch reopens the path.
  write_file(real, line_of(7) + line_of(8).substr(0, 10));
  fs::remove(path);
  fs::create_symlink(real, path);
  outcomes = sink->publish(batch);
  CHECK(outcomes[0].kind == OutcomeKind::kDelivered);
  CHECK(outcomes[1].kind == OutcomeKind::kDelivered);
  CHECK(sink->usable());
  CHECK(read_file(real) == line_of(7) + line_of(1) + line_of(2));
}
