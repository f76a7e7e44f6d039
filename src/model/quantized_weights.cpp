#include "model/quantized_weights.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "anvil/error.hpp"

namespace anvil {
namespace {

bool is_linear_weight(TensorRole r) {
  return r == TensorRole::QkvWeight || r == TensorRole::OutWeight || r == TensorRole::MlpInWeight ||
         r == TensorRole::MlpOutWeight;
}

}  // namespace

QuantizedWeights::QuantizedWeights(ParamLayout& layout, WeightStorage storage, DType compute)
    : storage_(storage), elem_(dtype_bytes(compute, 1)) {
  ANVIL_ASSERT(storage != WeightStorage::Compute, "QuantizedWeights: storage {} is not quantized",
               weight_storage_name(storage));
  const std::vector<ParamTensor>& ts = layout.tensors();
  // A matrix: adjacent tensors of one role in one block (q, k, v: the fused QKV weight).
  for (size_t i = 0; i < ts.size(); ++i) {
    if (!is_linear_weight(ts[i].role) || ts[i].layer < 0) continue;
    ANVIL_ASSERT(ts[i].shape.ndim == 2, "quantized tensor '{}' is not a matrix", ts[i].name);
    const bool joins = !matrices_.empty() && i > 0 && ts[i - 1].role == ts[i].role &&
                       ts[i - 1].layer == ts[i].layer && ts[i - 1].storage == storage &&
                       ts[i - 1].offset + ts[i - 1].numel() == ts[i].offset;
    if (joins) {
      QuantizedMatrix& m = matrices_.back().view;
      ANVIL_ASSERT(m.cols == ts[i].shape[1], "'{}' has {} columns, the fused matrix it joins {}", ts[i].name,
                   ts[i].shape[1], m.cols);
      m.rows += ts[i].shape[0];
    } else {
      Matrix m;
      m.offset = ts[i].offset;
      m.view = {storage, nullptr, nullptr, ts[i].shape[0], ts[i].shape[1]};
      matrices_.push_back(m);
    }
    layout.set_storage(i, storage);
    layout.set_trainable(i, false);
  }
  ANVIL_ASSERT(!matrices_.empty(), "QuantizedWeights: the layout has no Linear weights inside its blocks");
  size_t at = 0;
  for (Matrix& m : matrices_) {
    m.code_offset = code_bytes_;
    m.scale_offset = scale_count_;
    // Each matrix's codes start 16-byte aligned (vector loads); scales follow one another.
    code_bytes_ += (quantized_code_bytes(storage, m.view.rows, m.view.cols) + 15) / 16 * 16;
    scale_count_ += quantized_scale_count(storage, m.view.rows, m.view.cols);
    quantized_numel_ += m.view.numel();
    largest_ = std::max(largest_, m.view.numel());
    if (at < m.offset) dense_.push_back({at, m.offset});
    at = m.offset + m.view.numel();
  }
  if (at < layout.total_numel()) dense_.push_back({at, layout.total_numel()});
  for (const ParamRange& r : dense_) {
    dense_first_.push_back(dense_numel_);
    dense_numel_ += r.numel();
  }
}

size_t QuantizedWeights::dense_index(size_t offset) const {
  // The last dense range beginning at or before offset.
  const auto it = std::upper_bound(dense_.begin(), dense_.end(), offset,
                                   [](size_t o, const ParamRange& r) { return o < r.begin; });
  ANVIL_ASSERT(it != dense_.begin(), "element {} of the layout is stored quantized (no dense view)", offset);
  const size_t k = size_t(it - dense_.begin()) - 1;
  ANVIL_ASSERT(offset <= dense_[k].end, "element {} of the layout is stored quantized (no dense view)",
               offset);
  return dense_first_[k] + (offset - dense_[k].begin);
}

const QuantizedMatrix* QuantizedWeights::matrix_at(size_t offset) const {
  const auto it = std::lower_bound(matrices_.begin(), matrices_.end(), offset,
                                   [](const Matrix& m, size_t o) { return m.offset < o; });
  return it != matrices_.end() && it->offset == offset ? &it->view : nullptr;
}

void QuantizedWeights::plan_memory(MemoryPlan& plan) {
  using M = MemoryCategory;
  const char* s = weight_storage_name(storage_);
  i_codes_ = plan.add(fmt::format("quantized weights ({} codes, {} matrices)", s, matrices_.size()),
                      M::Weights, code_bytes_);
  i_scales_ = plan.add(fmt::format("quantized weights ({} scales, fp32)", s), M::Weights,
                       scale_count_ * sizeof(float));
  i_workspace_ = plan.add("dequantized weight (one Linear at a time)", M::Workspace, largest_ * elem_);
}

void QuantizedWeights::bind(const Arena& arena) {
  codes_ = arena.get<uint8_t>(i_codes_);
  scales_ = arena.get<float>(i_scales_);
  workspace_ = arena.get<void>(i_workspace_);
  for (Matrix& m : matrices_) {
    m.view.codes = codes_ + m.code_offset;
    m.view.scales = scales_ + m.scale_offset;
  }
}

void QuantizedWeights::upload(Device& dev, const float* host) const {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  for (const Matrix& m : matrices_) {
    const QuantizedMatrix& q = m.view;
    codes.resize(quantized_code_bytes(storage_, q.rows, q.cols));
    scales.resize(quantized_scale_count(storage_, q.rows, q.cols));
    quantize_host(storage_, host + m.offset, q.rows, q.cols, codes.data(), scales.data());
    dev.copy_to_device(codes_ + m.code_offset, codes.data(), codes.size());
    dev.copy_to_device(scales_ + m.scale_offset, scales.data(), scales.size() * sizeof(float));
  }
}

void QuantizedWeights::download_raw(Device& dev, uint8_t* codes, float* scales) const {
  dev.copy_to_host(codes, codes_, code_bytes_);
  dev.copy_to_host(scales, scales_, scale_count_ * sizeof(float));
}

void QuantizedWeights::upload_raw(Device& dev, const uint8_t* codes, const float* scales) const {
  dev.copy_to_device(codes_, codes, code_bytes_);
  dev.copy_to_device(scales_, scales, scale_count_ * sizeof(float));
}

void QuantizedWeights::download(Device& dev, float* host) const {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  for (const Matrix& m : matrices_) {
    QuantizedMatrix q = m.view;
    codes.resize(quantized_code_bytes(storage_, q.rows, q.cols));
    scales.resize(quantized_scale_count(storage_, q.rows, q.cols));
    dev.copy_to_host(codes.data(), q.codes, codes.size());
    dev.copy_to_host(scales.data(), q.scales, scales.size() * sizeof(float));
    q.codes = codes.data(), q.scales = scales.data();
    dequantize_host(q, host + m.offset);
  }
}

}  // namespace anvil
