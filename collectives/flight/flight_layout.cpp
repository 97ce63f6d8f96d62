#include "collectives/flight/flight_layout.h"

#include "runtime/error.h"

#include <cstddef>
#include <cstring>
#include <thread>

namespace ddp::flight {
namespace {

constexpr size_t kRecordWords = sizeof(SharedRecord) / sizeof(Word);
constexpr int kReadTries = 200;

size_t records_offset() {
  return (sizeof(SharedHeader) + 63) / 64 * 64;
}

// A copy of a record's words between two equal even reads of its seqlock (Note
// [flight region]); false when the writer kept it odd or changing.
bool copy_words(const SharedRecord& r, uint64_t (&out)[kRecordWords]) {
  const Word* words = reinterpret_cast<const Word*>(&r);
  for (int attempt = 0; attempt < kReadTries; ++attempt) {
    const uint64_t before = r.lock.load(std::memory_order_acquire);
    if ((before & 1) == 0) {
      for (size_t i = 0; i < kRecordWords; ++i) out[i] = words[i].load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (r.lock.load(std::memory_order_relaxed) == before) return true;
    }
    if (attempt > 8) std::this_thread::yield();
  }
  return false;
}

template <typename E>
bool in_range(uint64_t v, E last) {
  return v <= static_cast<uint64_t>(last);
}

// The word of `field` in a copy of a record.
#define DDP_RECORD_WORD(copy, field) (copy)[offsetof(SharedRecord, field) / sizeof(Word)]

// Decodes a consistent copy; false when its fields are out of range.
bool decode(const uint64_t (&w)[kRecordWords], CollectiveRecord& out) {
  const uint64_t shape = DDP_RECORD_WORD(w, shape);
  const uint64_t kind = shape & 0xff, op = (shape >> 8) & 0xff, dtype = (shape >> 16) & 0xff,
                 state = (shape >> 24) & 0xff, flags = (shape >> 32) & 0xff;
  if (!in_range(kind, CollectiveKind::barrier) || !in_range(op, ReduceOp::min) ||
      !in_range(dtype, DType::u8) || !in_range(state, RecordState::failed)) {
    return false;
  }
  const uint64_t ident = DDP_RECORD_WORD(w, ident);
  out.comm = static_cast<int>(static_cast<uint32_t>(ident));
  out.root = static_cast<int>(static_cast<uint32_t>(ident >> 32));
  out.sequence = static_cast<int64_t>(DDP_RECORD_WORD(w, sequence));
  out.kind = static_cast<CollectiveKind>(kind);
  out.op = static_cast<ReduceOp>(op);
  out.dtype = static_cast<DType>(dtype);
  out.state = static_cast<RecordState>(state);
  out.timed_out = (flags & kFlagTimedOut) != 0;
  out.count = static_cast<int64_t>(DDP_RECORD_WORD(w, count));
  out.bytes = static_cast<int64_t>(DDP_RECORD_WORD(w, bytes));
  out.enqueued_ns = static_cast<int64_t>(DDP_RECORD_WORD(w, enqueued_ns));
  out.started_ns = static_cast<int64_t>(DDP_RECORD_WORD(w, started_ns));
  out.finished_ns = static_cast<int64_t>(DDP_RECORD_WORD(w, finished_ns));
  out.wait_begin_ns = static_cast<int64_t>(DDP_RECORD_WORD(w, wait_begin_ns));
  out.wait_ns = static_cast<int64_t>(DDP_RECORD_WORD(w, wait_ns));
  char label[kLabelWords * 8] = {};
  std::memcpy(label, &DDP_RECORD_WORD(w, label), sizeof(label));
  out.label = std::string(label, ::strnlen(label, sizeof(label)));
  return true;
}

int64_t load(const Word& w) {
  return static_cast<int64_t>(w.load(std::memory_order_relaxed));
}

void load_wait_section(const SharedHeader& h, RankStatus& s) {
  s.waiters = load(h.waiters);
  s.wait_since_ns = load(h.wait_since_ns);
  s.wait_comm = load(h.wait_comm);
  s.wait_sequence = load(h.wait_sequence);
  s.blocked_ns = load(h.blocked_ns);
}

RankStatus read_status(const SharedHeader& h) {
  RankStatus s;
  s.last_progress_ns = load(h.last_progress_ns);
  s.first_ns = load(h.first_ns);
  s.last_ns = load(h.last_ns);
  s.steps = load(h.steps);
  s.step_ns = load(h.step_ns);
  s.step_blocked_ns = load(h.step_blocked_ns);
  s.first_step_ns = load(h.first_step_ns);
  s.first_step_blocked_ns = load(h.first_step_blocked_ns);
  s.collective_timeout_ns = load(h.collective_timeout_ns);
  for (int attempt = 0; attempt < kReadTries; ++attempt) {
    const uint64_t before = h.wait_lock.load(std::memory_order_acquire);
    if ((before & 1) == 0) {
      load_wait_section(h, s);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (h.wait_lock.load(std::memory_order_relaxed) == before) return s;
    }
    if (attempt > 8) std::this_thread::yield();
  }
  // The writer kept it odd (stopped inside Work::wait's bookkeeping) or changing:
  // the last copy, said to be torn rather than passed off as "not waiting".
  load_wait_section(h, s);
  s.wait_torn = true;
  return s;
}

}  // namespace

std::string_view record_state_name(RecordState state) {
  switch (state) {
    case RecordState::enqueued:
      return "enqueued";
    case RecordState::started:
      return "started";
    case RecordState::completed:
      return "completed";
    case RecordState::failed:
      return "failed";
  }
  return "?";
}

std::string_view process_state_name(ProcessState state) {
  switch (state) {
    case ProcessState::unknown:
      return "unknown";
    case ProcessState::running:
      return "running";
    case ProcessState::stopped:
      return "stopped";
    case ProcessState::exited:
      return "exited";
  }
  return "?";
}

size_t region_bytes(size_t capacity) {
  return records_offset() + capacity * sizeof(SharedRecord);
}

void store_string(Word* words, size_t n, std::string_view s) {
  char buffer[64] = {};
  DDP_ASSERT(n * 8 <= sizeof(buffer), "{} words", n);
  if (!s.empty()) std::memcpy(buffer, s.data(), std::min(s.size(), n * 8 - 1));
  for (size_t i = 0; i < n; ++i) {
    uint64_t word = 0;
    std::memcpy(&word, buffer + 8 * i, 8);
    words[i].store(word, std::memory_order_relaxed);
  }
}

std::string load_string(const Word* words, size_t n) {
  char buffer[65] = {};
  for (size_t i = 0; i < n && i < 8; ++i) {
    const uint64_t word = words[i].load(std::memory_order_relaxed);
    std::memcpy(buffer + 8 * i, &word, 8);
  }
  return std::string(buffer, ::strnlen(buffer, std::min<size_t>(n * 8, 64)));
}

namespace {

const SharedHeader& checked_header(const void* region, size_t bytes) {
  DDP_CHECK(bytes >= sizeof(SharedHeader), "flight recorder region of {} bytes: too small", bytes);
  const auto& h = *static_cast<const SharedHeader*>(region);
  DDP_CHECK(h.magic.load(std::memory_order_acquire) == kMagic,
            "not a flight recorder region (or one still being set up)");
  DDP_CHECK(load(h.version) == static_cast<int64_t>(kVersion) &&
                load(h.header_bytes) == static_cast<int64_t>(sizeof(SharedHeader)) &&
                load(h.record_bytes) == static_cast<int64_t>(sizeof(SharedRecord)),
            "flight recorder region of version {} (header {} bytes, record {} bytes); this "
            "reader knows version {} ({}, {}): read it with the same build",
            load(h.version), load(h.header_bytes), load(h.record_bytes), kVersion,
            sizeof(SharedHeader), sizeof(SharedRecord));
  DDP_CHECK(region_bytes(static_cast<size_t>(load(h.capacity))) <= bytes,
            "flight recorder region of {} bytes holds no {} records", bytes, load(h.capacity));
  return h;
}

}  // namespace

RankStatus read_region_status(const void* region, size_t bytes) {
  return read_status(checked_header(region, bytes));
}

RankSnapshot read_region(const void* region, size_t bytes, int64_t now_ns) {
  const SharedHeader& h = checked_header(region, bytes);
  const auto capacity = static_cast<size_t>(load(h.capacity));
  RankSnapshot s;
  s.rank = static_cast<int>(load(h.rank));
  s.world_size = static_cast<int>(load(h.world_size));
  s.pid = load(h.pid);
  s.backend = load_string(h.backend, kNameWords);
  s.job = load_string(h.job, kNameWords);
  s.taken_ns = now_ns;
  s.capacity = static_cast<int64_t>(capacity);
  s.status = read_status(h);
  const uint64_t recorded = h.recorded.load(std::memory_order_acquire);
  s.recorded = static_cast<int64_t>(recorded);
  if (capacity == 0) return s;
  const auto* records = reinterpret_cast<const SharedRecord*>(
      static_cast<const unsigned char*>(region) + records_offset());
  const uint64_t first = recorded > capacity ? recorded - capacity : 0;
  s.records.reserve(static_cast<size_t>(recorded - first));
  for (uint64_t i = first; i < recorded; ++i) {
    uint64_t words[kRecordWords];
    CollectiveRecord record;
    if (!copy_words(records[i % capacity], words)) {
      ++s.torn;
      continue;
    }
    // Another index: being reused for a newer record, or not yet written.
    if (DDP_RECORD_WORD(words, index) != i || !decode(words, record)) continue;
    s.records.push_back(std::move(record));
  }
  return s;
}

}  // namespace ddp::flight
