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
};

}  // namespace anvil
