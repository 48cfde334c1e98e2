#pragma once
#include <string>

#include "core/store.hpp"
#include "log/log.hpp"

namespace outbox::pg {

template <class Fn>
auto translate_errors(const char* what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const StoreUnavailable&) {
    throw;
  } catch (const std::exception& e) {
    throw StoreUnavailable(std::string(what) + ": " + describe_error(e));
  }
}

template <class Int>
std::string int_array(const Int* begin, const Int* end) {
  std::string out = "{";
  for (const Int* p = begin; p != end; ++p) {
    if (p != begin) out.push_back(',');
    out += std::to_string(*p);
  }
  out.push_back('}');
  return out;
}

}  // namespace outbox::pg
