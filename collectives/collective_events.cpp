#include "collectives/collective_events.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <vector>

namespace ddp {
namespace {

using Observers = std::vector<std::shared_ptr<CollectiveObserver>>;

// Copy on write: notify() reads a snapshot without a lock held while it calls
// out; add/remove replace the snapshot. `present` is the fast path.
struct Registry {
  std::mutex mutex;
  std::shared_ptr<const Observers> observers = std::make_shared<Observers>();
  std::atomic<bool> present{false};
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: observers may fire at exit
  return *r;
}

std::shared_ptr<const Observers> snapshot() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.observers;
}

thread_local std::string_view t_label;

}  // namespace

std::string_view collective_state_name(CollectiveState state) {
  switch (state) {
    case CollectiveState::enqueued:
      return "enqueued";
    case CollectiveState::started:
      return "started";
    case CollectiveState::completed:
      return "completed";
    case CollectiveState::failed:
      return "failed";
    case CollectiveState::wait_begin:
      return "wait_begin";
    case CollectiveState::wait_end:
      return "wait_end";
    case CollectiveState::timed_out:
      return "timed_out";
  }
  return "?";
}

void add_collective_observer(std::shared_ptr<CollectiveObserver> observer) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto next = std::make_shared<Observers>(*r.observers);
  next->push_back(std::move(observer));
  r.observers = std::move(next);
  r.present.store(true, std::memory_order_release);
}

void remove_collective_observer(const CollectiveObserver* observer) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto next = std::make_shared<Observers>(*r.observers);
  next->erase(std::remove_if(next->begin(), next->end(),
                             [observer](const auto& o) { return o.get() == observer; }),
              next->end());
  r.present.store(!next->empty(), std::memory_order_release);
  r.observers = std::move(next);
}

bool collective_observers_present() {
  return registry().present.load(std::memory_order_acquire);
}

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void notify_collective(const CollectiveInfo& info, CollectiveState state) {
  if (!collective_observers_present()) return;
  notify_collective(info, state, steady_now_ns());
}

void notify_collective(const CollectiveInfo& info, CollectiveState state, int64_t time_ns) {
  if (!collective_observers_present()) return;
  const CollectiveEvent event{info, state, time_ns};
  for (const auto& observer : *snapshot()) observer->on_collective(event);
}

CollectiveLabel::CollectiveLabel(std::string_view label) : previous_(t_label) {
  t_label = label.substr(0, kMaxLabelBytes);
}

CollectiveLabel::~CollectiveLabel() {
  t_label = previous_;
}

std::string_view current_collective_label() {
  return t_label;
}

}  // namespace ddp
