// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `topk_codec`: the k elements of largest |x|, exactly, with k a count or a ratio of n.
///
/// Selection is a radix select in O(n) on the key `bits(x) & 0x7fffffff`, which orders like |x|
/// for finite floats: one histogram pass over the top 11 key bits (per chunk on the pool; the
/// counts are exact, so the result does not depend on the thread count) finds the boundary
/// bucket; one pass in index order emits the elements of the buckets above it and collects the
/// boundary bucket's candidates; two 10-bit histogram passes over the candidates find the k-th
/// largest key T. The selection is every element with key > T plus the first elements (lowest
/// indices) with key == T, so ties break toward the lower index; indices are ascending.
///
/// Payload: the sparse payload (`detail/sparse.hpp`, docs/wire-format.md). Biased; aggregation
/// kind gather. A NaN or infinity (which has no place in the order) is a `numeric_error`
/// naming the first one.

#include <gradcomp/codec/detail/sparse.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/cpu/parallel.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Exact top-k sparsifier (see file comment).
class topk_codec : public detail::sparse_codec_base<topk_codec> {
 public:
  static constexpr codec_id id = codec_id::topk;

  /// Keeps 1% of the elements, values in f32.
  topk_codec() noexcept = default;

  /// Keeps min(k, n) elements (k = 0: none).
  static topk_codec count(std::uint64_t k, sparse_values values = sparse_values::f32) {
    check_values(values);
    topk_codec c;
    c.by_ratio_ = false;
    c.k_ = k;
    c.values_ = values;
    return c;
  }

  /// Keeps max(1, floor(r n)) elements of n > 0; 0 < r <= 1.
  static topk_codec ratio(double r, sparse_values values = sparse_values::f32) {
    if (!(r > 0.0 && r <= 1.0)) {
      throw config_error("gradcomp: topk ratio must be in (0, 1], got " + std::to_string(r));
    }
    check_values(values);
    topk_codec c;
    c.ratio_ = r;
    c.values_ = values;
    return c;
  }

  [[nodiscard]] bool by_ratio() const noexcept { return by_ratio_; }
  [[nodiscard]] double ratio_value() const noexcept { return ratio_; }
  [[nodiscard]] std::uint64_t count_value() const noexcept { return k_; }
  [[nodiscard]] sparse_values value_type() const noexcept { return values_; }

  /// Elements selected from a tensor of n.
  [[nodiscard]] std::size_t k_for(std::size_t n) const noexcept {
    if (n == 0) return 0;
    if (!by_ratio_) return k_ < n ? static_cast<std::size_t>(k_) : n;
    auto const k = static_cast<std::size_t>(std::floor(ratio_ * static_cast<double>(n)));
    return std::clamp<std::size_t>(k, 1, n);
  }

  /// Header plus absolute indices plus values for k_for(n) elements (the delta encoding is
  /// only used when smaller).
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const noexcept {
    return header_bytes + k_for(n) * static_cast<std::size_t>(4 + detail::sparse::value_bytes(values_));
  }

  /// Nominal wire bits per element, assuming absolute u32 indices: for a ratio r,
  /// r × (32 + value bits); for a count k, which means nothing without n, the cost per
  /// *selected* element, 32 + value bits.
  [[nodiscard]] double bits_per_element() const noexcept {
    double const per = 32.0 + 8.0 * static_cast<double>(detail::sparse::value_bytes(values_));
    return by_ratio_ ? ratio_ * per : per;
  }

  /// Ascending indices of the top k_for(n) elements of `x` by |x| (ties: lower index first).
  void select(float const* x, std::size_t n, std::vector<std::uint32_t>& idx,
              codec_context const& ctx) const {
    idx.clear();
    if (n == 0) return;
    std::size_t const k = k_for(n);
    if (k > 0 && k < n && n >= (std::size_t{1} << 16) && select_banded(x, n, k, idx, ctx)) return;
    constexpr std::size_t bins = 2048;
    std::size_t const chunks = cpu::chunk_count(n, 64);
    std::vector<std::uint32_t> hist(chunks * bins);
    cpu::for_each_chunk(n, 64, ctx, [&](std::size_t c, std::size_t b, std::size_t e) {
      histogram_top(x + b, e - b, hist.data() + c * bins);
    });
    std::vector<std::uint64_t> total(bins);
    for (std::size_t c = 0; c < chunks; ++c) {
      std::uint32_t const* h = hist.data() + c * bins;
      for (std::size_t d = 0; d < bins; ++d) total[d] += h[d];
    }
    for (std::size_t d = 0x7f8; d < bins; ++d) {  // infinities and NaNs
      if (total[d] != 0) {
        std::size_t const bad = detail::first_nonfinite(x, n);
        detail::throw_nonfinite(id, bad, x[bad]);
      }
    }
    if (k == 0) return;
    if (k == n) {
      idx.resize(n);
      std::iota(idx.begin(), idx.end(), std::uint32_t{0});
      return;
    }
    // Boundary bucket B: fewer than k keys lie above it, at least k at or above it.
    std::size_t bucket = bins;
    std::uint64_t above = 0;
    while (bucket > 0) {
      --bucket;
      if (above + total[bucket] >= k) break;
      above += total[bucket];
    }
    // Per-chunk output offsets from the per-chunk histograms.
    std::vector<std::uint64_t> off_a(chunks + 1), off_c(chunks + 1);
    for (std::size_t c = 0; c < chunks; ++c) {
      std::uint32_t const* h = hist.data() + c * bins;
      std::uint64_t a = 0;
      for (std::size_t d = bucket + 1; d < bins; ++d) a += h[d];
      off_a[c + 1] = off_a[c] + a;
      off_c[c + 1] = off_c[c] + h[bucket];
    }
    std::vector<std::uint32_t> greater(static_cast<std::size_t>(above));
    std::vector<std::uint32_t> cand(static_cast<std::size_t>(total[bucket]));
    auto const bk = static_cast<std::uint32_t>(bucket);
    cpu::for_each_chunk(n, 64, ctx, [&](std::size_t c, std::size_t b, std::size_t e) {
      std::uint32_t* ga = greater.data() + off_a[c];
      std::uint32_t* ca = cand.data() + off_c[c];
      for (std::size_t i = b; i < e; ++i) {
        std::uint32_t const d = key(x[i]) >> 20;
        if (d > bk) {
          *ga++ = static_cast<std::uint32_t>(i);
        } else if (d == bk) {
          *ca++ = static_cast<std::uint32_t>(i);
        }
      }
    });
    finish(x, k, greater, cand, bk << 20, 0xfff00000u, idx);
  }

 private:
  /// Completes a selection: `greater` (ascending) are all above the boundary, `cand`
  /// (ascending) hold the k-th largest key, which starts with the bits `prefix` under `known`.
  static void finish(float const* x, std::size_t k, std::vector<std::uint32_t> const& greater,
                     std::vector<std::uint32_t> const& cand, std::uint32_t prefix,
                     std::uint32_t known, std::vector<std::uint32_t>& idx) {
    std::uint64_t const above = greater.size();
    // Exact k-th largest key among the candidates: the remaining digits, 10 bits each (the
    // top one 11), most significant first.
    std::uint64_t need = k - above;  // rank of T among the candidates, 1-based
    std::vector<std::uint32_t> ck(cand.size());
    for (std::size_t j = 0; j < cand.size(); ++j) ck[j] = key(x[cand[j]]);
    for (unsigned shift : {20u, 10u, 0u}) {
      if ((known >> shift & 1u) != 0) continue;
      std::uint32_t const width = shift == 20 ? 2048u : 1024u;
      std::vector<std::uint64_t> h(width);
      for (std::uint32_t kk : ck) {
        if ((kk & known) == prefix) ++h[(kk >> shift) & (width - 1)];
      }
      std::uint32_t dig = width;
      while (dig > 0) {
        --dig;
        if (h[dig] >= need) break;
        need -= h[dig];
      }
      prefix |= dig << shift;
      known |= (shift == 20 ? 2047u : 1023u) << shift;
    }
    std::uint32_t const t = prefix;
    std::uint64_t ties = need;  // elements with key == T to take, lowest indices first
    std::vector<std::uint32_t> chosen;
    chosen.reserve(static_cast<std::size_t>(k - above));
    for (std::size_t j = 0; j < cand.size(); ++j) {
      if (ck[j] > t) {
        chosen.push_back(cand[j]);
      } else if (ck[j] == t && ties > 0) {
        chosen.push_back(cand[j]);
        --ties;
      }
    }
    idx.resize(k);
    std::merge(greater.begin(), greater.end(), chosen.begin(), chosen.end(), idx.begin());
  }

  /// One-pass selection for large n: a fixed-stride sample brackets the k-th largest key in a
  /// band [lo, hi]; one pass collects the indices above hi and those in the band (checking
  /// for non-finite values), and the band is then selected exactly. Returns false, with no
  /// effect, when the band missed (the caller then runs the histogram select); the result
  /// is the same either way.
  bool select_banded(float const* x, std::size_t n, std::size_t k, std::vector<std::uint32_t>& idx,
                     codec_context const& ctx) const {
    std::size_t const s = std::size_t{1} << 14;
    std::size_t const stride = n / s;
    std::vector<std::uint32_t> sample(s);
    for (std::size_t j = 0; j < s; ++j) sample[j] = key(x[j * stride]);
    std::sort(sample.begin(), sample.end(), std::greater<std::uint32_t>());
    if (sample[0] >= 0x7f800000u) return false;  // the histogram path reports it
    double const p = static_cast<double>(k) * static_cast<double>(s) / static_cast<double>(n);
    double const margin = 4.0 * std::sqrt(p) + 16.0;
    double const hi_rank = p - margin, lo_rank = p + margin;
    std::uint32_t const hi = hi_rank < 0.0 ? 0xffffffffu : sample[static_cast<std::size_t>(hi_rank)];
    std::uint32_t const lo = lo_rank >= static_cast<double>(s) ? 0u : sample[static_cast<std::size_t>(lo_rank)];
    std::size_t const chunks = cpu::chunk_count(n, 64);
    std::vector<std::vector<std::uint32_t>> ga(chunks), ca(chunks);
    std::vector<unsigned char> bad(chunks);
    cpu::for_each_chunk(n, 64, ctx, [&](std::size_t c, std::size_t b, std::size_t e) {
      std::uint32_t nonfinite = 0;
      std::size_t i = b;
      for (; i + 16 <= e; i += 16) {
        std::uint32_t any = 0;
        for (std::size_t j = 0; j < 16; ++j) any |= static_cast<std::uint32_t>(key(x[i + j]) >= lo);
        if (any == 0) continue;
        std::uint32_t mask = 0;  // elements at or above lo, visited by their set bits
        for (std::size_t j = 0; j < 16; ++j) mask |= static_cast<std::uint32_t>(key(x[i + j]) >= lo) << j;
        while (mask != 0) {
          std::size_t const j = i + static_cast<std::size_t>(std::countr_zero(mask));
          mask &= mask - 1;
          std::uint32_t const kk = key(x[j]);
          nonfinite |= kk >= 0x7f800000u;
          (kk > hi ? ga[c] : ca[c]).push_back(static_cast<std::uint32_t>(j));
        }
      }
      for (; i < e; ++i) {
        std::uint32_t const kk = key(x[i]);
        nonfinite |= kk >= 0x7f800000u;
        if (kk > hi) {
          ga[c].push_back(static_cast<std::uint32_t>(i));
        } else if (kk >= lo) {
          ca[c].push_back(static_cast<std::uint32_t>(i));
        }
      }
      bad[c] = nonfinite != 0;
    });
    for (std::size_t c = 0; c < chunks; ++c) {
      if (bad[c]) {
        std::size_t const at = detail::first_nonfinite(x, n);
        detail::throw_nonfinite(id, at, x[at]);
      }
    }
    std::vector<std::uint32_t> greater, cand;
    for (auto const& v : ga) greater.insert(greater.end(), v.begin(), v.end());
    if (greater.size() >= k) return false;
    for (auto const& v : ca) cand.insert(cand.end(), v.begin(), v.end());
    if (greater.size() + cand.size() < k) return false;
    finish(x, k, greater, cand, 0u, 0u, idx);
    return true;
  }

  static void check_values(sparse_values v) {
    if (static_cast<unsigned>(v) > 2) throw config_error("gradcomp: sparse value type must be f32, f16 or bf16");
  }

  static std::uint32_t key(float f) noexcept {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return u & 0x7fffffffu;
  }

  /// Adds the top-11-bit key digits of x[0, len) to h[2048]; four interleaved sub-histograms
  /// break the store-to-load chains of repeated digits.
  static void histogram_top(float const* x, std::size_t len, std::uint32_t* h) noexcept {
    std::uint32_t sub[4][2048] = {};
    std::size_t i = 0;
    for (; i + 4 <= len; i += 4) {
      ++sub[0][key(x[i]) >> 20];
      ++sub[1][key(x[i + 1]) >> 20];
      ++sub[2][key(x[i + 2]) >> 20];
      ++sub[3][key(x[i + 3]) >> 20];
    }
    for (; i < len; ++i) ++sub[0][key(x[i]) >> 20];
    for (std::size_t d = 0; d < 2048; ++d) h[d] = sub[0][d] + sub[1][d] + sub[2][d] + sub[3][d];
  }

  bool by_ratio_ = true;
  double ratio_ = 0.01;
  std::uint64_t k_ = 0;
  sparse_values values_ = sparse_values::f32;
};

GRADCOMP_NAMESPACE_END
