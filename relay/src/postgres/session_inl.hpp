#pragma once
#include <string>

#include "core/store.hpp"
#include "log/log.hpp"
#include "postgres/sqlstate.hpp"

namespace outbox::pg {

template <class Fn>
auto translate_errors(const char* what, Fn&& fn, const HintContext& hints) -> decltype(fn()) {
  try {
    return fn();
  } catch (const StoreUnavailable& e) {
    if (!e.hint().empty() || !needs_operator(e.kind())) throw;
    throw StoreUnavailable(e.what(), e.kind(), operator_hint(e.kind(), hints.user, hints.table));
  } catch (const std::exception& e) {
    throw store_failure(what, e, hints);
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
