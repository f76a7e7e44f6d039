// The quantized part of a ParamStore (ParamTensor::storage): bitsandbytes' load_in_8bit / load_in_4bit for
// Anvil's decoders. The weight of every Linear inside the blocks (q/k/v, the attention output, gate/up or
// fc, down; fused ones as one matrix) is kept as int8 or NF4 codes with fp32 scales
// (kernels/quantization.hpp) instead of the compute type; the embeddings, norms, biases and the LM head stay
// in the compute type, as transformers keeps them. A Linear dequantizes its matrix into one shared workspace
// before each GEMM (model/linear.hpp: WeightView).
//
// The store's compute-type buffer then holds only the tensors kept dense, in layout order (dense_index maps
// a layout offset to its place there); host values keep the whole layout (upload quantizes the matrices,
// download returns their dequantized values). Inference only: a quantized store has no master weights,
// gradients or optimizer state (training a quantized base needs adapters beside it, QLoRA).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "anvil/memory_plan.hpp"
#include "kernels/quantization.hpp"
#include "model/param_layout.hpp"
#include "runtime/arena.hpp"
#include "runtime/device.hpp"

namespace anvil {

class QuantizedWeights {
 public:
  // Marks the Linear weights of `layout`'s blocks as `storage` (Int8 or NF4) and plans their places.
  QuantizedWeights(ParamLayout& layout, WeightStorage storage, DType compute);

  WeightStorage storage() const { return storage_; }
  // Elements stored quantized, and the rest (kept dense in the compute type).
  size_t quantized_numel() const { return quantized_numel_; }
  size_t dense_numel() const { return dense_numel_; }
  size_t matrices() const { return matrices_.size(); }
  // Bytes of the codes and scales.
  size_t quantized_bytes() const { return code_bytes_ + scale_count_ * sizeof(float); }
  // The compute-type buffer's element of layout element `offset`, which must be stored dense (or the end of
  // the layout).
  size_t dense_index(size_t offset) const;
  // The layout ranges kept dense, in order (their dense indices follow one another).
  const std::vector<ParamRange>& dense_ranges() const { return dense_; }

  // Codes, scales and the dequantization workspace (the largest matrix in the compute type).
  void plan_memory(MemoryPlan& plan);
  void bind(const Arena& arena);
  // Quantizes the matrices of `host` (fp32, the whole layout) and uploads codes and scales.
  void upload(Device& dev, const float* host) const;
  // Writes the matrices' dequantized values into `host` (the whole layout); the rest is left as it is.
  void download(Device& dev, float* host) const;
  // Whether quantizing the dequantized values again gives these codes and scales (int8, nf4), so that a
  // checkpoint's dequantized weights restore them; nf4-dq's scales, quantized again, move.
  bool requantizes_exactly() const { return storage_ != WeightStorage::NF4DoubleQuant; }
  // The codes and scales as they are held (code_bytes() and scale_count() long), out and back in: what
  // restores a base that does not requantize exactly.
  size_t code_bytes() const { return code_bytes_; }
  size_t scale_count() const { return scale_count_; }
  void download_raw(Device& dev, uint8_t* codes, float* scales) const;
  void upload_raw(Device& dev, const uint8_t* codes, const float* scales) const;

  // The quantized matrix whose first element is layout element `offset` (a Linear's weight), or nullptr when
  // that element is stored dense. Device memory once bound.
  const QuantizedMatrix* matrix_at(size_t offset) const;
  // Where a Linear dequantizes its matrix (the Linears of a model run one at a time).
  void* workspace() const { return workspace_; }

 private:
  struct Matrix {
    size_t offset = 0;        // layout offset of its first element
    size_t code_offset = 0;   // bytes into the codes
    size_t scale_offset = 0;  // floats into the scales
    QuantizedMatrix view;     // bound pointers
  };
  WeightStorage storage_;
  size_t elem_;  // bytes per compute-type element
  std::vector<Matrix> matrices_;
  std::vector<ParamRange> dense_;
  std::vector<size_t> dense_first_;  // dense index of each dense range's begin
  size_t quantized_numel_ = 0, dense_numel_ = 0, largest_ = 0;
  size_t code_bytes_ = 0, scale_count_ = 0;
  size_t i_codes_ = SIZE_MAX, i_scales_ = SIZE_MAX, i_workspace_ = SIZE_MAX;
  uint8_t* codes_ = nullptr;
  float* scales_ = nullptr;
  void* workspace_ = nullptr;
};

}  // namespace anvil
