#include "collectives/collective_events.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <vector>

namespace ddp {
namespace {

using Observers = std::vector<std::shared_ptr<CollectiveObserver>>;

// Note [observer snapshots]: add/remove replace the list under the mutex and
// bump `version`; each thread keeps the list it last saw and refreshes it (under
// the mutex) only when the version moved, so a moment costs one atomic load
// and no reference count (a mutex and a shared_ptr copy per moment were 35 ns,
// most of what an observer cost each collective: `bench flight`). A removed
// observer is no longer called by a notify that starts after remove returned;
// a thread's stale list may keep it alive until that thread's next moment or
// its exit. A moment told from inside an observer uses the list it is in.
struct Registry {
  std::mutex mutex;
  std::shared_ptr<const Observers> observers = std::make_shared<Observers>();
  std::atomic<uint64_t> version{1};
  std::atomic<bool> present{false};
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: observers may fire at exit
  return *r;
}

struct ThreadSnapshot {
  uint64_t version = 0;
  std::shared_ptr<const Observers> observers;
  int depth = 0;  // notify calls of this thread in progress
};

thread_local ThreadSnapshot t_snapshot;

const Observers& current_observers() {
  Registry& r = registry();
  ThreadSnapshot& t = t_snapshot;
  const uint64_t version = r.version.load(std::memory_order_acquire);
  if (t.version != version && t.depth == 0) {
    std::lock_guard<std::mutex> lock(r.mutex);
    t.observers = r.observers;
    t.version = r.version.load(std::memory_order_relaxed);
  }
  return *t.observers;
}

void publish(Registry& r, std::shared_ptr<const Observers> next) {
  r.present.store(!next->empty(), std::memory_order_release);
  r.observers = std::move(next);
  r.version.fetch_add(1, std::memory_order_acq_rel);
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
  publish(r, std::move(next));
}

void remove_collective_observer(const CollectiveObserver* observer) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto next = std::make_shared<Observers>(*r.observers);
  next->erase(std::remove_if(next->begin(), next->end(),
                             [observer](const auto& o) { return o.get() == observer; }),
              next->end());
  publish(r, std::move(next));
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
  const Observers& observers = current_observers();  // Note [observer snapshots]
  ++t_snapshot.depth;
  for (const auto& observer : observers) observer->on_collective(event);
  --t_snapshot.depth;
}

CollectiveLabel::CollectiveLabel(std::string_view label) : previous_(t_label) {
  if (label.size() > kMaxLabelBytes) {  // cut at a character boundary: labels stay UTF-8
    size_t n = kMaxLabelBytes;
    while (n > 0 && (static_cast<unsigned char>(label[n]) & 0xC0) == 0x80) --n;
    label = label.substr(0, n);
  }
  t_label = label;
}

CollectiveLabel::~CollectiveLabel() {
  t_label = previous_;
}

std::string_view current_collective_label() {
  return t_label;
}

namespace {
thread_local bool t_caller_runs = false;  // Note [caller runs it]
}  // namespace

CallerRuns::CallerRuns() : previous_(t_caller_runs) {
  t_caller_runs = true;
}

CallerRuns::~CallerRuns() {
  t_caller_runs = previous_;
}

bool caller_runs() {
  return t_caller_runs;
}

}  // namespace ddp
