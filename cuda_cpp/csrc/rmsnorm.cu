// RMSNorm over the last dim:  y = x * rsqrt(mean(x^2) + eps) * weight,  fp32 math, one rounding.
//
// Memory traffic per row of N values of e bytes: read x (N*e), write y (N*e); the weight (N values)
// is read by every row but stays in L1/L2.
//
// Two kernels, picked by cuda/launch_config.py:
// - rmsnorm_cached_kernel: threads_per_row threads hold a whole row in registers, VPT <= 4 16-byte
//   packs each, kept in the storage type (8 packs spill bf16 rows at 1024 threads), so x crosses
//   HBM once: sum of squares, a warp-shuffle sum plus one shared-memory step across the row's
//   warps, then normalize from registers. Short rows run one warp a row, several rows a block.
// - rmsnorm_looped_kernel: rows too wide for registers, or rows that cannot be read in 16-byte
//   packs (VEC = 1): pass 1 sums squares, pass 2 reads the row again (from L1/L2) and normalizes.
// Both take any row stride. With 16-byte packs, a row whose length is not a multiple of the pack
// ends in a scalar tail of fewer than VEC values (with rows of packs in and out, that is a tensor
// of one row: the output's row stride is the row length).
#include "common.cuh"
#include "launchers.h"

// each file's internals in a namespace of its own: load_inline compiles the three as one unit
namespace llm::rmsnorm {

template <typename T, int N>
__device__ __forceinline__ float sum_squares(const Pack<T, N>& pk) {
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float f = to_float(pk.v[i]);
    s += f * f;
  }
  return s;
}

// y[0:N] = x * rstd * weight[0:N] for one pack of the row.
template <bool VECTOR, typename T, typename W, int N>
__device__ __forceinline__ void normalize_pack(T* y, const W* w, const Pack<T, N>& xv, float rstd) {
  float wv[N];
  load_floats<VECTOR, N>(w, 1, wv);
  float out[N];
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_float(xv.v[i]) * rstd * wv[i];
  store_floats<VECTOR, N>(y, out);
}

template <typename T, typename W, int VEC, int VPT>
__global__ void __launch_bounds__(1024) rmsnorm_cached_kernel(
    const T* __restrict__ x, const W* __restrict__ w, T* __restrict__ y,
    int64_t n_rows, int n_cols, int64_t stride_x, int64_t stride_y, float eps) {
  static_assert(VEC > 1, "the register-cached kernel reads 16-byte packs");
  __shared__ float partials[32];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  // only one-warp rows share a block, so a warp past the last row leaves before any barrier
  if (row >= n_rows) return;
  const T* xr = x + row * stride_x;  // 64-bit: row * stride can pass 2^31
  T* yr = y + row * stride_y;
  const int n_vec = n_cols / VEC;

  // all loads first, so each thread has VPT packs in flight
  Pack<T, VEC> xv[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int v = threadIdx.x + i * blockDim.x;
    xv[i] = v < n_vec ? load_pack<Load::kStreaming, T, VEC>(xr + v * VEC) : zero_pack<T, VEC>();
  }
  const int tail_col = n_vec * VEC + threadIdx.x;  // fewer than VEC values: the first threads
  const float x_tail = tail_col < n_cols ? to_float(xr[tail_col]) : 0.0f;

  float ss = x_tail * x_tail;
#pragma unroll
  for (int i = 0; i < VPT; ++i) ss += sum_squares(xv[i]);
  const float rstd = rsqrtf(row_sum(ss, partials) / static_cast<float>(n_cols) + eps);

#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int v = threadIdx.x + i * blockDim.x;
    if (v < n_vec) normalize_pack<true>(yr + v * VEC, w + v * VEC, xv[i], rstd);
  }
  if (tail_col < n_cols) yr[tail_col] = from_float<T>(x_tail * rstd * to_float(w[tail_col]));
}

template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(1024) rmsnorm_looped_kernel(
    const T* __restrict__ x, const W* __restrict__ w, T* __restrict__ y,
    int64_t n_rows, int n_cols, int64_t stride_x, int64_t stride_y, float eps) {
  constexpr bool VECTOR = VEC > 1;
  constexpr int UNROLL = 4;  // packs a thread has in flight per trip
  __shared__ float partials[32];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= n_rows) return;
  const T* xr = x + row * stride_x;
  T* yr = y + row * stride_y;
  const int n_vec = n_cols / VEC;
  const int step = UNROLL * blockDim.x;

  // pass 1: sum of squares; cached loads keep the row in L1/L2 for pass 2
  float ss = 0.0f;
  for (int base = threadIdx.x; base < n_vec; base += step) {
    Pack<T, VEC> xv[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int v = base + u * blockDim.x;
      xv[u] = v < n_vec ? load_pack<Load::kCached, T, VEC>(xr + v * VEC) : zero_pack<T, VEC>();
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) ss += sum_squares(xv[u]);
  }
  const int tail_col = n_vec * VEC + threadIdx.x;
  const float x_tail = tail_col < n_cols ? to_float(xr[tail_col]) : 0.0f;
  ss += x_tail * x_tail;
  const float rstd = rsqrtf(row_sum(ss, partials) / static_cast<float>(n_cols) + eps);

  // pass 2: the row's last read, so streaming loads
  for (int base = threadIdx.x; base < n_vec; base += step) {
    Pack<T, VEC> xv[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int v = base + u * blockDim.x;
      xv[u] = v < n_vec ? load_pack<Load::kStreaming, T, VEC>(xr + v * VEC) : zero_pack<T, VEC>();
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int v = base + u * blockDim.x;
      if (v < n_vec) normalize_pack<VECTOR>(yr + v * VEC, w + v * VEC, xv[u], rstd);
    }
  }
  if (tail_col < n_cols) yr[tail_col] = from_float<T>(x_tail * rstd * to_float(w[tail_col]));
}

template <typename T, typename W>
const char* rmsnorm_typed(const RmsnormArgs& a) {
  constexpr int VEC = 16 / sizeof(T);
  const dim3 block(a.threads_per_row, a.rows_per_block);
  const dim3 grid(static_cast<unsigned>((a.n_rows + a.rows_per_block - 1) / a.rows_per_block));
  const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  const T* x = static_cast<const T*>(a.x);
  const W* w = static_cast<const W*>(a.weight);
  T* y = static_cast<T*>(a.y);
  const int n_cols = static_cast<int>(a.n_cols);
#define LLM_RMSNORM_ARGS x, w, y, a.n_rows, n_cols, a.stride_x, a.stride_y, a.eps
  if (a.looped) {
    if (a.vector) {
      rmsnorm_looped_kernel<T, W, VEC><<<grid, block, 0, stream>>>(LLM_RMSNORM_ARGS);
    } else {
      rmsnorm_looped_kernel<T, W, 1><<<grid, block, 0, stream>>>(LLM_RMSNORM_ARGS);
    }
  } else {
    if (!a.vector) return "the register-cached kernel needs 16-byte packs (vector=True)";
    switch (a.vectors_per_thread) {
      case 1: rmsnorm_cached_kernel<T, W, VEC, 1><<<grid, block, 0, stream>>>(LLM_RMSNORM_ARGS); break;
      case 2: rmsnorm_cached_kernel<T, W, VEC, 2><<<grid, block, 0, stream>>>(LLM_RMSNORM_ARGS); break;
      case 4: rmsnorm_cached_kernel<T, W, VEC, 4><<<grid, block, 0, stream>>>(LLM_RMSNORM_ARGS); break;
      default: return "vectors_per_thread must be 1, 2 or 4";
    }
  }
#undef LLM_RMSNORM_ARGS
  return launch_error();
}

}  // namespace llm::rmsnorm

const char* launch_rmsnorm(const RmsnormArgs& a) {
  using namespace llm;
  using namespace llm::rmsnorm;
  if (a.threads_per_row < 32 || a.threads_per_row > 1024 || a.threads_per_row % 32 != 0)
    return "threads_per_row must be a multiple of 32 in [32, 1024]";
  if (a.rows_per_block < 1 || (a.rows_per_block > 1 && a.threads_per_row != 32) ||
      a.threads_per_row * a.rows_per_block > 1024)
    return "rows_per_block > 1 needs threads_per_row == 32, and a block holds at most 1024 threads";
  if (a.n_cols < 1 || a.n_cols > INT32_MAX) return "n_cols must be in [1, 2^31)";
  if ((a.n_rows + a.rows_per_block - 1) / a.rows_per_block > INT32_MAX) return "too many rows for one grid";
  return dispatch_dtype(a.dtype, [&](auto x_tag) -> const char* {
    using T = typename decltype(x_tag)::type;
    if (a.weight_dtype == a.dtype) return rmsnorm_typed<T, T>(a);
    if (a.weight_dtype == kFloat) return rmsnorm_typed<T, float>(a);
    return "weight_dtype must be x's dtype or fp32";
  });
}
