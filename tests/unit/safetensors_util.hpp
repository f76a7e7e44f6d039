// Reading reference tensors out of a safetensors file in tests (golden fixtures, checkpoints).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

// Largest |a - b| / max |a| over the tensors of two safetensors files holding the same fp32 tensors (each
// tensor scaled by its own largest value).
inline double max_rel_diff(const std::string& a_path, const std::string& b_path) {
  const io::SafeTensorsReader a(a_path), b(b_path);
  EXPECT_EQ(a.tensors().size(), b.tensors().size()) << a_path << " against " << b_path;
  double worst = 0;
  for (const io::SafeTensorInfo& t : a.tensors()) {
    const std::vector<float> x = read_f32(a, t.name), y = read_f32(b, t.name);
    EXPECT_EQ(x.size(), y.size()) << t.name;
    double diff = 0, scale = 0;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      diff = std::max(diff, double(std::fabs(x[i] - y[i])));
      scale = std::max(scale, double(std::fabs(x[i])));
    }
    if (scale > 0) worst = std::max(worst, diff / scale);
  }
  return worst;
}

}  // namespace anvil::test
