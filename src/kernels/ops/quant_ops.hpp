// Quantized-weight ops: the dequantization a Linear runs before the GEMM that reads a quantized weight
// (kernels/quantization.hpp gives the formats).
//
// Part of the Ops contract (kernels/ops.hpp: memory, storage types, the `[grad]` pointer marks, and the
// gradient convention). Ops inherits this interface; CpuOps and CudaOps implement it.
#pragma once
#include "kernels/quantization.hpp"

namespace anvil {

class QuantOps {
 public:
  virtual ~QuantOps() = default;

  // out [m.rows, m.cols] (compute type, overwritten) = the values m stands for (dequantized_value, in fp32),
  // rounded to the compute type. m's codes and scales are device memory; out must not overlap them.
  virtual void dequantize(void* out, const QuantizedMatrix& m) = 0;

  // y [N, m.rows] (compute type, overwritten) = x [N, m.cols] W^T + bias [m.rows] (null: none), W being m
  // dequantized: equals dequantize into scratch, then matmul_fwd (the CPU reference composes exactly these),
  // up to the order of the sums. CUDA reads the codes directly, with no dequantized copy (the way to decode
  // a few tokens; quantized_matmul_preferred says when). y must not overlap x.
  virtual void quantized_matmul_fwd(void* y, const void* x, const QuantizedMatrix& m, const void* bias,
                                    int N) = 0;
  // Whether quantized_matmul_fwd beats dequantize + matmul_fwd for N input rows here (CUDA: a few rows and
  // m.cols a multiple of 64; the CPU: never, it composes the same two).
  virtual bool quantized_matmul_preferred(const QuantizedMatrix& m, int N) const = 0;
};

}  // namespace anvil
