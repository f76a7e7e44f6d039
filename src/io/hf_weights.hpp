// Helpers shared by the Hugging Face model-directory loaders (GPT-2 in checkpoint.cpp, BERT in
// bert_checkpoint.cpp): the weight files of a directory (one model.safetensors or the shards an index lists),
// widening stored tensors to fp32, and shapes in messages.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.hpp"

namespace anvil::io {

// The weight files of a model directory: model.safetensors, or the shards that model.safetensors.index.json
// lists (Hugging Face's layout for large models). Throws naming the directory when neither exists
// (pytorch_model.bin is named as unsupported), or when the index is malformed or points at a tensor its shard
// does not hold.
class WeightFiles {
 public:
  explicit WeightFiles(const std::string& dir);

  // The tensor and the file holding it, or {nullptr, nullptr}. A tensor stored in a dtype Anvil cannot hold
  // (SafeTensorsReader::unsupported(), e.g. an int64 position_ids buffer) is an error naming it and its
  // dtype.
  std::pair<const SafeTensorsReader*, const SafeTensorInfo*> find(const std::string& name) const;
  // Every tensor of the files (those of unsupported dtypes too), with the index of the file holding it.
  const std::map<std::string, size_t>& names() const { return where_; }
  std::string path_of(const std::string& name) const { return readers_[where_.at(name)]->path(); }

 private:
  std::vector<std::unique_ptr<SafeTensorsReader>> readers_;
  std::map<std::string, size_t> where_;
};

// Widens a stored F32 / F16 / BF16 tensor (`src`, possibly unaligned) into dst[0, numel); any other dtype is
// an error naming `path` and the tensor.
void tensor_to_f32(const SafeTensorInfo& info, const void* src, float* dst, const std::string& path);
// The same for elements [first, first + count) of the tensor only, into dst[0, count).
void tensor_to_f32(const SafeTensorInfo& info, const void* src, float* dst, const std::string& path,
                   size_t first, size_t count);

// "[a, b, c]"
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace anvil::io
