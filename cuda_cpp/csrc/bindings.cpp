// Python entry points of the CUDA kernels: integers in (pointers, sizes, strides, the stream, the
// launch configuration), a RuntimeError out if a launcher reports a problem. Tensors never cross
// this boundary, so no torch header is needed; cuda/ops.py validates the tensors and passes
// `tensor.data_ptr()` and `torch.cuda.current_stream().cuda_stream`.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "launchers.h"

namespace py = pybind11;

namespace {

const void* cptr(std::uintptr_t p) { return reinterpret_cast<const void*>(p); }
void* mptr(std::uintptr_t p) { return reinterpret_cast<void*>(p); }

void raise_if(const char* op, const char* error) {
  if (error != nullptr) throw std::runtime_error(std::string(op) + " (CUDA kernel): " + error);
}

void rmsnorm(int dtype, int weight_dtype, std::uintptr_t x, std::uintptr_t weight, std::uintptr_t y,
             int64_t n_rows, int64_t n_cols, int64_t stride_x, int64_t stride_y, double eps, bool vector,
             bool looped, int vectors_per_thread, int threads_per_row, int rows_per_block, std::uintptr_t stream) {
  const RmsnormArgs a{dtype, weight_dtype, cptr(x), cptr(weight), mptr(y), n_rows, n_cols, stride_x, stride_y,
                      static_cast<float>(eps), vector, looped, vectors_per_thread, threads_per_row, rows_per_block,
                      mptr(stream)};
  raise_if("rmsnorm", launch_rmsnorm(a));
}

void swiglu(int dtype, std::uintptr_t gate, std::uintptr_t up, std::uintptr_t y, int64_t n_rows, int64_t n_cols,
            int64_t stride_gate, int64_t stride_up, int64_t stride_y, bool vector, int vectors_per_thread,
            int threads, std::uintptr_t stream) {
  const SwigluArgs a{dtype, cptr(gate), cptr(up), mptr(y), n_rows, n_cols, stride_gate, stride_up, stride_y,
                     vector, vectors_per_thread, threads, mptr(stream)};
  raise_if("swiglu", launch_swiglu(a));
}

void rope(int dtype, int table_dtype, std::uintptr_t q, std::uintptr_t k, std::uintptr_t cos, std::uintptr_t sin,
          std::uintptr_t q_out, std::uintptr_t k_out, int64_t batch, int64_t seq_len, int64_t n_q_heads,
          int64_t n_k_heads, int64_t head_dim, const std::vector<int64_t>& strides, bool interleaved, bool vector,
          int threads_pairs, int threads_heads, std::uintptr_t stream) {
  RopeArgs a{dtype, table_dtype, cptr(q), cptr(k), cptr(cos), cptr(sin), mptr(q_out), mptr(k_out), batch, seq_len,
             n_q_heads, n_k_heads, head_dim, {}, interleaved, vector, threads_pairs, threads_heads, mptr(stream)};
  constexpr size_t kStrides = sizeof(a.strides) / sizeof(a.strides[0]);
  if (strides.size() != kStrides)
    throw std::invalid_argument("rope: strides must hold 20 values (q 4, k 4, cos 3, sin 3, q_out 3, k_out 3), got " +
                                std::to_string(strides.size()));
  for (size_t i = 0; i < kStrides; ++i) a.strides[i] = strides[i];
  raise_if("rope", launch_rope(a));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Hand-written CUDA kernels: RMSNorm, RoPE, SwiGLU (launch with cuda/ops.py, which validates)";
  m.def("rmsnorm", &rmsnorm, py::arg("dtype"), py::arg("weight_dtype"), py::arg("x"), py::arg("weight"),
        py::arg("y"), py::arg("n_rows"), py::arg("n_cols"), py::arg("stride_x"), py::arg("stride_y"), py::arg("eps"),
        py::arg("vector"), py::arg("looped"), py::arg("vectors_per_thread"), py::arg("threads_per_row"),
        py::arg("rows_per_block"), py::arg("stream"));
  m.def("swiglu", &swiglu, py::arg("dtype"), py::arg("gate"), py::arg("up"), py::arg("y"), py::arg("n_rows"),
        py::arg("n_cols"), py::arg("stride_gate"), py::arg("stride_up"), py::arg("stride_y"), py::arg("vector"),
        py::arg("vectors_per_thread"), py::arg("threads"), py::arg("stream"));
  m.def("rope", &rope, py::arg("dtype"), py::arg("table_dtype"), py::arg("q"), py::arg("k"), py::arg("cos"),
        py::arg("sin"), py::arg("q_out"), py::arg("k_out"), py::arg("batch"), py::arg("seq_len"),
        py::arg("n_q_heads"), py::arg("n_k_heads"), py::arg("head_dim"), py::arg("strides"), py::arg("interleaved"),
        py::arg("vector"), py::arg("threads_pairs"), py::arg("threads_heads"), py::arg("stream"));
}
