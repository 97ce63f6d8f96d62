// Kernels on the CPU (Note [emulated CUDA device] in kernel_emu.h): every CUDA thread
// of a block is a fiber with a stack of its own, run by a round-robin
// scheduler on the launching thread. A fiber runs until it reaches __syncthreads or a
// warp shuffle and waits there until every live thread of its block (or warp) has
// come; a thread that returns counts as arrived, as on sm_70 and later. When no fiber
// can run and some have not finished, the block is deadlocked (threads waiting at
// different barriers): the launch records an error naming the kernel and the block.
//
// A kernel whose first block never waits runs its other blocks' threads as plain
// calls, one after another: most kernels are grid-stride loops without barriers, and
// a fiber switch per thread would dominate their time. Such a kernel reaching a
// barrier in a later block is an error the launch records.
#include "runtime/cuda/emu/kernel_emu.h"

#include <sys/mman.h>
#include <ucontext.h>

#include <array>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define DDP_EMU_ASAN 1
#else
#define DDP_EMU_ASAN 0
#endif

#if defined(__x86_64__)
// void ddp_emu_switch_stack(void** save_sp, void* load_sp): pushes the callee-saved
// registers on the current stack, stores the stack pointer in *save_sp, loads load_sp
// and pops the same from there. MXCSR and the x87 control word are not switched: every
// fiber runs on the launching thread, whose floating-point modes no kernel changes
// (saving and loading them took a third of a switch).
extern "C" void ddp_emu_switch_stack(void** save_sp, void* load_sp);
asm(R"(
  .text
  .p2align 4
  .type ddp_emu_switch_stack, @function
ddp_emu_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ddp_emu_switch_stack, .-ddp_emu_switch_stack
  .section .note.GNU-stack,"",@progbits
  .text
)");
#endif

namespace ddp::cuda_emu {
namespace {

constexpr int kWarp = 32;
constexpr size_t kStackBytes = DDP_EMU_ASAN ? (1u << 20) : (256u << 10);

// A barrier call in a block run without fibers.
struct SyncWithoutFibers : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class State { ready, at_block_barrier, at_warp_barrier, done };

// Where a suspended fiber (or the scheduler) resumes.
struct Context {
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t uc{};
#endif
};

void switch_context(Context& from, Context& to) {
#if defined(__x86_64__)
  ddp_emu_switch_stack(&from.sp, to.sp);
#else
  swapcontext(&from.uc, &to.uc);
#endif
}

struct Fiber {
  Context context{};
  char* stack = nullptr;
  uint3 tid{};
  int linear = 0;
  State state = State::ready;
  unsigned exchanges = 0;  // warp shuffles so far: which of the two slots is this one's
  void* fake_stack = nullptr;
};

// A fiber's stack, with an inaccessible page below it: a kernel that overflows its
// stack faults instead of writing over the next fiber's frames.
constexpr size_t kGuardBytes = 4096;
struct Stack {
  char* base = nullptr;  // the usable kStackBytes, above the guard page
  Stack() {
    void* p = mmap(nullptr, kGuardBytes + kStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("emulated CUDA: cannot map a fiber's stack");
    mprotect(p, kGuardBytes, PROT_NONE);
    base = static_cast<char*>(p) + kGuardBytes;
  }
  ~Stack() { munmap(base - kGuardBytes, kGuardBytes + kStackBytes); }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
};

// The state of the launch running on this thread.
struct Grid {
  const char* name = "";
  dim3 grid, block;
  uint3 block_idx{};
  void (*body)(void*) = nullptr;
  void* ctx = nullptr;

  bool fibers = true;        // this block runs as fibers (else as plain calls)
  uint3 direct_tid{};        // the thread a plain call runs
  Fiber* current = nullptr;  // the fiber running now
  std::vector<Fiber> threads;
  int live = 0;              // threads of the block not yet returned
  int at_block_barrier = 0;  // of them, waiting at __syncthreads
  std::vector<int> warp_live, at_warp_barrier;
  // [warp][slot][lane]: a shuffle's values, two slots so that a lane that has read its
  // value may store the next shuffle's before the slower lanes read this one's.
  std::vector<std::array<std::array<std::array<unsigned char, 16>, kWarp>, 2>> exchange;
  bool waited = false;  // some thread of this block waited at a barrier
  std::string error;    // the first failure inside the block (an exception in a thread)

  Context scheduler{};
  void* scheduler_fake_stack = nullptr;
  const void* scheduler_stack_bottom = nullptr;
  size_t scheduler_stack_size = 0;
  bool from_scheduler = false;  // the switch under way started in the scheduler
};

thread_local Grid* t_grid = nullptr;
thread_local std::string t_last_error;
std::mutex g_launch_mutex;  // one launch at a time: __shared__ is a static
std::vector<std::unique_ptr<Stack>> g_stacks;

Grid& grid() {
  if (t_grid == nullptr) {
    std::fprintf(stderr, "emulated CUDA: a device function ran outside a kernel launch\n");
    std::abort();
  }
  return *t_grid;
}

void finish_switch_into_fiber(Grid& g, Fiber& f) {
#if DDP_EMU_ASAN
  // A switch from the scheduler tells where its stack is, the way back to it.
  const void* from_bottom = nullptr;
  size_t from_size = 0;
  __sanitizer_finish_switch_fiber(f.fake_stack, &from_bottom, &from_size);
  if (g.from_scheduler) {
    g.scheduler_stack_bottom = from_bottom;
    g.scheduler_stack_size = from_size;
    g.from_scheduler = false;
  }
#else
  (void)g;
  (void)f;
#endif
}

// The first fiber after `f` in thread order that can run, or null.
Fiber* next_ready(Grid& g, const Fiber& f) {
  for (size_t i = static_cast<size_t>(f.linear) + 1; i < g.threads.size(); ++i)
    if (g.threads[i].state == State::ready) return &g.threads[i];
  return nullptr;
}

// From fiber `f` (waiting at a barrier, or done) straight to the next fiber after it
// that can run, else back to the scheduler, which goes round again; `f` resumes here
// when it runs again unless it is done. Going fiber to fiber, not through the
// scheduler, halves the switches of a barrier.
void yield(Grid& g, Fiber& f) {
  Fiber* next = next_ready(g, f);
#if DDP_EMU_ASAN
  __sanitizer_start_switch_fiber(f.state == State::done ? nullptr : &f.fake_stack,
                                 next != nullptr ? next->stack : g.scheduler_stack_bottom,
                                 next != nullptr ? kStackBytes : g.scheduler_stack_size);
#endif
  if (next != nullptr) {
    g.current = next;
    switch_context(f.context, next->context);
  } else {
    switch_context(f.context, g.scheduler);
  }
  finish_switch_into_fiber(g, f);
}

void release_block(Grid& g) {
  for (Fiber& f : g.threads)
    if (f.state == State::at_block_barrier) f.state = State::ready;
  g.at_block_barrier = 0;
}

void release_warp(Grid& g, int warp) {
  const size_t first = static_cast<size_t>(warp) * kWarp;
  const size_t end = std::min(first + kWarp, g.threads.size());
  for (size_t i = first; i < end; ++i)
    if (g.threads[i].state == State::at_warp_barrier) g.threads[i].state = State::ready;
  g.at_warp_barrier[warp] = 0;
}

void fiber_entry() {
  Grid& g = *t_grid;
  Fiber& f = *g.current;
  finish_switch_into_fiber(g, f);
  try {
    g.body(g.ctx);
  } catch (const std::exception& e) {
    if (g.error.empty()) g.error = e.what();
  } catch (...) {
    if (g.error.empty()) g.error = "a thread threw a non-standard exception";
  }
  f.state = State::done;
  --g.live;
  const int warp = f.linear / kWarp;
  --g.warp_live[warp];
  if (g.at_block_barrier > 0 && g.at_block_barrier == g.live) release_block(g);
  if (g.at_warp_barrier[warp] > 0 && g.at_warp_barrier[warp] == g.warp_live[warp])
    release_warp(g, warp);
  yield(g, f);  // never resumed
}

// How far below the top of its stack fiber f starts: the stacks' tops are all at the
// same offset in a page, so without it the fibers' hot frames would share a few cache
// sets and evict each other at every switch. A multiple of 64 (a cache line, and the
// alignment a frame needs).
size_t stack_color(const Fiber& f) {
  return static_cast<size_t>(f.linear % 64) * 64 + static_cast<size_t>(f.linear / 64 % 4) * 4096;
}

// Makes f.context start fiber_entry at the top of f's stack.
void start_context(Fiber& f) {
#if defined(__x86_64__)
  // The frame ddp_emu_switch_stack pops: six registers, then the "return address"
  // fiber_entry, entered with the stack aligned as after a call.
  auto* top = reinterpret_cast<uint64_t*>(f.stack + kStackBytes - stack_color(f));
  top[-1] = 0;  // fiber_entry's own return address: it never returns
  top[-2] = reinterpret_cast<uint64_t>(&fiber_entry);
  for (int r = 3; r <= 8; ++r) top[-r] = 0;  // rbp rbx r12 r13 r14 r15
  f.context.sp = &top[-8];
#else
  getcontext(&f.context.uc);
  f.context.uc.uc_stack.ss_sp = f.stack;
  f.context.uc.uc_stack.ss_size = kStackBytes - stack_color(f);
  f.context.uc.uc_link = nullptr;
  makecontext(&f.context.uc, fiber_entry, 0);
#endif
}

std::string block_name(const Grid& g) {
  return "block (" + std::to_string(g.block_idx.x) + ", " + std::to_string(g.block_idx.y) + ", " +
         std::to_string(g.block_idx.z) + ")";
}

void run_block_with_fibers(Grid& g) {
  const int n = static_cast<int>(g.block.x * g.block.y * g.block.z);
  while (g_stacks.size() < static_cast<size_t>(n)) g_stacks.push_back(std::make_unique<Stack>());
  g.threads.assign(static_cast<size_t>(n), Fiber{});
  const int warps = (n + kWarp - 1) / kWarp;
  g.warp_live.assign(static_cast<size_t>(warps), 0);
  g.at_warp_barrier.assign(static_cast<size_t>(warps), 0);
  g.exchange.resize(static_cast<size_t>(warps));
  g.live = n;
  g.at_block_barrier = 0;
  for (int i = 0; i < n; ++i) {
    Fiber& f = g.threads[static_cast<size_t>(i)];
    f.linear = i;
    f.tid = uint3{static_cast<unsigned>(i) % g.block.x,
                  static_cast<unsigned>(i) / g.block.x % g.block.y,
                  static_cast<unsigned>(i) / (g.block.x * g.block.y)};
    f.stack = g_stacks[static_cast<size_t>(i)]->base;
    ++g.warp_live[static_cast<size_t>(i / kWarp)];
    start_context(f);
  }
  while (g.live > 0) {
    bool ran = false;
    for (Fiber& f : g.threads) {
      if (f.state != State::ready) continue;
      ran = true;
      g.current = &f;
#if DDP_EMU_ASAN
      g.from_scheduler = true;
      __sanitizer_start_switch_fiber(&g.scheduler_fake_stack, f.stack, kStackBytes);
#endif
      switch_context(g.scheduler, f.context);
#if DDP_EMU_ASAN
      __sanitizer_finish_switch_fiber(g.scheduler_fake_stack, nullptr, nullptr);
#endif
      g.current = nullptr;
    }
    if (!ran) {
      int at_block = 0, at_warp = 0;
      for (const Fiber& f : g.threads) {
        at_block += f.state == State::at_block_barrier;
        at_warp += f.state == State::at_warp_barrier;
      }
#if DDP_EMU_ASAN
      // The waiting fibers are abandoned: their frames' redzones must not greet the
      // next launch that gets their stacks.
      for (const Fiber& f : g.threads)
        if (f.state != State::done) __asan_unpoison_memory_region(f.stack, kStackBytes);
#endif
      if (g.error.empty())
        g.error = block_name(g) + " deadlocked: " + std::to_string(at_block) +
                  " thread(s) wait at __syncthreads and " + std::to_string(at_warp) +
                  " at a warp shuffle whose other threads never come (a barrier in divergent "
                  "code)";
      return;
    }
  }
}

void run_block_directly(Grid& g) {
  for (unsigned z = 0; z < g.block.z; ++z)
    for (unsigned y = 0; y < g.block.y; ++y)
      for (unsigned x = 0; x < g.block.x; ++x) {
        g.direct_tid = uint3{x, y, z};
        try {
          g.body(g.ctx);
        } catch (const SyncWithoutFibers& e) {
          g.error = block_name(g) + " reached " + e.what() +
                    " but block (0, 0, 0) never waited at a barrier, so the emulator runs "
                    "this kernel's blocks without fibers: a kernel whose blocks synchronize "
                    "differently is not emulated";
          return;
        } catch (const std::exception& e) {
          g.error = e.what();
          return;
        } catch (...) {
          g.error = "a thread threw a non-standard exception";
          return;
        }
      }
}

std::string check_config(const Config& c) {
  const auto threads = static_cast<uint64_t>(c.block.x) * c.block.y * c.block.z;
  if (threads == 0 || threads > 1024 || c.block.z > 64)
    return "invalid block (" + std::to_string(c.block.x) + ", " + std::to_string(c.block.y) + ", " +
           std::to_string(c.block.z) + "): 1 to 1024 threads, z at most 64";
  if (c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 || c.grid.x > 0x7fffffffu ||
      c.grid.y > 65535 || c.grid.z > 65535)
    return "invalid grid (" + std::to_string(c.grid.x) + ", " + std::to_string(c.grid.y) + ", " +
           std::to_string(c.grid.z) + ")";
  if (c.shared != 0)
    return "dynamic shared memory (" + std::to_string(c.shared) + " bytes) is not emulated";
  return "";
}

}  // namespace

void run_grid(const char* name, const Config& config, void (*body)(void*), void* ctx) {
  std::string bad = check_config(config);
  if (bad.empty()) bad = stream_problem(config.stream);
  if (!bad.empty()) {
    if (t_last_error.empty()) t_last_error = std::string(name) + ": " + bad;
    return;
  }
  // Kernels do not launch kernels: one launch at a time, never nested.
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  Grid g;
  g.name = name;
  g.grid = config.grid;
  g.block = config.block;
  g.body = body;
  g.ctx = ctx;
  struct Running {
    explicit Running(Grid* g) { t_grid = g; }
    ~Running() { t_grid = nullptr; }
  } running(&g);
  for (unsigned z = 0; z < g.grid.z && g.error.empty(); ++z)
    for (unsigned y = 0; y < g.grid.y && g.error.empty(); ++y)
      for (unsigned x = 0; x < g.grid.x && g.error.empty(); ++x) {
        g.block_idx = uint3{x, y, z};
        if (g.fibers) {
          run_block_with_fibers(g);
          // Only block 0 can end without a wait here: once a block has waited, every
          // later one runs as fibers.
          if (!g.waited) g.fibers = false;
        } else {
          run_block_directly(g);
        }
      }
  if (!g.error.empty() && t_last_error.empty()) t_last_error = std::string(name) + ": " + g.error;
}

const char* take_last_error() {
  thread_local std::string taken;
  taken = std::move(t_last_error);
  t_last_error.clear();
  return taken.c_str();
}

const uint3& thread_idx() {
  Grid& g = grid();
  return g.fibers ? g.current->tid : g.direct_tid;
}
const uint3& block_idx() {
  return grid().block_idx;
}
const dim3& block_dim() {
  return grid().block;
}
const dim3& grid_dim() {
  return grid().grid;
}

void sync_threads() {
  Grid& g = grid();
  if (!g.fibers) throw SyncWithoutFibers("__syncthreads");
  Fiber& f = *g.current;
  g.waited = true;
  f.state = State::at_block_barrier;
  if (++g.at_block_barrier == g.live) {
    release_block(g);
    return;
  }
  yield(g, f);
}

void warp_exchange(const void* value, void* out, size_t bytes, int src_lane_xor, int width) {
  Grid& g = grid();
  if (!g.fibers) throw SyncWithoutFibers("a warp shuffle");
  Fiber& f = *g.current;
  g.waited = true;
  const int warp = f.linear / kWarp, lane = f.linear % kWarp;
  auto& slot = g.exchange[static_cast<size_t>(warp)][f.exchanges++ & 1u];
  std::memcpy(slot[static_cast<size_t>(lane)].data(), value, bytes);
  f.state = State::at_warp_barrier;
  if (++g.at_warp_barrier[static_cast<size_t>(warp)] == g.warp_live[static_cast<size_t>(warp)])
    release_warp(g, warp);
  else
    yield(g, f);
  int src = lane ^ src_lane_xor;
  const int lanes = std::min(kWarp, static_cast<int>(g.threads.size()) - warp * kWarp);
  // A lane past the group of `width` lanes (or past a partial warp) gives the caller
  // its own value, as __shfl_xor_sync does for a later group. (width is a power of two,
  // as CUDA requires; a division here took a tenth of the emulation's time.)
  const bool later_group =
      width <= 0 ||
      ((width & (width - 1)) == 0 ? (src & -width) > (lane & -width) : src / width > lane / width);
  if (later_group || src >= lanes) src = lane;
  std::memcpy(out, slot[static_cast<size_t>(src)].data(), bytes);
}

}  // namespace ddp::cuda_emu
