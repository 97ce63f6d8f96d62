// The graphs of cuDNN's fused causal attention (sdpa_cudnn.cpp), as plain C++ that a
// unit test interprets on the CPU (tests/unit/sdpa_graph_test.cpp) against the CPU
// attention kernels: every tensor's dims and strides inside the packed qkv, the
// transposes, the mask, the softmax statistics and the backward's formulas are
// checked there; what is left to the GPU is cuDNN's engine running the same graph.
//
// Note [cudnn attention graphs]: cuDNN 9 fuses attention from a graph of its generic
// operations (matmul, pointwise, reduction, reshape) that its runtime-fusion engines
// recognise; its dedicated SDPA operation has no causal mask before 9.21. The graphs
// below follow the order of operations cuDNN's engines match (as its frontend library
// builds them), in our own words:
//
//   forward:  S = q k^T, S1 = S * scale, S2 = where(row >= col, S1, -inf),
//             M = rowmax(S2), E = exp(S2 - M), Z = rowsum(E),
//             stats = M + log(Z)           (f32 [B, H, T, 1]: the row's log-sum-exp)
//             P = E / Z (16-bit), O = P v
//   backward: sum = rowsum(dO * O) * 1, P = exp(where(row >= col, q k^T * scale - stats,
//             -inf)), dV = P^T dO, dP = dO v^T, dS = (dP - sum) * P * scale,
//             dK = dS^T q, dQ = dS k
//
// Each head of q, k and v is read where it lies in qkv [B, T, 3C] (Note [packed
// attention] in ops/transformer_ops.h): dims [B, H, T, D], strides [T*3C, D, 3C, 1],
// k at +C, v at +2C elements; O, dO [B, T, C] likewise with C; dQ, dK, dV go into
// grad_qkv where q, k, v lie. k^T (and v^T in the backward) is k's own memory with
// the last two dims and strides swapped; P^T, dS^T and the k that dS multiplies are
// reshape operations (a view with other dims and strides). The backward writes dQ
// straight from dS k, without an f32 accumulator: the deterministic form (the one
// whose result does not depend on the order of thread blocks).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::kernels::sdpa_graph {

enum class Type : uint8_t { f32, bf16, f16, i32, boolean };

using Dims = std::array<int64_t, 4>;

struct TensorSpec {
  int64_t uid;
  std::string name;
  Dims dims, strides;
  Type type;
  bool is_virtual = false;
  bool by_value = false;  // a host scalar: the variant pack points at `value`
  float value = 0.0f;
};

enum class OpKind : uint8_t { matmul, pointwise, reduction, reshape };
enum class Mode : uint8_t {
  none,  // matmul and reshape
  mul,
  add,
  sub,
  div,
  exp,
  log,
  identity,
  gen_index,      // y = the index of each element along `axis` (x gives the shape)
  cmp_ge,         // y = x >= b (boolean)
  binary_select,  // y = t ? x : b
  reduce_max,     // y (x's dims, 1 where reduced) = the maximum over the reduced dims
  reduce_add,
};

// matmul: c (y) [.., M, N] = a (x) [.., M, K] b [.., K, N]. pointwise: y = x op b
// (t: the select's condition), a dim of 1 broadcast. reduction: x -> y. reshape: y is
// x's memory seen with y's dims and strides.
struct OpSpec {
  OpKind kind;
  Mode mode = Mode::none;
  int64_t x = 0, b = 0, t = 0, y = 0;  // tensor uids; 0: none
  int64_t axis = -1;                   // gen_index
  Type precision = Type::f32;          // a pointwise op's math precision, else compute type
};

// The UIDs of the tensors the caller binds (the variant pack's); virtual tensors
// are numbered from kFirstVirtual.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSoftmaxSum,  // backward scratch: rowsum(dO * O), f32 [B, H, T, 1]
  kScale,       // by value
  kNegInf,      // by value: the mask's fill
  kOne,         // by value
  kFirstVirtual = 100,
};

struct Geometry {
  int64_t batch, t, heads, d;
  int64_t c() const { return heads * d; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(d)); }  // as the CPU kernels
};

struct Graph {
  std::vector<TensorSpec> tensors;
  std::vector<OpSpec> ops;

  const TensorSpec& tensor(int64_t uid) const {
    for (const TensorSpec& t : tensors) {
      if (t.uid == uid) return t;
    }
    throw std::out_of_range("sdpa_graph: no tensor with uid " + std::to_string(uid));
  }
  // The UIDs the caller binds, in the order of `tensors`: every non-virtual one.
  std::vector<int64_t> bound() const {
    std::vector<int64_t> uids;
    for (const TensorSpec& t : tensors) {
      if (!t.is_virtual) uids.push_back(t.uid);
    }
    return uids;
  }
};

// Element offsets of the bound tensors from the start of their buffer: q, k, v in qkv
// (dQ, dK, dV likewise in grad_qkv), O and dO from the start of y and grad_y, stats
// and the softmax sum from their own.
inline int64_t offset_in_buffer(int64_t uid, const Geometry& g) {
  switch (uid) {
    case kK:
    case kDK:
      return g.c();
    case kV:
    case kDV:
      return 2 * g.c();
    default:
      return 0;
  }
}

namespace detail {

class Builder {
 public:
  explicit Builder(const Geometry& g, Type io) : g_(g), io_(io) {}

  Graph graph;

  // A head of qkv ([B, H, T, D] with qkv's strides), or its transpose [B, H, D, T].
  void packed(int64_t uid, const char* name, bool transposed) {
    const int64_t row = 3 * g_.c();
    if (transposed) {
      add({uid, name, {g_.batch, g_.heads, g_.d, g_.t}, {g_.t * row, g_.d, 1, row}, io_});
    } else {
      add({uid, name, {g_.batch, g_.heads, g_.t, g_.d}, {g_.t * row, g_.d, row, 1}, io_});
    }
  }
  // A head of y or grad_y [B, T, C].
  void rows(int64_t uid, const char* name) {
    add({uid, name, {g_.batch, g_.heads, g_.t, g_.d}, {g_.t * g_.c(), g_.d, g_.c(), 1}, io_});
  }
  // [B, H, T, 1] f32 (stats and the softmax sum), bound when uid is given.
  int64_t row_stat(const char* name, int64_t uid = 0) {
    return add({uid == 0 ? next_++ : uid,
                name,
                {g_.batch, g_.heads, g_.t, 1},
                {g_.heads * g_.t, g_.t, 1, 1},
                Type::f32,
                uid == 0});
  }
  // A virtual [B, H, T, T] (scores, probabilities, ...).
  int64_t square(const char* name, Type type = Type::f32) {
    return add({next_++,
                name,
                {g_.batch, g_.heads, g_.t, g_.t},
                {g_.heads * g_.t * g_.t, g_.t * g_.t, g_.t, 1},
                type,
                true});
  }
  // Its transpose, as the reshape's output.
  int64_t square_transposed(const char* name, Type type) {
    return add({next_++,
                name,
                {g_.batch, g_.heads, g_.t, g_.t},
                {g_.heads * g_.t * g_.t, g_.t * g_.t, 1, g_.t},
                type,
                true});
  }
  // A virtual [B, H, T, D] f32 with the strides cuDNN's frontend gives dO * O
  // ({H*T*D, T*D, H*D, 1}: nominal, the tensor never exists in memory).
  int64_t heads_virtual(const char* name) {
    return add({next_++,
                name,
                {g_.batch, g_.heads, g_.t, g_.d},
                {g_.heads * g_.t * g_.d, g_.t * g_.d, g_.heads * g_.d, 1},
                Type::f32,
                true});
  }
  int64_t add_virtual(const char* name, const Dims& dims, const Dims& strides, Type type) {
    return add({next_++, name, dims, strides, type, true});
  }
  void scalar(int64_t uid, const char* name, float value) {
    add({uid, name, {1, 1, 1, 1}, {1, 1, 1, 1}, Type::f32, false, true, value});
  }

  int64_t matmul(int64_t a, int64_t b, int64_t c) {
    graph.ops.push_back({OpKind::matmul, Mode::none, a, b, 0, c});
    return c;
  }
  int64_t pointwise(Mode mode, int64_t x, int64_t b, int64_t y, Type precision = Type::f32) {
    graph.ops.push_back({OpKind::pointwise, mode, x, b, 0, y, -1, precision});
    return y;
  }
  int64_t reduce(Mode mode, int64_t x, int64_t y) {
    graph.ops.push_back({OpKind::reduction, mode, x, 0, 0, y});
    return y;
  }
  int64_t reshape(int64_t x, int64_t y) {
    graph.ops.push_back({OpKind::reshape, Mode::none, x, 0, 0, y});
    return y;
  }

  // where(row >= col, x, -inf): GEN_INDEX along the rows and the columns, CMP_GE, select.
  int64_t causal_mask(int64_t x) {
    const int64_t row = square("row_index", Type::i32);
    const int64_t col = square("col_index", Type::i32);
    graph.ops.push_back({OpKind::pointwise, Mode::gen_index, x, 0, 0, row, 2, Type::i32});
    graph.ops.push_back({OpKind::pointwise, Mode::gen_index, x, 0, 0, col, 3, Type::i32});
    const int64_t keep =
        pointwise(Mode::cmp_ge, row, col, square("causal", Type::boolean), Type::boolean);
    const int64_t y = square("masked");
    graph.ops.push_back({OpKind::pointwise, Mode::binary_select, x, kNegInf, keep, y});
    return y;
  }

 private:
  int64_t add(TensorSpec t) {
    graph.tensors.push_back(std::move(t));
    return graph.tensors.back().uid;
  }

  Geometry g_;
  Type io_;
  int64_t next_ = kFirstVirtual;
};

}  // namespace detail

// O (into y) and stats from q, k, v. io: the 16-bit type of qkv and y.
inline Graph forward_graph(const Geometry& g, Type io) {
  detail::Builder b(g, io);
  b.packed(kQ, "q", false);
  b.packed(kK, "k^T", true);
  b.packed(kV, "v", false);
  b.rows(kO, "o");
  b.row_stat("stats", kStats);
  b.scalar(kScale, "scale", g.scale());
  b.scalar(kNegInf, "-inf", -INFINITY);
  const int64_t s = b.matmul(kQ, kK, b.square("q k^T"));
  const int64_t s1 = b.pointwise(Mode::mul, s, kScale, b.square("scaled"));
  const int64_t s2 = b.causal_mask(s1);
  const int64_t m = b.reduce(Mode::reduce_max, s2, b.row_stat("row max"));
  const int64_t s3 = b.pointwise(Mode::sub, s2, m, b.square("minus max"));
  const int64_t e = b.pointwise(Mode::exp, s3, 0, b.square("exp"));
  const int64_t z = b.reduce(Mode::reduce_add, e, b.row_stat("row sum"));
  const int64_t log_z = b.pointwise(Mode::log, z, 0, b.row_stat("log row sum"));
  b.pointwise(Mode::add, m, log_z, kStats);
  const int64_t p = b.pointwise(Mode::div, e, z, b.square("probs", io));
  b.matmul(p, kV, kO);
  return std::move(b.graph);
}

// dQ, dK, dV (into grad_qkv) from q, k, v, O, dO and stats; the softmax sum is a
// bound f32 [B, H, T, 1] scratch.
inline Graph backward_graph(const Geometry& g, Type io) {
  detail::Builder b(g, io);
  b.packed(kQ, "q", false);
  b.packed(kK, "k^T", true);
  b.packed(kV, "v^T", true);
  b.rows(kO, "o");
  b.rows(kDO, "do");
  b.row_stat("stats", kStats);
  b.packed(kDQ, "dq", false);
  b.packed(kDK, "dk", false);
  b.packed(kDV, "dv", false);
  b.row_stat("softmax sum", kSoftmaxSum);
  b.scalar(kScale, "scale", g.scale());
  b.scalar(kNegInf, "-inf", -INFINITY);
  b.scalar(kOne, "one", 1.0f);
  // sum = rowsum(dO * O) * 1.
  const int64_t do_o = b.pointwise(Mode::mul, kDO, kO, b.heads_virtual("do * o"));
  const int64_t raw_sum = b.reduce(Mode::reduce_add, do_o, b.row_stat("rowsum(do * o)"));
  b.pointwise(Mode::mul, raw_sum, kOne, kSoftmaxSum);
  // P = exp(where(row >= col, q k^T * scale - stats, -inf)), in f32.
  const int64_t s = b.matmul(kQ, kK, b.square("q k^T"));
  const int64_t s1 = b.pointwise(Mode::mul, s, kScale, b.square("scaled"));
  const int64_t s2 = b.pointwise(Mode::sub, s1, kStats, b.square("minus stats"));
  const int64_t s3 = b.causal_mask(s2);
  const int64_t p = b.pointwise(Mode::exp, s3, 0, b.square("probs"));
  // dV = P^T dO.
  const int64_t p_t = b.reshape(p, b.square_transposed("probs^T", io));
  b.matmul(p_t, kDO, kDV);
  // dS = (dO v^T - sum) * P * scale.
  const int64_t dp = b.matmul(kDO, kV, b.square("do v^T"));
  const int64_t dp_minus = b.pointwise(Mode::sub, dp, kSoftmaxSum, b.square("dp - sum"));
  const int64_t ds_unscaled = b.pointwise(Mode::mul, dp_minus, p, b.square("(dp - sum) p"));
  const int64_t ds = b.pointwise(Mode::mul, ds_unscaled, kScale, b.square("ds"));
  // dK = dS^T q.
  const int64_t ds_t = b.reshape(ds, b.square_transposed("ds^T", io));
  b.matmul(ds_t, kQ, kDK);
  // dQ = dS k, k seen again as [B, H, T, D] through a reshape of k^T (typed f32, as
  // the frontend's reshape output takes the intermediate type).
  const int64_t row = 3 * g.c();
  const int64_t k = b.reshape(
      kK, b.add_virtual("k", {g.batch, g.heads, g.t, g.d}, {g.t * row, g.d, row, 1}, Type::f32));
  b.matmul(ds, k, kDQ);
  return std::move(b.graph);
}

}  // namespace ddp::kernels::sdpa_graph
