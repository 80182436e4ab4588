// Rotary position embeddings on q and k in one launch, with the semantics of
// attention/triton_rope.py (fp32 math, one rounding). Pair i of a head is rotated by the table's
// column i (and, in the half layout, its second element by column i + D/2):
//     half:         (x[i], x[i + D/2]) -> (x[i] cos[i] - x[i + D/2] sin[i],
//                                          x[i + D/2] cos[i + D/2] + x[i] sin[i + D/2])
//     interleaved:  (x[2i], x[2i + 1]) -> (x[2i] cos[i] - x[2i + 1] sin[i],
//                                          x[2i + 1] cos[i] + x[2i] sin[i])
//
// One block per (b, t) position: thread (x, y) owns PAIRS pairs of every head (x * PAIRS .. in the
// pair index), loads their cos and sin once, and rotates them in heads y, y + blockDim.y, ... of
// q then k. With 16-byte packs (PAIRS = 16 / element size) a thread moves two packs of a head:
// x[c : c+PAIRS] and x[c + D/2 : ...] (half), or x[2c : 2c + 2*PAIRS] (interleaved). Without
// them (PAIRS = 1) every access is a scalar with its own stride, so any layout works.
//
// Memory traffic (e, e_c element sizes of q and of the table): read q, k and write q_out, k_out:
// 2 * B*T*(H + Hkv)*D * e; cos and sin: 2 * (table rows)*D * e_c (half of it interleaved), each
// row read by the blocks of its position.
#include "common.cuh"
#include "launchers.h"

// each file's internals in a namespace of its own: load_inline compiles the three as one unit
namespace llm::rope {

struct RopeStrides {
  int64_t q_b, q_h, q_t, q_d;
  int64_t k_b, k_h, k_t, k_d;
  int64_t cos_b, cos_t, cos_d;
  int64_t sin_b, sin_t, sin_d;
  int64_t qo_b, qo_h, qo_t;
  int64_t ko_b, ko_h, ko_t;
};

// Heads a thread rotates per trip: 4 packs (64 bytes) of loads in flight a thread. One head a trip
// saves only ~10 of the half layout's registers, whose four fp32 table columns dominate.
constexpr int HEADS_PER_TRIP = 2;
// Threads a block at most: __launch_bounds__ then leaves up to 128 registers a thread, where 1024
// would force 64. ptxas (sm_90, nvcc 13.0): 93-113 registers for the fp16 / bf16 half layout,
// 71-94 interleaved, 32-55 for the scalar and fp32 kernels; no spills.
constexpr int MAX_THREADS = 512;

template <typename T, typename C, int PAIRS, bool INTERLEAVED>
__global__ void __launch_bounds__(MAX_THREADS) rope_kernel(
    const T* __restrict__ q, const T* __restrict__ k, const C* __restrict__ cos, const C* __restrict__ sin,
    T* __restrict__ q_out, T* __restrict__ k_out,
    int64_t seq_len, int n_q_heads, int n_k_heads, int half, RopeStrides s) {
  constexpr bool VECTOR = PAIRS > 1;
  const int64_t b = blockIdx.x / seq_len;
  const int64_t t = blockIdx.x - b * seq_len;
  const int c = threadIdx.x * PAIRS;  // first pair of this thread
  // A thread's values of a head are two runs of PAIRS, at a and a + off_b (in elements along D):
  //   half:        x[c : c+PAIRS] and x[c + D/2 : ...], the two members of each pair
  //   interleaved: x[2c : 2c+PAIRS] and x[2c+PAIRS : 2c+2*PAIRS], whole pairs, PAIRS of them
  const int a = INTERLEAVED ? 2 * c : c;
  const int off_b = INTERLEAVED ? PAIRS : half;

  // One trip: the packs of heads h0, h0 + blockDim.y, ... (HEADS_PER_TRIP of them), q heads first,
  // then k heads. q and k are read once: streaming loads keep the tables of other blocks in L2.
  const int n_heads = n_q_heads + n_k_heads;
  Pack<T, PAIRS> xa[HEADS_PER_TRIP], xb[HEADS_PER_TRIP];  // kept in the storage type: half the registers
  T* dst[HEADS_PER_TRIP];
  auto load_trip = [&](int h0) {
#pragma unroll
    for (int j = 0; j < HEADS_PER_TRIP; ++j) {
      const int h = h0 + j * blockDim.y;
      dst[j] = nullptr;
      if (h >= n_heads) continue;
      const bool is_q = h < n_q_heads;  // pointers are selected, not branched on
      const int64_t head = is_q ? h : h - n_q_heads;
      const T* src = is_q ? q + b * s.q_b + head * s.q_h + t * s.q_t : k + b * s.k_b + head * s.k_h + t * s.k_t;
      const int64_t sd = VECTOR ? 1 : (is_q ? s.q_d : s.k_d);
      dst[j] = is_q ? q_out + b * s.qo_b + head * s.qo_h + t * s.qo_t : k_out + b * s.ko_b + head * s.ko_h + t * s.ko_t;
      xa[j] = load_values<Load::kStreaming, VECTOR, PAIRS>(src + a * sd, sd);
      xb[j] = load_values<Load::kStreaming, VECTOR, PAIRS>(src + (a + off_b) * sd, sd);
    }
  };
  // the first trip's loads go out before the table's, so the two latencies overlap
  load_trip(threadIdx.y);

  // the position's table, once for all heads: columns c.. (c1, s1) and, half layout, c + D/2.. (c2, s2)
  const int64_t cos_d = VECTOR ? 1 : s.cos_d, sin_d = VECTOR ? 1 : s.sin_d;  // packs: unit stride
  const C* cos_row = cos + b * s.cos_b + t * s.cos_t;
  const C* sin_row = sin + b * s.sin_b + t * s.sin_t;
  float c1[PAIRS], s1[PAIRS], c2[PAIRS], s2[PAIRS];
  load_floats<VECTOR, PAIRS>(cos_row + c * cos_d, cos_d, c1);
  load_floats<VECTOR, PAIRS>(sin_row + c * sin_d, sin_d, s1);
  if constexpr (!INTERLEAVED) {
    load_floats<VECTOR, PAIRS>(cos_row + (c + half) * cos_d, cos_d, c2);
    load_floats<VECTOR, PAIRS>(sin_row + (c + half) * sin_d, sin_d, s2);
  }

  const int step = HEADS_PER_TRIP * blockDim.y;
  for (int h0 = threadIdx.y; h0 < n_heads; h0 += step) {
#pragma unroll
    for (int j = 0; j < HEADS_PER_TRIP; ++j) {
      if (dst[j] == nullptr) continue;
      float oa[PAIRS], ob[PAIRS];
      if constexpr (INTERLEAVED) {
        float v[2 * PAIRS], o[2 * PAIRS];  // the 2*PAIRS values in order: pair i is (v[2i], v[2i + 1])
#pragma unroll
        for (int i = 0; i < PAIRS; ++i) {
          v[i] = to_float(xa[j].v[i]);
          v[PAIRS + i] = to_float(xb[j].v[i]);
        }
#pragma unroll
        for (int i = 0; i < PAIRS; ++i) {
          o[2 * i] = v[2 * i] * c1[i] - v[2 * i + 1] * s1[i];
          o[2 * i + 1] = v[2 * i + 1] * c1[i] + v[2 * i] * s1[i];
        }
#pragma unroll
        for (int i = 0; i < PAIRS; ++i) {
          oa[i] = o[i];
          ob[i] = o[PAIRS + i];
        }
      } else {
#pragma unroll
        for (int i = 0; i < PAIRS; ++i) {
          const float x1 = to_float(xa[j].v[i]), x2 = to_float(xb[j].v[i]);
          oa[i] = x1 * c1[i] - x2 * s1[i];
          ob[i] = x2 * c2[i] + x1 * s2[i];
        }
      }
      store_floats<VECTOR, PAIRS>(dst[j] + a, oa);  // outputs are unit-stride along D
      store_floats<VECTOR, PAIRS>(dst[j] + a + off_b, ob);
    }
    if (h0 + step < n_heads) load_trip(h0 + step);
  }
}

template <typename T, typename C>
const char* rope_typed(const RopeArgs& a) {
  constexpr int PAIRS = 16 / sizeof(T);
  const int64_t* st = a.strides;
  const RopeStrides s{st[0],  st[1],  st[2],  st[3],  st[4],  st[5],  st[6],  st[7],  st[8],  st[9],
                      st[10], st[11], st[12], st[13], st[14], st[15], st[16], st[17], st[18], st[19]};
  const dim3 grid(static_cast<unsigned>(a.batch * a.seq_len));
  const dim3 block(a.threads_pairs, a.threads_heads);
  const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const C* cos = static_cast<const C*>(a.cos);
  const C* sin = static_cast<const C*>(a.sin);
  T* q_out = static_cast<T*>(a.q_out);
  T* k_out = static_cast<T*>(a.k_out);
  const int half = static_cast<int>(a.head_dim / 2);
  const int n_q = static_cast<int>(a.n_q_heads), n_k = static_cast<int>(a.n_k_heads);
#define LLM_ROPE_ARGS q, k, cos, sin, q_out, k_out, a.seq_len, n_q, n_k, half, s
  if (a.vector && a.interleaved) {
    rope_kernel<T, C, PAIRS, true><<<grid, block, 0, stream>>>(LLM_ROPE_ARGS);
  } else if (a.vector) {
    rope_kernel<T, C, PAIRS, false><<<grid, block, 0, stream>>>(LLM_ROPE_ARGS);
  } else if (a.interleaved) {
    rope_kernel<T, C, 1, true><<<grid, block, 0, stream>>>(LLM_ROPE_ARGS);
  } else {
    rope_kernel<T, C, 1, false><<<grid, block, 0, stream>>>(LLM_ROPE_ARGS);
  }
#undef LLM_ROPE_ARGS
  return launch_error();
}

}  // namespace llm::rope

const char* launch_rope(const RopeArgs& a) {
  using namespace llm;
  using namespace llm::rope;
  if (a.head_dim < 2 || a.head_dim % 2 != 0) return "head_dim must be even and positive";
  const int64_t pairs = a.vector ? 16 / (a.dtype == kFloat ? 4 : 2) : 1;
  if ((a.head_dim / 2) % pairs != 0) return "with vector=True, D/2 must be a multiple of the pairs a thread takes";
  if (static_cast<int64_t>(a.threads_pairs) * pairs != a.head_dim / 2)
    return "threads_pairs must be D/2 divided by the pairs a thread takes";
  if (a.threads_heads < 1 || static_cast<int64_t>(a.threads_pairs) * a.threads_heads > MAX_THREADS)
    return "threads_heads must be positive, with threads_pairs * threads_heads <= 512";
  if (a.batch * a.seq_len < 1 || a.batch * a.seq_len > INT32_MAX) return "B*T must be in [1, 2^31)";
  if (a.n_q_heads + a.n_k_heads > INT32_MAX) return "too many heads";
  return dispatch_dtype(a.dtype, [&](auto tag) -> const char* {
    using T = typename decltype(tag)::type;
    if (a.table_dtype == a.dtype) return rope_typed<T, T>(a);
    if (a.table_dtype == kFloat) return rope_typed<T, float>(a);
    return "table_dtype must be q's dtype or fp32";
  });
}
