// Internal to onednn.cpp and onednn_conv.cpp: the engine, per-thread streams, and
// the staging of our plain f32 tensors into the layouts and types a primitive
// wants (Note [oneDNN threads] in onednn.cpp).
#pragma once

#include "runtime/tensor.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <optional>
#include <unordered_map>

namespace ddp::kernels::cpu::onednn::detail {

using dnnl::memory;
using Tag = memory::format_tag;
using Args = std::unordered_map<int, memory>;

dnnl::engine& engine();
// This thread's stream; every execution waits on it before its buffers go away.
dnnl::stream& thread_stream();

// Every primitive (reorders included) is made with this: the caller passes the
// scratchpad (Note [oneDNN threads]).
dnnl::primitive_attr user_scratchpad();

inline memory::desc plain(const memory::dims& dims, Tag tag) {
  return memory::desc(dims, memory::data_type::f32, tag);
}
inline memory::desc any(const memory::dims& dims, memory::data_type type = memory::data_type::f32) {
  return memory::desc(dims, type, Tag::any);
}

// A primitive with its scratchpad's size.
struct Prim {
  dnnl::primitive prim;
  memory::desc scratchpad;
};
template <class Primitive, class Pd>
Prim make_prim(const Pd& pd) {
  return {Primitive(pd), pd.scratchpad_desc()};
}
// Runs p on this thread's stream with a scratchpad from ddp's allocator and waits.
void execute(const Prim& p, Args args);

// One argument: our plain layout, the primitive's, and the reorder between them
// (none when they agree).
struct Arg {
  memory::desc user, inner;
  std::optional<Prim> to_inner, to_user;
  Arg(const memory::desc& user_desc, const memory::desc& inner_desc, bool output);
};

// The memory the primitive reads or writes for an argument: the caller's buffer
// when the layouts agree, else one of the primitive's layout from ddp's allocator
// (filled from the caller's for an input). Alive as long as this object.
struct Staged {
  Tensor storage;
  memory mem;
};
Staged stage(const Arg& arg, void* data, bool input);
// Copies a staged output back into data (nothing when it was data itself).
void unstage(const Arg& arg, const Staged& staged, void* data);

// A dense [rows, cols] copy of `rows` rows of `cols` values (`ld` apart), each rounded
// to bf16 (to nearest even) and held as f32: an operand of the bf16 precision where
// oneDNN has no bf16 primitives (bf16_primitives() in onednn.h).
Tensor bf16_rounded(const float* data, int64_t rows, int64_t cols, int64_t ld);

}  // namespace ddp::kernels::cpu::onednn::detail
