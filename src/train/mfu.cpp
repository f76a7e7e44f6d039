#include "train/mfu.hpp"

#include <array>

namespace anvil {

double training_flops_per_token(const TransformerConfig& m, int seq_len) {
  const double attention = 12.0 * m.n_layer * double(m.n_embd) * seq_len;
  if (m.is_bert()) {
    // Only the encoder's matrices multiply every token: the embedding tables are lookups (BERT has no LM
    // head reusing them), and the pooler and classifier run once per sequence.
    const double C = m.n_embd, F = m.ffn_size();
    const double block_matmul = 4 * C * C + 4 * C + 2 * C * F + F + C;  // weights and biases of the 6 Linears
    return 6.0 * m.n_layer * block_matmul + attention;
  }
  return 6.0 * double(m.num_parameters()) + attention;
}

PeakFlops peak_flops(const std::string& device_name, const std::string& precision, double configured) {
  if (configured > 0) return {configured, "peak_flops (configured)"};
  // Measured 16-bit dense GEMM peaks (anvil bench-gemm --precision bf16, 8192^3; docs/performance.md): what
  // the machine really reaches, which MFU is reported against when known.
  struct Measured {
    const char* name_part;
    double half;
  };
  static constexpr std::array<Measured, 1> kMeasured = {{{"H100 80GB HBM3", 795.8e12}}};
  if (precision == "bf16" || precision == "fp16")
    for (const Measured& m : kMeasured)
      if (device_name.find(m.name_part) != std::string::npos)
        return {m.half, std::string("measured dense 16-bit GEMM peak of ") + m.name_part +
                            " (anvil bench-gemm, docs/performance.md)"};
  struct Known {
    const char* name_part;
    double fp32, tf32, half;  // dense, FLOP/s
  };
  // Dense (no sparsity) peaks from NVIDIA's data sheets. More specific names first.
  static constexpr std::array<Known, 5> kKnown = {{{"H100 PCIe", 51.2e12, 378e12, 756e12},
                                                   {"H100", 66.9e12, 494.7e12, 989.4e12},
                                                   {"H200", 66.9e12, 494.7e12, 989.4e12},
                                                   {"A100", 19.5e12, 156e12, 312e12},
                                                   {"L4", 30.3e12, 60e12, 121e12}}};
  for (const Known& k : kKnown) {
    if (device_name.find(k.name_part) == std::string::npos) continue;
    if (precision == "3xtf32")  // three TF32 tensor-core products per fp32 product
      return {k.tf32 / 3, std::string("a third of the nominal dense tf32 peak of ") + k.name_part +
                              " (data sheet; 3xTF32 runs three TF32 products)"};
    const double f = precision == "fp32" ? k.fp32 : precision == "tf32" ? k.tf32 : k.half;
    return {f, std::string("nominal dense ") + precision + " peak of " + k.name_part + " (data sheet)"};
  }
  return {0, "unknown (set peak_flops)"};
}

}  // namespace anvil
