#include <algorithm>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {
namespace {

template <DType A>
void embedding_fwd_t(void* out_, const int32_t* tokens, const void* wte_, const void* wpe_, int B, int T,
                     int C) {
  using S = Storage<A>;
  auto* out = static_cast<storage_t<A>*>(out_);
  const auto* wte = static_cast<const storage_t<A>*>(wte_);
  const auto* wpe = static_cast<const storage_t<A>*>(wpe_);
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < int64_t(B) * T; ++bt) {
    const auto* te = wte + int64_t(tokens[bt]) * C;
    auto* o = out + bt * C;
    if (!wpe) {  // no learned positions (RoPE models): the token row as stored
      std::copy_n(te, C, o);
      continue;
    }
    const auto* pe = wpe + (bt % T) * C;
    for (int c = 0; c < C; ++c) o[c] = S::store(S::load(te[c]) + S::load(pe[c]));
  }
}

// Adds the rows dout[rows[0]], dout[rows[1]], ... (with rows null: dout[0], dout[row_stride], ...), in that
// order, into the gradient row `g`: in place for fp32 gradients, else in an fp32 copy of the row that is
// rounded once at the end.
template <DType A, DType G>
void add_rows(storage_t<G>* g, const storage_t<A>* dout, const uint64_t* rows, int64_t nrows,
              int64_t row_stride, int C) {
  float* acc;
  if constexpr (G == DType::F32) {
    acc = g;
  } else {
    acc = thread_scratch<float>(kScratchA, C);
    for (int c = 0; c < C; ++c) acc[c] = Storage<G>::load(g[c]);
  }
  for (int64_t i = 0; i < nrows; ++i) {
    const auto* d = dout + (rows ? int64_t(rows[i]) : i * row_stride) * C;
    for (int c = 0; c < C; ++c) acc[c] += Storage<A>::load(d[c]);
  }
  if constexpr (G != DType::F32)
    for (int c = 0; c < C; ++c) g[c] = Storage<G>::store(acc[c]);
}

template <DType A, DType G>
void embedding_bwd_t(void* dwte_, void* dwpe_, const void* dout_, const int32_t* tokens, int B, int T,
                     int C) {
  auto* dwte = static_cast<storage_t<G>*>(dwte_);
  auto* dwpe = static_cast<storage_t<G>*>(dwpe_);
  const auto* dout = static_cast<const storage_t<A>*>(dout_);
  const int64_t BT = int64_t(B) * T;
  // Every gradient element receives its contributions in increasing (b, t) order, whatever the thread
  // count. dwte: rows with the same token add into the same dwte row, so the positions are grouped by
  // token (sorting (token, position) keys keeps each group in position order) and threads split the groups.
  uint64_t* rows = thread_scratch<uint64_t>(kScratchB, BT);
  int64_t* starts = thread_scratch<int64_t>(kScratchC, BT + 1);
  for (int64_t i = 0; i < BT; ++i) rows[i] = uint64_t(uint32_t(tokens[i])) << 32 | uint64_t(i);
  std::sort(rows, rows + BT);
  int64_t ngroups = 0;
  for (int64_t i = 0; i < BT; ++i)
    if (i == 0 || rows[i] >> 32 != rows[i - 1] >> 32) starts[ngroups++] = i;
  starts[ngroups] = BT;
  for (int64_t i = 0; i < BT; ++i) rows[i] &= 0xffffffffu;  // keep the position
#pragma omp parallel
  {
    // dwpe (null: no learned positions): position t sums rows t, T + t, 2T + t, ...
    if (dwpe) {
#pragma omp for schedule(static) nowait
      for (int t = 0; t < T; ++t)
        add_rows<A, G>(dwpe + int64_t(t) * C, dout + int64_t(t) * C, nullptr, B, T, C);
    }
#pragma omp for schedule(dynamic, 8)
    for (int64_t g = 0; g < ngroups; ++g) {
      const int64_t begin = starts[g];
      add_rows<A, G>(dwte + int64_t(tokens[rows[begin]]) * C, dout, rows + begin, starts[g + 1] - begin, 0,
                     C);
    }
  }
}

template <DType A>
void bert_embedding_fwd_t(void* out_, const int32_t* tokens, const int32_t* types, const void* wte_,
                          const void* wpe_, const void* wtt_, int B, int T, int C) {
  using S = Storage<A>;
  auto* out = static_cast<storage_t<A>*>(out_);
  const auto* wte = static_cast<const storage_t<A>*>(wte_);
  const auto* wpe = static_cast<const storage_t<A>*>(wpe_);
  const auto* wtt = static_cast<const storage_t<A>*>(wtt_);
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < int64_t(B) * T; ++bt) {
    const auto* te = wte + int64_t(tokens[bt]) * C;
    const auto* ye = wtt + int64_t(types ? types[bt] : 0) * C;
    const auto* pe = wpe + (bt % T) * C;
    auto* o = out + bt * C;
    // Hugging Face's order: (word + token type) + position, in fp32.
    for (int c = 0; c < C; ++c) o[c] = S::store(S::load(te[c]) + S::load(ye[c]) + S::load(pe[c]));
  }
}

// dtable[ids[i],:] += dout[i,:] for every row i in [0, n) whose id is not `skip` (ids null: every row has id
// 0). Each table row receives its rows in increasing i whatever the thread count: the rows are grouped by id
// (sorting (id, row) keys keeps each group in row order) and threads split the groups.
template <DType A, DType G>
void scatter_add_rows(storage_t<G>* dtable, const storage_t<A>* dout, const int32_t* ids, int64_t n, int C,
                      int32_t skip) {
  if (!ids) {
    if (skip != 0) add_rows<A, G>(dtable, dout, nullptr, n, 1, C);
    return;
  }
  uint64_t* rows = thread_scratch<uint64_t>(kScratchB, size_t(n));
  int64_t* starts = thread_scratch<int64_t>(kScratchC, size_t(n) + 1);
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] != skip) rows[m++] = uint64_t(uint32_t(ids[i])) << 32 | uint64_t(i);
  std::sort(rows, rows + m);
  int64_t ngroups = 0;
  for (int64_t i = 0; i < m; ++i)
    if (i == 0 || rows[i] >> 32 != rows[i - 1] >> 32) starts[ngroups++] = i;
  starts[ngroups] = m;
  for (int64_t i = 0; i < m; ++i) rows[i] &= 0xffffffffu;  // keep the row
#pragma omp parallel for schedule(dynamic, 8)
  for (int64_t g = 0; g < ngroups; ++g) {
    const int64_t begin = starts[g];
    add_rows<A, G>(dtable + int64_t(ids[rows[begin]]) * C, dout, rows + begin, starts[g + 1] - begin, 0, C);
  }
}

template <DType A, DType G>
void bert_embedding_bwd_t(void* dwte_, void* dwpe_, void* dwtt_, const void* dout_, const int32_t* tokens,
                          const int32_t* types, int B, int T, int C, int32_t skip_token) {
  auto* dwte = static_cast<storage_t<G>*>(dwte_);
  auto* dwpe = static_cast<storage_t<G>*>(dwpe_);
  auto* dwtt = static_cast<storage_t<G>*>(dwtt_);
  const auto* dout = static_cast<const storage_t<A>*>(dout_);
  const int64_t BT = int64_t(B) * T;
  // dwpe: position t sums rows t, T + t, 2T + t, ...
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; ++t) add_rows<A, G>(dwpe + int64_t(t) * C, dout + int64_t(t) * C, nullptr, B, T, C);
  scatter_add_rows<A, G>(dwte, dout, tokens, BT, C, skip_token);
  scatter_add_rows<A, G>(dwtt, dout, types, BT, C, -1);
}

}  // namespace

void bert_embedding_fwd(DType act, void* out, const int32_t* tokens, const int32_t* types, const void* wte,
                        const void* wpe, const void* wtt, int B, int T, int C) {
  dispatch_float(act, [&](auto a) {
    bert_embedding_fwd_t<decltype(a)::value>(out, tokens, types, wte, wpe, wtt, B, T, C);
  });
}

void bert_embedding_bwd(DType act, DType grad, void* dwte, void* dwpe, void* dwtt, const void* dout,
                        const int32_t* tokens, const int32_t* types, int B, int T, int C,
                        int32_t skip_token) {
  dispatch_act_grad(act, grad, [&](auto a, auto g) {
    bert_embedding_bwd_t<decltype(a)::value, decltype(g)::value>(dwte, dwpe, dwtt, dout, tokens, types, B, T,
                                                                 C, skip_token);
  });
}

void embedding_bwd_skip(DType act, DType grad, void* dwte, const void* dout, const int32_t* tokens, int B,
                        int T, int C, int32_t skip_token) {
  dispatch_act_grad(act, grad, [&](auto a, auto g) {
    constexpr DType A = decltype(a)::value, G = decltype(g)::value;
    scatter_add_rows<A, G>(static_cast<storage_t<G>*>(dwte), static_cast<const storage_t<A>*>(dout), tokens,
                           int64_t(B) * T, C, skip_token);
  });
}

void embedding_fwd(DType act, void* out, const int32_t* tokens, const void* wte, const void* wpe, int B,
                   int T, int C) {
  dispatch_float(act, [&](auto a) { embedding_fwd_t<decltype(a)::value>(out, tokens, wte, wpe, B, T, C); });
}

void embedding_bwd(DType act, DType grad, void* dwte, void* dwpe, const void* dout, const int32_t* tokens,
                   int B, int T, int C) {
  dispatch_act_grad(act, grad, [&](auto a, auto g) {
    embedding_bwd_t<decltype(a)::value, decltype(g)::value>(dwte, dwpe, dout, tokens, B, T, C);
  });
}

}  // namespace anvil::cpu
