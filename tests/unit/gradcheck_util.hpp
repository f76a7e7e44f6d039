// Shared helpers for the finite-difference gradient checks: directional and single-coordinate
// central differences of a loss, compared with an analytic gradient. The loss is evaluated in fp32
// and differenced in double.
#pragma once
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "anvil/rng.hpp"

namespace anvil::test {

using Loss = std::function<double()>;

inline double dot(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

// Central difference of `loss` along `dir` at x (restored afterwards), next to the analytic
// prediction. x + eps*dir is rounded to fp32, so the prediction uses the steps actually taken:
// the comparison then sees only the loss's own rounding and the O(eps^2) truncation.
struct Probe {
  double analytic, numeric;
};
inline Probe probe(const Loss& loss, std::span<float> x, std::span<const float> g,
                   const std::vector<double>& dir, double eps) {
  const std::vector<float> x0(x.begin(), x.end());
  double predicted = 0, lp = 0, lm = 0;
  for (int sign : {1, -1}) {
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = float(x0[i] + sign * eps * dir[i]);
      predicted += sign * double(g[i]) * (double(x[i]) - x0[i]);
    }
    (sign > 0 ? lp : lm) = loss();
  }
  std::copy(x0.begin(), x0.end(), x.begin());
  return {predicted / (2 * eps), (lp - lm) / (2 * eps)};
}

struct CheckOptions {
  double eps = 1e-2;
  int directions = 4;
  int coordinates = 6;
  uint64_t seed = 1;
};

// A relative tolerance of 1e-2 on derivatives: fp32 rounding plus truncation stay below ~1e-3 in
// the checks that use it (ops and a two-block model), while a gradient 10% off fails (the negative
// controls check that it does).
inline constexpr double kRtol = 1e-2;

// Compares the analytic gradient g of `loss` w.r.t. x with central differences along random unit
// directions and at random single coordinates; fails naming the worst probe. Directions whose
// analytic derivative is accidentally small next to the typical |g|/sqrt(n) are redrawn, so rounding
// does not dominate their relative error; a coordinate's error is relative to max(|derivative|,
// 0.1 * rms(g)) for the same reason.
inline ::testing::AssertionResult gradient_matches(const Loss& loss, std::span<float> x,
                                                   std::span<const float> g, const CheckOptions& o) {
  const size_t n = x.size();
  const double typical = std::sqrt(dot(g, g) / double(n));
  Rng rng(o.seed);
  double worst = 0;
  std::string worst_what = "no probe";
  auto account = [&](const Probe& p, double floor, const std::string& what) {
    const double err = std::abs(p.analytic - p.numeric) / std::max({std::abs(p.analytic), floor, 1e-30});
    if (err >= worst) {
      worst = err;
      worst_what = fmt::format("{}: analytic {:.8g}, numeric {:.8g}", what, p.analytic, p.numeric);
    }
  };
  std::vector<double> dir(n);
  for (int k = 0; k < o.directions; ++k) {
    for (int attempt = 0; attempt < 100; ++attempt) {
      double norm = 0;
      for (double& d : dir) {
        d = rng.normal();
        norm += d * d;
      }
      double gd = 0;
      for (size_t i = 0; i < n; ++i) gd += g[i] * (dir[i] /= std::sqrt(norm));
      if (std::abs(gd) >= 0.5 * typical) break;
    }
    account(probe(loss, x, g, dir, o.eps), 0.0, fmt::format("direction {}", k));
  }
  for (int k = 0; k < o.coordinates; ++k) {
    std::fill(dir.begin(), dir.end(), 0.0);
    const size_t i = rng.below(n);
    dir[i] = 1.0;
    account(probe(loss, x, g, dir, o.eps), 0.1 * typical, fmt::format("coordinate {}", i));
  }
  if (worst < kRtol) return ::testing::AssertionSuccess() << "worst relative error " << worst;
  return ::testing::AssertionFailure()
         << "relative error " << worst << " > " << kRtol << " at " << worst_what;
}

}  // namespace anvil::test
