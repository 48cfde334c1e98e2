#pragma once
// type: webhook. POSTs each event's payload to one URL with Standard Webhooks headers, on libcurl.
#include <memory>
#include <string>

#include "core/sink.hpp"
#include "sinks/webhook/webhook_config.hpp"

namespace outbox::sinks {

// Up to max_in_flight requests at once on one curl multi handle; the multi handle, its
// connection cache and the easy handles live as long as the sink, so connections are kept alive
// across batches. Events of one key are sent one after another in id order; after a retryable
// failure the later events of that key get kDeferred. No request starts later than `timeout`
// after its batch's submit() (the rest get kDeferred and are released), and each request ends
// within `timeout`, so collect() returns within about twice the timeout from the submit().
// Pipelined (Sink::pipelined()): submit() starts a batch's requests and returns; collect() drives
// curl until the oldest batch's requests have ended. Every outstanding batch shares the
// max_in_flight slots, the oldest first, so the next batch's requests take the slots the previous
// one leaves at its end while its last answers are outstanding. The loop never has events of one
// key in two batches in the sink at once (Sink::submit()), so order is kept within a batch only,
// as publish() does. Curl runs only inside submit() and collect(): no thread of its own.
// Threading: publish(), submit() and collect() from one thread at a time; usable() from any thread.
// Throws config::ConfigError if curl cannot be set up with this config.
// usable(): false while the most recent request got no HTTP response at all (connection refused,
// DNS, TLS, timeout); any HTTP response, even a 500, makes it true again.
std::unique_ptr<Sink> make_webhook_sink(std::string name, WebhookSinkConfig config);

}  // namespace outbox::sinks
