// GEMMs through cuBLASLt, and the bias-gradient column reduction.
//
// Row-major to column-major: a row-major matrix X[r,c] occupies the same memory as the column-major
// matrix X^T[c,r] with leading dimension c. So the row-major product C = op(A) op(B) is computed as the
// column-major product C^T = op(B)^T op(A)^T, i.e. cuBLAS's first operand is our B and its second is our A,
// each keeping its own transpose flag, with cuBLAS dimensions (m, n, k) = (N, M, K). A bias over C's
// columns becomes a bias over C^T's rows, which is exactly what CUBLASLT_EPILOGUE_BIAS adds.
#include <cstdint>
#include <cstdio>
#include <string>

#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

void warn_cublas(const char* what, cublasStatus_t status) {
  if (status != CUBLAS_STATUS_SUCCESS)
    std::fprintf(stderr, "anvil: warning: %s failed: %s\n", what, cublasGetStatusName(status));
}

struct MatmulDescDestroyer {
  void operator()(cublasLtMatmulDesc_t d) const noexcept {
    warn_cublas("cublasLtMatmulDescDestroy", cublasLtMatmulDescDestroy(d));
  }
};
struct LayoutDestroyer {
  void operator()(cublasLtMatrixLayout_t l) const noexcept {
    warn_cublas("cublasLtMatrixLayoutDestroy", cublasLtMatrixLayoutDestroy(l));
  }
};
struct PreferenceDestroyer {
  void operator()(cublasLtMatmulPreference_t p) const noexcept {
    warn_cublas("cublasLtMatmulPreferenceDestroy", cublasLtMatmulPreferenceDestroy(p));
  }
};
using MatmulDescHandle = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, MatmulDescDestroyer>;
using LayoutHandle = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LayoutDestroyer>;
using PreferenceHandle =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, PreferenceDestroyer>;

cudaDataType_t cuda_type(anvil::DType t) {
  switch (t) {
    case anvil::DType::F32:
      return CUDA_R_32F;
    case anvil::DType::BF16:
      return CUDA_R_16BF;
    case anvil::DType::F16:
      return CUDA_R_16F;
    default:
      detail::raise_at(
          __FILE__, __LINE__,
          std::string("GEMM operands must be F32, BF16 or F16, not ") + anvil::dtype_name(t).data());
  }
}

size_t type_bytes(anvil::DType t) {
  return anvil::dtype_bits(t) / 8;
}

// Column-major layout of a stored `rows` x `cols` matrix with leading dimension `ld` (0: contiguous, ld =
// rows), optionally batched.
LayoutHandle make_layout(anvil::DType type, int64_t rows, int64_t cols, int batch, int64_t stride, int64_t ld,
                         bool pointer_array) {
  cublasLtMatrixLayout_t layout = nullptr;
  ANVIL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, cuda_type(type), static_cast<uint64_t>(rows),
                                                static_cast<uint64_t>(cols), ld ? ld : rows));
  LayoutHandle owned(layout);
  if (batch > 1) {
    const int32_t count = batch;
    ANVIL_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    if (pointer_array) {
      const uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
      ANVIL_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof(mode)));
    } else {
      ANVIL_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                          &stride, sizeof(stride)));
    }
  }
  return owned;
}

// Largest power of two (4..256) dividing the address of every batch's matrix. cuBLASLt's heuristic assumes
// 256-byte aligned operands unless told otherwise, and attention's per-head matrices and odd shapes are not.
uint32_t alignment_bytes(const void* p, int batch, int64_t stride_elems, size_t elem_bytes, int64_t ld = 0) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p);
  if (batch > 1) bits |= static_cast<uint64_t>(stride_elems) * elem_bytes;
  bits |= static_cast<uint64_t>(ld) * elem_bytes;  // every row's start (0: contiguous, nothing to add)
  uint32_t align = 256;
  while (align > elem_bytes && bits % align != 0) align /= 2;
  return align;
}

[[noreturn]] void gemm_error(const std::string& msg) {
  detail::raise_at(__FILE__, __LINE__, msg);
}

std::string describe(const GemmArgs& g) {
  return "M=" + std::to_string(g.m) + " N=" + std::to_string(g.n) + " K=" + std::to_string(g.k) +
         " batch=" + std::to_string(g.batch) + (g.trans_a ? " A^T" : "") + (g.trans_b ? " B^T" : "") +
         (g.bias ? " +bias" : "") +
         (g.gelu == GemmArgs::kGeluAux ? " gelu"
          : g.gelu == GemmArgs::kDGelu ? " dgelu"
                                       : "") +
         " " + anvil::dtype_name(g.ab_type).data() + "->" + anvil::dtype_name(g.c_type).data();
}

}  // namespace

struct Gemm::Plan {
  MatmulDescHandle desc;
  LayoutHandle layout_first;   // cuBLAS's A: our B
  LayoutHandle layout_second;  // cuBLAS's B: our A
  LayoutHandle layout_out;     // C and D (in place)
  cublasLtMatmulAlgo_t algo{};
};

void Gemm::HandleDestroyer::operator()(cublasLtHandle_t h) const noexcept {
  warn_cublas("cublasLtDestroy", cublasLtDestroy(h));
}

Gemm::Gemm(Fp32Matmul fp32, void* workspace, size_t workspace_bytes, float* split_scratch,
           size_t split_scratch_bytes, const GemmTuningOptions& tuning)
    : fp32_(fp32),
      workspace_(workspace),
      workspace_bytes_(workspace ? workspace_bytes : 0),
      split_scratch_(split_scratch),
      split_scratch_floats_(split_scratch ? split_scratch_bytes / sizeof(float) : 0) {
  cublasLtHandle_t h = nullptr;
  ANVIL_CUBLAS_CHECK(cublasLtCreate(&h));
  handle_.reset(h);
  if (tuning.enabled) tuner_ = std::make_unique<GemmTuner>(tuning);
}

Gemm::~Gemm() = default;

Gemm::Plan* Gemm::plan_for(const GemmArgs& g, bool tensor_tf32, cudaStream_t stream) {
  const bool pointer_array = g.batch > 1 && g.a_array;
  const size_t ab_bytes = type_bytes(g.ab_type), c_bytes = type_bytes(g.c_type);
  const uint32_t align_a = alignment_bytes(g.a, g.batch, g.stride_a, ab_bytes, g.lda);
  const uint32_t align_b = alignment_bytes(g.b, g.batch, g.stride_b, ab_bytes, g.ldb);
  const uint32_t align_c = alignment_bytes(g.c, g.batch, g.stride_c, c_bytes, g.ldc);
  const uint32_t align_bias = g.bias ? alignment_bytes(g.bias, 1, 0, c_bytes) : 0;
  const uint32_t align_aux = g.aux ? alignment_bytes(g.aux, 1, 0, c_bytes) : 0;
  const PlanKey key{g.trans_a,
                    g.trans_b,
                    g.m,
                    g.n,
                    g.k,
                    g.batch,
                    g.stride_a,
                    g.stride_b,
                    g.stride_c,
                    g.beta != 0.f,
                    align_a,
                    align_b,
                    align_c,
                    align_bias,
                    g.bias != nullptr,
                    int64_t(g.ab_type),
                    int64_t(g.c_type),
                    int64_t(g.gelu),
                    align_aux,
                    g.lda,
                    g.ldb,
                    g.ldc,
                    tensor_tf32 && g.ab_type == anvil::DType::F32,
                    pointer_array};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();  // null: known to have no algorithm

  auto plan = std::make_unique<Plan>();
  cublasLtMatmulDesc_t desc = nullptr;
  // TF32 only applies to fp32 operands; 16-bit operands always use the tensor cores with fp32 accumulation.
  const cublasComputeType_t compute =
      tensor_tf32 && g.ab_type == anvil::DType::F32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  ANVIL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
  plan->desc.reset(desc);
  // cuBLAS's first operand is our B (op = trans_b), its second our A (op = trans_a); see the file comment.
  const cublasOperation_t op_first = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  ANVIL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
  ANVIL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (g.gelu == GemmArgs::kGeluAux)
    epilogue = g.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  else if (g.gelu == GemmArgs::kDGelu)
    epilogue = CUBLASLT_EPILOGUE_DGELU;
  else if (g.bias)
    epilogue = CUBLASLT_EPILOGUE_BIAS;
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT)
    ANVIL_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  // The heuristic reads the pointers' alignment; run() sets the real pointers before every call.
  if (g.bias)
    ANVIL_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
  if (g.gelu != GemmArgs::kNoGelu) {
    // The auxiliary matrix is laid out like D: column-major [n, m] with leading dimension n.
    const int64_t aux_ld = g.n;
    const int32_t aux_type = cuda_type(g.c_type);
    ANVIL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux,
                                                      sizeof(g.aux)));
    ANVIL_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    ANVIL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                                                      &aux_type, sizeof(aux_type)));
  }

  // Stored (pre-op) column-major shapes. Row-major B is [K,N] (or [N,K] if trans_b) = column-major
  // [N,K] (or [K,N]); row-major A is [M,K] (or [K,M]) = column-major [K,M] (or [M,K]); C^T is [N,M].
  // A row stride (lda, ldb, ldc) is the column-major leading dimension.
  const bool pa = pointer_array;
  plan->layout_first = g.trans_b ? make_layout(g.ab_type, g.k, g.n, g.batch, g.stride_b, g.ldb, pa)
                                 : make_layout(g.ab_type, g.n, g.k, g.batch, g.stride_b, g.ldb, pa);
  plan->layout_second = g.trans_a ? make_layout(g.ab_type, g.m, g.k, g.batch, g.stride_a, g.lda, pa)
                                  : make_layout(g.ab_type, g.k, g.m, g.batch, g.stride_a, g.lda, pa);
  plan->layout_out = make_layout(g.c_type, g.n, g.m, g.batch, g.stride_c, g.ldc, pa);

  cublasLtMatmulPreference_t pref_raw = nullptr;
  ANVIL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_raw));
  PreferenceHandle pref(pref_raw);
  const uint64_t max_workspace = workspace_bytes_;
  ANVIL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref_raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                          &max_workspace, sizeof(max_workspace)));
  const uint32_t align_first = align_b, align_second = align_a;
  ANVIL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_first, sizeof(align_first)));
  ANVIL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_second, sizeof(align_second)));
  ANVIL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c)));
  ANVIL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c)));

  // With tuning on, a cached choice needs no heuristic query; otherwise the heuristic's first eight choices
  // are candidates too.
  GemmProblem p;
  if (tuner_) {
    p.handle = handle_.get();
    p.desc = desc;
    p.first = plan->layout_first.get();
    p.second = plan->layout_second.get();
    p.out = plan->layout_out.get();
    p.compute = compute;
    p.ab_type = cuda_type(g.ab_type);
    p.c_type = cuda_type(g.c_type);
    p.first_ptr = pointer_array ? static_cast<const void*>(g.b_array) : g.b;
    p.second_ptr = pointer_array ? static_cast<const void*>(g.a_array) : g.a;
    p.c = pointer_array ? const_cast<void*>(static_cast<const void*>(g.c_array)) : g.c;
    // The extent of a plain C: the last batch's last row ends (batch-1)*stride_c + (m-1)*ldc + n elements in.
    if (!pointer_array)
      p.c_bytes = (size_t(g.batch - 1) * size_t(g.stride_c) + size_t(g.m - 1) * size_t(g.ldc ? g.ldc : g.n) +
                   size_t(g.n)) *
                  c_bytes;
    p.alpha = g.alpha;
    p.beta = g.beta;
    p.workspace = workspace_;
    p.workspace_bytes = workspace_bytes_;
    p.stream = stream;
    p.describe = describe(g);
    p.key = describe(g) + " key";
    for (int64_t v : key) {
      p.key += ' ';
      p.key += std::to_string(v);
    }
    p.key += " compute ";
    p.key += std::to_string(int(compute));
    if (tuner_->cached(p, plan->algo)) return plans_.emplace(key, std::move(plan)).first->second.get();
  }
  std::array<cublasLtMatmulHeuristicResult_t, 8> results{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle_.get(), desc, plan->layout_first.get(), plan->layout_second.get(), plan->layout_out.get(),
      plan->layout_out.get(), pref_raw, tuner_ ? int(results.size()) : 1, results.data(), &found);
  if (pointer_array && (status == CUBLAS_STATUS_NOT_SUPPORTED || found == 0)) {
    plans_.emplace(key, nullptr);  // the caller runs the batch another way, and is told so at once next time
    return nullptr;
  }
  ANVIL_CUBLAS_CHECK(status);
  if (found == 0) gemm_error("cuBLASLt found no algorithm for the GEMM " + describe(g));
  plan->algo = tuner_ ? tuner_->choose(p, results.data(), found) : results[0].algo;
  return plans_.emplace(key, std::move(plan)).first->second.get();
}

void Gemm::run(cudaStream_t stream, const GemmArgs& g) {
  if (!try_run(stream, g))
    gemm_error("cuBLASLt found no algorithm for the pointer-array GEMM " + describe(g));
}

bool Gemm::try_run(cudaStream_t stream, const GemmArgs& g) {
  if (g.m <= 0 || g.n <= 0 || g.batch <= 0) return true;
  const bool arrays = g.a_array || g.b_array || g.c_array;
  if (arrays && !(g.a_array && g.b_array && g.c_array && g.batch > 1))
    gemm_error("a pointer-array GEMM needs all three arrays and a batch: " + describe(g));
  if (fp32_ == Fp32Matmul::TF32x3 && g.ab_type == anvil::DType::F32 && !g.native_fp32) {
    if (arrays) gemm_error("3xTF32 GEMMs take no pointer arrays (set native_fp32): " + describe(g));
    run_3xtf32(stream, g);
    return true;
  }
  return run_plain(stream, g, fp32_ == Fp32Matmul::TF32);
}

bool Gemm::run_plain(cudaStream_t stream, const GemmArgs& g, bool tensor_tf32) {
  if (g.m <= 0 || g.n <= 0 || g.batch <= 0) return true;
  if (g.k <= 0) gemm_error("GEMM with an empty inner dimension: " + describe(g));
  if (g.bias && g.batch != 1) gemm_error("GEMM bias epilogue is only supported unbatched: " + describe(g));
  if (g.gelu != GemmArgs::kNoGelu && (g.batch != 1 || !g.aux || g.beta != 0.f || g.ldc != 0))
    gemm_error(
        "GEMM GELU epilogue needs an unbatched, non-accumulating GEMM with an aux buffer and a "
        "contiguous output: " +
        describe(g));
  Plan* found = plan_for(g, tensor_tf32, stream);
  if (!found) return false;
  Plan& plan = *found;
  if (g.bias)
    ANVIL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &g.bias, sizeof(g.bias)));
  if (g.aux)
    ANVIL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan.desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof(g.aux)));
  // Pointer-array batches pass the device arrays where the matrices would go.
  const bool arrays = g.batch > 1 && g.a_array;
  const void* a = arrays ? static_cast<const void*>(g.a_array) : g.a;
  const void* b = arrays ? static_cast<const void*>(g.b_array) : g.b;
  void* c = arrays ? const_cast<void*>(static_cast<const void*>(g.c_array)) : g.c;
  // C and D are the same buffer with the same layout: beta = 1 accumulates in place.
  ANVIL_CUBLAS_CHECK(cublasLtMatmul(handle_.get(), plan.desc.get(), &g.alpha, b, plan.layout_first.get(), a,
                                    plan.layout_second.get(), &g.beta, c, plan.layout_out.get(), c,
                                    plan.layout_out.get(), &plan.algo, workspace_, workspace_bytes_, stream));
  return true;
}

// --- dbias: column sums ----------------------------------------------------------------------------------

namespace {

constexpr int kColumnTile = 32;  // columns per block: one warp-wide, coalesced row segment
constexpr int kRowThreads = 8;   // threads down the rows per block
constexpr int kMinRowsPerBlock = 256;

// Block (32, 8) sums a 32-column tile over its chunk of rows, then adds its partial with one atomic per
// column; the chunks make enough blocks to fill the GPU when there are few columns.
template <class D, class S>
__global__ void column_sums_kernel(D* dst, const S* src, int rows, int cols, int rows_per_block) {
  __shared__ float partial[kRowThreads][kColumnTile + 1];
  const int col = blockIdx.x * kColumnTile + threadIdx.x;
  const int row_begin = blockIdx.y * rows_per_block;
  const int row_end = min(rows, row_begin + rows_per_block);
  float acc = 0.f;
  if (col < cols)
    for (int r = row_begin + threadIdx.y; r < row_end; r += kRowThreads)
      acc += to_float(src[static_cast<size_t>(r) * cols + col]);
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.f;
    for (int i = 0; i < kRowThreads; ++i) total += partial[i][threadIdx.x];
    atomic_add(&dst[col], total);
  }
}

// The fp32-source column_sums_kernel with four columns a thread (cols % 4 == 0, 16-byte aligned rows): a
// block (32, 8) covers 128 columns, each thread kVecRowsPerThread rows per pass with all their loads in
// flight (the one-column kernel has one load per thread in flight and reached a third of the memory
// bandwidth at the BERT-large bias gradients).
constexpr int kVecRowsPerThread = 8;
template <class D>
__global__ void column_sums_vec4_kernel(D* dst, const float* src, int rows, int cols, int rows_per_block) {
  __shared__ float4 partial[kRowThreads][kColumnTile];
  const int col = 4 * (blockIdx.x * kColumnTile + threadIdx.x);
  const int row_begin = blockIdx.y * rows_per_block;
  const int row_end = min(rows, row_begin + rows_per_block);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (col < cols)
    for (int r0 = row_begin + threadIdx.y; r0 < row_end; r0 += kRowThreads * kVecRowsPerThread) {
      float4 v[kVecRowsPerThread];
#pragma unroll
      for (int k = 0; k < kVecRowsPerThread; ++k) {
        const int r = r0 + k * kRowThreads;
        v[k] = r < row_end ? *reinterpret_cast<const float4*>(src + static_cast<size_t>(r) * cols + col)
                           : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int k = 0; k < kVecRowsPerThread; ++k)
        acc.x += v[k].x, acc.y += v[k].y, acc.z += v[k].z, acc.w += v[k].w;
    }
  add_block_column_sums(partial, acc, dst, col, cols);
}

}  // namespace

void column_sums_accumulate(cudaStream_t stream, anvil::DType dst_type, void* dst, anvil::DType src_type,
                            const void* src, int rows, int cols) {
  if (rows <= 0 || cols <= 0) return;
  if (src_type == anvil::DType::F32 && rows_vectorizable<float>(cols, {src})) {
    const int vec_rows = std::max(kRowThreads * kVecRowsPerThread, (rows + 65534) / 65535);
    const dim3 grid((cols / 4 + kColumnTile - 1) / kColumnTile, (rows + vec_rows - 1) / vec_rows);
    dispatch_float(dst_type, [&](auto d) {
      using D = decltype(d);
      column_sums_vec4_kernel<<<grid, dim3(kColumnTile, kRowThreads), 0, stream>>>(
          static_cast<D*>(dst), static_cast<const float*>(src), rows, cols, vec_rows);
    });
    ANVIL_CUDA_CHECK_LAST();
    return;
  }
  const int rows_per_block = std::max(kMinRowsPerBlock, (rows + 65534) / 65535);  // gridDim.y <= 65535
  const dim3 grid((cols + kColumnTile - 1) / kColumnTile, (rows + rows_per_block - 1) / rows_per_block);
  dispatch_float(dst_type, [&](auto d) {
    using D = decltype(d);
    dispatch_float(src_type, [&](auto s) {
      using S = decltype(s);
      column_sums_kernel<<<grid, dim3(kColumnTile, kRowThreads), 0, stream>>>(
          static_cast<D*>(dst), static_cast<const S*>(src), rows, cols, rows_per_block);
    });
  });
  ANVIL_CUDA_CHECK_LAST();
}

}  // namespace anvil::cuda
