// The fused attention's graphs (runtime/ops/cuda/sdpa_graph.h, Note [cudnn attention
// graphs]) run by a CPU interpreter of cuDNN's operations with their documented
// semantics, against the CPU attention kernels: the forward's O and stats and the
// backward's dQ, dK, dV. The interpreter reads and writes each tensor through its own
// dims and strides (the bound ones inside the caller's qkv, y, grad_y and grad_qkv
// buffers, every access checked to stay inside them), follows reshapes as views of
// the same memory, refuses an operand whose dims do not fit the operation, and fails
// a read of a virtual tensor no earlier operation wrote. So the strides of every head
// inside the packed buffers, the transposes, the mask, the statistics and the
// backward's formulas are checked here; cuDNN's engines running them are left to the
// gpu tests.
#include "runtime/ops/cuda/sdpa_graph.h"

#include "runtime/ops/transformer_ops.h"
#include "runtime/tensor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <ostream>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::kernels::sdpa_graph {
namespace {

struct Storage {
  float* base;   // element 0 of the tensor
  float* begin;  // the buffer it must stay inside
  float* end;
};

class Interpreter {
 public:
  explicit Interpreter(const Graph& graph) : graph_(graph) {
    for (const OpSpec& op : graph_.ops) {
      if (op.kind == OpKind::reshape) viewed_.insert({op.x, op.y});
    }
  }

  // A bound tensor's buffer; the tensor starts offset_in_buffer(uid) elements in.
  void bind(int64_t uid, std::vector<float>& buffer, const Geometry& g) {
    float* begin = buffer.data();
    storage_[uid] = {begin + offset_in_buffer(uid, g), begin, begin + buffer.size()};
    written_.insert(uid);
  }

  void run() {
    for (const TensorSpec& t : graph_.tensors) {
      if (t.by_value) {
        scalars_[t.uid] = t.value;
        storage_[t.uid] = {&scalars_[t.uid], &scalars_[t.uid], &scalars_[t.uid] + 1};
        written_.insert(t.uid);
      } else if (!t.is_virtual && storage_.count(t.uid) == 0) {
        throw std::runtime_error("tensor '" + t.name + "' is bound but the test gave no buffer");
      }
    }
    for (size_t i = 0; i < graph_.ops.size(); ++i) {
      const OpSpec& op = graph_.ops[i];
      what_ = "op " + std::to_string(i) + " writing '" + graph_.tensor(op.y).name + "'";
      for (int64_t uid : {op.x, op.b, op.t}) {
        if (uid != 0 && written_.count(uid) == 0) {
          throw std::runtime_error(what_ + " reads '" + graph_.tensor(uid).name +
                                   "' before any op wrote it");
        }
      }
      if (graph_.tensor(op.y).is_virtual && written_.count(op.y) != 0) {
        throw std::runtime_error(what_ + ": a virtual tensor written twice");
      }
      switch (op.kind) {
        case OpKind::matmul:
          matmul(op);
          break;
        case OpKind::pointwise:
          pointwise(op);
          break;
        case OpKind::reduction:
          reduction(op);
          break;
        case OpKind::reshape:
          reshape(op);
          break;
      }
      written_.insert(op.y);
    }
  }

 private:
  // Whether strides lay dims out densely (some order of the dims, no gaps, no overlap).
  static bool dense(const Dims& dims, const Dims& strides) {
    std::array<int, 4> order{0, 1, 2, 3};
    std::sort(order.begin(), order.end(), [&](int a, int b) {
      return strides[a] != strides[b] ? strides[a] < strides[b] : a > b;
    });
    int64_t expected = 1;
    for (int k : order) {
      if (dims[k] > 1 && strides[k] != expected) return false;
      expected *= dims[k];
    }
    return true;
  }
  // The strides a tensor is read and written through: its own, except a virtual tensor
  // whose nominal strides are no dense layout (cuDNN never stores it) and that no
  // reshape sees as memory: row-major then.
  Dims strides_of(const TensorSpec& t) const {
    if (!t.is_virtual || viewed_.count(t.uid) != 0 || dense(t.dims, t.strides)) return t.strides;
    return {t.dims[1] * t.dims[2] * t.dims[3], t.dims[2] * t.dims[3], t.dims[3], 1};
  }
  // Storage for a virtual tensor on its first write: as many elements as its strides reach.
  Storage& storage(int64_t uid) {
    auto it = storage_.find(uid);
    if (it != storage_.end()) return it->second;
    const TensorSpec& t = graph_.tensor(uid);
    const Dims strides = strides_of(t);
    int64_t extent = 1;
    for (int k = 0; k < 4; ++k) extent += (t.dims[k] - 1) * strides[k];
    std::vector<float>& owned = owned_[uid];
    owned.assign(static_cast<size_t>(extent), NAN);
    return storage_[uid] = {owned.data(), owned.data(), owned.data() + owned.size()};
  }
  float& at(int64_t uid, const Dims& index) {
    const TensorSpec& t = graph_.tensor(uid);
    const Dims strides = strides_of(t);
    int64_t offset = 0;
    for (int k = 0; k < 4; ++k) {
      if (index[k] < 0 || index[k] >= t.dims[k]) {
        throw std::runtime_error(what_ + ": index out of '" + t.name + "''s dims");
      }
      offset += index[k] * strides[k];
    }
    Storage& s = storage(uid);
    float* p = s.base + offset;
    if (p < s.begin || p >= s.end) {
      throw std::runtime_error(what_ + ": '" + t.name + "' reaches outside its buffer");
    }
    return *p;
  }
  // The element of an operand at the output's index, its dims of 1 broadcast.
  float operand(int64_t uid, const Dims& out_index, const Dims& out_dims) {
    const TensorSpec& t = graph_.tensor(uid);
    Dims index{};
    for (int k = 0; k < 4; ++k) {
      if (t.dims[k] == out_dims[k]) {
        index[k] = out_index[k];
      } else if (t.dims[k] == 1) {
        index[k] = 0;
      } else {
        throw std::runtime_error(what_ + ": operand '" + t.name + "' does not broadcast");
      }
    }
    return at(uid, index);
  }
  static void for_each(const Dims& dims, const std::function<void(const Dims&)>& fn) {
    Dims i{};
    for (i[0] = 0; i[0] < dims[0]; ++i[0])
      for (i[1] = 0; i[1] < dims[1]; ++i[1])
        for (i[2] = 0; i[2] < dims[2]; ++i[2])
          for (i[3] = 0; i[3] < dims[3]; ++i[3]) fn(i);
  }

  void matmul(const OpSpec& op) {
    const Dims a = graph_.tensor(op.x).dims, b = graph_.tensor(op.b).dims,
               c = graph_.tensor(op.y).dims;
    if (a[0] != c[0] || a[1] != c[1] || b[0] != c[0] || b[1] != c[1] || a[2] != c[2] ||
        b[3] != c[3] || a[3] != b[2]) {
      throw std::runtime_error(what_ + ": the operands' dims do not multiply");
    }
    for_each(c, [&](const Dims& i) {
      double acc = 0.0;
      for (int64_t k = 0; k < a[3]; ++k) {
        acc +=
            static_cast<double>(at(op.x, {i[0], i[1], i[2], k})) * at(op.b, {i[0], i[1], k, i[3]});
      }
      at(op.y, i) = static_cast<float>(acc);
    });
  }

  void pointwise(const OpSpec& op) {
    const Dims dims = graph_.tensor(op.y).dims;
    if (op.mode == Mode::gen_index) {
      if (graph_.tensor(op.x).dims != dims || op.axis < 0 || op.axis > 3) {
        throw std::runtime_error(what_ + ": gen_index's shape or axis");
      }
      for_each(dims, [&](const Dims& i) { at(op.y, i) = static_cast<float>(i[op.axis]); });
      return;
    }
    for_each(dims, [&](const Dims& i) {
      const float x = operand(op.x, i, dims);
      const auto b = [&] { return operand(op.b, i, dims); };
      float y = 0.0f;
      switch (op.mode) {
        case Mode::mul:
          y = x * b();
          break;
        case Mode::add:
          y = x + b();
          break;
        case Mode::sub:
          y = x - b();
          break;
        case Mode::div:
          y = x / b();
          break;
        case Mode::exp:
          y = std::exp(x);
          break;
        case Mode::log:
          y = std::log(x);
          break;
        case Mode::identity:
          y = x;
          break;
        case Mode::cmp_ge:
          y = x >= b() ? 1.0f : 0.0f;
          break;
        case Mode::binary_select:
          y = operand(op.t, i, dims) != 0.0f ? x : b();
          break;
        default:
          throw std::runtime_error(what_ + ": not a pointwise mode");
      }
      at(op.y, i) = y;
    });
  }

  void reduction(const OpSpec& op) {
    const Dims x = graph_.tensor(op.x).dims, y = graph_.tensor(op.y).dims;
    for (int k = 0; k < 4; ++k) {
      if (y[k] != x[k] && y[k] != 1) throw std::runtime_error(what_ + ": reduced dims");
    }
    const bool max = op.mode == Mode::reduce_max;
    for_each(y, [&](const Dims& i) { at(op.y, i) = max ? -INFINITY : 0.0f; });
    for_each(x, [&](const Dims& i) {
      Dims o{};
      for (int k = 0; k < 4; ++k) o[k] = y[k] == 1 ? 0 : i[k];
      float& acc = at(op.y, o);
      const float v = at(op.x, i);
      acc = max ? std::max(acc, v) : acc + v;
    });
  }

  // y is x's memory seen through y's dims and strides.
  void reshape(const OpSpec& op) {
    const TensorSpec& x = graph_.tensor(op.x);
    const TensorSpec& y = graph_.tensor(op.y);
    int64_t nx = 1, ny = 1;
    for (int k = 0; k < 4; ++k) {
      nx *= x.dims[k];
      ny *= y.dims[k];
    }
    if (nx != ny) throw std::runtime_error(what_ + ": reshape changes the element count");
    storage_[op.y] = storage(op.x);
  }

  const Graph& graph_;
  std::string what_;
  std::map<int64_t, Storage> storage_;
  std::map<int64_t, std::vector<float>> owned_;
  std::map<int64_t, float> scalars_;
  std::set<int64_t> written_;
  std::set<int64_t> viewed_;  // the inputs and outputs of reshapes: their strides are memory
};

std::vector<float> random_values(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

struct Case {
  int64_t batch, t, heads, d;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << "B " << c.batch << ", T " << c.t << ", " << c.heads << " heads of " << c.d;
}

class SdpaGraph : public ::testing::TestWithParam<Case> {};

// Forward: O equals the CPU attention's y, and stats is each row's log-sum-exp of
// its scaled scores over the columns the mask keeps (computed here in double).
// Backward: dQ, dK, dV equal the CPU attention backward's.
TEST_P(SdpaGraph, ForwardAndBackwardMatchTheCpuAttention) {
  const Case k = GetParam();
  const Geometry g{k.batch, k.t, k.heads, k.d};
  const int64_t c = g.c();
  std::vector<float> qkv = random_values(k.batch * k.t * 3 * c, 7);
  const Tensor qkv_t = from_vector(qkv, {k.batch, k.t, 3 * c});
  const AttentionResult want = causal_self_attention(qkv_t, k.heads, AttentionPath::packed);

  std::vector<float> y(static_cast<size_t>(k.batch * k.t * c), NAN);
  std::vector<float> stats(static_cast<size_t>(k.batch * k.heads * k.t), NAN);
  {
    const Graph fwd = forward_graph(g, Type::bf16);
    Interpreter run(fwd);
    for (int64_t uid : {kQ, kK, kV}) run.bind(uid, qkv, g);
    run.bind(kO, y, g);
    run.bind(kStats, stats, g);
    ASSERT_NO_THROW(run.run());
  }
  const std::vector<float> want_y = want.y.to_vector<float>();
  for (size_t i = 0; i < y.size(); ++i) {
    ASSERT_NEAR(y[i], want_y[i], 1e-5) << "y element " << i;
  }
  const auto q_at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t e) {
    return static_cast<double>(
        qkv[static_cast<size_t>(((b * k.t + t) * 3 + part) * c + h * k.d + e)]);
  };
  for (int64_t b = 0; b < k.batch; ++b) {
    for (int64_t h = 0; h < k.heads; ++h) {
      for (int64_t i = 0; i < k.t; ++i) {
        double sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t e = 0; e < k.d; ++e) dot += q_at(b, i, 0, h, e) * q_at(b, j, 1, h, e);
          sum += std::exp(dot * g.scale());
        }
        ASSERT_NEAR(stats[static_cast<size_t>((b * k.heads + h) * k.t + i)], std::log(sum), 1e-5)
            << "stats of batch " << b << ", head " << h << ", row " << i;
      }
    }
  }

  std::vector<float> grad_y = random_values(k.batch * k.t * c, 11);
  const Tensor want_grad =
      causal_self_attention_backward(from_vector(grad_y, {k.batch, k.t, c}), qkv_t, want, k.heads);
  std::vector<float> grad_qkv(qkv.size(), NAN);
  std::vector<float> softmax_sum(stats.size(), NAN);
  {
    const Graph bwd = backward_graph(g, Type::bf16);
    Interpreter run(bwd);
    for (int64_t uid : {kQ, kK, kV}) run.bind(uid, qkv, g);
    run.bind(kO, y, g);
    run.bind(kDO, grad_y, g);
    run.bind(kStats, stats, g);
    for (int64_t uid : {kDQ, kDK, kDV}) run.bind(uid, grad_qkv, g);
    run.bind(kSoftmaxSum, softmax_sum, g);
    ASSERT_NO_THROW(run.run());
  }
  const std::vector<float> want_g = want_grad.to_vector<float>();
  for (size_t i = 0; i < grad_qkv.size(); ++i) {
    ASSERT_NEAR(grad_qkv[i], want_g[i], 1e-4)
        << "grad_qkv element " << i << " (part " << (i / static_cast<size_t>(c)) % 3 << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SdpaGraph,
                         ::testing::Values(Case{2, 5, 2, 8}, Case{1, 2, 1, 8}, Case{3, 9, 3, 16},
                                           Case{1, 16, 2, 64}));

// What the caller binds, and nothing else: the variant pack has a pointer for each.
TEST(SdpaGraphSpec, BoundTensorsAreTheCallersAndUidsAreUnique) {
  const Geometry g{2, 8, 4, 64};
  const auto sorted = [](std::vector<int64_t> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  const Graph fwd = forward_graph(g, Type::bf16);
  EXPECT_EQ(sorted(fwd.bound()), (std::vector<int64_t>{kQ, kK, kV, kO, kStats, kScale, kNegInf}));
  const Graph bwd = backward_graph(g, Type::f16);
  EXPECT_EQ(sorted(bwd.bound()), (std::vector<int64_t>{kQ, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV,
                                                       kSoftmaxSum, kScale, kNegInf, kOne}));
  for (const Graph* graph : {&fwd, &bwd}) {
    std::set<int64_t> uids;
    for (const TensorSpec& t : graph->tensors) {
      EXPECT_TRUE(uids.insert(t.uid).second) << "uid " << t.uid << " twice";
      EXPECT_TRUE(t.is_virtual || t.uid < kFirstVirtual) << t.name;
      if (!t.is_virtual && !t.by_value && t.uid != kStats && t.uid != kSoftmaxSum) {
        EXPECT_EQ(t.type, graph == &fwd ? Type::bf16 : Type::f16) << t.name;
        EXPECT_EQ(t.strides[t.dims[3] == g.d ? 3 : 2], 1)
            << t.name << ": a head's row is contiguous";
      }
    }
    // The 16-bit operands of the matmuls that cuDNN requires in the io type: the
    // probabilities and dS^T that multiply v, dO and q.
    for (const OpSpec& op : graph->ops) {
      if (op.kind != OpKind::matmul) continue;
      if (graph->tensor(op.x).is_virtual && op.y != kDQ) {
        EXPECT_NE(graph->tensor(op.x).type, Type::f32) << graph->tensor(op.x).name;
      }
    }
  }
  // The scale is the CPU kernels' 1 / sqrt(D).
  EXPECT_EQ(fwd.tensor(kScale).value, 1.0f / std::sqrt(64.0f));
  EXPECT_TRUE(std::isinf(fwd.tensor(kNegInf).value) && fwd.tensor(kNegInf).value < 0);
}

}  // namespace
}  // namespace ddp::kernels::sdpa_graph
