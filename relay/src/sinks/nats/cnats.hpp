#pragma once
// The one include of the NATS C client's header (Debian's libnats-dev, nats.c 3.4), for .cpp
// files of this sink and its tests only: no public header of the relay exposes nats.c types
// (it is linked PRIVATE).
#include <nats/nats.h>
