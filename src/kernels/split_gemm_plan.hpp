// How fp32 GEMMs run on CUDA, and the chunking of 3xTF32 GEMMs into the split scratch.
//
// 3xTF32 (Fp32Matmul::TF32x3) computes an fp32 GEMM on the TF32 tensor cores to about fp32 accuracy: each
// operand x is split into big = tf32(x) and small = tf32(x - big), and C = A_b B_b + A_b B_s + A_s B_b (the
// dropped A_s B_s is ~2^-22 relative). The split copies live in a planned scratch buffer; a GEMM whose split
// operands do not fit is run in chunks (of batches, of K, of M, of N), each one or two cuBLASLt calls.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace anvil {

struct TransformerConfig;

// fp32 GEMMs on CUDA: native fp32 (FFMA, the default), single-pass TF32 tensor cores (~1e-3 relative), or
// 3xTF32 (TF32 tensor cores, fp32-accurate). The CPU backend always computes native fp32.
enum class Fp32Matmul { Native, TF32, TF32x3 };
const char* fp32_matmul_name(Fp32Matmul m);             // "fp32" | "tf32" | "3xtf32"
Fp32Matmul parse_fp32_matmul(const std::string& name);  // throws naming the value

// One chunk shape of a 3xTF32 GEMM: mc x nc outputs over kc of the inner dimension, for nb batches at a
// time. `pieces` is 2 (A = [A_b | A_s], B = [B_s ; B_b]: one GEMM over 2K for the small terms, one over K
// for A_b B_b) or 3 (A = [A_b | A_b | A_s], B = [B_b ; B_s ; B_b]: a single GEMM over 3K, for epilogues
// such as GELU that must see the whole sum).
struct SplitGemmChunks {
  int mc = 0, nc = 0, kc = 0, nb = 0;
  int pieces = 2;
  bool fits() const { return nb > 0; }
};

// Floats of split scratch one chunk uses: both operands' pieces for nb batches.
size_t split_gemm_chunk_floats(const SplitGemmChunks& c);

// Chunks for op(A)[M,K] op(B)[K,N] over `batch` batches in `scratch_floats` of split scratch. With an
// epilogue that needs the whole sum (`whole_sum`: GELU), K is not chunked, N is not chunked (its aux matrix
// keeps one leading dimension) and 3 pieces are used. Batches are chunked first; a batch that does not fit
// alone is run one at a time in chunks of K (not below 256 while M or N can shrink instead), then M and N.
// Chunk dimensions stay multiples of 16 (16-byte alignment of every piece). nb == 0: no chunking fits.
SplitGemmChunks plan_split_gemm(int m, int n, int k, int batch, bool whole_sum, size_t scratch_floats);

// Split scratch bytes for a model's GEMMs at B x T tokens per micro-batch: every linear layer's GEMM of a
// block (forward and backward) unchunked, capped at kMaxSplitScratchBytes (larger GEMMs, such as a
// language-model head, run in chunks). Attention's per-head GEMMs stay native fp32 (GemmArgs::native_fp32).
size_t split_gemm_scratch_bytes(const TransformerConfig& cfg, int B, int T);
constexpr size_t kMaxSplitScratchBytes = 256ull << 20;
constexpr size_t kMinSplitScratchBytes = 16ull << 20;

}  // namespace anvil
