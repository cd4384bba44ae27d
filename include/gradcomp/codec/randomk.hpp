// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Random-k sparsification: k coordinates drawn uniformly *without replacement* from a
/// counter-based stream keyed by (seed, step, tensor id), so ranks sharing a seed select the
/// same coordinates and only the values go on the wire.
///
/// - `random_k_codec` sends x_i at the chosen coordinates (biased: E[x̂] = (k/n) x);
/// - `scaled_random_k_codec` sends (n/k) x_i, which makes it unbiased (E[x̂] = x).
///
/// **Selection.** A keyed pseudo-random permutation π of [0, n) (an 8-round Feistel network
/// over the smallest power-of-two domain ≥ max(n, 256), with cycle-walking; round keys from
/// Philox4x32-10 of (seed, step, tensor id)) maps the ranks 0..k−1 to the chosen coordinates S(k) =
/// {π(0), ..., π(k−1)}, which are then sorted by a bucket sort. The cost is O(k) (a few nanoseconds
/// per coordinate), independent of n, and the result does not depend on the thread count. Because
/// S(k') ⊂ S(k) for k' ≤ k, a random-k packet can be re-compressed to fewer coordinates without the
/// dense tensor (`codec/recompress.hpp`), and the result is the packet a direct compression to k'
/// gives. docs/wire-format.md, "random_k", specifies π exactly.
///
/// **Payload** (values only): a 32-bit check word derived from (seed, step, tensor id), then
/// the k values in ascending coordinate order (f32, f16 or bf16). The header holds k and the
/// tensor id; the seed and step are *not* on the wire. **The receiver must decode with the
/// sender's `codec_context` seed and step** (the tensor id travels in the packet); a packet
/// decoded under a different seed or step fails the check word and raises `format_error`
/// (a false accept has probability 2^-32). Aggregation kind shared support: ranks that share
/// the seed produce packets with the same header and check word, and the collective layer
/// all-reduces the value sections (payload offset 4, `value_section`).
///
/// Inputs are not inspected beyond the chosen coordinates, so a NaN or infinity elsewhere
/// goes unnoticed; one at a chosen coordinate is sent as is. A finite value beyond the value
/// type's range (scaled, or above 65504 in f16) saturates at its largest finite value
/// (core/quant/half.hpp).

#include <gradcomp/codec/budget.hpp>
#include <gradcomp/codec/detail/codec_base.hpp>
#include <gradcomp/codec/detail/sparse.hpp>
#include <gradcomp/codec/format/randomk.hpp>
#include <gradcomp/codec/value_section.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/quant/half.hpp>
#include <gradcomp/cpu/kernels/feistel.hpp>
#include <gradcomp/cpu/parallel.hpp>
#include <gradcomp/cpu/tuning.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

namespace detail::randomk {

/// Sorts `v` ascending by `key(e)` (< n, distinct): two LSD radix passes of ⌈w/2⌉ bits
/// (w = bit_width(n − 1)), or a comparison sort when `v` is small next to the digit tables.
template <class U, class Key>
void radix_sort(std::vector<U>& v, std::uint64_t n, Key key) {
  std::size_t const m = v.size();
  unsigned const w = n <= 1 ? 1u : static_cast<unsigned>(std::bit_width(n - 1));
  unsigned const d = (w + 1) / 2;
  if (m < 2) return;
  if (m * 8 < (std::size_t{1} << d)) {
    std::sort(v.begin(), v.end(), [&](U const& x, U const& y) { return key(x) < key(y); });
    return;
  }
  std::vector<std::uint32_t> c0(std::size_t{1} << d), c1(std::size_t{1} << d);
  std::uint32_t const mask = (std::uint32_t{1} << d) - 1;
  for (U const& e : v) {
    ++c0[key(e) & mask];
    ++c1[key(e) >> d];
  }
  std::uint32_t s0 = 0, s1 = 0;
  for (std::size_t b = 0; b < c0.size(); ++b) {
    std::uint32_t const t0 = c0[b], t1 = c1[b];
    c0[b] = s0;
    c1[b] = s1;
    s0 += t0;
    s1 += t1;
  }
  std::vector<U> tmp(m);
  for (U const& e : v) tmp[c0[key(e) & mask]++] = e;
  for (U const& e : tmp) v[c1[key(e) >> d]++] = e;
}

/// S(k) ascending: the coordinates of ranks 0..k−1 (k ≤ n), generated on the context's pool.
inline std::vector<std::uint32_t> indices(std::uint64_t n, std::uint64_t k, random_stream const& rs,
                                          codec_context const& ctx) {
  std::vector<std::uint32_t> idx(static_cast<std::size_t>(k));
  if (k == 0) return idx;
  if (k == n) {
    std::iota(idx.begin(), idx.end(), std::uint32_t{0});
    return idx;
  }
  auto const pi = permutation(n, rs);
  cpu::isa const level = cpu::effective_isa(ctx.isa);
  cpu::for_each_chunk(idx.size(), 64, ctx, [&](std::size_t, std::size_t b, std::size_t e) {
    cpu::kernels::feistel_fill(pi, b, e - b, idx.data() + b, level);
  });
  radix_sort(idx, n, [](std::uint32_t v) { return v; });
  return idx;
}

/// S(k) ascending with each coordinate's rank: entry = coordinate << 32 | rank.
inline std::vector<std::uint64_t> ranked_indices(std::uint64_t n, std::uint64_t k,
                                                 random_stream const& rs,
                                                 codec_context const& ctx) {
  std::vector<std::uint32_t> coord(static_cast<std::size_t>(k));
  cpu::kernels::feistel_fill(permutation(n, rs), 0, coord.size(), coord.data(),
                             cpu::effective_isa(ctx.isa));
  std::vector<std::uint64_t> out(coord.size());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = (std::uint64_t{coord[i]} << 32) | i;
  radix_sort(out, n, [](std::uint64_t v) { return static_cast<std::uint32_t>(v >> 32); });
  return out;
}

/// Throws `format_error` unless the packet's check word matches the context's seed and step.
inline void check(packet_header const& h, std::byte const* payload, codec_context const& ctx) {
  check(h, load_le<std::uint32_t>(payload), ctx.seed, ctx.step);
}

}  // namespace detail::randomk

/// Random-k sparsifier, unscaled (`Scaled = false`, `random_k_codec`) or scaled by n/k
/// (`Scaled = true`, `scaled_random_k_codec`, unbiased). See the file comment.
template <bool Scaled>
class basic_random_k_codec : public detail::codec_base<basic_random_k_codec<Scaled>> {
 public:
  static constexpr codec_id id = codec_id::random_k;
  static constexpr aggregation_kind aggregation = aggregation_kind::shared_support;
  /// Only the scaled variant is unbiased: E[x̂] = x there, (k/n) x otherwise.
  static constexpr bool unbiased = Scaled;
  /// Whether values are sent multiplied by n/k.
  static constexpr bool scaled = Scaled;

  /// Keeps 1% of the elements, values in f32.
  basic_random_k_codec() noexcept = default;

  /// Keeps min(k, n) elements (k = 0: none).
  static basic_random_k_codec count(std::uint64_t k, sparse_values values = sparse_values::f32) {
    check_values(values);
    basic_random_k_codec c;
    c.by_ratio_ = false;
    c.k_ = k;
    c.values_ = values;
    return c;
  }

  /// Keeps max(1, floor(r n)) elements of n > 0; 0 < r <= 1.
  static basic_random_k_codec ratio(double r, sparse_values values = sparse_values::f32) {
    detail::sparse::check_ratio(r, "random_k");
    check_values(values);
    basic_random_k_codec c;
    c.ratio_ = r;
    c.values_ = values;
    return c;
  }

  /// This codec with another selection size, the value type kept.
  [[nodiscard]] basic_random_k_codec with_budget(sparse_budget b) const {
    return b.by_count() ? count(b.count_value(), values_) : ratio(b.ratio(), values_);
  }

  [[nodiscard]] bool by_ratio() const noexcept { return by_ratio_; }
  [[nodiscard]] double ratio_value() const noexcept { return ratio_; }
  [[nodiscard]] std::uint64_t count_value() const noexcept { return k_; }
  [[nodiscard]] sparse_values value_type() const noexcept { return values_; }

  /// Elements selected from a tensor of n (the same rule as `topk_codec::k_for`).
  [[nodiscard]] std::size_t k_for(std::size_t n) const noexcept {
    return detail::sparse::kept_count(by_ratio_, ratio_, k_, n);
  }

  /// Exact packet size: header, check word, k_for(n) values.
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    detail::check_packet_elements(id, n);
    return header_bytes + 4 +
           k_for(n) * static_cast<std::size_t>(detail::sparse::value_bytes(values_));
  }

  /// Value bits per element for a ratio r (r × value bits; no indices on the wire); for a
  /// count, the value bits per *selected* element.
  [[nodiscard]] double bits_per_element() const noexcept {
    return detail::sparse::nominal_bits(by_ratio_, ratio_, values_, 0.0);
  }

  /// The ascending coordinates this codec selects from tensor `t` of n elements under `ctx`
  /// (what every rank sharing the seed and step selects; collectives all-reduce the values
  /// at these coordinates).
  [[nodiscard]] std::vector<std::uint32_t> indices(std::size_t n, codec_context const& ctx = {},
                                                   tensor_id t = tensor_id{0}) const {
    check_size(n);
    return detail::randomk::indices(n, k_for(n), stream(ctx, t), ctx);
  }

  /// Compresses `in` into `out` (at least `max_compressed_bytes(in.size())` bytes) and returns
  /// the packet size.
  template <element T>
  std::size_t compress(tensor_view<T const> in, std::span<std::byte> out,
                       codec_context const& ctx = {}) const {
    std::size_t const n = in.size();
    check_size(n);
    std::size_t const k = k_for(n);
    auto const vb = static_cast<std::size_t>(detail::sparse::value_bytes(values_));
    std::size_t const total = header_bytes + 4 + k * vb;
    if (out.size() < total) {
      throw config_error("gradcomp: random_k packet for " + std::to_string(n) + " elements needs " +
                         std::to_string(total) + " bytes, the output buffer has " +
                         std::to_string(out.size()));
    }
    random_stream const rs = stream(ctx, in.id());
    std::uint8_t const variant =
        static_cast<std::uint8_t>(static_cast<unsigned>(values_) | (Scaled ? 4u : 0u));
    write_header(
        out, packet_header{id, dtype_of<T>, variant, n, 4 + k * vb, static_cast<std::uint32_t>(k),
                           static_cast<std::uint32_t>(in.id())});
    std::byte* payload = out.data() + header_bytes;
    detail::store_le<std::uint32_t>(payload, detail::randomk::check_word(rs));
    std::vector<std::uint32_t> const idx = detail::randomk::indices(n, k, rs, ctx);
    float const s = scale(n, k);
    T const* x = in.data();
    std::byte* vals = payload + 4;
    sparse_values const v = values_;
    cpu::for_each_chunk(k, 64, ctx, [&](std::size_t, std::size_t b, std::size_t e) {
      for (std::size_t j = b; j < e; ++j) {
#if defined(__GNUC__) || defined(__clang__)
        if (j + cpu::gather_prefetch_ahead < e)
          __builtin_prefetch(x + idx[j + cpu::gather_prefetch_ahead]);
#endif
        float const f = to_float(x[idx[j]]);
        detail::sparse::store_value(v, vals, j, Scaled ? quant::scale_saturated(f, s) : f);
      }
    });
    return total;
  }

  /// Convenience overload for a span (tensor id 0).
  template <element T>
  std::size_t compress(std::span<T const> in, std::span<std::byte> out,
                       codec_context const& ctx = {}) const {
    return compress(tensor_view<T const>(in), out, ctx);
  }

  /// The factor values are multiplied by before sending: n/k rounded to float (1 unscaled).
  [[nodiscard]] static float scale(std::uint64_t n, std::uint64_t k) noexcept {
    return detail::randomk::scale(Scaled, n, k);
  }

  static void validate(packet_header const& h) { detail::randomk::validate(h); }

  /// The values: after the 4-byte check word, in the packet's value type (f32, f16, bf16);
  /// identical headers and check words on ranks sharing the seed and step, so collectives
  /// all-reduce only this section. Validates the packet.
  static gradcomp::value_section value_section(std::span<std::byte const> packet) {
    return detail::randomk::values_of(basic_random_k_codec::inspect(packet));
  }

  /// `out = x̂` (zeros off the support) or `out[i] += alpha * x̂_i` at the coordinates only.
  /// Needs the sender's seed and step in `ctx` (checked by the check word).
  template <element T>
  static void decode_typed(packet_header const& h, std::byte const* payload, T* out, float alpha,
                           bool add, codec_context const& ctx) {
    detail::randomk::check(h, payload, ctx);
    random_stream const rs{ctx.seed, ctx.step, h.param1};
    std::vector<std::uint32_t> const idx = detail::randomk::indices(h.count, h.param0, rs, ctx);
    auto const v = static_cast<sparse_values>(h.variant & 3u);
    std::byte const* vals = payload + 4;
    if (!add) std::fill(out, out + h.count, from_float<T>(0.0f));
    for (std::size_t j = 0; j < idx.size(); ++j) {
      float const val = detail::sparse::value_at(v, vals, j);
      T& o = out[idx[j]];
      o = add ? from_float<T>(std::fma(alpha, val, to_float(o))) : from_float<T>(val);
    }
  }

 private:
  static random_stream stream(codec_context const& ctx, tensor_id t) noexcept {
    return random_stream{ctx.seed, ctx.step, static_cast<std::uint32_t>(t)};
  }

  static void check_size(std::size_t n) { detail::randomk::check_size(n); }

  static void check_values(sparse_values v) {
    if (static_cast<unsigned>(v) > 2)
      throw config_error("gradcomp: sparse value type must be f32, f16 or bf16");
  }

  bool by_ratio_ = true;
  double ratio_ = 0.01;
  std::uint64_t k_ = 0;
  sparse_values values_ = sparse_values::f32;
};

/// Random-k with values sent as is (biased: E[x̂] = (k/n) x).
using random_k_codec = basic_random_k_codec<false>;
/// Random-k with values scaled by n/k (unbiased).
using scaled_random_k_codec = basic_random_k_codec<true>;

/// The ascending coordinates of a random_k packet, regenerated from its header and the
/// receiver's context (seed and step, checked against the packet's check word). Validates the
/// packet; throws `format_error`.
inline std::vector<std::uint32_t> random_k_packet_indices(std::span<std::byte const> packet,
                                                          codec_context const& ctx = {}) {
  packet_header const h = random_k_codec::inspect(packet);
  detail::randomk::check(h, packet.data() + header_bytes, ctx);
  return detail::randomk::indices(h.count, h.param0, random_stream{ctx.seed, ctx.step, h.param1},
                                  ctx);
}

GRADCOMP_NAMESPACE_END
