// The host side of a row-major GEMM with a bias epilogue, or a bias gradient
// epilogue, through cuBLASLt (linear_lt.cpp), as plain C++ that a unit test replays on the CPU
// (tests/unit/lt_plan_test.cpp) with a column-major reference GEMM against the CPU's
// linear op.
//
// Note [cublasLt linear]: our tensors are row-major; cuBLASLt is column-major, and a
// row-major [r, c] matrix read column-major is its transpose [c, r] (Note [row-major
// gemm] in gemm.cu). So row-major out [M, N] = op(a) [M, K] op(b) [K, N] + bias [N]
// is computed as column-major out^T [N, M] = op(b)^T op(a)^T + bias: cuBLASLt's A is
// our b and its B our a, each keeping its transpose flag, with m = N, n = M, and the
// bias epilogue adds bias[i] to row i of the column-major result, which is column i
// of ours: exactly nn.Linear's bias (one per output feature). Every layout is the
// stored matrix as cuBLASLt reads it: rows = our columns, cols = our rows, ld = our
// row length.
#pragma once

#include <cstdint>

namespace ddp::kernels::lt_plan {

struct Layout {
  int64_t rows, cols, ld;  // column-major
};

struct Plan {
  bool trans_a = false, trans_b = false;  // cuBLASLt's op(A), op(B)
  int64_t m = 0, n = 0, k = 0;            // column-major D [m, n] = op(A) [m, k] op(B) [k, n]
  Layout a{}, b{}, d{};
  int64_t bias_length = 0;       // 0: no bias epilogue; else m
  int64_t bias_grad_length = 0;  // 0: no BGRADB epilogue; else n (sums of op(B) over k)
  // Note [gelu epilogues]: gelu: D = gelu(op(A) op(B) + bias), the sum before the GELU
  // written to the aux matrix; dgelu: D = (op(A) op(B)) * gelu'(aux), aux read.
  bool gelu = false, dgelu = false;
  Layout aux{};  // as D (cuBLASLt: its ld a multiple of 8)
};

// Row-major a [a_rows, a_cols] (transposed when trans_a), b [b_rows, b_cols] likewise,
// out [M, N] = op(a) op(b) (+ bias [N] when `bias`).
inline Plan gemm_plan(int64_t a_rows, int64_t a_cols, bool trans_a, int64_t b_rows, int64_t b_cols,
                      bool trans_b, bool bias) {
  const int64_t out_rows = trans_a ? a_cols : a_rows;  // M
  const int64_t out_cols = trans_b ? b_rows : b_cols;  // N
  const int64_t k = trans_a ? a_rows : a_cols;
  Plan p;
  p.trans_a = trans_b;  // cuBLASLt's A is our b
  p.trans_b = trans_a;
  p.m = out_cols;
  p.n = out_rows;
  p.k = k;
  p.a = {b_cols, b_rows, b_cols};
  p.b = {a_cols, a_rows, a_cols};
  p.d = {out_cols, out_rows, out_cols};
  p.bias_length = bias ? out_cols : 0;
  return p;
}

// nn.Linear: x [rows, in] times weight [out, in]^T (+ bias [out]).
inline Plan linear_plan(int64_t rows, int64_t in, int64_t out, bool bias) {
  return gemm_plan(rows, in, false, out, in, true, bias);
}

// Note [weight gradient epilogue]: nn.Linear's backward over g [rows, out] and its
// input x [rows, in] has grad_weight [out, in] = g^T x and grad_bias [out] = the sum
// of g's rows. As gemm_plan(g^T, x), cuBLASLt's B is g with op(B) = g [k = rows, n =
// out], so the BGRADB epilogue, which sums op(B) over k into one value per column of
// D, is grad_bias: both gradients in one pass over g, and no column-sum kernel.
inline Plan weight_grad_plan(int64_t rows, int64_t in, int64_t out, bool bias_grad) {
  Plan p = gemm_plan(rows, out, true, rows, in, false, false);
  p.bias_grad_length = bias_grad ? p.n : 0;
  return p;
}

// Note [gelu epilogues]
// ~~~~~~~~~~~~~~~~~~~~~
// A GPT MLP is c_proj(gelu(c_fc(x))). As three ops, c_fc writes pre = x W_fc^T + b_fc,
// GELU reads it and writes h, and the backward reads dh and pre to write dpre. cuBLASLt
// fuses both ends: c_fc's matmul with the GELU_AUX_BIAS epilogue writes h and pre in
// one pass, and the backward's dh = dy W_proj with the DGELU epilogue reads pre and
// writes dpre = dh * gelu'(pre) without dh ever reaching memory. pre (the aux matrix)
// is laid out as D: row-major [rows, hidden], column-major [hidden, rows] with ld hidden.
// c_fc: h [rows, out] = gelu(x [rows, in] W [out, in]^T + b), pre kept.
inline Plan linear_gelu_plan(int64_t rows, int64_t in, int64_t out) {
  Plan p = linear_plan(rows, in, out, true);
  p.gelu = true;
  p.aux = p.d;
  return p;
}
// The input gradient of c_proj (weight [out, hidden]) taken through c_fc's GELU:
// dpre [rows, hidden] = (grad [rows, out] weight) * gelu'(pre [rows, hidden]).
inline Plan input_grad_dgelu_plan(int64_t rows, int64_t out, int64_t hidden) {
  Plan p = gemm_plan(rows, out, false, out, hidden, false, false);
  p.dgelu = true;
  p.aux = p.d;
  return p;
}

// Element (i, j) of a column-major matrix with leading dimension ld, op applied:
// the replay's (and a reader's) definition of what cuBLASLt multiplies.
inline int64_t at(const Layout& l, bool trans, int64_t i, int64_t j) {
  return trans ? j + i * l.ld : i + j * l.ld;
}

// The largest power of two up to 256 that divides the address: the alignment
// cuBLASLt's heuristic is told for each operand (its default assumes 256 bytes).
inline int alignment_of(uintptr_t address) {
  int a = 256;
  while (a > 1 && address % static_cast<uintptr_t>(a) != 0) a /= 2;
  return a;
}

}  // namespace ddp::kernels::lt_plan
