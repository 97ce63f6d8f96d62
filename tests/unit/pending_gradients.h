// Sets the autograd engine's pending-gradient switch for a scope and restores it at
// the end, exceptions included (Note [accumulating into a pending gradient]).
#pragma once

#include "runtime/autograd/autograd.h"

namespace ddp::test_util {

class PendingGradients {
 public:
  explicit PendingGradients(bool on) : before_(pending_gradients_enabled()) {
    set_pending_gradients_enabled(on);
  }
  ~PendingGradients() { set_pending_gradients_enabled(before_); }
  PendingGradients(const PendingGradients&) = delete;
  PendingGradients& operator=(const PendingGradients&) = delete;

 private:
  bool before_;
};

}  // namespace ddp::test_util
