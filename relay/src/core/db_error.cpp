#include "core/db_error.hpp"

namespace outbox {

const char* db_error_label(DbErrorClass kind) {
  switch (kind) {
    case DbErrorClass::kTransient: return "transient";
    case DbErrorClass::kOther: return "other";
    case DbErrorClass::kPrivilege: return "privilege";
    case DbErrorClass::kUndefinedObject: return "undefined_object";
    case DbErrorClass::kAuthentication: return "authentication";
    case DbErrorClass::kConfiguration: return "configuration";
  }
  return "other";  // not reached: the switch names every class
}

bool needs_operator(DbErrorClass kind) {
  switch (kind) {
    case DbErrorClass::kTransient:
    case DbErrorClass::kOther: return false;
    case DbErrorClass::kPrivilege:
    case DbErrorClass::kUndefinedObject:
    case DbErrorClass::kAuthentication:
    case DbErrorClass::kConfiguration: return true;
  }
  return false;  // not reached
}

}  // namespace outbox
