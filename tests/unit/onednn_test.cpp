// oneDNN's CPU convolutions (Note [oneDNN convolutions]) against the im2col + GEMM
// path they replace: forward, input gradient, weight and bias gradients, for odd
// shapes, strides, padding, one input channel, rectangular kernels and batches of
// one and none; plus the gradient destination and the errors of the checked ops.
// bf16 precision (Note [cpu bf16]): matmuls and convolutions equal the f32
// computation on bf16-rounded operands, and differ from plain f32. Signals during
// oneDNN's kernels run on a stack, not in its heap buffers (Note [oneDNN and signals]).
#include "runtime/ops/cpu/onednn.h"
#include "runtime/autograd/autograd.h"
#include "runtime/autograd/functions.h"
#include "runtime/error.h"
#include "runtime/ops/nn_ops.h"
#include "runtime/ops/ops.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace ddp {
namespace {

struct Case {
  int64_t n, c, h, w, c_out, kh, kw, stride, pad;
};

// max |a - b| over max(1, max |b|): both paths sum hundreds to thousands of f32
// products in different orders, so their rounding differs by a few ulp of the
// largest entries; a wrong tap or layout errs by O(1).
double max_rel_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const auto av = a.to_vector<float>(), bv = b.to_vector<float>();
  double worst = 0.0, scale = 1.0;
  for (size_t i = 0; i < av.size() && i < bv.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(av[i]) - bv[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(bv[i])));
  }
  return worst / scale;
}

class OneDnnConv : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!onednn_convolutions()) {
      GTEST_SKIP() << "this build has no oneDNN (configure found no libdnnl-dev; "
                      "deploy/install-deps.sh installs it) or DDP_ONEDNN=0 is set";
    }
  }
};

TEST_F(OneDnnConv, EveryDirectionEqualsIm2colAndGemm) {
  const Case cases[] = {
      {3, 2, 7, 5, 4, 3, 3, 1, 1},      // odd image, channel counts below oneDNN's block
      {2, 3, 9, 8, 5, 3, 3, 2, 0},      // stride 2, no padding
      {2, 3, 9, 8, 5, 3, 3, 2, 1},      // stride 2 with padding
      {4, 1, 28, 28, 32, 3, 3, 1, 1},   // the CNN's first layer (one input channel)
      {2, 32, 14, 14, 64, 3, 3, 1, 1},  // the CNN's second layer (blocked layouts)
      {1, 17, 6, 11, 19, 5, 3, 1, 2},   // rectangular kernel, one image, 17 and 19 channels
      {2, 4, 5, 5, 3, 1, 1, 1, 0},      // 1x1
  };
  uint64_t seed = 100;
  for (const Case& k : cases) {
    SCOPED_TRACE(fmt::format("x [{}, {}, {}, {}], c_out {}, kernel {}x{}, stride {}, pad {}", k.n,
                             k.c, k.h, k.w, k.c_out, k.kh, k.kw, k.stride, k.pad));
    const Tensor x = randn({k.n, k.c, k.h, k.w}, seed++);
    const Tensor weight = randn({k.c_out, k.c, k.kh, k.kw}, seed++);
    const Tensor bias = randn({k.c_out}, seed++);
    const auto g = conv_geometry(x, {k.kh, k.kw}, {k.stride, k.stride}, {k.pad, k.pad});
    const Tensor gy = randn({k.n, k.c_out, g.out_h(), g.out_w()}, seed++);

    // The reference: im2col rows [N*HW, K] times W^T, in [N, HW, C_out] order.
    const Tensor cols = im2col(x, g);
    const Tensor w2d = weight.reshape({k.c_out, k.c * k.kh * k.kw});
    const Tensor rows = add_bias_rows(matmul(cols, w2d, {.trans_b = true}), bias);
    const Tensor ref_y = permute4(rows.reshape({k.n, g.out_h(), g.out_w(), k.c_out}), {0, 3, 1, 2});
    const Tensor grows = permute4(gy, {0, 2, 3, 1}).reshape({cols.size(0), k.c_out});
    const Tensor ref_gx = col2im(matmul(grows, w2d), g);
    const Tensor ref_gw = matmul(grows, cols, {.trans_a = true}).reshape(weight.shape());
    const Tensor ref_gb = sum(grows, 0);

    EXPECT_LT(max_rel_diff(conv2d_onednn(x, weight, bias, g), ref_y), 1e-5);
    EXPECT_LT(
        max_rel_diff(
            conv2d_onednn(x, weight, Tensor(), g),
            permute4(
                matmul(cols, w2d, {.trans_b = true}).reshape({k.n, g.out_h(), g.out_w(), k.c_out}),
                {0, 3, 1, 2})),
        1e-5);
    EXPECT_LT(max_rel_diff(conv2d_backward_input_onednn(gy, weight, g), ref_gx), 1e-5);
    for (bool with_bias : {true, false}) {
      const auto grads = conv2d_backward_params_onednn(gy, x, weight.shape(), g, with_bias);
      EXPECT_LT(max_rel_diff(grads.weight, ref_gw), 1e-5);
      EXPECT_EQ(grads.bias.defined(), with_bias);
      if (with_bias) {
        EXPECT_LT(max_rel_diff(grads.bias, ref_gb), 1e-5);
      }
    }
  }
}

TEST_F(OneDnnConv, EmptyBatchGivesZeroParameterGradients) {
  const Tensor x = randn({0, 3, 6, 6}, 7), weight = randn({4, 3, 3, 3}, 8);
  const auto g = conv_geometry(x, 3, 1, 1);
  EXPECT_EQ(conv2d_onednn(x, weight, Tensor(), g).shape(), (Shape{0, 4, 6, 6}));
  const Tensor gy = randn({0, 4, 6, 6}, 9);
  EXPECT_EQ(conv2d_backward_input_onednn(gy, weight, g).shape(), x.shape());
  Tensor dirty = full({4, 3, 3, 3}, 5.0);  // a destination is overwritten, not accumulated
  const auto grads =
      conv2d_backward_params_onednn(gy, x, weight.shape(), g, true, {dirty, Tensor()});
  for (float v : grads.weight.to_vector<float>()) EXPECT_EQ(v, 0.0f);
  for (float v : grads.bias.to_vector<float>()) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(grads.weight.data_ptr(), dirty.data_ptr());
}

TEST_F(OneDnnConv, ZeroChannelsGiveTheBiasAndZeroGradients) {
  const Tensor x = randn({2, 0, 5, 5}, 51), weight = randn({3, 0, 3, 3}, 52);
  const Tensor bias = from_vector<float>({1.5f, -2.0f, 0.25f}, {3});
  const auto g = conv_geometry(x, 3, 1, 1);
  const auto y = conv2d_onednn(x, weight, bias, g).to_vector<float>();
  ASSERT_EQ(y.size(), size_t{2 * 3 * 25});
  for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], bias.to_vector<float>()[(i / 25) % 3]);
  const Tensor x2 = randn({2, 4, 5, 5}, 53), no_filters = randn({0, 4, 3, 3}, 54);
  const Tensor gx =
      conv2d_backward_input_onednn(randn({2, 0, 5, 5}, 55), no_filters, conv_geometry(x2, 3, 1, 1));
  for (float v : gx.to_vector<float>()) EXPECT_EQ(v, 0.0f);
}

// Note [oneDNN threads]: a primitive made by one thread, run by two others at once
// (DataParallel's replicas share the cache), gives every thread the same result.
TEST_F(OneDnnConv, CachedPrimitivesRunOnOtherThreads) {
  const Tensor x = randn({4, 16, 12, 12}, 61), weight = randn({32, 16, 3, 3}, 62);
  const Tensor bias = randn({32}, 63), gy = randn({4, 32, 12, 12}, 64);
  const auto g = conv_geometry(x, 3, 1, 1);
  Tensor ref_y, ref_gx, ref_gw;
  std::thread([&] {
    ref_y = conv2d_onednn(x, weight, bias, g);
    ref_gx = conv2d_backward_input_onednn(gy, weight, g);
    ref_gw = conv2d_backward_params_onednn(gy, x, weight.shape(), g, true).weight;
  }).join();
  double worst[2] = {1.0, 1.0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      double w = 0.0;
      for (int i = 0; i < 10; ++i) {
        w = std::max(w, max_rel_diff(conv2d_onednn(x, weight, bias, g), ref_y));
        w = std::max(w, max_rel_diff(conv2d_backward_input_onednn(gy, weight, g), ref_gx));
        w = std::max(
            w, max_rel_diff(conv2d_backward_params_onednn(gy, x, weight.shape(), g, true).weight,
                            ref_gw));
      }
      worst[t] = w;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(worst[0], 0.0);
  EXPECT_EQ(worst[1], 0.0);
}

// Note [gradient destinations]: the weight gradient lands in DDP's bucket slice.
TEST_F(OneDnnConv, WeightGradientIsWrittenIntoItsDestination) {
  Tensor x = randn({2, 3, 8, 8}, 11), weight = randn({5, 3, 3, 3}, 12), bias = randn({5}, 13);
  set_requires_grad(weight, true);
  set_requires_grad(bias, true);
  const Tensor expected_gw = [&] {
    Tensor w2 = weight.clone();
    set_requires_grad(w2, true);
    backward(functional::sum(functional::conv2d(x, w2, bias, {1, 1})));
    return grad(w2);
  }();
  set_grad(bias, Tensor());
  Tensor destination = full({5, 3, 3, 3}, -1.0);
  set_gradient_destination(weight, destination);
  backward(functional::sum(functional::conv2d(x, weight, bias, {1, 1})));
  EXPECT_EQ(grad(weight).data_ptr(), destination.data_ptr());
  EXPECT_LT(max_rel_diff(destination, expected_gw), 1e-6);
}

TEST_F(OneDnnConv, BadShapesNameTheValues) {
  const Tensor x = randn({2, 3, 6, 6}, 1), weight = randn({4, 2, 3, 3}, 2);
  const auto g = conv_geometry(x, 3, 1, 1);
  try {
    conv2d_onednn(x, weight, Tensor(), g);
    FAIL() << "a weight with 2 input channels for a 3-channel input was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("[4, 2, 3, 3]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 3, 6, 6]"), std::string::npos) << e.what();
  }
  const Tensor good_w = randn({4, 3, 3, 3}, 3);
  EXPECT_THROW(conv2d_onednn(x, good_w, randn({5}, 4), g), ValueError);  // bias of 5 for 4
  EXPECT_THROW(conv2d_backward_input_onednn(randn({2, 4, 5, 5}, 5), good_w, g), ValueError);
}

// Sets a CPU precision for one test and restores f32.
class PrecisionGuard {
 public:
  explicit PrecisionGuard(CpuPrecision p) { set_cpu_precision(p, /*allow_emulation=*/true); }
  ~PrecisionGuard() { set_cpu_precision(CpuPrecision::f32); }
};

Tensor bf16_rounded(const Tensor& t) {
  return cast(cast(t, DType::bf16), DType::f32);
}

// The two ways the bf16 precision multiplies (kernels::cpu::onednn::bf16_primitives()):
// oneDNN's bf16 primitives where the CPU has them (avx512_core and newer; else this is
// the second way too), and operands rounded to bf16 values multiplied in f32 (AVX2).
class Bf16Way {
 public:
  explicit Bf16Way(bool rounding) { kernels::cpu::onednn::force_bf16_rounding(rounding); }
  ~Bf16Way() { kernels::cpu::onednn::force_bf16_rounding(false); }
};
const char* bf16_way_name(bool rounding) {
  if (rounding) return "rounded operands in f32";
  return kernels::cpu::onednn::bf16_primitives() ? "bf16 primitives"
                                                 : "rounded operands in f32 (no bf16 primitives)";
}

TEST_F(OneDnnConv, Bf16MatmulIsF32OnRoundedOperands) {
  for (bool rounding : {false, true}) {
    for (auto [ta, tb] : {std::pair{false, false}, {true, false}, {false, true}, {true, true}}) {
      for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{70, 260, 66}, {5, 10, 3}}) {
        SCOPED_TRACE(fmt::format("m {} n {} k {} trans_a {} trans_b {}, {}", m, n, k, ta, tb,
                                 bf16_way_name(rounding)));
        const Bf16Way way(rounding);
        const Tensor a = randn(ta ? Shape{k, m} : Shape{m, k}, 21);
        const Tensor b = randn(tb ? Shape{n, k} : Shape{k, n}, 22);
        const Tensor c0 = randn({m, n}, 23);
        const MatmulOptions o{.trans_a = ta, .trans_b = tb, .alpha = 2.0f, .beta = 0.5f};
        Tensor ref = c0.clone(), f32 = c0.clone(), got = c0.clone();
        matmul_out(bf16_rounded(a), bf16_rounded(b), ref, o);  // f32: products of bf16 are exact
        matmul_out(a, b, f32, o);
        {
          PrecisionGuard bf16(CpuPrecision::bf16);
          matmul_out(a, b, got, o);
        }
        EXPECT_LT(max_rel_diff(got, ref), 1e-5);
        EXPECT_GT(max_rel_diff(got, f32), 1e-4) << "the bf16 precision multiplied in f32";
      }
    }
  }
}

TEST_F(OneDnnConv, Bf16ConvolutionIsF32OnRoundedOperands) {
  const Tensor x = randn({2, 16, 9, 9}, 31), weight = randn({32, 16, 3, 3}, 32);
  const Tensor bias = randn({32}, 33);
  const auto g = conv_geometry(x, 3, 1, 1);
  const Tensor gy = randn({2, 32, 9, 9}, 34);
  const Tensor ref_y = conv2d_onednn(bf16_rounded(x), bf16_rounded(weight), bias, g);
  const Tensor ref_gx = conv2d_backward_input_onednn(bf16_rounded(gy), bf16_rounded(weight), g);
  const auto ref_p =
      conv2d_backward_params_onednn(bf16_rounded(gy), bf16_rounded(x), weight.shape(), g, true);
  const Tensor f32_y = conv2d_onednn(x, weight, bias, g);
  for (bool rounding : {false, true}) {
    SCOPED_TRACE(bf16_way_name(rounding));
    const Bf16Way way(rounding);
    PrecisionGuard bf16(CpuPrecision::bf16);
    const Tensor y = conv2d_onednn(x, weight, bias, g);
    EXPECT_LT(max_rel_diff(y, ref_y), 1e-5);
    EXPECT_GT(max_rel_diff(y, f32_y), 1e-4) << "the bf16 precision convolved in f32";
    EXPECT_LT(max_rel_diff(conv2d_backward_input_onednn(gy, weight, g), ref_gx), 1e-5);
    const auto p = conv2d_backward_params_onednn(gy, x, weight.shape(), g, true);
    EXPECT_LT(max_rel_diff(p.weight, ref_p.weight), 1e-5);
    EXPECT_LT(max_rel_diff(p.bias, ref_p.bias), 1e-5);
  }
}

TEST_F(OneDnnConv, PrecisionIsReportedAndRestored) {
  EXPECT_EQ(cpu_precision(), CpuPrecision::f32);
  {
    PrecisionGuard bf16(CpuPrecision::bf16);
    EXPECT_EQ(cpu_precision(), CpuPrecision::bf16);
  }
  EXPECT_EQ(cpu_precision(), CpuPrecision::f32);
  if (!cpu_has_bf16()) {
    try {
      set_cpu_precision(CpuPrecision::bf16);
      FAIL() << "bf16 precision was accepted on a CPU without AVX512_BF16";
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find("AVX512_BF16"), std::string::npos) << e.what();
    }
  }
}

// Note [oneDNN and signals]. A child process (a death test, so it starts with no
// OpenMP pool) runs oneDNN's sgemm at the MLP's first-layer shape (k = 784, where
// oneDNN 2.6 moves the stack register into a heap buffer) and convolutions
// through the primitives, while another thread sends SIGUSR2 every 20 us, to the
// GEMM thread and to the process in turn. The handler records its thread and
// where the kernel put the signal frame (its ucontext, the frame the bug
// misplaces; a local's address would lie on ASan's fake stack where that is on);
// every frame must lie on that thread's stack. Without the signal mask around
// oneDNN's executions the child died of SIGSEGV (seen: every run).
struct SignalFrame {
  pthread_t thread;
  uintptr_t address;
};
constexpr int kMaxFrames = 1 << 16;
SignalFrame g_frames[kMaxFrames];
std::atomic<int> g_frame_count{0};

void record_frame(int, siginfo_t*, void* context) {
  const int i = g_frame_count.fetch_add(1);
  if (i < kMaxFrames) g_frames[i] = {pthread_self(), reinterpret_cast<uintptr_t>(context)};
}

struct StackRange {
  uintptr_t low = 0, high = 0;
  bool contains(uintptr_t a) const { return a >= low && a < high; }
};

StackRange stack_of(pthread_t thread) {
  pthread_attr_t attr;
  if (pthread_getattr_np(thread, &attr) != 0) return {};
  void* low = nullptr;
  size_t size = 0;
  pthread_attr_getstack(&attr, &low, &size);
  pthread_attr_destroy(&attr);
  return {reinterpret_cast<uintptr_t>(low), reinterpret_cast<uintptr_t>(low) + size};
}

// Exit codes: 0 every frame on its stack; 2 no signal was handled; 3 a frame off its
// thread's stack; 4 the GEMM thread's mask was left changed.
void gemms_under_signals() {
  ::alarm(120);  // a child whose heap was corrupted ends (SIGALRM) instead of hanging
  struct sigaction action = {};
  action.sa_sigaction = record_frame;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | SA_SIGINFO;
  sigaction(SIGUSR2, &action, nullptr);
  sigset_t mask_before;
  pthread_sigmask(SIG_SETMASK, nullptr, &mask_before);

  const pthread_t gemm_thread = pthread_self();
  std::atomic<bool> stop{false};
  StackRange sender_stack;
  pthread_t sender_thread{};
  std::thread sender([&] {
    sender_thread = pthread_self();
    sender_stack = stack_of(sender_thread);
    for (int i = 0; !stop.load(); ++i) {
      if (i % 2 == 0) {
        pthread_kill(gemm_thread, SIGUSR2);
      } else {
        kill(getpid(), SIGUSR2);
      }
      const timespec pause{0, 20'000};
      nanosleep(&pause, nullptr);
    }
  });
  const int64_t m = 64, n = 256, k = 784;
  const std::vector<float> a(m * k, 0.5f), b(k * n, 0.25f);
  std::vector<float> c(m * n);
  for (int i = 0; i < 400; ++i) {
    kernels::cpu::onednn::sgemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f,
                                c.data(), n);
  }
  const Tensor x = randn({8, 32, 14, 14}, 71), weight = randn({64, 32, 3, 3}, 72);
  const Tensor bias = randn({64}, 73), gy = randn({8, 64, 14, 14}, 74);
  const auto g = conv_geometry(x, 3, 1, 1);
  for (int i = 0; i < 20; ++i) {
    conv2d_onednn(x, weight, bias, g);
    conv2d_backward_input_onednn(gy, weight, g);
    conv2d_backward_params_onednn(gy, x, weight.shape(), g, true);
  }
  stop = true;
  sender.join();

  sigset_t mask_after;
  pthread_sigmask(SIG_SETMASK, nullptr, &mask_after);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sigismember(&mask_before, sig) != sigismember(&mask_after, sig)) std::_Exit(4);
  }
  const int frames = std::min(g_frame_count.load(), kMaxFrames);
  if (frames == 0) std::_Exit(2);
  const StackRange gemm_stack = stack_of(gemm_thread);
  int off_stack = 0;
  for (int i = 0; i < frames; ++i) {
    const SignalFrame& f = g_frames[i];
    const StackRange range = pthread_equal(f.thread, gemm_thread)     ? gemm_stack
                             : pthread_equal(f.thread, sender_thread) ? sender_stack
                                                                      : stack_of(f.thread);
    if (!range.contains(f.address)) ++off_stack;
  }
  std::fprintf(stderr, "%d signals handled, %d of them off their thread's stack\n", frames,
               off_stack);
  std::_Exit(off_stack == 0 ? 0 : 3);
}

TEST(OneDnnSignalsDeathTest, HandlersRunOnTheThreadsStackDuringGemms) {
  if (!onednn_convolutions()) {
    GTEST_SKIP() << "this build has no oneDNN (configure found no libdnnl-dev; "
                    "deploy/install-deps.sh installs it) or DDP_ONEDNN=0 is set";
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(gemms_under_signals(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace ddp
