#pragma once
// The pipelined part of RelayLoop::drain(): batch k in the sinks (one helper thread), the outcomes
// of batch k-1 written (a second helper, on the store's second session), batch k+1 claimed ahead
// (the caller's thread); and the keys a batch claimed ahead holds back, because it was claimed
// before the outcomes of the batches in flight were written (the claim's head-of-line rule sees
// only written retries).
//
// Lifetime: the work given to start(), and whatever it borrows (the batch, the completions), must
// stay alive until collect() returns; start() and collect() alternate. The destructor waits for
// work in flight and joins the helpers; its owner (RelayLoop) destroys it before anything else it
// owns, and the store and sinks the work uses outlive the loop.
#include <exception>
#include <functional>

#include "core/helper_thread.hpp"
#include "core/key_holds.hpp"

namespace outbox {

class DrainPipeline {
 public:
  struct Collected {
    std::exception_ptr publish_failure;   // the publish work threw
    std::exception_ptr complete_failure;  // the previous batch's outcomes were not written
  };

  // Starts the publish work (on a helper if `publish_on_helper`; otherwise it runs on the caller's
  // thread inside collect(), as a short batch has nothing to overlap with) and the complete work
  // (on the other helper), which may be empty.
  void start(std::function<void()> publish, bool publish_on_helper, std::function<void()> complete);
  // Waits for both and says which failed.
  Collected collect();

  // What the batch being prepared holds back.
  const KeyHolds& held() const { return held_; }
  // The next batch was claimed before the outcomes of the one just collected (`failed`: its keys
  // not delivered) were written, and perhaps before the previous batch's.
  void claimed_ahead(KeyHolds failed);
  // Every outcome so far is written: what is claimed from here on holds nothing back.
  void caught_up();

 private:
  KeyHolds held_;
  KeyHolds held_previous_;  // failures of the batch whose outcomes are written beside the next claim
  std::function<void()> publish_here_;
  bool publishing_ = false;  // the publish work runs on publisher_
  bool completing_ = false;  // the complete work runs on completer_
  // Last: destroyed first, so a helper never outlives what its work touches here.
  HelperThread publisher_;
  HelperThread completer_;
};

}  // namespace outbox
