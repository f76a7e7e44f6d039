#include "kernels/cuda/gemm_tuner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>
#include <set>
#include <vector>

#include "anvil/error.hpp"
#include "kernels/gemm_tuning_cache.hpp"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

using Config = std::array<int64_t, 9>;

// The attributes that make up a configuration, in the cache file's order, with their byte sizes.
constexpr std::array<std::pair<cublasLtMatmulAlgoConfigAttributes_t, size_t>, 9> kAttributes{{
    {CUBLASLT_ALGO_CONFIG_ID, sizeof(int32_t)},
    {CUBLASLT_ALGO_CONFIG_TILE_ID, sizeof(uint32_t)},
    {CUBLASLT_ALGO_CONFIG_STAGES_ID, sizeof(uint32_t)},
    {CUBLASLT_ALGO_CONFIG_SPLITK_NUM, sizeof(int32_t)},
    {CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, sizeof(uint32_t)},
    {CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, sizeof(uint32_t)},
    {CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, sizeof(uint32_t)},
    {CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, sizeof(uint16_t)},
    {CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, sizeof(uint16_t)},
}};

Config config_of(const cublasLtMatmulAlgo_t& algo) {
  Config c{};
  for (size_t i = 0; i < kAttributes.size(); ++i) {
    size_t written = 0;
    if (kAttributes[i].second == sizeof(uint16_t)) {
      uint16_t v = 0;
      ANVIL_CUBLAS_CHECK(
          cublasLtMatmulAlgoConfigGetAttribute(&algo, kAttributes[i].first, &v, sizeof(v), &written));
      c[i] = v;
    } else {
      uint32_t v = 0;  // the id and split-K count are int32_t: same bytes
      ANVIL_CUBLAS_CHECK(
          cublasLtMatmulAlgoConfigGetAttribute(&algo, kAttributes[i].first, &v, sizeof(v), &written));
      c[i] = i == 0 || i == 3 ? int64_t(int32_t(v)) : int64_t(v);
    }
  }
  return c;
}

// Sets every attribute but the id (fixed by cublasLtMatmulAlgoInit); false if cuBLASLt refuses one.
bool set_config(cublasLtMatmulAlgo_t& algo, const Config& c) {
  for (size_t i = 1; i < kAttributes.size(); ++i) {
    const uint32_t v32 = uint32_t(c[i]);
    const uint16_t v16 = uint16_t(c[i]);
    const void* v = kAttributes[i].second == sizeof(uint16_t) ? static_cast<const void*>(&v16) : &v32;
    if (cublasLtMatmulAlgoConfigSetAttribute(&algo, kAttributes[i].first, v, kAttributes[i].second) !=
        CUBLAS_STATUS_SUCCESS)
      return false;
  }
  return true;
}

bool accepted(const GemmProblem& p, const cublasLtMatmulAlgo_t& algo) {
  cublasLtMatmulHeuristicResult_t result{};
  return cublasLtMatmulAlgoCheck(p.handle, p.desc, p.first, p.second, p.out, p.out, &algo, &result) ==
             CUBLAS_STATUS_SUCCESS &&
         result.workspaceSize <= p.workspace_bytes;
}

bool init_algo(const GemmProblem& p, int id, cublasLtMatmulAlgo_t& algo) {
  return cublasLtMatmulAlgoInit(p.handle, p.compute, CUDA_R_32F, p.ab_type, p.ab_type, p.c_type, p.c_type, id,
                                &algo) == CUBLAS_STATUS_SUCCESS;
}

template <class T>
std::vector<T> capability_list(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS ||
      bytes == 0)
    return {T{}};
  std::vector<T> v(bytes / sizeof(T));
  if (v.empty() ||
      cublasLtMatmulAlgoCapGetAttribute(&algo, attr, v.data(), bytes, &bytes) != CUBLAS_STATUS_SUCCESS)
    return {T{}};
  return v;
}

template <class T>
T capability(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  T v{};
  size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, &v, sizeof(v), &bytes) != CUBLAS_STATUS_SUCCESS)
    return T{};
  return v;
}

// Every configuration cuBLASLt accepts for `p` among: each algorithm id x tile x stages x split-K (1-4) x
// CTA swizzling. fp32 operands only: their (SIMT or TF32) kernels are where the heuristic's first choice
// leaves time on the table; 16-bit GEMMs choose among the heuristic's own candidates.
void add_enumerated(const GemmProblem& p, std::vector<cublasLtMatmulAlgo_t>& out, std::set<Config>& seen) {
  constexpr size_t kMaxCandidates = 256;
  int ids[128], n_ids = 0;
  if (cublasLtMatmulAlgoGetIds(p.handle, p.compute, CUDA_R_32F, p.ab_type, p.ab_type, p.c_type, p.c_type, 128,
                               ids, &n_ids) != CUBLAS_STATUS_SUCCESS)
    return;
  for (int a = 0; a < n_ids; ++a) {
    cublasLtMatmulAlgo_t base{};
    if (!init_algo(p, ids[a], base)) continue;
    const auto tiles = capability_list<uint32_t>(base, CUBLASLT_ALGO_CAP_TILE_IDS);
    const auto stages = capability_list<uint32_t>(base, CUBLASLT_ALGO_CAP_STAGES_IDS);
    const bool splitk = capability<int32_t>(base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT) != 0;
    const uint32_t swizzle_max = capability<uint32_t>(base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT);
    const uint32_t reductions = capability<uint32_t>(base, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK);
    const uint32_t reduction =
        reductions & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE  ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
        : reductions & CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE ? CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE
                                                             : CUBLASLT_REDUCTION_SCHEME_INPLACE;
    for (uint32_t tile : tiles)
      for (uint32_t stage : stages)
        for (int32_t k_split = 1; k_split <= (splitk ? 4 : 1); ++k_split)
          for (uint32_t swizzle = 0; swizzle <= std::min<uint32_t>(swizzle_max, 1); ++swizzle) {
            if (out.size() >= kMaxCandidates) return;
            const Config c{ids[a], tile, stage, k_split, k_split > 1 ? reduction : 0, swizzle, 0, 0, 0};
            cublasLtMatmulAlgo_t algo = base;
            if (!set_config(algo, c) || !accepted(p, algo)) continue;
            if (seen.insert(config_of(algo)).second) out.push_back(algo);
          }
  }
}

// Frees the scratch C of an accumulating GEMM's timing.
struct DeviceBuffer {
  void* ptr = nullptr;
  ~DeviceBuffer() {
    if (ptr) ANVIL_CUDA_WARN(cudaFree(ptr));
  }
};

struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    ANVIL_CUDA_CHECK(cudaEventCreate(&start));
    ANVIL_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    ANVIL_CUDA_WARN(cudaEventDestroy(start));
    ANVIL_CUDA_WARN(cudaEventDestroy(stop));
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

}  // namespace

GemmTuner::GemmTuner(const GemmTuningOptions& options)
    : cache_(std::make_unique<GemmTuningCache>(options.cache_path.empty() ? GemmTuningCache::default_path()
                                                                          : options.cache_path)) {
  int dev = 0;
  cudaDeviceProp prop{};
  ANVIL_CUDA_CHECK(cudaGetDevice(&dev));
  ANVIL_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  device_ = fmt::format("{} sm_{}{} {} SMs", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  for (char& ch : device_)
    if (ch == '\t' || ch == '\n' || ch == '\r') ch = ' ';
}

GemmTuner::~GemmTuner() = default;

std::string GemmTuner::full_key(const GemmProblem& p) const {
  return fmt::format("{}|cublasLt {}|workspace {}|{}", device_, cublasLtGetVersion(), p.workspace_bytes,
                     p.key);
}

bool GemmTuner::cached(const GemmProblem& p, cublasLtMatmulAlgo_t& algo) {
  const GemmTuningEntry* e = cache_->find(full_key(p));
  if (!e) return false;
  if (init_algo(p, int(e->config[0]), algo) && set_config(algo, e->config) && accepted(p, algo)) return true;
  std::fprintf(stderr, "anvil: warning: %s: the tuned algorithm for %s is no longer accepted; tuning again\n",
               cache_->path().c_str(), p.describe.c_str());
  return false;
}

cublasLtMatmulAlgo_t GemmTuner::choose(const GemmProblem& p,
                                       const cublasLtMatmulHeuristicResult_t* heuristics, int count) {
  ANVIL_ASSERT(count > 0, "no heuristic algorithm for {}", p.describe);
  const cublasLtMatmulAlgo_t& heuristic = heuristics[0].algo;
  const std::string key = full_key(p);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  ANVIL_CUDA_CHECK(cudaStreamIsCapturing(p.stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return heuristic;  // no timing inside a graph capture
  if (p.beta != 0.f && p.c_bytes == 0)
    return heuristic;  // a pointer array: nowhere to accumulate but the real C

  std::vector<cublasLtMatmulAlgo_t> candidates;
  std::set<Config> seen;
  for (int i = 0; i < count; ++i)
    if (seen.insert(config_of(heuristics[i].algo)).second) candidates.push_back(heuristics[i].algo);
  if (p.ab_type == CUDA_R_32F) add_enumerated(p, candidates, seen);

  DeviceBuffer scratch;
  void* c = p.c;
  if (p.beta != 0.f) {
    ANVIL_CUDA_CHECK(cudaMalloc(&scratch.ptr, p.c_bytes));
    ANVIL_CUDA_CHECK(cudaMemsetAsync(scratch.ptr, 0, p.c_bytes, p.stream));
    c = scratch.ptr;
  }
  EventPair events;
  constexpr double kFailed = std::numeric_limits<double>::infinity();
  // `n` calls with `algo`; false if cuBLASLt refuses it.
  auto run = [&](const cublasLtMatmulAlgo_t& algo, int n) {
    for (int i = 0; i < n; ++i)
      if (cublasLtMatmul(p.handle, p.desc, &p.alpha, p.first_ptr, p.first, p.second_ptr, p.second, &p.beta, c,
                         p.out, c, p.out, &algo, p.workspace, p.workspace_bytes,
                         p.stream) != CUBLAS_STATUS_SUCCESS)
        return false;
    return true;
  };
  // Microseconds per call over `reps` calls after `warmup` untimed ones; infinity if cuBLASLt refuses it.
  auto time_us = [&](const cublasLtMatmulAlgo_t& algo, int warmup, int reps) -> double {
    if (!run(algo, warmup)) return kFailed;
    ANVIL_CUDA_CHECK(cudaEventRecord(events.start, p.stream));
    if (!run(algo, reps)) return kFailed;
    ANVIL_CUDA_CHECK(cudaEventRecord(events.stop, p.stream));
    ANVIL_CUDA_CHECK(cudaEventSynchronize(events.stop));
    float ms = 0;
    ANVIL_CUDA_CHECK(cudaEventElapsedTime(&ms, events.start, events.stop));
    return 1000.0 * ms / reps;
  };

  // Round 1: every candidate briefly. Round 2: the five fastest and the heuristic's choice, interleaved
  // over three passes (best of the passes), so clock drift does not favour whichever ran first.
  std::vector<std::pair<double, size_t>> round1;
  for (size_t i = 0; i < candidates.size(); ++i) round1.push_back({time_us(candidates[i], 1, 2), i});
  std::sort(round1.begin(), round1.end());
  std::vector<size_t> finalists;
  for (size_t i = 0; i < round1.size() && finalists.size() < 5; ++i)
    if (round1[i].first < kFailed) finalists.push_back(round1[i].second);
  if (std::find(finalists.begin(), finalists.end(), size_t(0)) == finalists.end()) finalists.push_back(0);
  std::vector<double> best(finalists.size(), kFailed);
  for (int pass = 0; pass < 3; ++pass)
    for (size_t f = 0; f < finalists.size(); ++f)
      best[f] = std::min(best[f], time_us(candidates[finalists[f]], 1, 3));
  const size_t heuristic_slot =
      size_t(std::find(finalists.begin(), finalists.end(), size_t(0)) - finalists.begin());
  size_t chosen = heuristic_slot;
  for (size_t f = 0; f < finalists.size(); ++f)
    if (best[f] < best[chosen]) chosen = f;
  // Keep the heuristic's choice unless another is clearly (1%) faster: smaller gaps are timing noise.
  if (best[chosen] > 0.99 * best[heuristic_slot]) chosen = heuristic_slot;
  ANVIL_CUDA_CHECK(cudaStreamSynchronize(p.stream));  // before the scratch C is freed

  const cublasLtMatmulAlgo_t algo = candidates[finalists[chosen]];
  GemmTuningEntry entry;
  entry.config = config_of(algo);
  entry.heuristic_us = best[heuristic_slot] < kFailed ? best[heuristic_slot] : 0;
  entry.tuned_us = best[chosen] < kFailed ? best[chosen] : 0;
  entry.candidates = int(candidates.size());
  cache_->put(key, entry);
  std::printf("gemm tuning: %s: %.1f us (heuristic %.1f us, %d candidates) -> %s\n", p.describe.c_str(),
              entry.tuned_us, entry.heuristic_us, entry.candidates, cache_->path().c_str());
  std::fflush(stdout);
  return algo;
}

}  // namespace anvil::cuda
