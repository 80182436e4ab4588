// Host entry points of the three kernels, shared by the .cu files that define them and by
// bindings.cpp, which exposes them to Python. Plain C++ (no CUDA or torch headers): pointers and
// the stream arrive as integers from cuda/ops.py, which has already validated every argument and
// picked the launch configuration (cuda/launch_config.py).
//
// Each returns nullptr on success, or a message naming what was wrong (a configuration with no
// compiled kernel, or the CUDA error of the launch).
#pragma once

#include <cstdint>

struct RmsnormArgs {
  int dtype;         // x and y: 0 fp16, 1 bf16, 2 fp32
  int weight_dtype;  // x's dtype or fp32
  const void* x;     // (n_rows, n_cols), row stride stride_x, unit column stride
  const void* weight;  // (n_cols,) contiguous
  void* y;           // (n_rows, n_cols), row stride stride_y, unit column stride
  int64_t n_rows, n_cols, stride_x, stride_y;
  float eps;
  bool vector;             // 16-byte loads: x, y, weight 16-byte aligned, row strides multiples of 16 bytes
  bool looped;             // two passes over the row (the second from L2) instead of a row in registers
  int vectors_per_thread;  // register-cached kernel: 1, 2 or 4
  int threads_per_row;     // a multiple of 32, at most 1024
  int rows_per_block;      // > 1 only with threads_per_row == 32
  void* stream;            // cudaStream_t
};

struct SwigluArgs {
  int dtype;
  const void* gate;  // (n_rows, n_cols), row strides stride_*, unit column stride
  const void* up;
  void* y;
  int64_t n_rows, n_cols, stride_gate, stride_up, stride_y;
  bool vector;             // 16-byte loads: all three 16-byte aligned, row strides multiples of 16 bytes
  int vectors_per_thread;  // 1, 2 or 4
  int threads;             // a multiple of 32, at most 512
  void* stream;
};

struct RopeArgs {
  int dtype;        // q, k, q_out, k_out
  int table_dtype;  // cos, sin: q's dtype or fp32
  const void* q;    // (B, H, T, D)
  const void* k;    // (B, Hkv, T, D)
  const void* cos;  // (B or 1, T, D): batch stride 0 for a table shared by the batch
  const void* sin;
  void* q_out;  // (B, H, T, D), unit stride along D
  void* k_out;  // (B, Hkv, T, D), unit stride along D
  int64_t batch, seq_len, n_q_heads, n_k_heads, head_dim;
  // q (b, h, t, d), k (b, h, t, d), cos (b, t, d), sin (b, t, d), q_out (b, h, t), k_out (b, h, t)
  int64_t strides[20];
  bool interleaved;
  bool vector;        // 16-byte loads of whole packs of pairs; scalar loads with any strides otherwise
  int threads_pairs;  // threads along the pairs of a head: D/2 / pairs a thread
  int threads_heads;  // threads along the heads of a position
  void* stream;
};

const char* launch_rmsnorm(const RmsnormArgs& a);
const char* launch_swiglu(const SwigluArgs& a);
const char* launch_rope(const RopeArgs& a);
