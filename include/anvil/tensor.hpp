// A non-owning view of a tensor in some device's memory: pointer, dtype, shape (row-major, contiguous).
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "anvil/dtype.hpp"
#include "anvil/error.hpp"

namespace anvil {

enum class DeviceKind : uint8_t { CPU, CUDA };

constexpr const char* device_name(DeviceKind d) {
  return d == DeviceKind::CPU ? "cpu" : "cuda";
}

struct Shape {
  static constexpr int kMaxDims = 4;
  std::array<int64_t, kMaxDims> dims{};
  int ndim = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d) {
    ANVIL_ASSERT(d.size() <= kMaxDims, "too many dims: {}", d.size());
    for (int64_t v : d) dims[ndim++] = v;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= dims[i];
    return n;
  }
  int64_t operator[](int i) const { return dims[i]; }
  bool operator==(const Shape& o) const {
    if (ndim != o.ndim) return false;
    for (int i = 0; i < ndim; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + "]";
  }
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  DeviceKind device = DeviceKind::CPU;

  int64_t numel() const { return shape.numel(); }
  size_t nbytes() const { return dtype_bytes(dtype, static_cast<size_t>(numel())); }
  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

}  // namespace anvil
