#pragma once
// Note [gloo SIGPIPE]: gloo writes to its sockets without MSG_NOSIGNAL, so a write
// to a rank that died raises SIGPIPE, which ends the process by default. Every
// gloo call runs inside a SigpipeBlock: gloo's threads and the communication
// thread are created under one (threads inherit the mask), and each collective
// runs under one whichever thread runs it (a waiter may run it itself: Note
// [waiter runs it] in communicator_base.h). A write to a dead peer then fails
// with EPIPE and becomes a CommError; the program's own SIGPIPE disposition and
// every other thread's mask are untouched.
#include <pthread.h>
#include <signal.h>

namespace ddp::comm {

// Blocks SIGPIPE in the calling thread for its lifetime; on exit drops a SIGPIPE
// raised in this thread meanwhile and restores the thread's previous mask.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &previous_);
  }
  ~SigpipeBlock() {
    const timespec zero{};
    while (sigtimedwait(&pipe_, nullptr, &zero) == SIGPIPE) {
    }
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t pipe_;
  sigset_t previous_;
};

}  // namespace ddp::comm
