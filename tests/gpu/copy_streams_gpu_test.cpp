// Copies and streams on CUDA, the cases the GPU review asked for:
//  - a copy issued right after a large fill of its source sees the filled values
//    (same device with a non-default current stream; across two devices), and a
//    copy between CUDA tensors never blocks the host;
//  - ops on cuda:0 while another device is current (two GPUs), or from a thread
//    that never set its device (one GPU), give the CPU's results;
//  - pinned host blocks freed right after a non_blocking copy are not handed out
//    again before that copy has read them.
// The intended behaviour is PyTorch's: copy_ runs on the current stream of the
// device(s) involved and never waits on the host between CUDA tensors; a cross-
// device copy is ordered after the source device's current stream and before
// later work on either device's current stream. Without a GPU every test skips
// and says why (and the two-GPU cases say so on a one-GPU machine).
#include "runtime/cuda/cuda_api.h"
#include "runtime/device.h"
#include "runtime/memory/allocator.h"
#include "runtime/ops/ops.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"
#include "tests/gpu/require_gpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#define DDP_REQUIRE_TWO_GPUS()                                 \
  DDP_REQUIRE_CUDA();                                          \
  if (::ddp::device_count(::ddp::DeviceType::cuda) < 2)        \
  GTEST_SKIP() << "needs two CUDA devices, this machine has "  \
               << ::ddp::device_count(::ddp::DeviceType::cuda) \
               << " (the one-GPU variant of this check is the test next to it)"

namespace ddp {
namespace {

using gpu_test::kGpu;

// 64 Mi floats (256 MiB): a fill takes long enough (tens of microseconds per pass
// on an H100, more on older GPUs) that a copy on an unordered stream starts
// before it has finished. The emulated device runs every stream in order at once
// (Note [emulated CUDA device]), so there the size shows nothing more than 1 Mi
// floats do, and took 101 s of CI's AddressSanitizer phase.
int64_t large_elements() {
  return cuda_api::emulated() ? int64_t{1} << 20 : int64_t{64} << 20;
}
constexpr int kFillPasses = 8;  // the last pass writes kFillValue

constexpr float kFillValue = 7.0f;

// Fills `t` kFillPasses times on the current stream (the last value kFillValue),
// so the stream stays busy for a while after this returns.
void large_fill(Tensor& t) {
  for (int pass = 1; pass <= kFillPasses; ++pass) {
    fill_(t, pass == kFillPasses ? kFillValue : static_cast<float>(pass));
  }
}

// The index of the first element that is not `value`, or -1.
int64_t first_not(const std::vector<float>& v, float value) {
  const auto it = std::find_if(v.begin(), v.end(), [value](float x) { return x != value; });
  return it == v.end() ? -1 : static_cast<int64_t>(it - v.begin());
}

void expect_all(const Tensor& t, float value, const std::string& what) {
  const std::vector<float> v = t.cpu().to_vector<float>();
  const int64_t bad = first_not(v, value);
  EXPECT_EQ(bad, -1) << what << ": element " << bad << " of " << v.size() << " is "
                     << (bad >= 0 ? v[static_cast<size_t>(bad)] : 0.0f) << ", expected " << value;
}

// ---- a copy right after a large fill of its source ------------------------------

TEST(CopyAfterFill, SameDeviceOnANonDefaultStreamSeesTheFill) {
  DDP_REQUIRE_CUDA();
  // A stream made by Stream::create does not synchronize with the legacy default
  // stream: a copy that ran there (or on any stream but the current one) would
  // overtake the fill.
  const Stream side = Stream::create(kGpu);
  StreamGuard guard(side);
  Tensor src = empty({large_elements()}, {.device = kGpu});
  Tensor dst = empty({large_elements()}, {.device = kGpu});
  fill_(dst, -1.0);
  large_fill(src);
  const uint64_t syncs = cuda_api::host_sync_count();
  copy_(dst, src);
  EXPECT_EQ(cuda_api::host_sync_count() - syncs, 0u)
      << "copy_ between two tensors on " << kGpu.str() << " blocked the host";
  // An op on the current stream right after the copy sees the copied values.
  const Tensor doubled = add(dst, dst);
  expect_all(dst, kFillValue, "the copy");
  expect_all(doubled, 2 * kFillValue, "dst + dst after the copy");
}

TEST(CopyAfterFill, DeviceToHostWaitsForTheFillOnTheCurrentStream) {
  DDP_REQUIRE_CUDA();
  const Stream side = Stream::create(kGpu);
  StreamGuard guard(side);
  Tensor src = empty({large_elements()}, {.device = kGpu});
  large_fill(src);
  Tensor host = full({large_elements()}, -1.0);  // pageable: copy_ returns with the data in place
  copy_(host, src);
  EXPECT_EQ(first_not(host.to_vector<float>(), kFillValue), -1)
      << "device-to-host copy_ returned before the fill on the current stream finished";
}

// The source on `from` is filled on a non-default current stream of `from`, with
// `current` the current device; the copy to `to` must see the fill, never block the
// host, come before later work on `to`'s current stream, and read the source before
// a later fill of it on `from`'s current stream.
void check_cross_device_copy(int from, int to, int current) {
  const Device a = Device::cuda(from), b = Device::cuda(to);
  const Stream side_a = Stream::create(a), side_b = Stream::create(b);
  StreamGuard guard_a(side_a);
  StreamGuard guard_b(side_b);
  Tensor src = empty({large_elements()}, {.device = a});
  Tensor dst = empty({large_elements()}, {.device = b});
  fill_(dst, -1.0);
  large_fill(src);
  cuda_api::set_device(current);
  const uint64_t syncs = cuda_api::host_sync_count();
  copy_(dst, src);
  EXPECT_EQ(cuda_api::host_sync_count() - syncs, 0u)
      << "copy_ from " << a.str() << " to " << b.str() << " blocked the host";
  fill_(src, -2.0);                      // on a's current stream: after the copy read src
  const Tensor doubled = add(dst, dst);  // on b's current stream: after the copy wrote dst
  EXPECT_EQ(cuda_api::current_device(), current) << "copy_ changed the current device";
  const std::string what =
      a.str() + " -> " + b.str() + " with cuda:" + std::to_string(current) + " current";
  expect_all(dst, kFillValue, what);
  expect_all(doubled, 2 * kFillValue, what + ", dst + dst after the copy");
}

TEST(CopyAfterFill, AcrossDevicesSeesTheFillAndDoesNotBlockTheHost) {
  DDP_REQUIRE_TWO_GPUS();
  const int before = cuda_api::current_device();
  check_cross_device_copy(0, 1, 0);
  check_cross_device_copy(0, 1, 1);
  check_cross_device_copy(1, 0, 0);
  check_cross_device_copy(1, 0, 1);
  cuda_api::set_device(before);
}

// ---- ops while another device is current --------------------------------------

// A short chain of ops on `device` compared with the same chain on the CPU, and
// the current device left as it was.
void check_ops_match_cpu(const Device& device, const std::string& context) {
  const int current = cuda_api::current_device();
  const Tensor a = randn({67, 129}, 11, {.device = device});  // made there
  const Tensor b = randn({129, 33}, 12).to(device);           // copied there
  const Tensor a_cpu = a.cpu(), b_cpu = b.cpu();
  const Tensor expected = relu(add(matmul(a_cpu, b_cpu), full({67, 33}, 0.5)));
  const Tensor actual = relu(add(matmul(a, b), full({67, 33}, 0.5, {.device = device})));
  ASSERT_EQ(actual.device(), device) << context;
  const std::vector<float> e = expected.to_vector<float>(), r = actual.cpu().to_vector<float>();
  ASSERT_EQ(r.size(), e.size()) << context;
  for (size_t i = 0; i < e.size(); ++i) {
    ASSERT_NEAR(r[i], e[i], 1e-4 * (1.0 + std::fabs(e[i]))) << context << ", element " << i;
  }
  EXPECT_NEAR(sum(actual).item<float>(), sum(expected).item<float>(),
              1e-4 * (1.0 + std::fabs(sum(expected).item<float>())))
      << context << ": sum";
  EXPECT_EQ(cuda_api::current_device(), current) << context << ": the current device changed";
}

TEST(OpsWhileAnotherDeviceIsCurrent, OpsOnCuda0WithCuda1Current) {
  DDP_REQUIRE_TWO_GPUS();
  const int before = cuda_api::current_device();
  cuda_api::set_device(1);
  check_ops_match_cpu(kGpu, "ops on cuda:0 with cuda:1 current");
  cuda_api::set_device(0);
  check_ops_match_cpu(Device::cuda(1), "ops on cuda:1 with cuda:0 current");
  cuda_api::set_device(before);
}

TEST(OpsWhileAnotherDeviceIsCurrent, OpsFromAThreadThatNeverSetItsDevice) {
  DDP_REQUIRE_CUDA();
  // A new thread has no current stream of its own yet and never called
  // set_device: ddp must pick the tensor's device and that thread's stream itself.
  std::thread worker([] {
    check_ops_match_cpu(kGpu, "ops on cuda:0 from a new thread");
    if (device_count(DeviceType::cuda) > 1) {
      check_ops_match_cpu(Device::cuda(1), "ops on cuda:1 from a new thread");
    }
  });
  worker.join();
}

// ---- pinned blocks reused under stress ------------------------------------------

constexpr int kCopies = 256;
constexpr int64_t kCopyFloats = int64_t{64} << 10;  // 256 KiB per copy

// Queues enough work on the current stream of cuda:0 that the copies queued after
// it are still pending while the host runs ahead and frees their sources.
// (64 f32 GEMMs of 2048^3: about 20 ms on an H100, longer elsewhere.)
void keep_stream_busy() {
  const Tensor a = randn({2048, 2048}, 3, {.device = kGpu});
  Tensor out = empty({2048, 2048}, {.device = kGpu});
  for (int i = 0; i < 64; ++i) matmul_out(a, a, out);
}

float copy_value(int i) {
  return static_cast<float>(i + 1);
}

void expect_destinations(const std::vector<Tensor>& dst, const std::string& what) {
  synchronize(kGpu);
  for (size_t i = 0; i < dst.size(); ++i) {
    const std::vector<float> v = dst[i].cpu().to_vector<float>();
    const float want = copy_value(static_cast<int>(i));
    const int64_t bad = first_not(v, want);
    ASSERT_EQ(bad, -1) << what << ": copy " << i << " of " << dst.size() << ", element " << bad
                       << " is " << v[static_cast<size_t>(std::max<int64_t>(bad, 0))]
                       << ", expected " << want
                       << " (a pinned block was reused before its copy had read it)";
  }
}

// How each copy's host source is made and handed over.
enum class Source { pinned_copy, pinned_to, pageable_staged };

void stress_pinned_reuse(Source source, bool on_side_stream) {
  std::optional<StreamGuard> guard;
  const Stream side = Stream::create(kGpu);
  if (on_side_stream) guard.emplace(side);
  keep_stream_busy();
  std::vector<Tensor> dst;
  dst.reserve(kCopies);
  for (int i = 0; i < kCopies; ++i) {
    const bool pinned = source != Source::pageable_staged;
    Tensor host = empty({kCopyFloats}, {.pinned = pinned});
    std::fill_n(host.data<float>(), kCopyFloats, copy_value(i));
    if (source == Source::pinned_to) {
      dst.push_back(host.to(kGpu, /*non_blocking=*/true));
    } else {
      dst.push_back(empty({kCopyFloats}, {.device = kGpu}));
      copy_(dst.back(), host, /*non_blocking=*/true);
    }
    // A pageable source may be overwritten as soon as copy_ returns (it was
    // staged); a pinned one is freed here, while its copy may still be queued
    // behind the GEMMs, and its block goes back to the cache: the next iteration's
    // empty() or staging must not get it before the copy has read it.
    if (!pinned) std::fill_n(host.data<float>(), kCopyFloats, -1.0f);
  }
  expect_destinations(dst, std::string(source == Source::pinned_copy ? "copy_ from pinned"
                                       : source == Source::pinned_to ? "to() from pinned"
                                                                     : "copy_ from pageable") +
                               (on_side_stream ? " on a side stream" : " on the default stream"));
}

TEST(PinnedReuse, CopyFromPinnedTensorsFreedRightAfterTheCopy) {
  DDP_REQUIRE_REAL_CUDA("copies queued behind a busy stream");
  stress_pinned_reuse(Source::pinned_copy, false);
  stress_pinned_reuse(Source::pinned_copy, true);
}

TEST(PinnedReuse, ToFromPinnedTensorsFreedRightAfterTheCopy) {
  DDP_REQUIRE_REAL_CUDA("copies queued behind a busy stream");
  stress_pinned_reuse(Source::pinned_to, false);
  stress_pinned_reuse(Source::pinned_to, true);
}

TEST(PinnedReuse, PageableSourcesStagedThroughPinnedBlocks) {
  DDP_REQUIRE_REAL_CUDA("copies queued behind a busy stream");
  stress_pinned_reuse(Source::pageable_staged, false);
  stress_pinned_reuse(Source::pageable_staged, true);
}

}  // namespace
}  // namespace ddp
