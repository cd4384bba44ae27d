// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The CPU side of the sparse payload shared by the sparsifiers (top-k, threshold): m ascending
/// indices, then m values. Its header fields, validation and element functions are the
/// backend-neutral ones of codec/format/sparse.hpp; docs/wire-format.md, "Sparse payload", is
/// the specification; in short:
///
/// - header param0 = m; variant bits 0-1 = value type (`sparse_values`), bits 2-3 = index
///   encoding (0 absolute u32, 1 delta bit-packed in param1 = b bits), bits 4-7 zero;
/// - index section: absolute = m little-endian u32; delta = the first index, then the gaps
///   minus one, each in b bits LSB-first, zero-padded to a multiple of 4 bytes;
/// - value section: m values of the value type, little-endian, no padding.
///
/// A codec derives from `sparse_codec_base<Self>` and supplies
/// `void select(float const* x, std::size_t n, std::vector<std::uint32_t>& idx,
/// codec_context const&) const` (ascending indices; throws `numeric_error`) and
/// `sparse_values value_type() const`. A codec that can also return the selected values
/// (`select(x, n, idx, values, ctx)`, values[j] = x[idx[j]]) has them used by the writer,
/// which then need not gather them from x.

#include <gradcomp/codec/detail/codec_base.hpp>
#include <gradcomp/codec/format/sparse.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/quant/half.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

namespace detail::sparse {

/// Bits per entry of the delta encoding of ascending `idx` (0 for an empty list).
inline unsigned delta_width(std::vector<std::uint32_t> const& idx) noexcept {
  if (idx.empty()) return 0;
  std::uint32_t acc = idx[0];
  for (std::size_t i = 1; i < idx.size(); ++i) acc |= idx[i] - idx[i - 1] - 1u;
  return bit_width(acc);
}

/// The header of a sparse packet of `idx` (ascending, each < n) over n elements.
inline packet_header plan(codec_id id, dtype t, std::uint64_t n,
                          std::vector<std::uint32_t> const& idx, sparse_values v) {
  return plan(id, t, n, idx.size(), delta_width(idx), v);
}

/// Writes the index section of the payload of `h` (from `plan`) for `idx`; returns its size.
inline std::size_t write_indices(std::byte* p, packet_header const& h, std::vector<std::uint32_t> const& idx) {
  std::size_t const m = idx.size();
  std::size_t ib = 4 * m;
  if ((h.variant >> 2) == 1) {
    unsigned const b = h.param1;
    ib = static_cast<std::size_t>(delta_bytes(m, b));
    std::uint64_t acc = 0;
    unsigned fill = 0;
    std::size_t o = 0;
    std::uint32_t prev = 0;
    for (std::size_t i = 0; i < m; ++i) {
      std::uint32_t const e = i == 0 ? idx[0] : idx[i] - prev - 1u;
      prev = idx[i];
      acc |= static_cast<std::uint64_t>(e) << fill;
      fill += b;
      while (fill >= 8) {
        p[o++] = static_cast<std::byte>(acc & 0xffu);
        acc >>= 8;
        fill -= 8;
      }
    }
    if (fill > 0) p[o++] = static_cast<std::byte>(acc & 0xffu);
    while (o < ib) p[o++] = std::byte{0};
  } else {
    for (std::size_t i = 0; i < m; ++i) store_le<std::uint32_t>(p + 4 * i, idx[i]);
  }
  return ib;
}

/// Writes the payload of `h` (from `plan`): the indices `idx` and the values `value(j)` of
/// idx[j].
template <class Value>
void write_with(std::byte* p, packet_header const& h, std::vector<std::uint32_t> const& idx,
                Value const& value) {
  std::size_t const m = idx.size();
  auto const v = static_cast<sparse_values>(h.variant & 3u);
  std::byte* vals = p + write_indices(p, h, idx);
  switch (v) {
    case sparse_values::f32:
      for (std::size_t i = 0; i < m; ++i) store_f32(vals + 4 * i, value(i));
      break;
    case sparse_values::f16:
      for (std::size_t i = 0; i < m; ++i)
        store_le<std::uint16_t>(vals + 2 * i, quant::half_bits_saturated(value(i)));
      break;
    case sparse_values::bf16:
      for (std::size_t i = 0; i < m; ++i)
        store_le<std::uint16_t>(vals + 2 * i, quant::bfloat16_bits_saturated(value(i)));
      break;
  }
}

/// Writes the payload of `h` (from `plan`): the indices `idx` and the values `x[idx]`.
inline void write(std::byte* p, packet_header const& h, std::vector<std::uint32_t> const& idx,
                  float const* x) {
  write_with(p, h, idx, [&](std::size_t j) { return x[idx[j]]; });
}

/// Writes the payload of `h` (from `plan`): the indices `idx` and their values `v` (v[j] is
/// the value of idx[j]).
inline void write_values(std::byte* p, packet_header const& h, std::vector<std::uint32_t> const& idx,
                         std::vector<float> const& v) {
  write_with(p, h, idx, [&](std::size_t j) { return v[j]; });
}

}  // namespace detail::sparse

namespace detail {

/// Front end of the sparsifiers: selection by the codec, then the sparse payload. The packet
/// size depends on the data, so `compress` plans the header after selecting.
template <class Self>
class sparse_codec_base : public codec_base<Self> {
 public:
  static constexpr aggregation_kind aggregation = aggregation_kind::gather;
  static constexpr bool unbiased = false;

  /// Compresses `in` into `out` (at least `max_compressed_bytes(in.size())` bytes, or the
  /// exact packet size) and returns the packet size.
  template <element T>
  std::size_t compress(tensor_view<T const> in, std::span<std::byte> out,
                       codec_context const& ctx = {}) const {
    Self const& self = static_cast<Self const&>(*this);
    std::size_t const n = in.size();
    if (n > UINT32_MAX) {
      throw config_error(std::string("gradcomp: ") + codec_name(Self::id) + " handles at most " +
                         std::to_string(UINT32_MAX) + " elements per tensor, got " + std::to_string(n));
    }
    float const* x = nullptr;
    std::vector<float> tmp;
    if constexpr (std::same_as<T, float>) {
      x = in.data();
    } else {
      tmp.resize(n);
      for (std::size_t i = 0; i < n; ++i) tmp[i] = to_float(in[i]);
      x = tmp.data();
    }
    std::vector<std::uint32_t> idx;
    std::vector<float> vals;  // filled by a codec whose selection also returns the values
    constexpr bool with_values = requires { self.select(x, n, idx, vals, ctx); };
    if constexpr (with_values) {
      self.select(x, n, idx, vals, ctx);
    } else {
      self.select(x, n, idx, ctx);
    }
    packet_header const h = sparse::plan(Self::id, dtype_of<T>, n, idx, self.value_type());
    std::uint64_t const total = h.packet_bytes();
    check_room(Self::id, n, total, out.size());
    write_header(out, h);
    if constexpr (with_values) {
      sparse::write_values(out.data() + header_bytes, h, idx, vals);
    } else {
      sparse::write(out.data() + header_bytes, h, idx, x);
    }
    return static_cast<std::size_t>(total);
  }

  /// Convenience overload for a span (tensor id 0).
  template <element T>
  std::size_t compress(std::span<T const> in, std::span<std::byte> out,
                       codec_context const& ctx = {}) const {
    return compress(tensor_view<T const>(in), out, ctx);
  }

  static void validate(packet_header const& h) { sparse::validate(h); }

  /// `out = x̂` (zeros off the support) or `out[i] += alpha * x̂_i` at the indices only.
  template <element T>
  static void decode_typed(packet_header const& h, std::byte const* payload, T* out, float alpha,
                           bool add, codec_context const&) {
    std::vector<std::uint32_t> idx;
    sparse::read_indices(h, payload, idx);
    auto const v = static_cast<sparse_values>(h.variant & 3u);
    bool const delta = (h.variant >> 2) == 1;
    std::byte const* vals =
        payload + (delta ? sparse::delta_bytes(idx.size(), h.param1) : 4 * idx.size());
    if (!add) {
      for (std::size_t i = 0; i < h.count; ++i) out[i] = from_float<T>(0.0f);
    }
    for (std::size_t j = 0; j < idx.size(); ++j) {
      float const val = sparse::value_at(v, vals, j);
      T& o = out[idx[j]];
      o = add ? from_float<T>(std::fma(alpha, val, to_float(o))) : from_float<T>(val);
    }
  }
};

}  // namespace detail

GRADCOMP_NAMESPACE_END
