#include "collectives/trace_collectives.h"

#include "collectives/collective_events.h"
#include "collectives/store/tcp_store.h"
#include "runtime/env.h"
#include "runtime/logging.h"
#include "runtime/ops/ops.h"
#include "runtime/trace.h"
#include "runtime/trace/file.h"

#include "runtime/fmt.h"

#include <map>
#include <mutex>
#include <random>
#include <vector>

namespace ddp {
namespace {

// "all_reduce (ddp bucket 3)" without allocating: names are cut at kMaxNameBytes anyway.
struct Name {
  char text[trace::kMaxNameBytes + 1];
  size_t size = 0;
  std::string_view view() const { return {text, size}; }
};

Name name_of(std::string_view prefix, const CollectiveInfo& info) {
  Name n;
  const std::string_view op = collective_name(info.kind);
  const auto r =
      info.label.empty()
          ? fmt::format_to_n(n.text, trace::kMaxNameBytes, "{}{}", prefix, op)
          : fmt::format_to_n(n.text, trace::kMaxNameBytes, "{}{} ({})", prefix, op, info.label);
  n.size = std::min(r.size, trace::kMaxNameBytes);
  if (r.size > n.size) {  // cut inside the label: at a character boundary (valid UTF-8)
    while (n.size > 0 && (static_cast<unsigned char>(n.text[n.size]) & 0xC0) == 0x80) --n.size;
  }
  return n;
}

// Flow ids of collectives: one per (communicator, sequence), apart from
// trace::new_flow_id()'s (which count up from 1 and stay below 2^62): bit 62,
// 22 bits of the communicator, 40 of the sequence number (a trillion
// collectives), so no two collectives of a run share one.
constexpr int kSequenceBits = 40, kCommBits = 22;
uint64_t flow_of(const CollectiveInfo& info) {
  const uint64_t comm = static_cast<uint64_t>(info.comm_id) & ((uint64_t{1} << kCommBits) - 1);
  const uint64_t seq = static_cast<uint64_t>(info.sequence) & ((uint64_t{1} << kSequenceBits) - 1);
  return (uint64_t{1} << 62) | (comm << kSequenceBits) | seq;
}

// The enqueue slice lasts a nanosecond: a slice of its own (never zero-length)
// that the flow arrow starts from.
constexpr int64_t kEnqueueNs = 1;

struct OpenSlice {
  int comm_id;
  int64_t sequence;
  bool wait;
  trace::Track track;
};
thread_local std::vector<OpenSlice> t_open;

class TimelineObserver final : public CollectiveObserver {
 public:
  void on_collective(const CollectiveEvent& e) noexcept override {
    if (!trace::enabled()) return;
    try {
      handle(e);
    } catch (...) {
      // Observers must not throw (Note [collective events]); a lost record is all it costs.
    }
  }

 private:
  void handle(const CollectiveEvent& e) {
    const CollectiveInfo& info = e.info;
    const trace::Args args = {{"seq", info.sequence},
                              {"bytes", info.bytes},
                              {"comm", info.comm_id},
                              {"world", info.world_size}};
    switch (e.state) {
      case CollectiveState::enqueued:
        trace::complete(name_of("enqueue ", info).view(), "collective", e.time_ns, kEnqueueNs, args,
                        0, {.id = flow_of(info), .out = true});
        return;
      case CollectiveState::started: {
        const trace::Track track = track_of(info);
        if (track != 0) return stream_started(info, e.time_ns);
        trace::begin(name_of("", info).view(), "collective", args, e.time_ns, 0,
                     {.id = flow_of(info), .in = true});
        t_open.push_back({info.comm_id, info.sequence, false, 0});
        return;
      }
      case CollectiveState::completed:
      case CollectiveState::failed:
        if (info.backend == "nccl") return stream_ended(info, e, args);
        if (e.state == CollectiveState::failed) {
          trace::instant(name_of("failed: ", info).view(), "collective", args, e.time_ns);
        }
        close(info, false, e.time_ns);
        return;
      case CollectiveState::wait_begin:
        trace::begin(name_of("wait ", info).view(), "wait", args, e.time_ns);
        t_open.push_back({info.comm_id, info.sequence, true, 0});
        return;
      case CollectiveState::timed_out:
        trace::instant(name_of("timed out: ", info).view(), "wait", args, e.time_ns);
        return;
      case CollectiveState::wait_end:
        close(info, true, e.time_ns);
        return;
    }
  }

  // Where the collective runs: the nccl stream's track, else this thread's
  // (named after the backend unless it has a name).
  trace::Track track_of(const CollectiveInfo& info) {
    if (info.backend != "nccl") {
      // A thread runs one communicator's collectives: named once per start().
      thread_local uint64_t named_in = 0;
      if (named_in != trace::generation()) {
        trace::name_thread(fmt::format("{} comm thread (comm {})", info.backend, info.comm_id),
                           /*replace=*/false);
        named_in = trace::generation();
      }
      return 0;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    return nccl_track_locked(info.comm_id);
  }
  trace::Track nccl_track_locked(int comm_id) {
    if (tracks_of_ != trace::generation()) {  // a start() since: the tracks are gone
      nccl_tracks_.clear();
      stream_starts_.clear();
      tracks_of_ = trace::generation();
    }
    auto it = nccl_tracks_.find(comm_id);
    if (it == nccl_tracks_.end()) {
      const trace::Track t = trace::stream_track(fmt::format("nccl stream (comm {})", comm_id));
      it = nccl_tracks_.emplace(comm_id, t).first;
    }
    return it->second;
  }

  // A stream's collectives may end on another thread than the one that saw them
  // start (the watchdog, a waiter that gave up): their span is written whole at
  // the end, from the start kept here.
  void stream_started(const CollectiveInfo& info, int64_t ts) {
    std::lock_guard<std::mutex> lock(mutex_);
    stream_starts_[{info.comm_id, info.sequence}] = ts;
  }
  void stream_ended(const CollectiveInfo& info, const CollectiveEvent& e, trace::Args args) {
    int64_t start = -1;
    trace::Track track = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = stream_starts_.find({info.comm_id, info.sequence});
          it != stream_starts_.end()) {
        start = it->second;
        stream_starts_.erase(it);
      }
      track = nccl_track_locked(info.comm_id);  // also when it failed before it started
    }
    if (start >= 0) {
      trace::complete(name_of("", info).view(), "collective", start, e.time_ns - start, args, track,
                      {.id = flow_of(info), .in = true});
    }
    if (e.state == CollectiveState::failed) {
      trace::instant(name_of("failed: ", info).view(), "collective", args, e.time_ns, track);
    }
  }

  // Ends the slice this thread opened for the collective; nothing when it opened
  // none (a collective failed before it started), so no other slice is ended.
  static void close(const CollectiveInfo& info, bool wait, int64_t ts) {
    if (t_open.empty()) return;
    const OpenSlice& top = t_open.back();
    if (top.comm_id != info.comm_id || top.sequence != info.sequence || top.wait != wait) return;
    trace::end(ts, top.track);
    t_open.pop_back();
  }

  std::mutex mutex_;
  uint64_t tracks_of_ = 0;  // the trace::generation() of nccl_tracks_
  std::map<int, trace::Track> nccl_tracks_;
  std::map<std::pair<int, int64_t>, int64_t> stream_starts_;  // (comm, sequence) -> start
};

std::string random_run_id() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

// The run's id on every rank: ddprun's, else rank 0's made up and broadcast
// (a collective: every rank calls it, Note [trace participation]).
std::string shared_run_id(const ProcessGroup& pg) {
  if (!pg.env.run_id.empty()) return pg.env.run_id;
  std::random_device rd;
  const int64_t mine = (static_cast<int64_t>(rd()) << 31) ^ rd();
  if (pg.comm->size() == 1) return fmt::format("{:x}", mine);
  Tensor t = from_vector<int64_t>({mine}, {1}, {.dtype = DType::i64, .device = pg.comm->device()});
  const CollectiveLabel labelled("trace run id");
  pg.comm->broadcast(t, 0)->wait();
  return fmt::format("{:x}", t.to_vector<int64_t>()[0]);
}

// One clock sample (Note [trace clocks]). Never throws: an older ddprun's store
// without TIME, a store timeout or a failed collective cost the sample and a
// warning, not the run (a failed collective then fails the program's next one).
void measure(const ProcessGroup& pg) {
  if (pg.comm->size() == 1) return;  // one rank: its own clock is the reference
  try {
    auto* store = dynamic_cast<TcpStore*>(pg.store.get());
    if (pg.env.agent_store && store != nullptr) {
      const trace::OffsetEstimate e = measure_offset_with_store(*store);
      trace::add_clock_sample(
          {e.local_ns, e.offset_ns, e.error_ns,
           fmt::format("ddprun store at {}:{}", pg.env.store_host, pg.env.store_port)});
      return;
    }
    const trace::OffsetEstimate e = measure_offset_with_comm(*pg.comm);
    trace::add_clock_sample({e.local_ns, e.offset_ns, e.error_ns, "rank 0 (all_gather rounds)"});
  } catch (const std::exception& e) {
    DDP_LOG_WARN("trace: no clock sample on rank {} (its timeline keeps its own clock): {}",
                 pg.env.rank, e.what());
  }
}

}  // namespace

void attach_trace_observer() {
  if (!trace::enabled()) return;
  static std::once_flag once;
  std::call_once(once, [] { add_collective_observer(std::make_shared<TimelineObserver>()); });
}

trace::OffsetEstimate measure_offset_with_store(TcpStore& store, int requests) {
  std::vector<trace::OffsetBound> bounds;
  for (int i = 0; i < requests; ++i) {
    const int64_t send = trace::now_ns();
    const int64_t remote = store.server_time_ns();
    const int64_t receive = trace::now_ns();
    bounds.push_back(trace::bound_from_request(send, remote, receive));
  }
  return trace::estimate_offset(bounds);
}

// Round k carries this rank's enter of round k and exit of round k - 1 (Note
// [trace clocks]); rank 0's are the reference.
trace::OffsetEstimate measure_offset_with_comm(Communicator& comm, int rounds) {
  const CollectiveLabel labelled("trace clock sync");
  const int64_t n = comm.size();
  std::vector<trace::OffsetBound> bounds;
  int64_t my_enter = 0, my_exit = 0, ref_enter = 0;
  for (int k = 0; k <= rounds; ++k) {
    const int64_t enter = trace::now_ns();
    Tensor in =
        from_vector<int64_t>({enter, my_exit}, {2}, {.dtype = DType::i64, .device = comm.device()});
    Tensor out = empty({2 * n}, {.dtype = DType::i64, .device = comm.device()});
    comm.all_gather(in, out)->wait();
    const std::vector<int64_t> all = out.to_vector<int64_t>();  // waits for the device too
    const int64_t exit = trace::now_ns();
    if (k > 0) bounds.push_back(trace::bound_from_round(my_enter, my_exit, ref_enter, all[1]));
    my_enter = enter;
    my_exit = exit;
    ref_enter = all[0];
  }
  return trace::estimate_offset(bounds);
}

// Note [trace participation]
// Tracing adds collectives: the run id's broadcast, the clock's all_gather
// rounds (without ddprun's store) and the barrier before rank 0 merges. Every
// rank must run them or none, so they follow trace::requested() (DDP_TRACE in
// the environment, alike on every rank of a launch), not whether this rank
// records: a rank whose start_from_env() failed (a directory it cannot create,
// a bad DDP_TRACE_MAX_EVENTS) still runs them and records nothing.
void trace_process_group(const ProcessGroup& pg) {
  trace::start_from_env();  // a no-op when init_process_group already did
  if (!trace::requested() && !trace::enabled()) return;
  trace::RankInfo info;
  info.rank = pg.env.rank;
  info.world_size = pg.env.world_size;
  info.restart = static_cast<int>(env::get_int(env::kRestartCount).value_or(0));
  info.launcher = pg.env.launcher;
  info.backend = pg.comm ? pg.comm->backend() : pg.backend;  // a replacement: none yet
  info.run_id = pg.env.run_id;
  if (trace::requested()) {
    try {
      info.run_id = shared_run_id(pg);
    } catch (const std::exception& e) {
      DDP_LOG_WARN("trace: the run id could not be shared: {}", e.what());
    }
  }
  trace::set_rank_info(info);
  if (trace::requested()) measure(pg);
}

std::string finish_trace(const ProcessGroup* pg) {
  // No communicator: a replacement that found its group finished (trainer/elastic.cpp).
  const bool collective =
      pg != nullptr && pg->comm != nullptr && pg->comm->size() > 1 && trace::requested();
  const bool writes = trace::enabled() && !trace::directory().empty();
  if (!collective && !writes) return "";
  if (pg == nullptr && writes) {
    trace::RankInfo info = trace::rank_info();
    if (info.run_id.empty()) info.run_id = random_run_id();
    trace::set_rank_info(info);
  }
  if (collective) measure(*pg);  // Note [trace participation]
  if (writes) {
    try {
      trace::write_file();
    } catch (const std::exception& e) {
      // Never fails the run (and never leaves the other ranks in the barrier below).
      DDP_LOG_WARN("trace: {}", e.what());
    }
  }
  if (pg != nullptr && pg->env.agent_store) return "";  // ddprun merges
  if (collective) {
    try {
      const CollectiveLabel labelled("trace files written");
      pg->comm->barrier()->wait();
    } catch (const std::exception& e) {
      DDP_LOG_WARN("trace: the barrier before the merge failed: {}", e.what());
      return "";
    }
  }
  if ((pg != nullptr && pg->env.rank != 0) || !writes) return "";
  const trace::RankInfo info = trace::rank_info();
  try {
    return trace::describe(
        trace::merge_trace_dir(trace::directory(), {.run_id = info.run_id,
                                                    .restart = info.restart,
                                                    .expected_ranks = info.world_size,
                                                    .output = ""}));
  } catch (const std::exception& e) {
    return fmt::format("nothing merged: {}", e.what());
  }
}

}  // namespace ddp
