#pragma once
// What the store reports about the writers that hold events back (Store::writer_holds), for the
// runner's metrics and the operator: the writer transactions, the lanes, the events. Plain data.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace outbox {

inline constexpr int kLaneCount = 64;  // fixed by the schema's lane column
using LaneIds = std::array<long long, kLaneCount>;
using LaneMask = std::uint64_t;  // bit n: lane n

inline constexpr LaneMask lane_bit(int lane) { return LaneMask{1} << lane; }

// A transaction that held ROW EXCLUSIVE on the outbox at a reading.
struct OpenWriter {
  std::string vxid;       // its virtual transaction id: the identity across readings
  int pid = 0;            // its backend
  bool complete = false;  // its lane marks cover every id it drew up to the reading's last id
  LaneMask lanes = 0;     // its lane marks
  // For the operator (pg_stat_activity; empty when not visible).
  std::string state;
  std::string application;
  std::string client_addr;
  std::string query;            // the first 200 characters
  std::string wait_event;       // "type:event", or empty
  double xact_age_seconds = 0;  // a prepared transaction: since it was prepared
  // A prepared transaction (schema/010; pid 0): its global id, owner and database.
  std::string gid;
  std::string owner;
  std::string database;

  // The lanes whose events it may hold back: its marks, or every lane when it is not complete.
  LaneMask holds() const { return complete ? lanes : ~LaneMask{0}; }
};

// Writers holding back events of this instance's lanes, as the last reading saw them.
struct WriterHold {
  OpenWriter writer;
  LaneMask lanes = 0;      // this instance's lanes whose events it holds back
  std::size_t events = 0;  // committed events of those lanes held back (as last counted)
};
struct WriterHolds {
  std::size_t events = 0;            // committed events held back by open writers (as last counted)
  double oldest_writer_seconds = 0;  // the age of the oldest writer transaction holding events back; 0: none
  std::vector<WriterHold> writers;
};

// Lanes of a mask as "3,17,42" (every lane: "all").
std::string describe_lanes(LaneMask lanes);

}  // namespace outbox
