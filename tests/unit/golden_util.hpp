// What the decoder golden tests share (golden_decoder_test.cpp, lora_golden_test.cpp): the fixture's batch
// and the relative error they are held to.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "io/safetensors.hpp"
#include "kernels/ops/loss_ops.hpp"
#include "model/decoder.hpp"

namespace anvil::test {

// A fixture's input_ids [B, T] (I32) and the next-token targets transformers computes from labels = input_ids
// (the last position of each row has none); `valid` counts the positions with a target.
struct GoldenBatch {
  int B = 0, T = 0, valid = 0;
  std::vector<int32_t> ids, targets;
};

inline GoldenBatch golden_batch(const io::SafeTensorsReader& golden) {
  const io::SafeTensorInfo& info = golden.at("input_ids");
  GoldenBatch g;
  g.B = int(info.shape[0]), g.T = int(info.shape[1]);
  g.ids.resize(size_t(g.B) * g.T), g.targets.resize(g.ids.size());
  std::memcpy(g.ids.data(), golden.data(info), g.ids.size() * sizeof(int32_t));
  for (int b = 0; b < g.B; ++b)
    for (int t = 0; t < g.T; ++t)
      g.targets[b * g.T + t] = t + 1 < g.T ? g.ids[b * g.T + t + 1] : kIgnoreIndex;
  g.valid = g.B * (g.T - 1);
  return g;
}

// The logits of `m`'s last forward (without targets) for `rows` rows, cut to the real vocabulary: what
// transformers' logits hold.
inline std::vector<float> real_vocab_logits(Device& dev, const Decoder& m, size_t rows) {
  const size_t V = size_t(m.config().vocab_size), Vp = size_t(m.config().padded_vocab_size());
  std::vector<float> padded(rows * Vp), out(rows * V);
  m.copy_logits_to_host(dev, padded.data(), 0, rows);
  for (size_t r = 0; r < rows; ++r) std::copy_n(padded.begin() + long(r * Vp), V, out.begin() + long(r * V));
  return out;
}

// Max absolute difference relative to the reference's max magnitude; `skip` masks ill-conditioned entries.
inline double rel_error(const std::vector<float>& got, const std::vector<float>& want,
                        const std::vector<bool>* skip = nullptr) {
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < want.size(); ++i) max_ref = std::max(max_ref, double(std::fabs(want[i])));
  for (size_t i = 0; i < want.size(); ++i)
    if (!skip || !(*skip)[i]) max_diff = std::max(max_diff, double(std::fabs(got[i] - want[i])));
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

}  // namespace anvil::test
