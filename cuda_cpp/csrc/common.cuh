// What the three kernels share: fp16 / bf16 / fp32 <-> fp32 conversions, 16-byte vector loads and
// stores with cache hints, and the warp / block sums of the RMSNorm reduction.
//
// PyTorch builds extensions with __CUDA_NO_HALF_OPERATORS__, __CUDA_NO_HALF_CONVERSIONS__ and
// __CUDA_NO_BFLOAT16_CONVERSIONS__, so every conversion here is an explicit intrinsic.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace llm {

// ---- scalar conversions (all math is fp32; one rounding to the storage type at the end) ----

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// ---- packs: N consecutive values of T moved as whole 16-byte (or 8-, 4-byte) words ----

template <typename T, int N>
struct alignas(sizeof(T) * N >= 16 ? 16 : sizeof(T) * N) Pack {
  T v[N];
};

// Streaming: read once, evict first (ld.global.cs), so it does not push reused data out of L2.
// Cached: the read-only path with normal caching (ld.global.nc), for data read again soon.
enum class Load { kCached, kStreaming };
enum class Store { kDefault, kStreaming };

// p must be aligned to min(16, N * sizeof(T)) bytes; a pack of more than 16 bytes is several
// 16-byte loads (sm_90 has no wider global load).
template <Load POLICY, typename T, int N>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p) {
  constexpr int BYTES = N * sizeof(T);
  Pack<T, N> out;
  if constexpr (BYTES % 16 == 0) {
    const uint4* src = reinterpret_cast<const uint4*>(p);
    uint4* dst = reinterpret_cast<uint4*>(&out);
#pragma unroll
    for (int i = 0; i < BYTES / 16; ++i) dst[i] = POLICY == Load::kStreaming ? __ldcs(src + i) : __ldg(src + i);
  } else if constexpr (BYTES == 8) {
    const uint2* src = reinterpret_cast<const uint2*>(p);
    *reinterpret_cast<uint2*>(&out) = POLICY == Load::kStreaming ? __ldcs(src) : __ldg(src);
  } else if constexpr (BYTES == 4) {
    const unsigned* src = reinterpret_cast<const unsigned*>(p);
    *reinterpret_cast<unsigned*>(&out) = POLICY == Load::kStreaming ? __ldcs(src) : __ldg(src);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out.v[i] = p[i];
  }
  return out;
}

template <Store POLICY, typename T, int N>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, N>& in) {
  constexpr int BYTES = N * sizeof(T);
  if constexpr (BYTES % 16 == 0) {
    uint4* dst = reinterpret_cast<uint4*>(p);
    const uint4* src = reinterpret_cast<const uint4*>(&in);
#pragma unroll
    for (int i = 0; i < BYTES / 16; ++i) {
      if constexpr (POLICY == Store::kStreaming) {
        __stcs(dst + i, src[i]);
      } else {
        dst[i] = src[i];
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = in.v[i];
  }
}

template <typename T, int N>
__device__ __forceinline__ Pack<T, N> zero_pack() {
  Pack<T, N> out;
#pragma unroll
  for (int i = 0; i < N; ++i) out.v[i] = from_float<T>(0.0f);
  return out;
}

// N values: one pack (VECTOR: p aligned as load_pack needs, unit stride), or N scalar loads
// `stride` elements apart (any alignment, any stride).
template <Load POLICY, bool VECTOR, int N, typename T>
__device__ __forceinline__ Pack<T, N> load_values(const T* p, int64_t stride) {
  if constexpr (VECTOR) {
    return load_pack<POLICY, T, N>(p);
  } else {
    Pack<T, N> out;
#pragma unroll
    for (int i = 0; i < N; ++i) out.v[i] = p[i * stride];
    return out;
  }
}

// The same as fp32 values, through the cached path (weights and tables, which are read again).
template <bool VECTOR, int N, typename T>
__device__ __forceinline__ void load_floats(const T* p, int64_t stride, float (&out)[N]) {
  const Pack<T, N> pk = load_values<Load::kCached, VECTOR, N>(p, stride);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_float(pk.v[i]);
}

// N fp32 values rounded to T and stored at p, p + 1, ...: one streaming pack (VECTOR) or N scalars.
template <bool VECTOR, int N, typename T>
__device__ __forceinline__ void store_floats(T* p, const float (&in)[N]) {
  if constexpr (VECTOR) {
    Pack<T, N> pk;
#pragma unroll
    for (int i = 0; i < N; ++i) pk.v[i] = from_float<T>(in[i]);
    store_pack<Store::kStreaming, T, N>(p, pk);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = from_float<T>(in[i]);
  }
}

// ---- reductions ----

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum of v over the blockDim.x threads that share a row (a multiple of 32, at most 1024), returned
// to every one of them. One warp a row (blockDim.x == 32, several rows a block): shuffles only.
// Wider rows (blockDim.y == 1): each warp leaves its sum in shared memory, then every warp adds
// the (at most 32) partial sums itself, which saves a second barrier and a broadcast. Call once
// per kernel: `partials` is not reused.
__device__ __forceinline__ float row_sum(float v, float (&partials)[32]) {
  v = warp_sum(v);
  if (blockDim.x <= 32) return v;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) partials[warp] = v;
  __syncthreads();
  return warp_sum(lane < static_cast<int>(blockDim.x / 32) ? partials[lane] : 0.0f);
}

// ---- launch plumbing ----

enum DType : int { kHalf = 0, kBFloat16 = 1, kFloat = 2 };  // the codes cuda/ops.py passes

template <typename T>
struct Tag {
  using type = T;
};

// Calls f(Tag<T>{}) with T the storage type of `code`; the message of an unknown code otherwise.
template <typename F>
const char* dispatch_dtype(int code, F&& f) {
  switch (code) {
    case kHalf: return f(Tag<__half>{});
    case kBFloat16: return f(Tag<__nv_bfloat16>{});
    case kFloat: return f(Tag<float>{});
    default: return "unknown dtype code (expected 0 fp16, 1 bf16, 2 fp32)";
  }
}

// After a launch: nullptr, or the CUDA error's text (a bad configuration, no device, ...).
inline const char* launch_error() {
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace llm
