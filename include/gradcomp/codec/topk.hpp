// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `topk_codec`: the k elements of largest |x|, exactly, with k a count or a ratio of n.
///
/// Selection is a radix select in O(n) on the key `bits(x) & 0x7fffffff`, which orders like |x|
/// for finite floats. For n >= 2^16 (0 < k < n), a fixed-stride sample of 2^14 keys gives a
/// bound a little below the k-th largest key, and one vectorized pass (per chunk on the pool,
/// joined in index order) collects the indices and values of the elements at or above it,
/// typically k plus a few percent; otherwise (or in the rare case that fewer than k were
/// collected), one histogram pass over the top 11 key bits finds the boundary bucket and one
/// pass collects the elements of the buckets at or above it. Up to three histogram passes over
/// the collected keys (11, 10 and 10 bits) then find the k-th largest key T. The selection is
/// every element with key > T plus the first elements (lowest indices) with key == T, so ties
/// break toward the lower index; indices are ascending. The result depends neither on the path
/// nor on the thread count or the SIMD level.
///
/// Payload: the sparse payload (`detail/sparse.hpp`, docs/wire-format.md). Biased; aggregation
/// kind gather. A NaN or infinity (which has no place in the order) is a `numeric_error`
/// naming the first one.

#include <gradcomp/codec/budget.hpp>
#include <gradcomp/codec/detail/sparse.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/cpu/isa.hpp>
#include <gradcomp/cpu/kernels/topk.hpp>
#include <gradcomp/cpu/parallel.hpp>
#include <gradcomp/cpu/tuning.hpp>

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
    detail::sparse::check_ratio(r, "topk");
    check_values(values);
    topk_codec c;
    c.ratio_ = r;
    c.values_ = values;
    return c;
  }

  /// This codec with another selection size, the value type kept.
  [[nodiscard]] topk_codec with_budget(sparse_budget b) const {
    return b.by_count() ? count(b.count_value(), values_) : ratio(b.ratio(), values_);
  }

  [[nodiscard]] bool by_ratio() const noexcept { return by_ratio_; }
  [[nodiscard]] double ratio_value() const noexcept { return ratio_; }
  [[nodiscard]] std::uint64_t count_value() const noexcept { return k_; }
  [[nodiscard]] sparse_values value_type() const noexcept { return values_; }

  /// Elements selected from a tensor of n.
  [[nodiscard]] std::size_t k_for(std::size_t n) const noexcept {
    return detail::sparse::kept_count(by_ratio_, ratio_, k_, n);
  }

  /// Header plus absolute indices plus values for k_for(n) elements (the delta encoding is
  /// only used when smaller).
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    detail::check_packet_elements(id, n);
    return header_bytes + k_for(n) * static_cast<std::size_t>(4 + detail::sparse::value_bytes(values_));
  }

  /// Nominal wire bits per element, assuming absolute u32 indices: for a ratio r,
  /// r × (32 + value bits); for a count k, which means nothing without n, the cost per
  /// *selected* element, 32 + value bits.
  [[nodiscard]] double bits_per_element() const noexcept {
    return detail::sparse::nominal_bits(by_ratio_, ratio_, values_, 32.0);
  }

  /// Ascending indices of the top k_for(n) elements of `x` by |x| (ties: lower index first).
  void select(float const* x, std::size_t n, std::vector<std::uint32_t>& idx,
              codec_context const& ctx) const {
    std::vector<float> values;
    select(x, n, idx, values, ctx);
  }

  /// As `select`, and their values in `values` (values[j] = x[idx[j]], taken during the scan,
  /// which spares the packet writer a gather over x).
  void select(float const* x, std::size_t n, std::vector<std::uint32_t>& idx,
              std::vector<float>& values, codec_context const& ctx) const {
    select(x, n, idx, values, ctx, id);
  }

  /// As `select`, naming codec `who` in the `numeric_error` of a non-finite input (for
  /// `approx_topk_codec`, which selects with this kernel).
  void select(float const* x, std::size_t n, std::vector<std::uint32_t>& idx,
              std::vector<float>& values, codec_context const& ctx, codec_id who) const {
    idx.clear();
    values.clear();
    if (n == 0) return;
    std::size_t const k = k_for(n);
    if (k > 0 && k < n && n >= (std::size_t{1} << 16) &&
        select_sampled(x, n, k, idx, values, ctx, who)) {
      return;
    }
    select_histogram(x, n, k, idx, values, ctx, who);
  }

 private:
  /// The radix select of the file comment (any n, any k).
  void select_histogram(float const* x, std::size_t n, std::size_t k,
                        std::vector<std::uint32_t>& idx, std::vector<float>& values,
                        codec_context const& ctx, codec_id who) const {
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
        detail::throw_nonfinite(who, bad, x[bad]);
      }
    }
    if (k == 0) return;
    if (k == n) {
      idx.resize(n);
      std::iota(idx.begin(), idx.end(), std::uint32_t{0});
      values.assign(x, x + n);
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
    // Per-chunk output offsets from the per-chunk histograms; the elements of buckets >= B are
    // collected in index order.
    std::vector<std::uint64_t> off(chunks + 1);
    for (std::size_t c = 0; c < chunks; ++c) {
      std::uint32_t const* h = hist.data() + c * bins;
      std::uint64_t a = 0;
      for (std::size_t d = bucket; d < bins; ++d) a += h[d];
      off[c + 1] = off[c] + a;
    }
    idx.resize(static_cast<std::size_t>(off[chunks]));
    values.resize(idx.size());
    auto const bk = static_cast<std::uint32_t>(bucket);
    cpu::for_each_chunk(n, 64, ctx, [&](std::size_t c, std::size_t b, std::size_t e) {
      std::uint32_t* o = idx.data() + off[c];
      float* v = values.data() + off[c];
      for (std::size_t i = b; i < e; ++i) {
        if ((key(x[i]) >> 20) >= bk) {
          *o++ = static_cast<std::uint32_t>(i);
          *v++ = x[i];
        }
      }
    });
    finish(k, above, bk << 20, 0xfff00000u, idx, values);
  }

  /// Completes a selection from the candidates `idx` (ascending, values `values`), which hold
  /// every element of key >= T, the k-th largest key: `above` of them have keys above all keys
  /// starting with the bits `prefix` under `known`, and T starts with those bits. Reduces the
  /// candidates to the k selected, in place.
  static void finish(std::size_t k, std::uint64_t above, std::uint32_t prefix, std::uint32_t known,
                     std::vector<std::uint32_t>& idx, std::vector<float>& values) {
    // T: the remaining digits, 10 bits each (the top one 11), most significant first.
    std::uint64_t need = k - above;  // rank of T among the keys starting with prefix, 1-based
    for (unsigned shift : {20u, 10u, 0u}) {
      if ((known >> shift & 1u) != 0) continue;
      std::uint32_t const width = shift == 20 ? 2048u : 1024u;
      // Four interleaved sub-histograms break the store-to-load chains of repeated digits;
      // keys outside the prefix count in an extra bin, without a branch.
      std::size_t const stride = width + 1;
      std::vector<std::uint32_t> h(4 * stride);
      auto const bin = [&](float v) {
        std::uint32_t const kk = key(v);
        return (kk & known) == prefix ? (kk >> shift) & (width - 1) : width;
      };
      std::size_t const m = values.size();
      std::size_t j = 0;
      for (; j + 4 <= m; j += 4) {
        ++h[bin(values[j])];
        ++h[stride + bin(values[j + 1])];
        ++h[2 * stride + bin(values[j + 2])];
        ++h[3 * stride + bin(values[j + 3])];
      }
      for (; j < m; ++j) ++h[bin(values[j])];
      std::uint32_t dig = width;
      while (dig > 0) {
        --dig;
        std::uint64_t const c =
            std::uint64_t{h[dig]} + h[stride + dig] + h[2 * stride + dig] + h[3 * stride + dig];
        if (c >= need) break;
        need -= c;
      }
      prefix |= dig << shift;
      known |= (shift == 20 ? 2047u : 1023u) << shift;
    }
    // Keep keys > T and the first `need` keys == T (ties: lowest indices first).
    std::uint32_t const t = prefix;
    std::uint64_t ties = need;
    std::size_t o = 0;
    for (std::size_t j = 0; j < idx.size() && o < k; ++j) {
      std::uint32_t const kk = key(values[j]);
      bool const tie = kk == t && ties > 0;
      ties -= tie ? 1 : 0;
      idx[o] = idx[j];
      values[o] = values[j];
      o += (kk > t || tie) ? 1 : 0;
    }
    idx.resize(k);
    values.resize(k);
  }

  /// One-pass selection for large n: a fixed-stride sample gives a bound lo a little below the
  /// k-th largest key; one vectorized pass (`cpu::kernels::collect_at_least`) collects the
  /// elements with key >= lo and their values, flagging non-finite ones (every non-finite
  /// value is above the largest sample key, which is finite, so it is collected); `finish`
  /// selects among them. Returns false, with no effect, when fewer than k were collected (the
  /// caller then runs the histogram select); the result is the same either way.
  bool select_sampled(float const* x, std::size_t n, std::size_t k, std::vector<std::uint32_t>& idx,
                      std::vector<float>& values, codec_context const& ctx, codec_id who) const {
    std::size_t const s = std::size_t{1} << 14;
    std::size_t const stride = n / s;
    std::vector<std::uint32_t> sample(s);
    std::uint32_t largest = 0;
    for (std::size_t j = 0; j < s; ++j) {
      sample[j] = key(x[j * stride]);
      largest = std::max(largest, sample[j]);
    }
    if (largest >= 0x7f800000u) return false;  // the histogram path reports it
    // lo: the sample key of rank p + margin (0 = largest), p the expected rank of the k-th
    // largest key; the margin (4 standard deviations of the sample count, plus 16) makes
    // collecting fewer than k very rare.
    double const p = static_cast<double>(k) * static_cast<double>(s) / static_cast<double>(n);
    double const lo_rank = p + 4.0 * std::sqrt(p) + 16.0;
    std::uint32_t lo = 0;
    if (lo_rank < static_cast<double>(s)) {
      auto const r = static_cast<std::ptrdiff_t>(lo_rank);
      std::nth_element(sample.begin(), sample.begin() + r, sample.end(), std::greater<>());
      lo = sample[static_cast<std::size_t>(r)];
    }
    double const expected = std::min(lo_rank, static_cast<double>(s)) / static_cast<double>(s);
    bool const many = expected >= 0.01;  // the scan's hint (same result either way)
    cpu::isa const level = cpu::effective_isa(ctx.isa);
    constexpr std::size_t slack = cpu::kernels::collect_slack;
    // Scans x[b, e) in blocks of `block`, making room for a whole block before each; returns
    // whether a non-finite value was collected.
    auto const scan = [&](std::size_t b, std::size_t e, std::size_t block,
                          std::vector<std::uint32_t>& at, std::vector<float>& v) {
      std::size_t m = 0;
      bool nonfinite = false;
      for (std::size_t i = b; i < e; i += block) {
        std::size_t const len = std::min(block, e - i);
        if (at.size() < m + len + slack) {
          at.resize(std::max(m + len + slack, 2 * at.size()));
          v.resize(at.size());
        }
        cpu::kernels::collect_counts const got = cpu::kernels::collect_at_least(
            x + i, len, static_cast<std::uint32_t>(i), lo, at.data() + m, v.data() + m, level, many);
        m += got.count;
        nonfinite |= got.nonfinite;
      }
      at.resize(m);
      v.resize(m);
      return nonfinite;
    };
    auto const room = [&](std::size_t len, std::size_t block) {
      return static_cast<std::size_t>(expected * 1.25 * static_cast<double>(len)) + block + slack;
    };
    bool nonfinite = false;
    if (n < ctx.parallel_threshold || ctx.threads().size() == 1) {
      // One thread: one pass in index order straight into the result.
      constexpr std::size_t block = cpu::topk_serial_block;
      idx.resize(room(n, block));
      values.resize(idx.size());
      nonfinite = scan(0, n, block, idx, values);
    } else {
      // Per chunk on the pool (buffers sized here, on the calling thread), then joined in
      // chunk order.
      constexpr std::size_t block = cpu::topk_chunk_block;  // small: room for one per chunk
      std::size_t const chunks = cpu::chunk_count(n, 64);
      std::vector<std::vector<std::uint32_t>> at(chunks);
      std::vector<std::vector<float>> v(chunks);
      std::vector<unsigned char> bad(chunks);
      for (std::size_t c = 0; c < chunks; ++c) {
        at[c].resize(room(cpu::chunk_length(64), block));
        v[c].resize(at[c].size());
      }
      cpu::for_each_chunk(n, 64, ctx, [&](std::size_t c, std::size_t b, std::size_t e) {
        bad[c] = scan(b, e, block, at[c], v[c]) ? 1 : 0;
      });
      std::size_t total = 0;
      for (std::size_t c = 0; c < chunks; ++c) {
        total += at[c].size();
        nonfinite |= bad[c] != 0;
      }
      idx.resize(total);
      values.resize(total);
      std::size_t o = 0;
      for (std::size_t c = 0; c < chunks; ++c) {
        std::copy(at[c].begin(), at[c].end(), idx.begin() + static_cast<std::ptrdiff_t>(o));
        std::copy(v[c].begin(), v[c].end(), values.begin() + static_cast<std::ptrdiff_t>(o));
        o += at[c].size();
      }
    }
    if (nonfinite) {
      idx.clear();
      values.clear();
      std::size_t const at = detail::first_nonfinite(x, n);
      detail::throw_nonfinite(who, at, x[at]);
    }
    if (idx.size() < k) {
      idx.clear();
      values.clear();
      return false;
    }
    finish(k, 0, 0u, 0u, idx, values);
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
