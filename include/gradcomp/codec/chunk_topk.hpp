// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `chunk_topk_codec`: chunk-wise top-k. The tensor is cut into chunks of C elements (C a power
/// of two); each chunk keeps its k largest magnitudes (ties to the lower index), sent as indices
/// of log2(C) bits inside the chunk and values as f32, f16, bf16, or 2-/4-bit sign-magnitude
/// codes with one step per chunk (SparseLoCo's chunk-wise top-k with 2-bit values; DeMo selects
/// per chunk as well). Against a global top-k: the selection is local (no tensor-wide
/// threshold), every chunk gets the same share of the budget, and an index costs log2(C) bits
/// instead of log2(n).
///
/// With f32 values the kept elements are exact and the rest decode to 0, so the error is the
/// mass of the dropped elements, each at most the chunk's k-th largest magnitude. With b-bit
/// codes and m the chunk's largest magnitude, step = m / 2^(b-1): a kept value v decodes to
/// ±(j + 1) step, within step / 2 of v when |v| >= step / 2 (within step otherwise) and with
/// its sign; m itself is exact.
///
/// The wire format is `chunk_topk_format` (codec/format/chunk_topk.hpp). Selection and packing
/// are scalar and independent of the ISA level and thread count (chunks are encoded in groups
/// of 8, whose sections start on byte boundaries). Per-rank supports differ: packets are
/// gathered (aggregation kind gather).

#include <gradcomp/codec/detail/codec_base.hpp>
#include <gradcomp/codec/format/chunk_topk.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/quant/half.hpp>
#include <gradcomp/core/quant/int4.hpp>
#include <gradcomp/cpu/isa.hpp>
#include <gradcomp/cpu/kernels/dct.hpp>
#include <gradcomp/cpu/parallel.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// Calls `keep(i)` in ascending i for the `kc` largest of `mag[0, L)` (ties to the lower
/// index); `work` holds L scratch values; `level` picks the kernels of short rows (the result
/// is the same at every level). For finite floats, `mag` = their bits with the sign
/// cleared orders them by magnitude.
template <class Keep>
void for_each_top(std::uint32_t const* mag, std::size_t L, std::size_t kc, std::uint32_t* work,
                  cpu::isa level, Keep&& keep) {
  // Speed only: both branches find the same t and ties, so the kept set is the same.
  constexpr std::size_t small_select = 256;
  // The kc-th largest t: every mag > t is kept, then the first (kc - #greater) equal to t.
  std::uint32_t t = 0;
  std::size_t equal_left = L;
  if (kc < L && L <= small_select && level == cpu::isa::avx512) {
    // Short rows (DeMo's chunks of 64): t found bit by bit, 16 keys a comparison, with no
    // data-dependent branch (the scalar form of that search is slower than the histogram).
    std::size_t greater = 0;
    t = cpu::kernels::kth_largest_key(mag, L, kc, greater, level);
    equal_left = kc - greater;
  } else if (kc < L) {
    // The exponent byte (bits 23..30) whose bin holds the kc-th largest; only that bin's
    // elements go through nth_element.
    std::size_t hist[256] = {};
    for (std::size_t i = 0; i < L; ++i) ++hist[(mag[i] >> 23) & 0xff];
    std::size_t above = 0;
    unsigned bin = 255;
    while (above + hist[bin] < kc) above += hist[bin--];  // stops: the bins hold L > kc
    std::size_t m = 0;
    for (std::size_t i = 0; i < L; ++i) {
      if (((mag[i] >> 23) & 0xff) == bin) work[m++] = mag[i];
    }
    std::size_t const r = kc - above;  // 1 <= r <= hist[bin]
    std::nth_element(work, work + (r - 1), work + m, std::greater<>());
    t = work[r - 1];
    std::size_t greater = above;
    for (std::size_t i = 0; i < m; ++i) greater += work[i] > t ? 1 : 0;
    equal_left = kc - greater;
  }
  for (std::size_t i = 0; i < L; ++i) {
    bool take = mag[i] > t;
    if (!take && mag[i] == t && equal_left > 0) {
      take = true;
      --equal_left;
    }
    if (take) keep(i);
  }
}

}  // namespace detail

/// Chunk-wise top-k codec (see file comment).
class chunk_topk_codec : public detail::codec_base<chunk_topk_codec> {
 public:
  static constexpr codec_id id = codec_id::chunk_topk;
  static constexpr aggregation_kind aggregation = aggregation_kind::gather;
  static constexpr bool unbiased = false;

  /// Keeps `k` of every `chunk` elements (chunk a power of two in 2..65536, 1 <= k <= chunk),
  /// values of type `values`; `config_error` otherwise.
  explicit chunk_topk_codec(std::uint32_t chunk = 4096, std::uint32_t k = 64,
                            chunk_values values = chunk_values::f32)
      : f_(chunk_topk_format::checked(chunk, k, values)) {}
  [[nodiscard]] std::uint32_t chunk() const noexcept { return f_.chunk; }
  [[nodiscard]] std::uint32_t k() const noexcept { return f_.k; }
  [[nodiscard]] chunk_values values() const noexcept { return f_.values; }

  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    return f_.max_compressed_bytes(n);
  }
  [[nodiscard]] double bits_per_element() const noexcept { return f_.bits_per_element(); }
  packet_header header_for(std::size_t n, dtype t) const { return f_.header_for(n, t); }
  static void validate(packet_header const& h) { chunk_topk_format::validate(h); }
  /// The wire format of this codec's packets.
  [[nodiscard]] chunk_topk_format wire_format() const noexcept { return f_; }

  void encode(float const* x, std::size_t n, std::byte* payload, packet_header const&,
              random_stream const&, codec_context const& ctx) const {
    std::uint32_t const C = f_.chunk, k = f_.k;
    chunk_values const v = f_.values;
    unsigned const vb = chunk_topk_format::value_bits(v), ib = chunk_topk_format::index_bits(C);
    std::byte* const steps = payload;
    std::byte* const vals = payload + chunk_topk_format::values_offset(C, v, n);
    std::byte* const idx = payload + chunk_topk_format::indices_offset(C, k, v, n);
    // Groups of 8 chunks: each group's sections start on a byte boundary.
    cpu::isa const level = cpu::effective_isa(ctx.isa);
    cpu::for_each_chunk(n, std::size_t{8} * C, ctx, [&](std::size_t, std::size_t gb, std::size_t ge) {
      std::vector<std::uint32_t> mag(C), work(C);
      std::uint64_t const j0 = gb / C * k;  // first value of the group
      detail::bit_writer wv{vals + j0 * vb / 8};
      detail::bit_writer wi{idx + j0 * ib / 8};
      for (std::size_t b = gb; b < ge; b += C) {
        std::size_t const e = std::min<std::size_t>(ge, b + C);
        encode_chunk(x, b, e, mag, work, steps, wv, wi, level);
      }
      wv.flush();
      wi.flush();
    });
  }

  static void decode(packet_header const& h, std::byte const* payload, float* out, float alpha,
                     bool add, codec_context const& ctx) {
    std::size_t const n = h.count;
    std::uint32_t const C = h.param0, k = h.param1;
    auto const v = static_cast<chunk_values>(h.variant);
    unsigned const vb = chunk_topk_format::value_bits(v), ib = chunk_topk_format::index_bits(C);
    std::byte const* const vals = payload + chunk_topk_format::values_offset(C, v, n);
    std::byte const* const idx = payload + chunk_topk_format::indices_offset(C, k, v, n);
    auto groups = [&](auto&& per_chunk) {
      cpu::for_each_chunk(n, std::size_t{8} * C, ctx, [&](std::size_t, std::size_t gb, std::size_t ge) {
        std::uint64_t const j0 = gb / C * k;
        detail::bit_reader rv{vals + j0 * vb / 8};
        detail::bit_reader ri{idx + j0 * ib / 8};
        for (std::size_t b = gb; b < ge; b += C) {
          std::size_t const e = std::min<std::size_t>(ge, b + C);
          per_chunk(b, e, rv, ri);
        }
      });
    };
    // Pass 1 checks everything, so a malformed packet leaves `out` as it was.
    groups([&](std::size_t b, std::size_t e, detail::bit_reader& rv, detail::bit_reader& ri) {
      std::size_t const kc = std::min<std::size_t>(k, e - b);
      if (chunk_topk_format::quantized(v)) {
        float const step = detail::load_f32(payload + 4 * (b / C));
        if (!chunk_topk_format::valid_step(step, vb)) {
          throw format_error("gradcomp: chunk_topk packet has step " + std::to_string(step) +
                             " at chunk " + std::to_string(b / C) +
                             " (expected finite, 0 <= step <= FLT_MAX / 2^(bits-1))");
        }
      }
      std::uint32_t prev = 0;
      for (std::size_t t = 0; t < kc; ++t) {
        std::uint32_t const i = ri.get(ib);
        std::uint32_t const raw = rv.get(vb);
        if ((t > 0 && i <= prev) || i >= e - b) {
          throw format_error("gradcomp: chunk_topk packet has index " + std::to_string(i) +
                             " after " + std::to_string(prev) + " in chunk " + std::to_string(b / C) +
                             " of " + std::to_string(e - b) +
                             " elements (expected strictly ascending indices inside the chunk)");
        }
        prev = i;
        if (!chunk_topk_format::quantized(v) && !std::isfinite(value_of(v, raw, 0.0f))) {
          throw format_error("gradcomp: chunk_topk packet has a non-finite value at chunk " +
                             std::to_string(b / C));
        }
      }
    });
    groups([&](std::size_t b, std::size_t e, detail::bit_reader& rv, detail::bit_reader& ri) {
      std::size_t const kc = std::min<std::size_t>(k, e - b);
      float const step = chunk_topk_format::quantized(v) ? detail::load_f32(payload + 4 * (b / C)) : 0.0f;
      if (!add) std::fill(out + b, out + e, 0.0f);
      for (std::size_t t = 0; t < kc; ++t) {
        std::size_t const i = b + ri.get(ib);
        float const x = value_of(v, rv.get(vb), step);
        out[i] = add ? std::fma(alpha, x, out[i]) : x;
      }
    });
  }

 private:
  /// The decoded value of a value field `raw` (the chunk's `step` for codes).
  static float value_of(chunk_values v, std::uint32_t raw, float step) noexcept {
    switch (v) {
      case chunk_values::f16: return half_bits_to_float(static_cast<std::uint16_t>(raw));
      case chunk_values::bf16: return bfloat16_bits_to_float(static_cast<std::uint16_t>(raw));
      case chunk_values::int2: return quant::magnitude_value(static_cast<std::uint8_t>(raw), step, 2);
      case chunk_values::int4: return quant::magnitude_value(static_cast<std::uint8_t>(raw), step, 4);
      case chunk_values::f32: break;
    }
    return std::bit_cast<float>(raw);
  }

  /// Selects and writes chunk [b, e): its step (codes), values and indices.
  void encode_chunk(float const* x, std::size_t b, std::size_t e, std::vector<std::uint32_t>& mag,
                    std::vector<std::uint32_t>& work, std::byte* steps, detail::bit_writer& wv,
                    detail::bit_writer& wi, cpu::isa level) const {
    std::size_t const L = e - b;
    std::size_t const kc = std::min<std::size_t>(f_.k, L);
    chunk_values const v = f_.values;
    unsigned const vb = chunk_topk_format::value_bits(v), ib = chunk_topk_format::index_bits(f_.chunk);
    // |x| as bits: for finite floats their order is the order of the magnitudes.
    std::uint32_t top = 0;
    for (std::size_t i = 0; i < L; ++i) {
      std::uint32_t const a = std::bit_cast<std::uint32_t>(x[b + i]) & 0x7fffffffu;
      if (a >= 0x7f800000u) detail::throw_nonfinite(id, b + i, x[b + i]);
      mag[i] = a;
      top = a > top ? a : top;
    }
    float step = 0.0f, inv = 0.0f;
    if (chunk_topk_format::quantized(v)) {
      float const m = std::bit_cast<float>(top);
      step = quant::magnitude_step(m, vb);
      inv = quant::magnitude_inverse(m, vb);
      detail::store_f32(steps + 4 * (b / f_.chunk), step);
    }
    detail::for_each_top(mag.data(), L, kc, work.data(), level, [&](std::size_t i) {
      float const xv = x[b + i];
      std::uint32_t raw;
      switch (v) {
        case chunk_values::f16: raw = quant::half_bits_saturated(xv); break;
        case chunk_values::bf16: raw = quant::bfloat16_bits_saturated(xv); break;
        case chunk_values::int2:
        case chunk_values::int4: raw = quant::magnitude_code(xv, inv, vb); break;
        case chunk_values::f32:
        default: raw = std::bit_cast<std::uint32_t>(xv); break;
      }
      wv.put(raw, vb);
      wi.put(static_cast<std::uint32_t>(i), ib);
    });
  }

  chunk_topk_format f_;
};

GRADCOMP_NAMESPACE_END
