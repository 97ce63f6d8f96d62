#include "runtime/tensor.h"
#include "runtime/logging.h"
#include "runtime/memory/allocator.h"
#include "runtime/ops/ops.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <limits>
#include <sstream>
#include <stdexcept>

namespace ddp {
namespace {

TEST(Tensor, FactoriesFillWithTheRightValues) {
  EXPECT_EQ(zeros({2, 3}).to_vector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(ones({4}, {.dtype = DType::i32}).to_vector<int32_t>(), std::vector<int32_t>(4, 1));
  EXPECT_EQ(full({3}, 2.5).to_vector<float>(), std::vector<float>(3, 2.5f));
  EXPECT_EQ(arange(5, {.dtype = DType::i64}).to_vector<int64_t>(),
            (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(1.0, 2.0, 0.25).to_vector<float>(), (std::vector<float>{1, 1.25, 1.5, 1.75}));
  const Tensor h = full({2}, 1.5, {.dtype = DType::bf16});
  EXPECT_EQ(h.dtype(), DType::bf16);
  EXPECT_EQ(cast(h, DType::f32).to_vector<float>(), (std::vector<float>{1.5f, 1.5f}));
  EXPECT_THROW(empty({2, -1}), ValueError);
  EXPECT_THROW(arange(0.0, 1.0, 0.0), ValueError);
}

// 2^62 f32 elements are 2^64 bytes: the count fits an int64, the bytes do not, and
// wrapped around they were 0 bytes, a tensor without memory that crashed on first use
// (torch: "Storage size calculation overflowed").
TEST(Tensor, AShapeWhoseBytesOverflowIsRefused) {
  const Shape huge{int64_t{1} << 62};
  for (const auto& make : std::vector<std::function<Tensor()>>{
           [&] { return empty(huge); }, [&] { return zeros(huge); },
           [&] {
             return full({int64_t{1} << 31, int64_t{1} << 31}, 1.0, {.dtype = DType::i32});
           },
           [&] {
             float x = 0;
             return from_blob(&x, huge, {});
           }}) {
    try {
      make();
      ADD_FAILURE() << "a tensor of 2^64 bytes was made";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("more bytes than a 64-bit size holds"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(shape_nbytes("empty", {int64_t{1} << 61}, DType::f32), size_t{1} << 63);
}

TEST(Tensor, MetadataAndBytes) {
  const Tensor t = empty({64, 784}, {.dtype = DType::bf16});
  EXPECT_EQ(t.numel(), 64 * 784);
  EXPECT_EQ(t.nbytes(), 64u * 784u * 2u);
  EXPECT_EQ(t.dim(), 2);
  EXPECT_EQ(t.size(-1), 784);
  EXPECT_EQ(t.device(), Device::cpu());
  EXPECT_THROW(t.size(2), ValueError);
  const Tensor scalar = full({}, 3.0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.item<float>(), 3.0f);
  EXPECT_FALSE(Tensor().defined());
  EXPECT_THROW(Tensor().numel(), ValueError);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = arange(12).reshape({4, 3});
  EXPECT_EQ(t.shape(), (Shape{4, 3}));
  Tensor rows = t.slice(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 3}));
  EXPECT_EQ(rows.to_vector<float>(), (std::vector<float>{3, 4, 5, 6, 7, 8}));
  fill_(rows, -1.0);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 1, 2, -1, -1, -1, -1, -1, -1, 9, 10, 11}));
  EXPECT_EQ(t.reshape({-1, 6}).shape(), (Shape{2, 6}));
  EXPECT_THROW(t.reshape({5, -1}), ValueError);
  EXPECT_THROW(t.reshape({-1, -1}), ValueError);
  EXPECT_THROW(t.slice(2, 5), ValueError);
}

// torch: "unsupported range: 0 -> inf" and "invalid size, possible overflow?". The
// count was converted to int64 undefined, and the error named a "negative dimension
// -9223372036854775808" that nobody gave.
TEST(Tensor, ArangeRefusesRangesNoTensorHolds) {
  const auto message = [](double start, double end, double step) {
    try {
      arange(start, end, step);
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_NE(message(0.0, inf, 1.0).find("must be finite, got 0 and inf"), std::string::npos);
  EXPECT_NE(message(std::numeric_limits<double>::quiet_NaN(), 1.0, 1.0).find("must be finite"),
            std::string::npos);
  const std::string huge = message(0.0, 1e300, 1.0);
  EXPECT_NE(huge.find("more than a tensor can hold"), std::string::npos) << huge;
  EXPECT_EQ(huge.find("negative dimension"), std::string::npos) << huge;
  EXPECT_EQ(arange(-1.0, 1.0, 0.5).to_vector<float>(), (std::vector<float>{-1, -0.5, 0, 0.5}));
}

TEST(Tensor, FlatViewIntoALargerBuffer) {
  Tensor bucket = zeros({10});
  Tensor w = bucket.flat_view(2, {2, 2});
  Tensor b = bucket.flat_view(6, {3});
  fill_(w, 1.0);
  fill_(b, 2.0);
  EXPECT_EQ(bucket.to_vector<float>(), (std::vector<float>{0, 0, 1, 1, 1, 1, 2, 2, 2, 0}));
  EXPECT_EQ(w.storage(), bucket.storage());
  EXPECT_THROW(bucket.flat_view(8, {3}), ValueError);
  // A flat view of a slice is offset from the slice.
  Tensor tail = bucket.slice(5, 10).flat_view(1, {2});
  EXPECT_EQ(tail.to_vector<float>(), (std::vector<float>{2, 2}));
}

// A view or a wrapped buffer of negative dims ([-1, -1] has "1 element") or at an
// offset past the end (INT64_MAX + n wrapped to pass the bounds check) is refused, as
// empty() and reshape() refuse negative dims.
TEST(Tensor, ViewsRefuseNegativeDimsAndOffsetsPastTheEnd) {
  const Tensor t = zeros({4});
  EXPECT_THROW(t.flat_view(0, {-1, -1}), ValueError);
  EXPECT_THROW(t.flat_view(INT64_MAX, {1}), ValueError);
  EXPECT_THROW(t.flat_view(3, {2}), ValueError);
  EXPECT_EQ(t.flat_view(4, {0}).numel(), 0);
  float buf[4] = {};
  EXPECT_THROW(from_blob(buf, {-2, -2}, {}), ValueError);
  EXPECT_EQ(from_blob(buf, {2, 2}, {}).numel(), 4);
}

TEST(Tensor, MovesAndCopiesAreExplicit) {
  Tensor t = rand({3, 4}, 1);
  EXPECT_TRUE(t.to(Device::cpu()).is_same(t)) << "to() the same device must not copy";
  Tensor c = t.clone();
  EXPECT_FALSE(c.is_same(t));
  EXPECT_NE(c.data_ptr(), t.data_ptr());
  EXPECT_EQ(c.to_vector<float>(), t.to_vector<float>());
  Tensor p = t.pin_memory();
  EXPECT_TRUE(p.is_pinned());
  EXPECT_EQ(p.to_vector<float>(), t.to_vector<float>());
  Tensor dst = empty({3, 4});
  copy_(dst, t);
  EXPECT_EQ(dst.to_vector<float>(), t.to_vector<float>());
  Tensor wrong = empty({4, 3});
  EXPECT_THROW(copy_(wrong, t), ValueError);
}

// Note [errors freeing memory]: a failing free is reported and the process goes on
// (an exception out of ~Storage, which is noexcept, would call std::terminate).
TEST(Tensor, AFailingFreeIsLoggedNotFatal) {
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  logger().sinks().push_back(sink);
  int calls = 0;
  {
    float value = 1.0f;
    Tensor t = from_blob(&value, {1}, {}, [&calls](void*) {
      ++calls;
      throw std::runtime_error("the deleter failed on purpose");
    });
    Tensor view = t.reshape({1, 1});
  }  // the last view goes: the deleter runs and throws
  logger().flush();
  logger().sinks().pop_back();
  EXPECT_EQ(calls, 1);
  EXPECT_NE(log.str().find("the deleter failed on purpose"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("freeing 4 B of tensor memory on cpu failed"), std::string::npos)
      << log.str();
}

TEST(Tensor, FromVectorAndItem) {
  const Tensor t = from_vector<int64_t>({3, 1, 2}, {3});
  EXPECT_EQ(t.dtype(), DType::i64);
  EXPECT_EQ(t.to_vector<int64_t>(), (std::vector<int64_t>{3, 1, 2}));
  EXPECT_THROW(t.item<int64_t>(), ValueError);
  EXPECT_THROW(t.to_vector<float>(), ValueError);
  const Tensor f = from_vector<float>({1.5f, 2.0f}, {2}, {.dtype = DType::f16});
  EXPECT_EQ(f.dtype(), DType::f16);
  EXPECT_EQ(cast(f, DType::f32).to_vector<float>(), (std::vector<float>{1.5f, 2.0f}));
  EXPECT_THROW(from_vector<float>({1, 2, 3}, {2}), ValueError);
}

TEST(Tensor, PrintsInPyTorchStyle) {
  EXPECT_EQ(from_vector<float>({1.0f, 2.5f, -3.0f}, {3}).str(),
            "tensor([ 1.0000,  2.5000, -3.0000])");
  EXPECT_EQ(from_vector<float>({1, 2, 3, 4}, {2, 2}).str(),
            "tensor([[1., 2.],\n        [3., 4.]])");
  EXPECT_EQ(from_vector<int64_t>({7, 10}, {2}).str(), "tensor([ 7, 10])");
  EXPECT_EQ(from_vector<int32_t>({7}, {1}).str(), "tensor([7], dtype=i32)");
  EXPECT_EQ(full({}, 0.5).str(), "tensor(0.5000)");
  EXPECT_EQ(empty({0}).str(), "tensor([])");
  const std::string big = arange(2000).str();
  EXPECT_NE(big.find("0.,    1.,    2., ..., 1997., 1998., 1999."), std::string::npos) << big;
}

}  // namespace
}  // namespace ddp
