// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Element-type codecs: `identity_codec` (the tensor as it is), `fp16_codec` and `bf16_codec`
/// (round to nearest even into a 16-bit float, saturating finite values at the format's
/// largest). These are the dense baselines; their packets are summable, and they carry NaN and
/// infinities through unchanged.

#include <gradcomp/codec/detail/codec_base.hpp>
#include <gradcomp/codec/format/cast.hpp>
#include <gradcomp/codec/value_section.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/cpu/kernels/convert.hpp>
#include <gradcomp/cpu/kernels/stream.hpp>
#include <gradcomp/cpu/parallel.hpp>

#include <cstring>
#include <span>

GRADCOMP_NAMESPACE_BEGIN

namespace detail {

// Copies or accumulates n elements of wire dtype `w` at `src` into `dst`; `stream`: a float
// copy uses streaming stores (cpu/kernels/stream.hpp).
template <element T>
void widen_any(dtype w, std::byte const* src, T* dst, std::size_t n, float alpha, bool add,
               cpu::isa level, bool stream = false) {
  if constexpr (std::same_as<T, float>) {
    switch (w) {
      case dtype::f32:
        if (!add && stream) {
          cpu::kernels::stream_copy(reinterpret_cast<std::byte*>(dst), src, n * 4, level);
        } else if (!add) {
          if (n != 0) std::memcpy(dst, src, n * 4);
        } else {
          cpu::kernels::axpy_f32(src, dst, n, alpha, level);
        }
        return;
      case dtype::f16:
        cpu::kernels::widen<cpu::kernels::half_format::f16>(src, dst, n, alpha, add, level, stream);
        return;
      case dtype::bf16:
        cpu::kernels::widen<cpu::kernels::half_format::bf16>(src, dst, n, alpha, add, level, stream);
        return;
    }
  } else {
    if (!add && w == dtype_of<T>) {
      if (n != 0) std::memcpy(static_cast<void*>(dst), src, n * 2);
      return;
    }
    float buf[1024];
    for (std::size_t b = 0; b < n; b += 1024) {
      std::size_t const m = n - b < 1024 ? n - b : 1024;
      widen_any<float>(w, src + (b * dtype_size(w)), buf, m, 1.0f, false, level);
      for (std::size_t i = 0; i < m; ++i) {
        dst[b + i] = add ? from_float<T>(std::fma(alpha, buf[i], to_float(dst[b + i])))
                         : from_float<T>(buf[i]);
      }
    }
  }
}

}  // namespace detail

/// Sends the tensor unchanged in its own element type: 32 (f32) or 16 (f16, bf16) bits per
/// element. Lossless, summable. Payload: n little-endian elements of the header's dtype.
class identity_codec : public detail::codec_base<identity_codec> {
 public:
  static constexpr codec_id id = identity_format::id;
  static constexpr aggregation_kind aggregation = aggregation_kind::summable;
  static constexpr bool unbiased = true;

  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    return identity_format::max_compressed_bytes(n);
  }
  [[nodiscard]] double bits_per_element() const noexcept { return 32.0; }

  packet_header header_for(std::size_t n, dtype t) const noexcept {
    return identity_format::header_for(n, t);
  }
  static void validate(packet_header const& h) { identity_format::validate(h); }
  /// The values: the whole payload, in the packet's element type. Validates the packet.
  static gradcomp::value_section value_section(std::span<std::byte const> packet) {
    packet_header const h = inspect(packet);
    return {header_bytes, static_cast<std::size_t>(h.payload_bytes), h.type};
  }
  template <element T>
  void encode_typed(T const* x, std::size_t n, std::byte* payload, packet_header const&,
                    codec_context const& ctx) const {
    cpu::isa const level = cpu::effective_isa(ctx.isa);
    bool const stream = cpu::stream_output(n * sizeof(T));
    cpu::for_each_chunk(n, 16, ctx, [&](std::size_t, std::size_t b, std::size_t e) {
      auto const* src = reinterpret_cast<std::byte const*>(x + b);
      if (stream) {
        cpu::kernels::stream_copy(payload + b * sizeof(T), src, (e - b) * sizeof(T), level);
      } else {
        std::memcpy(payload + b * sizeof(T), src, (e - b) * sizeof(T));
      }
    });
  }
  template <element T>
  static void decode_typed(packet_header const& h, std::byte const* payload, T* out, float alpha,
                           bool add, codec_context const& ctx) {
    cpu::isa const level = cpu::effective_isa(ctx.isa);
    std::size_t const wsize = dtype_size(h.type);
    bool const stream = !add && cpu::stream_output(h.count * sizeof(T));
    cpu::for_each_chunk(h.count, 16, ctx, [&](std::size_t, std::size_t b, std::size_t e) {
      detail::widen_any<T>(h.type, payload + b * wsize, out + b, e - b, alpha, add, level, stream);
    });
  }
};

/// Rounds each element to a 16-bit float (`Wire` = `dtype::f16` or `dtype::bf16`), nearest
/// even. 16 bits per element, summable, deterministic (not unbiased). Infinities and NaNs are
/// kept; a finite value beyond the format's range saturates to its largest finite value
/// (±65504 for binary16; core/quant/half.hpp), so that error feedback keeps the excess in a
/// finite residual. Payload: n little-endian 16-bit values.
template <dtype Wire>
class half_cast_codec : public detail::codec_base<half_cast_codec<Wire>> {
  static_assert(Wire == dtype::f16 || Wire == dtype::bf16);
  static constexpr auto format =
      Wire == dtype::f16 ? cpu::kernels::half_format::f16 : cpu::kernels::half_format::bf16;

 public:
  static constexpr codec_id id = half_cast_format<Wire>::id;
  static constexpr aggregation_kind aggregation = aggregation_kind::summable;
  static constexpr bool unbiased = false;

  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    return half_cast_format<Wire>::max_compressed_bytes(n);
  }
  [[nodiscard]] double bits_per_element() const noexcept { return 16.0; }

  packet_header header_for(std::size_t n, dtype t) const noexcept {
    return half_cast_format<Wire>::header_for(n, t);
  }
  static void validate(packet_header const& h) { half_cast_format<Wire>::validate(h); }
  /// The values: the whole payload, 16-bit floats of type `Wire`. Validates the packet.
  static gradcomp::value_section value_section(std::span<std::byte const> packet) {
    packet_header const h = half_cast_codec::inspect(packet);
    return {header_bytes, static_cast<std::size_t>(h.payload_bytes), Wire};
  }

  template <element T>
  void encode_typed(T const* x, std::size_t n, std::byte* payload, packet_header const&,
                    codec_context const& ctx) const {
    if constexpr (dtype_of<T> == Wire) {
      if (n != 0) std::memcpy(payload, static_cast<void const*>(x), 2 * n);
    } else if constexpr (std::same_as<T, float>) {
      cpu::isa const level = cpu::effective_isa(ctx.isa);
      bool const stream = cpu::stream_output(2 * n);
      cpu::for_each_chunk(n, 16, ctx, [&](std::size_t, std::size_t b, std::size_t e) {
        cpu::kernels::narrow_saturated<format>(x + b, payload + 2 * b, e - b, level, stream);
      });
    } else {  // the other 16-bit type: convert through float (exact widening)
      for (std::size_t i = 0; i < n; ++i) {
        cpu::kernels::scalar::store_u16(payload + 2 * i,
                                        cpu::kernels::scalar::narrow<format, true>(to_float(x[i])));
      }
    }
  }

  template <element T>
  static void decode_typed(packet_header const& h, std::byte const* payload, T* out, float alpha,
                           bool add, codec_context const& ctx) {
    cpu::isa const level = cpu::effective_isa(ctx.isa);
    if constexpr (std::same_as<T, float>) {
      bool const stream = !add && cpu::stream_output(4 * h.count);
      cpu::for_each_chunk(h.count, 16, ctx, [&](std::size_t, std::size_t b, std::size_t e) {
        cpu::kernels::widen<format>(payload + 2 * b, out + b, e - b, alpha, add, level, stream);
      });
    } else {
      detail::widen_any<T>(Wire, payload, out, h.count, alpha, add, level);
    }
  }

  // Block interface (codec/detail/codec_base.hpp): element by element, any boundaries.
  struct block_scratch {};
  [[nodiscard]] std::size_t block_align(std::size_t) const noexcept { return 16; }
  [[nodiscard]] block_scratch block_begin(std::size_t) const noexcept { return {}; }
  void encode_block(block_scratch&, float const* x, std::size_t, std::size_t b, std::size_t e,
                    std::byte* payload, packet_header const&, random_stream const&,
                    cpu::isa level) const noexcept {
    cpu::kernels::narrow_saturated<format>(x + b, payload + 2 * b, e - b, level);
  }
  void decode_block(block_scratch&, packet_header const&, std::byte const* payload, float* out,
                    std::size_t b, std::size_t e, float alpha, cpu::isa level) const noexcept {
    cpu::kernels::widen<format>(payload + 2 * b, out + b, e - b, alpha, true, level);
  }
};

/// IEEE binary16 codec (see `half_cast_codec`).
using fp16_codec = half_cast_codec<dtype::f16>;
/// bfloat16 codec (see `half_cast_codec`).
using bf16_codec = half_cast_codec<dtype::bf16>;

GRADCOMP_NAMESPACE_END
