// CudnnAttention: one cuDNN frontend graph per (direction, type, shape, mask) built on first use and cached,
// so the heuristics and plan building run once per distinct call. Built only with the frontend headers
// (ANVIL_WITH_CUDNN); without them compiled() is false and CudaOps never selects this path.
//
// Masks: causal is the top-left-aligned diagonal band with right bound 0 (set_causal_mask); the sliding
// window is the band's left bound W (set_diagonal_band_left_bound; the frontend 1.32 headers of this build
// accept it with the causal and padding masks on cuDNN >= 9.10.2): key t2 stays visible to query t when
// t2 + W > t, which is Mistral's t - t2 < W (Hugging Face masking_utils.sliding_window_overlay: kv_idx >
// q_idx - sliding_window). Padding: seq_len_q = seq_len_kv = lengths; the top-left alignment keeps the band
// where the unpadded positions put it. Grouped-query attention: k and v tensors of NKV heads, q of NH.
#include "kernels/cuda/cudnn_attention.hpp"

#include <cmath>

#include "anvil/error.hpp"

#ifdef ANVIL_WITH_CUDNN
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <map>
#include <tuple>
#include <unordered_map>
#endif

namespace anvil::cuda {

bool CudnnAttention::supports(anvil::DType act, int HS) {
  if (!compiled() || HS <= 0) return false;
  return (act == anvil::DType::BF16 || act == anvil::DType::F16) && HS % 8 == 0 && HS <= 128;
}

size_t CudnnAttention::workspace_bytes(const AttentionDims& s) {
  // The backward's fp32 dq accumulator and per-row softmax sums, with room for alignment. Grouped-query
  // heads: also room for fp32 dK and dV of every query head before the group sums (what an engine that
  // reduces per-query-head partials asks at most; the fused Hopper engine may ask less).
  const size_t rows = size_t(s.B) * s.NH * s.T, q = rows * s.HS;
  return sizeof(float) * (q + 2 * rows + (s.grouped() ? 2 * q : 0)) + (4u << 20);
}

#ifndef ANVIL_WITH_CUDNN

struct CudnnAttention::Impl {};
bool CudnnAttention::compiled() {
  return false;
}
CudnnAttention::CudnnAttention() = default;
CudnnAttention::~CudnnAttention() = default;
void CudnnAttention::fwd(cudaStream_t, anvil::DType, void*, float*, const void*, void*, size_t,
                         const AttentionDims&, bool, int, const int32_t*) {
  ANVIL_THROW("cuDNN flash attention: this build has no cuDNN frontend (run scripts/setup.sh and rebuild)");
}
void CudnnAttention::bwd(cudaStream_t, anvil::DType, void*, const void*, const void*, const void*,
                         const float*, void*, size_t, const AttentionDims&, bool, int, const int32_t*) {
  ANVIL_THROW("cuDNN flash attention: this build has no cuDNN frontend (run scripts/setup.sh and rebuild)");
}

#else

namespace fe = cudnn_frontend;

namespace {

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSeqLen };

void check(fe::error_t e, const char* what) {
  if (e.is_bad()) ANVIL_THROW("cuDNN flash attention: {} failed: {}", what, e.get_message());
}

void check_status(cudnnStatus_t s, const char* call, const char* file, int line) {
  if (s != CUDNN_STATUS_SUCCESS)
    ANVIL_THROW("cuDNN call {} failed at {}:{}: {}", call, file, line, cudnnGetErrorString(s));
}
#define ANVIL_CUDNN_CHECK(call) check_status((call), #call, __FILE__, __LINE__)

fe::DataType_t fe_type(anvil::DType t) {
  return t == anvil::DType::BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

// The logical [B, heads, T, HS] tensors cuDNN sees, as strided views of the token-major buffers: q, k and v
// heads inside qkv rows of W = (NH + 2 NKV) HS elements, out (and dout) heads inside rows of NH HS.
struct Shape {
  explicit Shape(const AttentionDims& s) : B(s.B), T(s.T), NH(s.NH), NKV(s.NKV), HS(s.HS) {}
  int64_t B, T, NH, NKV, HS;
  int64_t W() const { return (NH + 2 * NKV) * HS; }
  std::vector<int64_t> q_dim() const { return {B, NH, T, HS}; }
  std::vector<int64_t> kv_dim() const { return {B, NKV, T, HS}; }
  std::vector<int64_t> qkv_stride() const { return {T * W(), HS, W(), 1}; }
  std::vector<int64_t> out_stride() const { return {T * NH * HS, HS, NH * HS, 1}; }
  // Element offsets of the k and v parts in a qkv row.
  int64_t k_offset() const { return NH * HS; }
  int64_t v_offset() const { return (NH + NKV) * HS; }
};

using Tensor = std::shared_ptr<fe::graph::Tensor_attributes>;

Tensor add_tensor(fe::graph::Graph& g, const char* name, Uid uid, std::vector<int64_t> dim,
                  std::vector<int64_t> stride) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
}

Tensor add_stats(fe::graph::Graph& g, const Shape& s) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name("stats")
                      .set_uid(kStats)
                      .set_dim({s.B, s.NH, s.T, 1})
                      .set_stride({s.NH * s.T, s.T, 1, 1})
                      .set_data_type(fe::DataType_t::FLOAT));
}

Tensor add_seq_len(fe::graph::Graph& g, const Shape& s) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name("seq_len")
                      .set_uid(kSeqLen)
                      .set_dim({s.B, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT32));
}

struct BuiltGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
};

}  // namespace

struct CudnnAttention::Impl {
  cudnnHandle_t handle = nullptr;
  // (backward?, type, B, T, NH, NKV, HS, causal, window, padded) -> graph
  std::map<std::tuple<bool, int, int64_t, int64_t, int64_t, int64_t, int64_t, bool, int, bool>, BuiltGraph>
      graphs;

  ~Impl() {
    if (handle) cudnnDestroy(handle);
  }

  cudnnHandle_t get_handle(cudaStream_t stream) {
    if (!handle) ANVIL_CUDNN_CHECK(cudnnCreate(&handle));
    ANVIL_CUDNN_CHECK(cudnnSetStream(handle, stream));
    return handle;
  }

  BuiltGraph& graph_for(bool backward, anvil::DType act, const Shape& s, bool causal, int window, bool padded,
                        cudnnHandle_t h) {
    const auto key = std::make_tuple(backward, int(act), s.B, s.T, s.NH, s.NKV, s.HS, causal, window, padded);
    auto it = graphs.find(key);
    if (it != graphs.end()) return it->second;
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe_type(act))
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    Tensor q = add_tensor(*g, "q", kQ, s.q_dim(), s.qkv_stride());
    Tensor k = add_tensor(*g, "k", kK, s.kv_dim(), s.qkv_stride());
    Tensor v = add_tensor(*g, "v", kV, s.kv_dim(), s.qkv_stride());
    const float scale = 1.f / std::sqrt(float(s.HS));
    if (!backward) {
      auto opts = fe::graph::SDPA_attributes()
                      .set_name("flash_attention")
                      .set_generate_stats(true)
                      .set_attn_scale(scale);
      if (causal) opts.set_causal_mask(true);
      if (window > 0) opts.set_diagonal_band_left_bound(window);
      if (padded) {
        Tensor len = add_seq_len(*g, s);
        opts.set_padding_mask(true).set_seq_len_q(len).set_seq_len_kv(len);
      }
      auto [o, stats] = g->sdpa(q, k, v, opts);
      o->set_output(true).set_uid(kO).set_dim(s.q_dim()).set_stride(s.out_stride());
      stats->set_output(true)
          .set_uid(kStats)
          .set_data_type(fe::DataType_t::FLOAT)
          .set_dim({s.B, s.NH, s.T, 1})
          .set_stride({s.NH * s.T, s.T, 1, 1});
    } else {
      Tensor o = add_tensor(*g, "o", kO, s.q_dim(), s.out_stride());
      Tensor dout = add_tensor(*g, "dout", kDO, s.q_dim(), s.out_stride());
      Tensor stats = add_stats(*g, s);
      auto opts =
          fe::graph::SDPA_backward_attributes().set_name("flash_attention_backward").set_attn_scale(scale);
      if (causal) opts.set_causal_mask(true);
      if (window > 0) opts.set_diagonal_band_left_bound(window);
      if (padded) {
        Tensor len = add_seq_len(*g, s);
        opts.set_padding_mask(true).set_seq_len_q(len).set_seq_len_kv(len);
      }
      auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opts);
      dq->set_output(true).set_uid(kDQ).set_dim(s.q_dim()).set_stride(s.qkv_stride());
      dk->set_output(true).set_uid(kDK).set_dim(s.kv_dim()).set_stride(s.qkv_stride());
      dv->set_output(true).set_uid(kDV).set_dim(s.kv_dim()).set_stride(s.qkv_stride());
    }
    check(g->validate(), "validate");
    check(g->build_operation_graph(h), "build_operation_graph");
    check(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
    check(g->check_support(h), "check_support");
    check(g->build_plans(h), "build_plans");
    BuiltGraph built{g, 0};
    check(g->get_workspace_size(built.workspace), "get_workspace_size");
    return graphs.emplace(key, std::move(built)).first->second;
  }

  void execute(BuiltGraph& bg, cudnnHandle_t h, std::unordered_map<int64_t, void*>& pack, void* workspace,
               size_t workspace_bytes) {
    if (size_t(bg.workspace) > workspace_bytes)
      ANVIL_THROW(
          "cuDNN flash attention wants a {}-byte workspace, the plan reserved {} bytes (set "
          "ANVIL_ATTENTION=materialized to use the materialised attention instead)",
          bg.workspace, workspace_bytes);
    check(bg.graph->execute(h, pack, workspace), "execute");
  }
};

bool CudnnAttention::compiled() {
  return true;
}

CudnnAttention::CudnnAttention() : impl_(std::make_unique<Impl>()) {}
CudnnAttention::~CudnnAttention() = default;

void CudnnAttention::fwd(cudaStream_t stream, anvil::DType act, void* out, float* lse, const void* qkv,
                         void* workspace, size_t workspace_bytes, const AttentionDims& dims, bool causal,
                         int window, const int32_t* lengths) {
  if (dims.B <= 0 || dims.T <= 0) return;
  const Shape s(dims);
  cudnnHandle_t h = impl_->get_handle(stream);
  BuiltGraph& bg = impl_->graph_for(false, act, s, causal, window, lengths != nullptr, h);
  const size_t e = anvil::dtype_bits(act) / 8;
  char* base = const_cast<char*>(static_cast<const char*>(qkv));
  std::unordered_map<int64_t, void*> pack = {
      {kQ, base}, {kK, base + s.k_offset() * e}, {kV, base + s.v_offset() * e}, {kO, out}, {kStats, lse}};
  if (lengths) pack[kSeqLen] = const_cast<int32_t*>(lengths);
  impl_->execute(bg, h, pack, workspace, workspace_bytes);
}

void CudnnAttention::bwd(cudaStream_t stream, anvil::DType act, void* dqkv, const void* dout, const void* qkv,
                         const void* out, const float* lse, void* workspace, size_t workspace_bytes,
                         const AttentionDims& dims, bool causal, int window, const int32_t* lengths) {
  if (dims.B <= 0 || dims.T <= 0) return;
  const Shape s(dims);
  cudnnHandle_t h = impl_->get_handle(stream);
  BuiltGraph& bg = impl_->graph_for(true, act, s, causal, window, lengths != nullptr, h);
  const size_t e = anvil::dtype_bits(act) / 8;
  char* base = const_cast<char*>(static_cast<const char*>(qkv));
  char* dbase = static_cast<char*>(dqkv);
  std::unordered_map<int64_t, void*> pack = {{kQ, base},
                                             {kK, base + s.k_offset() * e},
                                             {kV, base + s.v_offset() * e},
                                             {kO, const_cast<void*>(out)},
                                             {kDO, const_cast<void*>(dout)},
                                             {kStats, const_cast<float*>(lse)},
                                             {kDQ, dbase},
                                             {kDK, dbase + s.k_offset() * e},
                                             {kDV, dbase + s.v_offset() * e}};
  if (lengths) pack[kSeqLen] = const_cast<int32_t*>(lengths);
  impl_->execute(bg, h, pack, workspace, workspace_bytes);
}

#endif

}  // namespace anvil::cuda
