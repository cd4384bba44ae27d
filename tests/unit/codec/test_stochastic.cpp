// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Statistical properties of the stochastic codecs (QSGD, TernGrad, natural compression, linear
// and natural dithering with max and L2 norms, int8 with stochastic rounding):
//
// - support: every decoded element is one of the two quantization levels around it;
// - unbiasedness: over T steps (fresh random draws each step, fixed seed), the mean of each
//   decoded element is within 5 standard errors of the input, the per-element variance being
//   the exact variance (b - x)(x - a) of rounding x to its neighbouring levels a <= x <= b;
//   a pooled z-score over all elements is within 5 as well (catches small systematic bias);
// - variance: the mean squared error per bucket matches the theoretical sum of variances, and
//   stays below each codec's published bound (QSGD min(d/s^2, sqrt(d)/s) |v|^2, TernGrad
//   sum |v_i|(m - |v_i|), natural compression |x|^2/8, linear max-norm dithering step^2/4).
//
// Each 5-sigma check fails by chance with probability < 6e-7; seeds are fixed, so a run is
// reproducible. Besides sampling error, the bounds allow the documented deterministic bias of
// the 16-bit draw (probability error <= 2^-17) and float rounding of the level index.

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

namespace {

using namespace gradcomp_test;
namespace gc = gradcomp;

constexpr std::size_t bucket = 16;

/// 56 elements, four buckets of 16 (the last partial, 8): Gaussian with exact zeros,
/// heavy-tailed, a bucket spanning ~130 binades, and a small partial one.
std::vector<float> test_tensor() {
  std::vector<float> x = gaussian(56, 1234);
  auto const h = heavy_tailed(16, 99);
  std::copy(h.begin(), h.end(), x.begin() + 16);
  x[0] = 0.0f;
  x[1] = -0.0f;
  x[2] = 0.5f;
  x[32] = 0x1p100f;         // dominates its bucket
  x[33] = 1.3f * 0x1p-30f;  // far below natural compression's exponent window
  x[34] = -3.0f * 0x1p-28f;
  x[35] = -0x1.8p90f;
  x[36] = 0x1p-126f;
  x[37] = 1e-40f;  // subnormal
  x[50] = 0.0f;
  return x;
}

/// What an element may decode to: the exact float values, and the two neighbouring levels
/// a <= x <= b (a == b when x sits on a level) in double for the variance.
struct element_model {
  double x = 0;
  double a = 0, b = 0;
  double u = 0;               ///< x in level units, for the float-rounding allowance
  bool below_window = false;  ///< natural compression: |x| under the bucket's exponent window
  std::vector<float> allowed;
};

void add_allowed(element_model& m, float v) {
  if (std::find(m.allowed.begin(), m.allowed.end(), v) == m.allowed.end()) m.allowed.push_back(v);
}

/// Linear levels q * step (q = 0..s), step = scale / s in float as the decoder computes it.
element_model linear_model(float x, float scale, std::uint32_t s) {
  element_model m;
  m.x = x;
  float const step = scale / static_cast<float>(s);
  if (scale == 0.0f) {
    m.allowed = {0.0f};
    return m;
  }
  double const STEP = step;
  double const u = std::fabs(static_cast<double>(x)) / STEP;
  m.u = u;
  double const sign = x < 0 ? -1.0 : 1.0;
  auto level = [&](double q) { return q * STEP; };
  double const ql = std::min(std::floor(u), static_cast<double>(s));
  double const qh = u == ql ? ql : std::min(ql + 1, static_cast<double>(s));
  m.a = sign * level(sign > 0 ? ql : qh);
  m.b = sign * level(sign > 0 ? qh : ql);
  for (double up : {u * (1 - 1e-5), u * (1 + 1e-5)}) {
    double const lo = std::min(std::floor(up), static_cast<double>(s));
    for (double q : {lo, std::min(lo + 1, static_cast<double>(s))}) {
      float const v = static_cast<float>(q) * step;
      add_allowed(m, x < 0 && q > 0 ? -v : v);
    }
  }
  return m;
}

/// Natural levels 2^(q-1) * step (q = 1..s) and 0, step = scale / 2^(s-1).
element_model natural_levels_model(float x, float scale, std::uint32_t s) {
  element_model m;
  m.x = x;
  float const step = scale / std::ldexp(1.0f, static_cast<int>(s) - 1);
  if (scale == 0.0f) {
    m.allowed = {0.0f};
    return m;
  }
  double const STEP = step;
  double const u = std::fabs(static_cast<double>(x)) / STEP;
  m.u = u;
  auto level_of = [](double q) { return q == 0 ? 0.0 : std::ldexp(1.0, static_cast<int>(q) - 1); };
  // neighbouring level indices of u
  auto nbr = [&](double uu) -> std::pair<double, double> {
    if (uu < 1.0) return {0.0, uu == 0.0 ? 0.0 : 1.0};
    int e = 0;
    double const mant = std::frexp(uu, &e);  // uu = mant 2^e, floor(log2 uu) = e - 1
    double const ql = std::min(static_cast<double>(e), static_cast<double>(s));  // level 2^(e-1)
    double const qh = mant == 0.5 ? ql : std::min(ql + 1, static_cast<double>(s));
    return {ql, qh};
  };
  auto const [ql, qh] = nbr(u);
  double const sign = x < 0 ? -1.0 : 1.0;
  m.a = sign * level_of(sign > 0 ? ql : qh) * STEP;
  m.b = sign * level_of(sign > 0 ? qh : ql) * STEP;
  for (double up : {u * (1 - 1e-5), u * (1 + 1e-5)}) {
    auto const [l, h] = nbr(up);
    for (double q : {l, h}) {
      float const v = static_cast<float>(level_of(q)) * step;
      add_allowed(m, x < 0 && q > 0 ? -v : v);
    }
  }
  return m;
}

/// int8 levels fma(q, step, lo), q = 0..255, step = f32((hi - lo) / 255).
element_model int8_model(float x, float lo, float hi) {
  element_model m;
  m.x = x;
  float const step =
      static_cast<float>((static_cast<double>(hi) - static_cast<double>(lo)) / 255.0);
  if (hi == lo) {
    m.a = m.b = lo;
    m.allowed = {lo};
    return m;
  }
  double const STEP = step;
  double const v = (static_cast<double>(x) - lo) / STEP;
  m.u = 255.0;  // the level index is computed from values of this magnitude
  double const ql = std::clamp(std::floor(v), 0.0, 255.0);
  double const qh = v == ql ? ql : std::min(ql + 1, 255.0);
  m.a = lo + ql * STEP;
  m.b = lo + qh * STEP;
  for (double vv : {v - 1e-3, v + 1e-3}) {
    double const l = std::clamp(std::floor(vv), 0.0, 255.0);
    for (double q : {l, std::min(l + 1, 255.0)})
      add_allowed(m, std::fma(static_cast<float>(q), step, lo));
  }
  return m;
}

/// Natural compression: the powers of two around |x|, or 0 and 2^(lo-127) below the window.
element_model natural_codec_model(float x, unsigned emax) {
  element_model m;
  m.x = x;
  std::uint32_t const bits = bits_of(x) & 0x7fffffffu;
  double const sign = x < 0 ? -1.0 : 1.0;
  if (bits == 0) {
    m.allowed = {0.0f};
    return m;
  }
  unsigned const e = bits >> 23;
  unsigned const lo = emax > 126 ? emax - 125 : 1;
  double a, b;
  if (e >= lo) {
    a = std::ldexp(1.0, static_cast<int>(e) - 127);
    b = (bits & 0x7fffffu) == 0 ? a : 2 * a;
  } else {
    a = 0.0;
    b = std::ldexp(1.0, static_cast<int>(lo) - 127);
    m.below_window = true;
  }
  m.u = 1.0;
  m.a = sign > 0 ? a : -b;
  m.b = sign > 0 ? b : -a;
  add_allowed(m, static_cast<float>(sign * a));
  add_allowed(m, static_cast<float>(sign * b));
  if (a == 0.0) add_allowed(m, 0.0f);
  return m;
}

enum class kind { linear, natural_levels, int8, natural_codec };

struct stochastic_case {
  std::string name;
  gc::any_codec codec;
  kind k;
  std::uint32_t s = 1;
  bool l2 = false;
};

/// Models of every element, from the bucket scales stored in a packet.
std::vector<element_model> models(stochastic_case const& c, std::vector<float> const& x,
                                  std::vector<std::byte> const& p) {
  std::vector<element_model> out;
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::size_t const k = i / bucket;
    switch (c.k) {
      case kind::linear: out.push_back(linear_model(x[i], get_f32(p, hdr + 4 * k), c.s)); break;
      case kind::natural_levels:
        out.push_back(natural_levels_model(x[i], get_f32(p, hdr + 4 * k), c.s));
        break;
      case kind::int8:
        out.push_back(int8_model(x[i], get_f32(p, hdr + 8 * k), get_f32(p, hdr + 8 * k + 4)));
        break;
      case kind::natural_codec:
        out.push_back(natural_codec_model(x[i], static_cast<unsigned>(p[hdr + k])));
        break;
    }
  }
  return out;
}

std::vector<stochastic_case> stochastic_cases() {
  std::string const b = ",bucket=" + std::to_string(bucket);
  return {
      {"qsgd s=1", gc::make_codec("qsgd:levels=1" + b), kind::linear, 1, true},
      {"qsgd s=4", gc::make_codec("qsgd:levels=4" + b), kind::linear, 4, true},
      {"qsgd s=127", gc::make_codec("qsgd:levels=127" + b), kind::linear, 127, true},
      {"terngrad", gc::make_codec("terngrad:bucket=16"), kind::linear, 1, false},
      {"dithering linear max s=3",
       gc::make_codec("dithering:levels=3,partition=linear,norm=max" + b), kind::linear, 3, false},
      {"dithering linear l2 s=2", gc::make_codec("dithering:levels=2,partition=linear,norm=l2" + b),
       kind::linear, 2, true},
      {"dithering natural max s=4",
       gc::make_codec("dithering:levels=4,partition=natural,norm=max" + b), kind::natural_levels, 4,
       false},
      {"dithering natural l2 s=8",
       gc::make_codec("dithering:levels=8,partition=natural,norm=l2" + b), kind::natural_levels, 8,
       true},
      {"natural", gc::make_codec("natural:bucket=16"), kind::natural_codec},
      {"int8 stochastic", gc::make_codec("int8:rounding=stochastic" + b), kind::int8},
  };
}

struct bucket_stats {
  double sum = 0, sumsq = 0;  // of the per-step squared error of the bucket
};

}  // namespace

TEST_CASE(
    "stochastic codecs decode to neighbouring levels, are unbiased, and have the "
    "theoretical variance",
    "[codec][stochastic][unbiased][variance]") {
  std::vector<float> const x = test_tensor();
  std::size_t const n = x.size();
  std::size_t const nb = (n + bucket - 1) / bucket;
  std::uint32_t const T = quick_mode() ? 4000 : 20000;
  double const sqrtT = std::sqrt(static_cast<double>(T));

  for (auto const& c : stochastic_cases()) {
    SECTION(c.name) {
      gc::codec_context ctx = serial_ctx(gc::cpu::isa::best, 0x5eed5eedull);
      auto const p0 = compress(c.codec, x, ctx, gc::tensor_id{77});
      auto const m = models(c, x, p0);

      std::vector<double> sum(n, 0.0), sumsq(n, 0.0), sq4(n, 0.0);
      std::vector<bucket_stats> bs(nb);
      std::size_t off_grid = 0;
      std::size_t first_bad = SIZE_MAX;
      float first_bad_value = 0;
      std::vector<float> y(n);
      for (std::uint32_t t = 0; t < T; ++t) {
        ctx.step = 1000 + t;
        auto const p = compress(c.codec, x, ctx, gc::tensor_id{77});
        c.codec.decompress(std::span<std::byte const>(p), std::span<float>(y), ctx);
        std::vector<double> se(nb, 0.0);
        for (std::size_t i = 0; i < n; ++i) {
          auto const& al = m[i].allowed;
          if (std::find(al.begin(), al.end(), y[i]) == al.end() && off_grid++ == 0) {
            first_bad = i;
            first_bad_value = y[i];
          }
          double const d = static_cast<double>(y[i]) - m[i].x;
          sum[i] += y[i];
          sumsq[i] += d * d;
          sq4[i] += d * d * d * d;
          se[i / bucket] += d * d;
        }
        for (std::size_t k = 0; k < nb; ++k) {
          bs[k].sum += se[k];
          bs[k].sumsq += se[k] * se[k];
        }
      }
      INFO("first off-grid element " << first_bad << " = "
                                     << x[first_bad == SIZE_MAX ? 0 : first_bad] << " decoded to "
                                     << first_bad_value);
      REQUIRE(off_grid == 0);

      // Unbiasedness, per element and pooled.
      // (a or b can miss x by an ulp where x sits on a level: then the variance is 0.)
      double pooled_bias = 0, pooled_var = 0, pooled_allow = 0;
      std::vector<double> mse_allow(n);
      for (std::size_t i = 0; i < n; ++i) {
        double const var = std::max((m[i].b - m[i].x) * (m[i].x - m[i].a), 0.0);
        double const gap = m[i].b - m[i].a;
        double const allow =
            gap * (0x1p-17 + m[i].u * 0x1p-21) +
            4.0 *
                std::ldexp(
                    1.0, std::ilogb(std::max(std::fabs(m[i].a), std::fabs(m[i].b)) + 1e-300) - 23);
        double const mean = sum[i] / T;
        CAPTURE(i, m[i].x, m[i].a, m[i].b, mean, var);
        REQUIRE(std::fabs(mean - m[i].x) <= 5.0 * std::sqrt(var) / sqrtT + allow);
        pooled_bias += mean - m[i].x;
        pooled_var += var;
        pooled_allow += allow;
        // Per-element mean squared error matches the variance of two-level rounding.
        double const mse = sumsq[i] / T;
        double const sd_sq = std::sqrt(std::max(sq4[i] / T - mse * mse, 0.0));
        mse_allow[i] = 2 * allow * gap + allow * allow + 1e-12 * var;
        REQUIRE(std::fabs(mse - var) <= 5.0 * sd_sq / sqrtT + mse_allow[i]);
      }
      if (pooled_var > 0) {
        double const z =
            (pooled_bias -
             std::copysign(std::min(std::fabs(pooled_bias), pooled_allow), pooled_bias)) /
            std::sqrt(pooled_var / T);
        CAPTURE(pooled_bias, pooled_var, z);
        REQUIRE(std::fabs(z) <= 5.0);
      }

      // Per-bucket variance: theory, and the codec's published bound.
      for (std::size_t k = 0; k < nb; ++k) {
        std::size_t const b0 = k * bucket, b1 = std::min(n, b0 + bucket);
        double theory = 0, norm2 = 0, maxabs = 0, allow = 0;
        for (std::size_t i = b0; i < b1; ++i) {
          theory += std::max((m[i].b - m[i].x) * (m[i].x - m[i].a), 0.0);
          norm2 += m[i].x * m[i].x;
          maxabs = std::max(maxabs, std::fabs(m[i].x));
          allow += mse_allow[i];
        }
        double const mean = bs[k].sum / T;
        double const sd = std::sqrt(std::max(bs[k].sumsq / T - mean * mean, 0.0));
        double const slack = 5.0 * sd / sqrtT + allow;
        CAPTURE(k, mean, theory, norm2, sd);
        REQUIRE(std::fabs(mean - theory) <= slack + 1e-300);
        double const d = static_cast<double>(b1 - b0);
        if (c.name.rfind("qsgd", 0) == 0) {
          double const s = c.s;
          double const bound = std::min(d / (s * s), std::sqrt(d) / s) * norm2;
          REQUIRE(theory <= bound * (1 + 1e-6));
          REQUIRE(mean <= bound + slack);
        }
        if (c.name == "terngrad") {
          // E|Q(v) - v|^2 = sum |v_i| (m - |v_i|) with m the float scale of the bucket.
          double const scale = get_f32(p0, hdr + 4 * k);
          double exact = 0;
          for (std::size_t i = b0; i < b1; ++i)
            exact += std::fabs(m[i].x) * (scale - std::fabs(m[i].x));
          REQUIRE(scale == maxabs);
          REQUIRE(std::fabs(theory - exact) <= 1e-6 * exact + 1e-300);
          REQUIRE(std::fabs(mean - exact) <= slack + 1e-6 * exact + 1e-300);
        }
        if (c.name == "dithering linear max s=3") {
          double const step = get_f32(p0, hdr + 4 * k) / 3.0;
          REQUIRE(mean <= d * step * step / 4 + slack);
        }
        if (c.k == kind::int8) {
          double const step =
              (static_cast<double>(get_f32(p0, hdr + 8 * k + 4)) - get_f32(p0, hdr + 8 * k)) /
              255.0;
          REQUIRE(mean <= d * step * step / 4 * (1 + 1e-5) + slack);
        }
      }
      if (c.k == kind::natural_codec) {
        // Relative variance at most 1/8 for every element inside the exponent window.
        for (std::size_t i = 0; i < n; ++i) {
          if (m[i].below_window) continue;  // rounds to 0 or 2^(lo-127): no relative bound
          double const var = std::max((m[i].b - m[i].x) * (m[i].x - m[i].a), 0.0);
          double const mse = sumsq[i] / T;
          double const sd_sq = std::sqrt(std::max(sq4[i] / T - mse * mse, 0.0));
          CAPTURE(i, m[i].x, var, mse);
          REQUIRE(var <= m[i].x * m[i].x / 8 * (1 + 1e-12));
          REQUIRE(mse <= m[i].x * m[i].x / 8 + 5.0 * sd_sq / sqrtT + mse_allow[i]);
        }
      }
    }
  }
}

TEST_CASE(
    "stochastic codecs draw fresh randomness per step, tensor and seed, and none for "
    "deterministic ones",
    "[codec][stochastic][determinism]") {
  auto const x = gaussian(1000, 8);
  for (auto const& v : all_variants(64)) {
    CAPTURE(v.name);
    gc::codec_context ctx = serial_ctx(gc::cpu::isa::best, 42, 5);
    auto const base = compress(v.codec, x, ctx, gc::tensor_id{3});
    // Same seed, step and tensor: same bytes.
    REQUIRE(compress(v.codec, x, ctx, gc::tensor_id{3}) == base);
    gc::codec_context other_step = ctx;
    other_step.step = 6;
    gc::codec_context other_seed = ctx;
    other_seed.seed = 43;
    gc::codec_context high_seed = ctx;
    high_seed.seed = 42 | (std::uint64_t{1} << 40);  // the upper key word matters too
    auto const a = compress(v.codec, x, other_step, gc::tensor_id{3});
    auto const b = compress(v.codec, x, ctx, gc::tensor_id{4});
    auto const s = compress(v.codec, x, other_seed, gc::tensor_id{3});
    auto const h = compress(v.codec, x, high_seed, gc::tensor_id{3});
    if (v.stochastic) {
      REQUIRE(a != base);
      REQUIRE(b != base);
      REQUIRE(s != base);
      REQUIRE(h != base);
      // The difference is in the codes only: header and scales are deterministic.
      REQUIRE(std::equal(a.begin(), a.begin() + hdr, base.begin()));
    } else {
      REQUIRE(a == base);
      REQUIRE(b == base);
      REQUIRE(s == base);
      REQUIRE(h == base);
    }
  }
}

TEST_CASE("codecs declare unbiasedness consistently with their rounding", "[codec][traits]") {
  STATIC_REQUIRE(gc::identity_codec::unbiased);
  STATIC_REQUIRE_FALSE(gc::fp16_codec::unbiased);
  STATIC_REQUIRE_FALSE(gc::bf16_codec::unbiased);
  STATIC_REQUIRE_FALSE(gc::onebit_codec::unbiased);
  STATIC_REQUIRE_FALSE(gc::int8_codec::unbiased);
  STATIC_REQUIRE(gc::qsgd_codec::unbiased);
  STATIC_REQUIRE(gc::terngrad_codec::unbiased);
  STATIC_REQUIRE(gc::natural_codec::unbiased);
  STATIC_REQUIRE(gc::dithering_codec::unbiased);
  STATIC_REQUIRE(gc::identity_codec::aggregation == gc::aggregation_kind::summable);
  STATIC_REQUIRE(gc::fp16_codec::aggregation == gc::aggregation_kind::summable);
  STATIC_REQUIRE(gc::bf16_codec::aggregation == gc::aggregation_kind::summable);
  STATIC_REQUIRE(gc::onebit_codec::aggregation == gc::aggregation_kind::gather);
  STATIC_REQUIRE(gc::int8_codec::aggregation == gc::aggregation_kind::gather);
  STATIC_REQUIRE(gc::qsgd_codec::aggregation == gc::aggregation_kind::gather);
  STATIC_REQUIRE(gc::natural_codec::aggregation == gc::aggregation_kind::gather);
  REQUIRE(gc::make_codec("qsgd").unbiased());
  REQUIRE_FALSE(gc::make_codec("int8").unbiased());
}
