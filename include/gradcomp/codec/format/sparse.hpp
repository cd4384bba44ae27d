// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Wire format of the sparsifiers' sparse payload (top-k, approximate top-k, threshold), for
/// every backend: its header fields, layout, validation and error messages, and the element
/// functions both backends use to write and read it. docs/wire-format.md, "Sparse payload",
/// is the specification; in short:
///
/// - header param0 = m; variant bits 0-1 = value type (`sparse_values`), bits 2-3 = index
///   encoding (0 absolute u32, 1 delta bit-packed in param1 = b bits), bits 4-7 zero;
/// - index section: absolute = m little-endian u32; delta = the first index, then the gaps
///   minus one, each in b bits LSB-first, zero-padded to a multiple of 4 bytes;
/// - value section: m values of the value type, little-endian, no padding.
///
/// The encoding is chosen from m and b alone (`plan`): delta when its section is smaller. The
/// CPU codecs (codec/detail/sparse.hpp) and the CUDA codecs (cuda/detail/sparse.cuh) call these
/// functions; they depend on core/ only.

#include <gradcomp/codec/format/common.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/quant/half.hpp>
#include <gradcomp/core/wire.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Value type of a sparse payload (variant bits 0-1).
enum class sparse_values : std::uint8_t {
  f32 = 0,   ///< exact
  f16 = 1,   ///< IEEE binary16, round to nearest even (a finite overflow saturates at ±65504, as
             ///< `fp16_codec`)
  bf16 = 2,  ///< bfloat16, round to nearest even
};

/// Index encoding of a sparse payload (variant bits 2-3).
enum class sparse_index : std::uint8_t {
  absolute = 0,  ///< m × u32
  delta = 1,     ///< first index, then gap - 1, each in param1 bits, LSB-first
};

namespace detail::sparse {

GRADCOMP_HOST_DEVICE constexpr std::uint64_t value_bytes(sparse_values v) noexcept {
  return v == sparse_values::f32 ? 4 : 2;
}

/// Nominal wire bits per element of a sparsifier (`bits_per_element` of the CPU and device
/// codecs): `index_bits` (32 with absolute u32 indices, 0 for random-k, whose coordinates are
/// not sent) plus the value bits, per selected element; for a ratio r, times r (a count means
/// nothing without n, so it gives the cost per selected element).
[[nodiscard]] constexpr double nominal_bits(bool by_ratio, double ratio, sparse_values v, double index_bits) noexcept {
  double const per = index_bits + 8.0 * static_cast<double>(value_bytes(v));
  return by_ratio ? ratio * per : per;
}

/// The sparsifiers' selection size (top-k, approximate top-k, random-k): of n elements, keep
/// min(k, n) for a count, max(1, floor(ratio n)) for a ratio; none of an empty tensor.
[[nodiscard]] inline std::size_t kept_count(bool by_ratio, double ratio, std::uint64_t k, std::size_t n) noexcept {
  if (n == 0) return 0;
  if (!by_ratio) return k < n ? static_cast<std::size_t>(k) : n;
  auto const kept = static_cast<std::size_t>(std::floor(ratio * static_cast<double>(n)));
  return std::clamp<std::size_t>(kept, 1, n);
}

/// Throws `config_error` naming `codec` unless 0 < r <= 1.
inline void check_ratio(double r, char const* codec) {
  if (!(r > 0.0 && r <= 1.0)) {
    throw config_error(std::string("gradcomp: ") + codec + " ratio must be in (0, 1], got " + std::to_string(r));
  }
}

/// Throws `config_error` unless `v` is f32, f16 or bf16.
inline void check_values(sparse_values v) {
  if (static_cast<unsigned>(v) > 2) throw config_error("gradcomp: sparse value type must be f32, f16 or bf16");
}

/// approx_topk's window [lo, hi] of selected counts for a target k and a tolerance
/// (lo >= 1 when k >= 1): ⌈(1 − tol) k⌉ ≤ m ≤ ⌊(1 + tol) k⌋.
[[nodiscard]] inline std::pair<std::uint64_t, std::uint64_t> approx_window(std::uint64_t k,
                                                                          double tolerance) noexcept {
  if (k == 0) return {0, 0};
  auto const kd = static_cast<double>(k);
  auto const lo = static_cast<std::uint64_t>(std::ceil(kd * (1.0 - tolerance) - 1e-9));
  auto const hi = static_cast<std::uint64_t>(std::floor(kd * (1.0 + tolerance) + 1e-9));
  return {std::clamp<std::uint64_t>(lo, 1, k), std::max(hi, k)};
}

/// Throws `config_error` unless approx_topk's sample fraction is in (0, 1] and its tolerance
/// in [0, 1).
inline void check_approx(double sample, double tolerance) {
  if (!(sample > 0.0 && sample <= 1.0)) {
    throw config_error("gradcomp: approx_topk sample fraction must be in (0, 1], got " +
                       std::to_string(sample));
  }
  if (!(tolerance >= 0.0 && tolerance < 1.0)) {
    throw config_error("gradcomp: approx_topk tolerance must be in [0, 1), got " +
                       std::to_string(tolerance));
  }
}

/// Bytes of a delta index section of m entries of b bits (padded to 4 bytes).
GRADCOMP_HOST_DEVICE constexpr std::uint64_t delta_bytes(std::uint64_t m, unsigned b) noexcept {
  return (m * b + 31) / 32 * 4;
}

/// Entry j of the delta encoding of ascending indices `idx`: the first index, then the gap
/// minus one (the bits of all entries, ORed, give the width b).
GRADCOMP_HOST_DEVICE constexpr std::uint32_t delta_entry(std::uint32_t const* idx, std::uint64_t j) noexcept {
  return j == 0 ? idx[0] : idx[j] - idx[j - 1] - 1u;
}

/// The header of a sparse packet over n elements selecting m ascending indices whose delta
/// entries need b bits (`bit_width` of their OR; 0 for m = 0): delta encoding when its section
/// is smaller than the absolute one.
inline packet_header plan(codec_id id, dtype t, std::uint64_t n, std::uint64_t m, unsigned b,
                          sparse_values v) {
  bool const delta = delta_bytes(m, b) < 4 * m;
  std::uint64_t const ib = delta ? delta_bytes(m, b) : 4 * m;
  return {id, t,
          static_cast<std::uint8_t>(static_cast<unsigned>(v) | (delta ? 4u : 0u)),
          n, ib + m * value_bytes(v), static_cast<std::uint32_t>(m), delta ? b : 0u};
}

/// Whether a validated header uses the delta encoding.
GRADCOMP_HOST_DEVICE constexpr bool is_delta(std::uint8_t variant) noexcept { return (variant >> 2) == 1; }

/// Bytes of the index section of a validated header.
GRADCOMP_HOST_DEVICE constexpr std::uint64_t index_bytes(std::uint8_t variant, std::uint64_t m,
                                                        std::uint32_t width) noexcept {
  return is_delta(variant) ? delta_bytes(m, width) : 4 * m;
}

/// 32-bit word w (little-endian) of the delta index section of `idx` (m entries of b bits,
/// LSB-first): entries may straddle words, bits past m b are zero.
GRADCOMP_HOST_DEVICE constexpr std::uint32_t delta_word(std::uint32_t const* idx, std::uint64_t m,
                                                        unsigned b, std::uint64_t w) noexcept {
  if (b == 0) return 0;
  std::uint64_t const lo = 32 * w, hi = lo + 32;  // bit range of the word
  std::uint64_t j = lo / b;
  std::uint32_t word = 0;
  for (; j < m && j * b < hi; ++j) {
    std::uint64_t const at = j * b;  // first bit of entry j
    std::uint64_t const e = delta_entry(idx, j);
    word |= at >= lo ? static_cast<std::uint32_t>(e << (at - lo))
                     : static_cast<std::uint32_t>(e >> (lo - at));
  }
  return word;
}

/// Entry j of a delta index section `p` of b bits (b <= 32).
GRADCOMP_HOST_DEVICE inline std::uint64_t read_delta_entry(std::byte const* p, std::uint64_t j,
                                                           unsigned b) noexcept {
  if (b == 0) return 0;
  std::uint64_t const at = j * b;
  std::uint64_t const first = at / 8;
  std::uint64_t const last = (at + b - 1) / 8;
  std::uint64_t acc = 0;
  for (std::uint64_t o = first; o <= last; ++o) acc |= std::uint64_t{static_cast<unsigned char>(p[o])} << (8 * (o - first));
  acc >>= at % 8;
  return acc & (~std::uint64_t{0} >> (64 - b));
}

/// Whether the bits of a delta section `p` of m entries of b bits past its entries are zero.
GRADCOMP_HOST_DEVICE inline bool delta_padding_clear(std::byte const* p, std::uint64_t m, unsigned b) noexcept {
  std::uint64_t const used = m * b, total = 8 * delta_bytes(m, b);
  for (std::uint64_t bit = used; bit < total;) {
    std::uint64_t const o = bit / 8;
    unsigned const from = static_cast<unsigned>(bit % 8);
    if ((static_cast<unsigned>(p[o]) >> from) != 0) return false;
    bit = 8 * (o + 1);
  }
  return true;
}

/// The bits of value `f` in a value section of type `v` (f16 and bf16 round to nearest even
/// and saturate a finite value beyond their range: core/quant/half.hpp).
GRADCOMP_HOST_DEVICE constexpr std::uint32_t value_bits(sparse_values v, float f) noexcept {
  return v == sparse_values::f16    ? quant::half_bits_saturated(f)
         : v == sparse_values::bf16 ? quant::bfloat16_bits_saturated(f)
                                    : gradcomp::detail::bit_cast<std::uint32_t>(f);
}

/// Writes value j of a value section, rounded to the value type.
GRADCOMP_HOST_DEVICE inline void store_value(sparse_values v, std::byte* vals, std::uint64_t j, float f) noexcept {
  std::uint32_t const bits = value_bits(v, f);
  if (v == sparse_values::f32) {
    store_le<std::uint32_t>(vals + 4 * j, bits);
  } else {
    store_le<std::uint16_t>(vals + 2 * j, static_cast<std::uint16_t>(bits));
  }
}

/// Value j of a validated packet's value section.
GRADCOMP_HOST_DEVICE inline float value_at(sparse_values v, std::byte const* vals, std::uint64_t j) noexcept {
  switch (v) {
    case sparse_values::f16: return half_bits_to_float(load_le<std::uint16_t>(vals + 2 * j));
    case sparse_values::bf16: return bfloat16_bits_to_float(load_le<std::uint16_t>(vals + 2 * j));
    default: return gradcomp::detail::bit_cast<float>(load_le<std::uint32_t>(vals + 4 * j));
  }
}

/// Checks the header fields and payload size of a sparse packet; throws `format_error`.
inline void validate(packet_header const& h) {
  std::string const who = std::string("gradcomp: ") + codec_name(h.codec) + " packet ";
  if ((h.variant & 3u) > 2 || (h.variant >> 2) > 1) {
    throw format_error(who + "has variant " + std::to_string(h.variant) +
                       " (value type must be 0..2, index encoding 0..1, bits 4-7 zero)");
  }
  std::uint64_t const m = h.param0;
  if (m > h.count) {
    throw format_error(who + "selects " + std::to_string(m) + " of " + std::to_string(h.count) +
                       " elements");
  }
  bool const delta = (h.variant >> 2) == 1;
  if (delta ? h.param1 > 32 : h.param1 != 0) {
    throw format_error(who + "has index width " + std::to_string(h.param1) +
                       (delta ? " (expected 0..32)" : " (expected 0 for absolute indices)"));
  }
  std::uint64_t const ib = delta ? delta_bytes(m, h.param1) : 4 * m;
  expect_payload(h, ib + m * value_bytes(static_cast<sparse_values>(h.variant & 3u)));
}

/// The `format_error` of index `at` at position i of a packet whose indices are not strictly
/// ascending and below its element count.
[[noreturn]] inline void throw_bad_index(packet_header const& h, std::uint64_t i, std::uint64_t at) {
  throw format_error(std::string("gradcomp: ") + codec_name(h.codec) + " packet has index " +
                     std::to_string(at) + " at position " + std::to_string(i) +
                     " (indices must be strictly ascending and below " + std::to_string(h.count) + ")");
}

/// The `format_error` of a delta index section whose padding bits are not zero.
[[noreturn]] inline void throw_bad_padding(packet_header const& h) {
  throw format_error(std::string("gradcomp: ") + codec_name(h.codec) +
                     " packet has non-zero padding after its delta-coded indices");
}

/// Reads the m ascending indices of a validated topk, approx_topk or threshold packet (u32 or
/// delta-coded) at `p` into `idx`; `format_error` for an index out of order or range, or
/// non-zero padding.
inline void read_indices(packet_header const& h, std::byte const* p, std::vector<std::uint32_t>& idx) {
  std::size_t const m = h.param0;
  idx.resize(m);
  auto bad = [&](std::size_t i, std::uint64_t at) { throw_bad_index(h, i, at); };
  if ((h.variant >> 2) == 1) {
    unsigned const b = h.param1;
    std::uint64_t const mask = b == 0 ? 0 : (~std::uint64_t{0} >> (64 - b));
    std::uint64_t acc = 0;
    unsigned fill = 0;
    std::size_t o = 0;
    std::uint64_t pos = 0;
    for (std::size_t i = 0; i < m; ++i) {
      while (fill < b) {
        acc |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[o++])) << fill;
        fill += 8;
      }
      std::uint64_t const e = acc & mask;
      acc = b == 0 ? acc : acc >> b;
      fill -= b;
      pos = i == 0 ? e : pos + e + 1;
      if (pos >= h.count) bad(i, pos);
      idx[i] = static_cast<std::uint32_t>(pos);
    }
    std::size_t const ib = static_cast<std::size_t>(delta_bytes(m, b));
    bool nonzero = acc != 0;
    while (o < ib) nonzero |= p[o++] != std::byte{0};
    if (nonzero) throw_bad_padding(h);
  } else {
    for (std::size_t i = 0; i < m; ++i) {
      std::uint32_t const at = load_le<std::uint32_t>(p + 4 * i);
      if (at >= h.count || (i > 0 && at <= idx[i - 1])) bad(i, at);
      idx[i] = at;
    }
  }
}

/// Whether packets of codec `id` carry the sparse payload of this file (topk, approx_topk,
/// threshold).
constexpr bool is_sparse_payload(codec_id id) noexcept {
  return id == codec_id::topk || id == codec_id::approx_topk || id == codec_id::threshold;
}

}  // namespace detail::sparse

GRADCOMP_NAMESPACE_END
