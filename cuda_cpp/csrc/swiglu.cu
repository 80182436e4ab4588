// SwiGLU:  y = silu(gate) * up = gate / (1 + exp(-gate)) * up,  fp32 math, one rounding.
//
// Memory traffic for M rows of I values of e bytes: read gate and up, write y: 3*M*I*e.
//
// Each block takes threads * VPT packs of one row (a packed tensor is one row of M*I values, so
// no block straddles a row end); each thread issues its VPT gate and up loads before any math.
// Blocks are numbered row-major: block / col_blocks is the row. With 16-byte packs, a row whose
// length is not a multiple of the pack ends in a scalar tail, written by the row's last block.
// No eviction hints: gate and up are read once, but evict-first loads cost the Triton kernel 4-6%
// on an H200 (mlp/triton_glu.py).
#include "common.cuh"
#include "launchers.h"

// each file's internals in a namespace of its own: load_inline compiles the three as one unit
namespace llm::swiglu {

// Threads a block at most: __launch_bounds__ then leaves 128 registers a thread; at 1024 (64
// registers) four bf16 packs a thread spill, as ptxas unpacks every bf16 value to fp32 up front.
constexpr int MAX_THREADS = 512;

// For gate < -88, exp(-gate) overflows to inf and gate / inf = -0: never NaN. __expf is exp2 of
// gate * log2(e), the same instruction sequence as Triton's tl.exp.
__device__ __forceinline__ float silu_mul(float gate, float up) {
  return gate / (1.0f + __expf(-gate)) * up;
}

template <typename T, int VEC, int VPT>
__global__ void __launch_bounds__(MAX_THREADS) swiglu_kernel(
    const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ y,
    int64_t n_cols, int64_t stride_gate, int64_t stride_up, int64_t stride_y, unsigned col_blocks) {
  constexpr bool VECTOR = VEC > 1;
  const unsigned row = blockIdx.x / col_blocks;
  const unsigned col_block = blockIdx.x - row * col_blocks;
  const T* g = gate + static_cast<int64_t>(row) * stride_gate;  // 64-bit: row * stride can pass 2^31
  const T* u = up + static_cast<int64_t>(row) * stride_up;
  T* yr = y + static_cast<int64_t>(row) * stride_y;
  const int64_t n_vec = n_cols / VEC;
  const int64_t first = static_cast<int64_t>(col_block) * blockDim.x * VPT + threadIdx.x;

  Pack<T, VEC> gv[VPT], uv[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int64_t v = first + i * blockDim.x;
    if (v < n_vec) {
      gv[i] = load_pack<Load::kCached, T, VEC>(g + v * VEC);
      uv[i] = load_pack<Load::kCached, T, VEC>(u + v * VEC);
    }
  }
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int64_t v = first + i * blockDim.x;
    if (v < n_vec) {
      float out[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) out[j] = silu_mul(to_float(gv[i].v[j]), to_float(uv[i].v[j]));
      Pack<T, VEC> pk;
#pragma unroll
      for (int j = 0; j < VEC; ++j) pk.v[j] = from_float<T>(out[j]);
      store_pack<Store::kDefault, T, VEC>(yr + v * VEC, pk);
    }
  }
  if (VECTOR && col_block == col_blocks - 1) {
    const int64_t col = n_vec * VEC + threadIdx.x;
    if (col < n_cols) yr[col] = from_float<T>(silu_mul(to_float(g[col]), to_float(u[col])));
  }
}

template <typename T>
const char* swiglu_typed(const SwigluArgs& a) {
  constexpr int VEC = 16 / sizeof(T);
  const int vec = a.vector ? VEC : 1;
  const int64_t per_block = static_cast<int64_t>(a.threads) * a.vectors_per_thread * vec;
  const int64_t col_blocks = (a.n_cols + per_block - 1) / per_block;
  if (col_blocks * a.n_rows > INT32_MAX) return "too many blocks for one grid (rows x column blocks >= 2^31)";
  const dim3 grid(static_cast<unsigned>(col_blocks * a.n_rows));
  const dim3 block(a.threads);
  const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  const T* gate = static_cast<const T*>(a.gate);
  const T* up = static_cast<const T*>(a.up);
  T* y = static_cast<T*>(a.y);
#define LLM_SWIGLU_ARGS gate, up, y, a.n_cols, a.stride_gate, a.stride_up, a.stride_y, static_cast<unsigned>(col_blocks)
#define LLM_SWIGLU_LAUNCH(V)                                                                                 \
  switch (a.vectors_per_thread) {                                                                             \
    case 1: swiglu_kernel<T, V, 1><<<grid, block, 0, stream>>>(LLM_SWIGLU_ARGS); break;                      \
    case 2: swiglu_kernel<T, V, 2><<<grid, block, 0, stream>>>(LLM_SWIGLU_ARGS); break;                      \
    case 4: swiglu_kernel<T, V, 4><<<grid, block, 0, stream>>>(LLM_SWIGLU_ARGS); break;                      \
    default: return "vectors_per_thread must be 1, 2 or 4";                                                  \
  }
  if (a.vector) {
    LLM_SWIGLU_LAUNCH(VEC)
  } else {
    LLM_SWIGLU_LAUNCH(1)
  }
#undef LLM_SWIGLU_LAUNCH
#undef LLM_SWIGLU_ARGS
  return launch_error();
}

}  // namespace llm::swiglu

const char* launch_swiglu(const SwigluArgs& a) {
  using namespace llm;
  using namespace llm::swiglu;
  if (a.threads < 32 || a.threads > MAX_THREADS || a.threads % 32 != 0)
    return "threads must be a multiple of 32 in [32, 512]";
  if (a.n_rows < 1 || a.n_cols < 1) return "n_rows and n_cols must be positive";
  return dispatch_dtype(a.dtype, [&](auto tag) -> const char* { return swiglu_typed<typename decltype(tag)::type>(a); });
}
