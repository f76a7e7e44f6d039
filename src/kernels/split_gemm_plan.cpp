#include "kernels/split_gemm_plan.hpp"

#include <algorithm>
#include <initializer_list>

#include "anvil/error.hpp"
#include "anvil/model_config.hpp"

namespace anvil {

const char* fp32_matmul_name(Fp32Matmul m) {
  switch (m) {
    case Fp32Matmul::Native:
      return "fp32";
    case Fp32Matmul::TF32:
      return "tf32";
    case Fp32Matmul::TF32x3:
      return "3xtf32";
  }
  return "?";
}

Fp32Matmul parse_fp32_matmul(const std::string& name) {
  if (name == "fp32") return Fp32Matmul::Native;
  if (name == "tf32") return Fp32Matmul::TF32;
  if (name == "3xtf32") return Fp32Matmul::TF32x3;
  ANVIL_THROW("fp32_matmul must be fp32, tf32 or 3xtf32, got '{}'", name);
}

namespace {

constexpr size_t kPieceAlignFloats = 64;  // 256 bytes: B's pieces start as aligned as the scratch itself
constexpr int kChunkMultiple = 16;
constexpr int kPreferredMinK = 256;

size_t round_up(size_t v, size_t to) {
  return (v + to - 1) / to * to;
}

// Halves a chunk dimension, keeping it a multiple of kChunkMultiple.
int halved(int d) {
  return int(round_up(size_t(d + 1) / 2, kChunkMultiple));
}

}  // namespace

size_t split_gemm_chunk_floats(const SplitGemmChunks& c) {
  const size_t per_piece_k = size_t(c.pieces) * size_t(c.kc) * size_t(c.nb);
  return round_up(per_piece_k * size_t(c.mc), kPieceAlignFloats) + per_piece_k * size_t(c.nc);
}

SplitGemmChunks plan_split_gemm(int m, int n, int k, int batch, bool whole_sum, size_t scratch_floats) {
  ANVIL_ASSERT(m > 0 && n > 0 && k > 0 && batch > 0, "plan_split_gemm: M={} N={} K={} batch={}", m, n, k,
               batch);
  SplitGemmChunks c{m, n, k, 1, whole_sum ? 3 : 2};
  const size_t one = split_gemm_chunk_floats(c);
  if (one <= scratch_floats) {
    // As many whole batches as fit: the per-batch pieces sit back to back in each operand's region.
    int nb = batch;
    while (nb > 1) {
      c.nb = nb;
      if (split_gemm_chunk_floats(c) <= scratch_floats) break;
      nb = std::max(1, int(size_t(nb) * scratch_floats / split_gemm_chunk_floats(c)));
    }
    c.nb = nb;
    return c;
  }
  while (split_gemm_chunk_floats(c) > scratch_floats) {
    const bool k_ok = !whole_sum && c.kc > kChunkMultiple;
    const bool m_ok = c.mc > kChunkMultiple;
    const bool n_ok = !whole_sum && c.nc > kChunkMultiple;
    if (k_ok && c.kc > kPreferredMinK)
      c.kc = halved(c.kc);
    else if (m_ok && (c.mc >= c.nc || !n_ok))
      c.mc = halved(c.mc);
    else if (n_ok)
      c.nc = halved(c.nc);
    else if (k_ok)
      c.kc = halved(c.kc);
    else
      return SplitGemmChunks{};
  }
  return c;
}

size_t split_gemm_scratch_bytes(const TransformerConfig& cfg, int B, int T) {
  const size_t tok = size_t(B) * size_t(T), C = size_t(cfg.n_embd);
  const size_t I = size_t(cfg.intermediate_size > 0 ? cfg.intermediate_size : 4 * cfg.n_embd);
  size_t floats = 0;
  // Linear layers in -> out: forward (M tok, K in, N out), input gradient (M tok, K out, N in) and weight
  // gradient (M out, K tok, N in); K x (M + N) elements per operand piece.
  for (const auto& [in, out] : {std::pair{C, 3 * C}, {C, C}, {C, I}, {I, C}}) {
    floats = std::max(floats, 2 * std::max({in * (tok + out), out * (tok + in), tok * (out + in)}));
  }
  // The tanh GELU fused into the MLP's GEMMs (forward, and the input gradient of its output projection)
  // needs three pieces: K = C, M + N = tok + I.
  if (!cfg.exact_gelu()) floats = std::max(floats, 3 * C * (tok + I));
  const size_t bytes = round_up(floats * sizeof(float) + 2 * kPieceAlignFloats * sizeof(float), 1 << 20);
  return std::clamp(bytes, kMinSplitScratchBytes, kMaxSplitScratchBytes);
}

}  // namespace anvil
