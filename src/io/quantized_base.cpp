#include "io/quantized_base.hpp"

#include <filesystem>
#include <vector>

#include "io/safetensors.hpp"

namespace anvil::io {

void save_quantized_base(const std::string& dir, const Model& model, Device& dev) {
  const QuantizedWeights* q = model.param_store().quantized();
  if (!q || q->requantizes_exactly()) return;
  std::vector<uint8_t> codes(q->code_bytes());
  std::vector<float> scales(q->scale_count());
  q->download_raw(dev, codes.data(), scales.data());
  SafeTensorsWriter w;
  w.set_metadata("storage", weight_storage_name(q->storage()));
  w.set_metadata("matrices", std::to_string(q->matrices()));
  w.add_view("codes", DType::I8, {int64_t(codes.size())}, codes.data());
  w.add_view("scales", DType::F32, {int64_t(scales.size())}, scales.data());
  w.write((std::filesystem::path(dir) / kQuantizedBaseFile).string());
}

bool load_quantized_base(const std::string& dir, const Model& model, Device& dev) {
  const std::string path = (std::filesystem::path(dir) / kQuantizedBaseFile).string();
  const QuantizedWeights* q = model.param_store().quantized();
  if (!q || !model.layout().lora().enabled() || !std::filesystem::exists(path)) return false;
  const SafeTensorsReader r(path);
  const auto storage = r.metadata().find("storage");
  if (storage == r.metadata().end() || storage->second != weight_storage_name(q->storage())) return false;
  const SafeTensorInfo* codes = r.find("codes");
  const SafeTensorInfo* scales = r.find("scales");
  ANVIL_REQUIRE(
      codes && scales && codes->dtype == DType::I8 && scales->dtype == DType::F32,
      "{}: needs tensors 'codes' (I8) and 'scales' (F32); delete the file to quantize the base again "
      "from model.safetensors",
      path);
  ANVIL_REQUIRE(codes->nbytes == q->code_bytes() && scales->numel() == int64_t(q->scale_count()),
                "{}: {} code bytes and {} scales, but this model's {} base has {} and {} (another model "
                "shape); delete the file to quantize the base again from model.safetensors",
                path, codes->nbytes, scales->numel(), weight_storage_name(q->storage()), q->code_bytes(),
                q->scale_count());
  q->upload_raw(dev, static_cast<const uint8_t*>(r.data(*codes)), static_cast<const float*>(r.data(*scales)));
  return true;
}

}  // namespace anvil::io
