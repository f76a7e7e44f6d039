// Reading reference tensors out of a safetensors file in tests (golden fixtures, checkpoints).
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "io/safetensors.hpp"

namespace anvil::test {

// Tensor `name` of `r`, which must be of `dtype` (a test failure otherwise), as a vector of T.
template <class T>
std::vector<T> read_tensor(const io::SafeTensorsReader& r, const std::string& name, DType dtype) {
  const io::SafeTensorInfo& t = r.at(name);
  EXPECT_EQ(t.dtype, dtype) << name;
  std::vector<T> v(size_t(t.numel()));
  std::memcpy(v.data(), r.data(t), v.size() * sizeof(T));
  return v;
}

inline std::vector<float> read_f32(const io::SafeTensorsReader& r, const std::string& name) {
  return read_tensor<float>(r, name, DType::F32);
}

}  // namespace anvil::test
