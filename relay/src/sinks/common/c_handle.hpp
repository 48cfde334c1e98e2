#pragma once
// One owner for every C library handle the sinks hold: CHandle<rd_kafka_conf_t,
// &rd_kafka_conf_destroy> is a std::unique_ptr that frees with that function (as userver's
// HolderBase). One line per handle type instead of a deleter struct each.
#include <memory>

namespace outbox::sinks {

template <class T, auto Free>
struct CFree {
  void operator()(T* handle) const { Free(handle); }
};

template <class T, auto Free>
using CHandle = std::unique_ptr<T, CFree<T, Free>>;

}  // namespace outbox::sinks
