// CudnnAttention: one cuDNN frontend graph per (direction, type, shape, mask) built on first use and cached,
// so the heuristics and plan building run once per distinct call. Built only with the frontend headers
// (ANVIL_WITH_CUDNN); without them compiled() is false and CudaOps never selects this path.
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

bool CudnnAttention::supports(anvil::DType act, int C, int NH) {
  if (!compiled() || NH <= 0 || C % NH != 0) return false;
  const int HS = C / NH;
  return (act == anvil::DType::BF16 || act == anvil::DType::F16) && HS % 8 == 0 && HS <= 128;
}

size_t CudnnAttention::workspace_bytes(int B, int T, int C, int NH) {
  // The backward's fp32 dq accumulator and per-row softmax sums, with room for alignment.
  return sizeof(float) * (size_t(B) * T * C + 2 * size_t(B) * NH * T) + (4u << 20);
}

#ifndef ANVIL_WITH_CUDNN

struct CudnnAttention::Impl {};
bool CudnnAttention::compiled() {
  return false;
}
CudnnAttention::CudnnAttention() = default;
CudnnAttention::~CudnnAttention() = default;
void CudnnAttention::fwd(cudaStream_t, anvil::DType, void*, float*, const void*, void*, size_t, int, int, int,
                         int, bool, const int32_t*) {
  ANVIL_THROW("cuDNN flash attention: this build has no cuDNN frontend (run scripts/setup.sh and rebuild)");
}
void CudnnAttention::bwd(cudaStream_t, anvil::DType, void*, const void*, const void*, const void*,
                         const float*, void*, size_t, int, int, int, int, bool, const int32_t*) {
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

struct Shape {
  int64_t B, T, C, NH, HS;
  std::vector<int64_t> dim() const { return {B, NH, T, HS}; }
  std::vector<int64_t> qkv_stride() const { return {T * 3 * C, HS, 3 * C, 1}; }  // a head inside [B,T,3C]
  std::vector<int64_t> out_stride() const { return {T * C, HS, C, 1}; }          // a head inside [B,T,C]
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
  // (backward?, type, B, T, C, NH, causal, padded) -> graph
  std::map<std::tuple<bool, int, int, int, int, int, bool, bool>, BuiltGraph> graphs;

  ~Impl() {
    if (handle) cudnnDestroy(handle);
  }

  cudnnHandle_t get_handle(cudaStream_t stream) {
    if (!handle) ANVIL_CUDNN_CHECK(cudnnCreate(&handle));
    ANVIL_CUDNN_CHECK(cudnnSetStream(handle, stream));
    return handle;
  }

  BuiltGraph& graph_for(bool backward, anvil::DType act, const Shape& s, bool causal, bool padded,
                        cudnnHandle_t h) {
    const auto key =
        std::make_tuple(backward, int(act), int(s.B), int(s.T), int(s.C), int(s.NH), causal, padded);
    auto it = graphs.find(key);
    if (it != graphs.end()) return it->second;
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe_type(act))
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    Tensor q = add_tensor(*g, "q", kQ, s.dim(), s.qkv_stride());
    Tensor k = add_tensor(*g, "k", kK, s.dim(), s.qkv_stride());
    Tensor v = add_tensor(*g, "v", kV, s.dim(), s.qkv_stride());
    const float scale = 1.f / std::sqrt(float(s.HS));
    if (!backward) {
      auto opts = fe::graph::SDPA_attributes()
                      .set_name("flash_attention")
                      .set_generate_stats(true)
                      .set_attn_scale(scale);
      if (causal) opts.set_causal_mask(true);
      if (padded) {
        Tensor len = add_seq_len(*g, s);
        opts.set_padding_mask(true).set_seq_len_q(len).set_seq_len_kv(len);
      }
      auto [o, stats] = g->sdpa(q, k, v, opts);
      o->set_output(true).set_uid(kO).set_dim(s.dim()).set_stride(s.out_stride());
      stats->set_output(true)
          .set_uid(kStats)
          .set_data_type(fe::DataType_t::FLOAT)
          .set_dim({s.B, s.NH, s.T, 1})
          .set_stride({s.NH * s.T, s.T, 1, 1});
    } else {
      Tensor o = add_tensor(*g, "o", kO, s.dim(), s.out_stride());
      Tensor dout = add_tensor(*g, "dout", kDO, s.dim(), s.out_stride());
      Tensor stats = add_stats(*g, s);
      auto opts =
          fe::graph::SDPA_backward_attributes().set_name("flash_attention_backward").set_attn_scale(scale);
      if (causal) opts.set_causal_mask(true);
      if (padded) {
        Tensor len = add_seq_len(*g, s);
        opts.set_padding_mask(true).set_seq_len_q(len).set_seq_len_kv(len);
      }
      auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opts);
      dq->set_output(true).set_uid(kDQ).set_dim(s.dim()).set_stride(s.qkv_stride());
      dk->set_output(true).set_uid(kDK).set_dim(s.dim()).set_stride(s.qkv_stride());
      dv->set_output(true).set_uid(kDV).set_dim(s.dim()).set_stride(s.qkv_stride());
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
                         void* workspace, size_t workspace_bytes, int B, int T, int C, int NH, bool causal,
                         const int32_t* lengths) {
  if (B <= 0 || T <= 0) return;
  const Shape s{B, T, C, NH, C / NH};
  cudnnHandle_t h = impl_->get_handle(stream);
  BuiltGraph& bg = impl_->graph_for(false, act, s, causal, lengths != nullptr, h);
  const size_t e = anvil::dtype_bits(act) / 8;
  char* base = const_cast<char*>(static_cast<const char*>(qkv));
  std::unordered_map<int64_t, void*> pack = {
      {kQ, base}, {kK, base + C * e}, {kV, base + 2 * C * e}, {kO, out}, {kStats, lse}};
  if (lengths) pack[kSeqLen] = const_cast<int32_t*>(lengths);
  impl_->execute(bg, h, pack, workspace, workspace_bytes);
}

void CudnnAttention::bwd(cudaStream_t stream, anvil::DType act, void* dqkv, const void* dout, const void* qkv,
                         const void* out, const float* lse, void* workspace, size_t workspace_bytes, int B,
                         int T, int C, int NH, bool causal, const int32_t* lengths) {
  if (B <= 0 || T <= 0) return;
  const Shape s{B, T, C, NH, C / NH};
  cudnnHandle_t h = impl_->get_handle(stream);
  BuiltGraph& bg = impl_->graph_for(true, act, s, causal, lengths != nullptr, h);
  const size_t e = anvil::dtype_bits(act) / 8;
  char* base = const_cast<char*>(static_cast<const char*>(qkv));
  char* dbase = static_cast<char*>(dqkv);
  std::unordered_map<int64_t, void*> pack = {{kQ, base},
                                             {kK, base + C * e},
                                             {kV, base + 2 * C * e},
                                             {kO, const_cast<void*>(out)},
                                             {kDO, const_cast<void*>(dout)},
                                             {kStats, const_cast<float*>(lse)},
                                             {kDQ, dbase},
                                             {kDK, dbase + C * e},
                                             {kDV, dbase + 2 * C * e}};
  if (lengths) pack[kSeqLen] = const_cast<int32_t*>(lengths);
  impl_->execute(bg, h, pack, workspace, workspace_bytes);
}

#endif

}  // namespace anvil::cuda
