// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Magnitude selection over one tensor or a list of tensors treated as one vector (the
/// engine of approximate top-k, whole-model top-k and multi-level re-compression).
///
/// Elements are ranked by the key `bits(x) & 0x7fffffff` (orders like |x| for finite floats),
/// ties by position (lower first; across tensors, the earlier tensor first). A selection of
/// m elements is always the top m in that order. Given a target k and a window [lo, hi] ∋ k:
///
/// 1. a fixed-stride sample of s keys (every ⌊N/s⌋-th element) gives a lower key bound that about k
/// + 4√(ks/N) + 8
///    sample-ranks' worth of elements reach (N the total length);
/// 2. one pass collects every element at or above the bound (per chunk on the pool; chunks
///    joined in order, so nothing depends on the thread count); if fewer than lo did (a
///    misleading sample), an exact 11-bit histogram pass finds a bound that works and the
///    collection is repeated;
/// 3. `find_cut` narrows the candidates by 2048-bin histograms over their key range and stops
///    at the first bin boundary whose count lies in [lo, hi]; if none does, it resolves the
///    exact k-th key and takes ties by position up to exactly k.
///
/// With lo = hi = k the result is the exact top-k (the same set as `topk_codec`).

#include <gradcomp/codec/detail/codec_base.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cpu/kernels/select.hpp>
#include <gradcomp/cpu/parallel.hpp>
#include <gradcomp/cpu/tuning.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail::select {

/// The ranking key of a float: its bits without the sign.
inline std::uint32_t key(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u & 0x7fffffffu;
}

/// A cut of a ranked list: every element with key > t, plus the first `eq` elements (in
/// position order) with key == t.
struct cut {
  std::uint32_t t = 0x7fffffffu;
  std::uint64_t eq = 0;

  /// The cut that selects everything.
  static constexpr cut all() noexcept { return {0u, UINT64_MAX}; }
  /// The cut that selects nothing (no finite key exceeds 0x7fffffff).
  static constexpr cut none() noexcept { return {0x7fffffffu, 0}; }
};

/// A cut of the keys in `parts` (taken as one list) selecting m elements with
/// lo <= m <= hi: at a histogram bin boundary when one lands in the window, else exactly k
/// (lo <= k <= hi, lo >= 1). Each level histograms the keys of the current key range
/// [a, b] (first: the keys' minimum and maximum) into at most 2048 bins of 2^shift keys,
/// walks the bins from the top and either stops at a boundary inside the window or narrows
/// the range to the bin holding the k-th key; a range of single keys resolves it exactly.
inline cut find_cut(std::span<std::span<std::uint32_t const> const> parts, std::uint64_t lo,
                    std::uint64_t k, std::uint64_t hi) {
  std::uint64_t total = 0;
  std::uint32_t a = 0xffffffffu, b = 0;
  for (auto const& p : parts) {
    total += p.size();
    for (std::uint32_t kk : p) {
      a = std::min(a, kk);
      b = std::max(b, kk);
    }
  }
  if (k == 0) return cut::none();
  if (hi >= total) return cut::all();
  std::uint64_t above = 0;  // keys above the range [a, b]
  std::vector<std::uint64_t> h(2048);
  for (;;) {
    std::uint32_t const span = b - a;
    unsigned const bits = static_cast<unsigned>(std::bit_width(span));
    unsigned const shift = bits > 11 ? bits - 11 : 0;
    std::uint32_t const bins = (span >> shift) + 1;
    std::fill(h.begin(), h.begin() + bins, 0);
    for (auto const& p : parts) {
      for (std::uint32_t kk : p) {
        if (kk >= a && kk <= b) ++h[(kk - a) >> shift];
      }
    }
    std::uint32_t d = bins;
    while (d > 0) {
      --d;
      std::uint64_t const c = above + h[d];
      if (c >= lo) {
        std::uint32_t const lb = a + (d << shift);
        if (c <= hi) return lb == 0 ? cut::all() : cut{lb - 1, 0};
        if (shift == 0) return cut{lb, k - above};
        b = static_cast<std::uint32_t>(
            std::min<std::uint64_t>(b, std::uint64_t{lb} + (std::uint64_t{1} << shift) - 1));
        a = lb;
        break;
      }
      above = c;
    }
  }
}

/// `find_cut` of one list of keys.
inline cut find_cut(std::span<std::uint32_t const> keys, std::uint64_t lo, std::uint64_t k,
                    std::uint64_t hi) {
  return find_cut(std::span<std::span<std::uint32_t const> const>(&keys, 1), lo, k, hi);
}

/// One contiguous float tensor of a selection.
struct segment {
  float const* x = nullptr;
  std::size_t n = 0;
};

/// The elements of one segment at or above a bound: ascending indices and their keys.
struct candidates {
  std::vector<std::uint32_t> idx;
  std::vector<std::uint32_t> key;
};

/// Every element with key >= `bound`, per segment and chunk: `parts[s][c]` receives chunk c of
/// segment s (branch-free SIMD compaction per chunk on the pool). `parts` is reused: its
/// vectors keep their capacity from earlier calls. Throws the `numeric_error` of codec `who`
/// naming the first non-finite element of the first segment holding one (`bound` <=
/// 0x7f800000, so every non-finite element is collected). Returns the number collected.
inline std::uint64_t collect(std::span<segment const> segs, std::uint32_t bound,
                             std::vector<std::vector<candidates>>& parts, codec_id who,
                             codec_context const& ctx) {
  constexpr std::size_t block = cpu::select_collect_block;
  cpu::isa const level = cpu::effective_isa(ctx.isa);
  parts.resize(segs.size());
  std::uint64_t total = 0;
  for (std::size_t s = 0; s < segs.size(); ++s) {
    float const* x = segs[s].x;
    std::size_t const n = segs[s].n;
    std::size_t const chunks = cpu::chunk_count(n, block);
    std::vector<candidates>& part = parts[s];
    part.resize(chunks);
    std::vector<unsigned char> bad(chunks);
    cpu::for_each_chunk(n, block, ctx, [&](std::size_t c, std::size_t b, std::size_t e) {
      std::uint32_t ib[block + cpu::kernels::compact_slack],
          kb[block + cpu::kernels::compact_slack];
      candidates& o = part[c];
      o.idx.clear();
      o.key.clear();
      std::uint32_t top = 0;
      for (std::size_t i = b; i < e; i += block) {
        std::size_t const len = std::min(block, e - i);
        std::size_t const m = cpu::kernels::compact_above(x + i, len, static_cast<std::uint32_t>(i),
                                                          bound, ib, kb, level);
        o.idx.insert(o.idx.end(), ib, ib + m);
        o.key.insert(o.key.end(), kb, kb + m);
        for (std::size_t j = 0; j < m; ++j) top = std::max(top, kb[j]);
      }
      bad[c] = top >= 0x7f800000u;
    });
    for (std::size_t c = 0; c < chunks; ++c) {
      if (bad[c]) {
        std::size_t const at = first_nonfinite(x, n);
        throw_nonfinite(who, at, x[at]);
      }
    }
    for (auto const& p : part) total += p.idx.size();
  }
  return total;
}

/// A key bound that at least k elements of `segs` reach, from an exact histogram of the top
/// 11 key bits (one pass; non-finite values raise `numeric_error` of `who`).
inline std::uint32_t histogram_bound(std::span<segment const> segs, std::uint64_t k, codec_id who,
                                     codec_context const& ctx) {
  std::vector<std::uint64_t> total(2048);
  for (segment const& sg : segs) {
    std::size_t const chunks = cpu::chunk_count(sg.n, 64);
    std::vector<std::uint32_t> hist(chunks * 2048);
    cpu::for_each_chunk(sg.n, 64, ctx, [&](std::size_t c, std::size_t b, std::size_t e) {
      std::uint32_t* h = hist.data() + c * 2048;
      for (std::size_t i = b; i < e; ++i) ++h[key(sg.x[i]) >> 20];
    });
    for (std::size_t c = 0; c < chunks; ++c) {
      for (std::size_t d = 0; d < 2048; ++d) total[d] += hist[c * 2048 + d];
    }
    for (std::size_t d = 0x7f8; d < 2048; ++d) {
      if (total[d] != 0) {
        std::size_t const at = first_nonfinite(sg.x, sg.n);
        throw_nonfinite(who, at, sg.x[at]);
      }
    }
  }
  std::uint64_t cum = 0;
  std::uint32_t d = 2048;
  while (d > 0) {
    --d;
    cum += total[d];
    if (cum >= k) break;
  }
  return d << 20;
}

/// Parameters of a selection: the target k, the window [lo, hi] ∋ k, and the sample size
/// (`sample_fraction` of the total length, at least `min_sample`, at most all of it).
struct request {
  std::uint64_t k = 0, lo = 0, hi = 0;
  double sample_fraction = 0.001;
  std::size_t min_sample = 4096;
};

/// Selects from `segs` per `req` (see the file comment); returns ascending indices per segment.
inline std::vector<std::vector<std::uint32_t>> top(std::span<segment const> segs,
                                                   request const& req, codec_id who,
                                                   codec_context const& ctx) {
  std::uint64_t total_n = 0;
  for (segment const& sg : segs) total_n += sg.n;
  std::vector<std::vector<std::uint32_t>> none(segs.size());
  std::uint64_t const k = std::min<std::uint64_t>(req.k, total_n);
  std::uint32_t bound = 0;
  if (k > 0 && k < total_n) {
    // Sample every `step`-th element from step / 2 on: spread evenly, distinct, in range.
    auto const want =
        static_cast<std::uint64_t>(std::ceil(req.sample_fraction * static_cast<double>(total_n)));
    std::uint64_t const s0 =
        std::min<std::uint64_t>(total_n, std::max<std::uint64_t>(want, req.min_sample));
    std::uint64_t const step = total_n / s0;
    std::uint64_t const s = total_n / step;
    std::vector<std::uint32_t> sample(static_cast<std::size_t>(s));
    std::size_t seg = 0;
    std::uint64_t base = 0;
    for (std::uint64_t j = 0; j < s; ++j) {
      std::uint64_t const pos = j * step + step / 2;
      while (pos >= base + segs[seg].n) base += segs[seg++].n;
      sample[j] = key(segs[seg].x[pos - base]);
    }
    double const p = static_cast<double>(k) * static_cast<double>(s) / static_cast<double>(total_n);
    double const r = std::ceil(p + 4.0 * std::sqrt(p) + 8.0);
    if (r < static_cast<double>(s)) {
      auto const rank = static_cast<std::size_t>(r);
      std::nth_element(sample.begin(), sample.begin() + static_cast<std::ptrdiff_t>(rank),
                       sample.end(), std::greater<std::uint32_t>());
      bound = std::min(sample[rank], 0x7f800000u);
    }
  }
  // Candidate storage reused across calls on this thread, so that a training loop does not
  // pay fresh pages every step; released after a call that needed more than 2^21 entries.
  thread_local std::vector<std::vector<candidates>> parts;
  struct release {
    std::vector<std::vector<candidates>>& p;
    std::uint64_t m = 0;
    ~release() {
      if (m > (std::uint64_t{1} << 21)) {
        p.clear();
        p.shrink_to_fit();
      }
    }
  } guard{parts};
  if (k == 0) {
    // Nothing to select, but non-finite input is still an error.
    (void)collect(segs, 0x7f800000u, parts, who, ctx);
    return none;
  }
  std::uint64_t m = collect(segs, bound, parts, who, ctx);
  if (m < req.lo) {
    bound = histogram_bound(segs, k, who, ctx);
    m = collect(segs, bound, parts, who, ctx);
  }
  guard.m = m;
  std::vector<std::vector<std::uint32_t>> result(segs.size());
  if (m <= req.hi) {
    for (std::size_t s = 0; s < segs.size(); ++s) {
      std::size_t ms = 0;
      for (auto const& p : parts[s]) ms += p.idx.size();
      result[s].reserve(ms);
      for (auto const& p : parts[s]) result[s].insert(result[s].end(), p.idx.begin(), p.idx.end());
    }
    return result;
  }
  std::vector<std::span<std::uint32_t const>> keys;
  for (auto const& seg_parts : parts) {
    for (auto const& p : seg_parts) keys.emplace_back(p.key);
  }
  cut const c = find_cut(keys, req.lo, k, req.hi);
  std::uint64_t eq = c.eq;
  for (std::size_t s = 0; s < segs.size(); ++s) {
    std::vector<std::uint32_t>& r = result[s];
    std::size_t ms = 0;
    for (auto const& p : parts[s]) ms += p.idx.size();
    r.reserve(std::min(static_cast<std::size_t>(req.hi), ms));
    for (auto const& p : parts[s]) {
      for (std::size_t j = 0; j < p.idx.size(); ++j) {
        std::uint32_t const kk = p.key[j];
        if (kk > c.t || (kk == c.t && eq > 0)) {
          if (kk == c.t) --eq;
          r.push_back(p.idx[j]);
        }
      }
    }
  }
  return result;
}

}  // namespace detail::select
GRADCOMP_NAMESPACE_END
