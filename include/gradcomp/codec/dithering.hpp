// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Unbiased stochastic quantizers that share one kernel (random dithering):
///
/// - `qsgd_codec` (Alistarh et al. 2017): s linear levels of the per-bucket L2 norm;
/// - `terngrad_codec` (Wen et al. 2017): levels {-1, 0, 1} of the per-bucket max |x|;
/// - `dithering_codec` (Horváth et al., "Natural compression"; BytePS "dithering"): linear or
///   natural (powers of two) levels, max or L2 normalisation.
///
/// The wire format is in codec/format/dither.hpp (`qsgd_format`, `terngrad_format`,
/// `dithering_format`), the element math and the canonical norm order in
/// core/quant/dither.hpp. Randomness: 16-bit draws of the stream keyed by (seed, step, tensor
/// id) (core/philox.hpp), so packets do not depend on threads, ISA or backend.

#include <gradcomp/codec/detail/codec_base.hpp>
#include <gradcomp/codec/format/dither.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/cpu/kernels/dither.hpp>
#include <gradcomp/cpu/kernels/stream.hpp>
#include <gradcomp/cpu/parallel.hpp>
#include <gradcomp/cpu/tuning.hpp>

#include <atomic>
#include <cmath>
#include <numeric>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

namespace detail {

// Scale of bucket [b, e) from canonical blocks computed sequentially.
inline float dither_bucket_scale(float const* x, std::size_t b, std::size_t e, dither_norm norm,
                                 cpu::isa level) {
  if (norm == dither_norm::max) {
    float m = 0.0f;
    for (std::size_t s = b; s < e; s += cpu::kernels::norm_block) {
      std::size_t const len = e - s < cpu::kernels::norm_block ? e - s : cpu::kernels::norm_block;
      float const bm = cpu::kernels::block_absmax(x + s, len, level);
      if (std::isnan(bm)) return NAN;
      m = bm > m ? bm : m;
    }
    return m;
  }
  double const sum = cpu::kernels::canonical_sumsq(x + b, e - b, level);
  if (!std::isfinite(sum)) return NAN;
  return static_cast<float>(std::sqrt(sum));
}

[[noreturn]] inline void throw_bad_scale(codec_id id, float const* x, std::size_t b, std::size_t e) {
  std::size_t const bad = b + first_nonfinite(x + b, e - b);
  if (bad < e) throw_nonfinite(id, bad, x[bad]);
  throw_norm_overflow(id, b);
}

inline void dither_encode(codec_id id, dither_config const& cfg, float const* x, std::size_t n,
                          std::byte* payload, random_stream const& rs, codec_context const& ctx) {
  std::size_t const blen = cfg.bucket_len(n);
  std::size_t const nb = cfg.buckets(n);
  auto const shape = cfg.shape();
  std::vector<cpu::kernels::dither_bucket> kb(nb);
  std::byte* codes = payload + 4 * nb;
  cpu::isa const level = cpu::effective_isa(ctx.isa);

  auto set_bucket = [&](std::size_t k, float scale) {
    std::size_t const b = k * blen;
    std::size_t const e = b + blen < n ? b + blen : n;
    if (!(scale <= FLT_MAX)) throw_bad_scale(id, x, b, e);
    store_f32(payload + 4 * k, scale);
    kb[k] = cpu::kernels::make_dither_bucket(scale, shape);
  };

  std::size_t const align = std::lcm(blen, std::size_t{128});
  if (align <= (std::size_t{1} << 20)) {
    // One pass: each chunk normalises its own buckets (in cache) and then quantizes them.
    std::vector<float> scales(blen <= cpu::kernels::norm_block ? nb : 0);
    cpu::for_each_chunk(n, align, ctx, [&](std::size_t, std::size_t cb, std::size_t ce) {
      if (blen <= cpu::kernels::norm_block) {
        // A bucket is one canonical block: all the chunk's scales in one kernel call.
        cpu::kernels::bucket_scales(x, cb, ce, blen, cfg.norm == dither_norm::l2, scales.data() + cb / blen,
                                    level, 4 * n <= cpu::interleaved_norms_max_bytes);
        for (std::size_t b = cb; b < ce; b += blen) set_bucket(b / blen, scales[b / blen]);
      } else {
        for (std::size_t b = cb; b < ce; b += blen) {
          std::size_t const e = b + blen < ce ? b + blen : ce;
          set_bucket(b / blen, dither_bucket_scale(x, b, e, cfg.norm, level));
        }
      }
      cpu::kernels::dither_encode(x, cb, ce, blen, kb.data(), shape, rs, codes, level);
    });
    return;
  }
  // Large buckets: norms from parallel canonical blocks, then quantize in parallel.
  std::size_t const blocks_per_bucket = (blen + cpu::kernels::norm_block - 1) / cpu::kernels::norm_block;
  std::vector<double> part(nb * blocks_per_bucket, 0.0);
  auto block_task = [&](std::size_t t) {
    std::size_t const k = t / blocks_per_bucket;
    std::size_t const s = k * blen + (t % blocks_per_bucket) * cpu::kernels::norm_block;
    std::size_t const bucket_end = k * blen + blen < n ? k * blen + blen : n;
    if (s >= bucket_end) return;
    std::size_t const len = bucket_end - s < cpu::kernels::norm_block ? bucket_end - s : cpu::kernels::norm_block;
    part[t] = cfg.norm == dither_norm::l2 ? cpu::kernels::block_sumsq(x + s, len, level)
                                          : static_cast<double>(cpu::kernels::block_absmax(x + s, len, level));
  };
  if (n >= ctx.parallel_threshold) {
    ctx.threads().run(part.size(), block_task);
  } else {
    for (std::size_t t = 0; t < part.size(); ++t) block_task(t);
  }
  for (std::size_t k = 0; k < nb; ++k) {
    double acc = 0.0;
    bool bad = false;
    for (std::size_t j = 0; j < blocks_per_bucket; ++j) {
      double const v = part[k * blocks_per_bucket + j];
      bad |= std::isnan(v);
      acc = cfg.norm == dither_norm::l2 ? acc + v : (v > acc ? v : acc);
    }
    float scale = NAN;
    if (!bad && std::isfinite(acc)) {
      scale = cfg.norm == dither_norm::l2 ? static_cast<float>(std::sqrt(acc)) : static_cast<float>(acc);
    }
    set_bucket(k, scale);
  }
  cpu::for_each_chunk(n, 128, ctx, [&](std::size_t, std::size_t cb, std::size_t ce) {
    cpu::kernels::dither_encode(x, cb, ce, blen, kb.data(), shape, rs, codes, level);
  });
}

inline void dither_decode(codec_id id, dither_config const& cfg, packet_header const& h,
                          std::byte const* payload, float* out, float alpha, bool add,
                          codec_context const& ctx) {
  std::size_t const n = h.count;
  std::size_t const blen = cfg.bucket_len(n);
  std::size_t const nb = cfg.buckets(n);
  auto const shape = cfg.shape();
  std::vector<float> steps(nb);
  for (std::size_t k = 0; k < nb; ++k) {
    float const scale = load_f32(payload + 4 * k);
    check_dither_scale(id, k, scale);
    steps[k] = cpu::kernels::make_dither_bucket(scale, shape).step;
  }
  std::byte const* codes = payload + 4 * nb;
  std::uint64_t const bits = static_cast<std::uint64_t>(n) * shape.width;
  if (bits % 8 != 0) check_dither_padding(id, n, shape.width, codes[bits / 8]);
  std::atomic<bool> ok{true};
  cpu::isa const level = cpu::effective_isa(ctx.isa);
  bool const stream = !add && cpu::stream_output(4 * n);
  cpu::for_each_chunk(n, 16, ctx, [&](std::size_t, std::size_t b, std::size_t e) {
    if (!cpu::kernels::dither_decode(codes, b, e, blen, steps.data(), shape, out, alpha, add, level,
                                     stream)) {
      ok.store(false, std::memory_order_relaxed);
    }
  });
  if (!ok.load()) throw_bad_dither_code(id, cfg.s);
}

template <class Self>
class dither_codec_base : public codec_base<Self> {
 public:
  static constexpr aggregation_kind aggregation = aggregation_kind::gather;
  static constexpr bool unbiased = true;

  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    return wire_format().max_compressed_bytes(n);
  }
  [[nodiscard]] double bits_per_element() const noexcept {
    return wire_format().bits_per_element();
  }

  packet_header header_for(std::size_t n, dtype t) const { return wire_format().header_for(n, t); }

  static void validate(packet_header const& h) {
    dither_packets<typename Self::format_type>::validate(h);
  }
  /// The wire format of this codec's packets.
  [[nodiscard]] auto wire_format() const noexcept {
    return dither_packets<typename Self::format_type>{self().config()};
  }

  void encode(float const* x, std::size_t n, std::byte* payload, packet_header const&,
              random_stream const& rs, codec_context const& ctx) const {
    dither_encode(Self::id, self().config(), x, n, payload, rs, ctx);
  }

  static void decode(packet_header const& h, std::byte const* payload, float* out, float alpha,
                     bool add, codec_context const& ctx) {
    dither_decode(Self::id, Self::format_type::config_of(h), h, payload, out, alpha, add, ctx);
  }

  // Block interface (codec/detail/codec_base.hpp): blocks of whole buckets and whole
  // 128-element random groups (byte-aligned codes for every width); each bucket's scale from
  // the same canonical blocks as `encode`.
  struct block_scratch {
    std::vector<cpu::kernels::dither_bucket> kb;  // encode's bucket constants, by bucket
    std::vector<float> steps;                     // decode's, by bucket
  };
  [[nodiscard]] std::size_t block_align(std::size_t n) const noexcept {
    return std::lcm(self().config().bucket_len(n), std::size_t{128});
  }
  [[nodiscard]] block_scratch block_begin(std::size_t n) const {
    std::size_t const nb = self().config().buckets(n);
    return {std::vector<cpu::kernels::dither_bucket>(nb), std::vector<float>(nb)};
  }
  void encode_block(block_scratch& s, float const* x, std::size_t n, std::size_t b, std::size_t e,
                    std::byte* payload, packet_header const&, random_stream const& rs,
                    cpu::isa level) const {
    dither_config const cfg = self().config();
    std::size_t const blen = cfg.bucket_len(n);
    auto const shape = cfg.shape();
    for (std::size_t k0 = b; k0 < e; k0 += blen) {
      std::size_t const k1 = k0 + blen < n ? k0 + blen : n;
      float const scale = dither_bucket_scale(x, k0, k1, cfg.norm, level);
      if (!(scale <= FLT_MAX)) throw_bad_scale(Self::id, x, k0, k1);
      store_f32(payload + 4 * (k0 / blen), scale);
      s.kb[k0 / blen] = cpu::kernels::make_dither_bucket(scale, shape);
    }
    cpu::kernels::dither_encode(x, b, e, blen, s.kb.data(), shape, rs, payload + 4 * cfg.buckets(n), level);
  }
  void decode_block(block_scratch& s, packet_header const& h, std::byte const* payload, float* out,
                    std::size_t b, std::size_t e, float alpha, cpu::isa level) const {
    dither_config const cfg = self().config();
    std::size_t const blen = cfg.bucket_len(h.count);
    auto const shape = cfg.shape();
    for (std::size_t k0 = b; k0 < e; k0 += blen) {
      s.steps[k0 / blen] = cpu::kernels::make_dither_bucket(load_f32(payload + 4 * (k0 / blen)), shape).step;
    }
    // the packet is the one just written: every code is one its bucket can hold
    (void)cpu::kernels::dither_decode(payload + 4 * cfg.buckets(h.count), b, e, blen, s.steps.data(), shape, out,
                                      alpha, true, level);
  }

 private:
  Self const& self() const noexcept { return static_cast<Self const&>(*this); }
};

}  // namespace detail

/// QSGD: per bucket of `bucket` elements (0 = whole tensor), x̂ = ‖v‖₂ · sign(x) · q/s with q a
/// stochastic rounding of s|x|/‖v‖₂. Unbiased; E‖x̂ − x‖² ≤ min(d/s², √d/s)·‖v‖² per bucket
/// of d elements. Header: param0 = s, param1 = bucket, variant 0.
class qsgd_codec : public detail::dither_codec_base<qsgd_codec> {
 public:
  using format_type = qsgd_format;
  static constexpr codec_id id = format_type::id;

  /// `levels` = s in [1, 32767]; `bucket` elements per norm (0 = whole tensor).
  explicit qsgd_codec(std::uint32_t levels = 7, std::uint32_t bucket = 512)
      : cfg_(format_type::configure(levels, bucket)) {}
  [[nodiscard]] detail::dither_config config() const noexcept { return cfg_; }
  [[nodiscard]] std::uint32_t levels() const noexcept { return cfg_.s; }
  [[nodiscard]] std::uint32_t bucket() const noexcept { return cfg_.bucket; }

 private:
  detail::dither_config cfg_;
};

/// TernGrad: per bucket, x̂ ∈ {−m, 0, m} with m = max|x| and P(|x̂| = m) = |x|/m. Unbiased,
/// 2 bits per element. Header: param0 = 1, param1 = bucket, variant 0.
class terngrad_codec : public detail::dither_codec_base<terngrad_codec> {
 public:
  using format_type = terngrad_format;
  static constexpr codec_id id = format_type::id;

  /// `bucket` elements per scale (0 = whole tensor, the paper's layer-wise scale).
  explicit terngrad_codec(std::uint32_t bucket = 512) : cfg_(format_type::configure(bucket)) {}
  [[nodiscard]] detail::dither_config config() const noexcept { return cfg_; }
  [[nodiscard]] std::uint32_t bucket() const noexcept { return cfg_.bucket; }

 private:
  detail::dither_config cfg_;
};

/// Random dithering with linear or natural levels and max or L2 normalisation (BytePS
/// "dithering"; BytePS normalises the whole partition, which is `bucket = 0`). Unbiased.
/// Header: param0 = s, param1 = bucket, variant bit 0 = natural, bit 1 = L2.
class dithering_codec : public detail::dither_codec_base<dithering_codec> {
 public:
  using format_type = dithering_format;
  static constexpr codec_id id = format_type::id;

  /// `levels` = s (linear: 1..32767, natural: 1..30).
  explicit dithering_codec(std::uint32_t levels = 2, dither_partition partition = dither_partition::linear,
                           dither_norm norm = dither_norm::max, std::uint32_t bucket = 512)
      : cfg_(format_type::configure(levels, partition, norm, bucket)) {}
  [[nodiscard]] detail::dither_config config() const noexcept { return cfg_; }

 private:
  detail::dither_config cfg_;
};

GRADCOMP_NAMESPACE_END
