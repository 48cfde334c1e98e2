#pragma once
// The one include of librdkafka's C headers, for .cpp files of this sink and its tests only:
// no public header of the relay exposes librdkafka types (it is linked PRIVATE).
//
// librdkafka's type-check macros expand to GNU statement expressions, which -Wpedantic rejects
// in our translation units; the checks only duplicate what the C++ compiler already checks.
#ifndef LIBRDKAFKA_TYPECHECKS
#define LIBRDKAFKA_TYPECHECKS 0
#endif
#include <librdkafka/rdkafka.h>
