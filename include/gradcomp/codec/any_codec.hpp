// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Run-time codec choice: `any_codec` (type erasure over any `codec`), `make_codec` (from a
/// text spec such as "qsgd:levels=15,bucket=256"), and `decompress_any` (decode a packet of
/// whatever codec wrote it, from its header).

#include <gradcomp/codec/approx_topk.hpp>
#include <gradcomp/codec/budget.hpp>
#include <gradcomp/codec/cast.hpp>
#include <gradcomp/codec/dithering.hpp>
#include <gradcomp/codec/chunk_topk.hpp>
#include <gradcomp/codec/dct_sign.hpp>
#include <gradcomp/codec/int4.hpp>
#include <gradcomp/codec/int8.hpp>
#include <gradcomp/codec/natural.hpp>
#include <gradcomp/codec/onebit.hpp>
#include <gradcomp/codec/powersgd.hpp>
#include <gradcomp/codec/randomk.hpp>
#include <gradcomp/codec/threshold.hpp>
#include <gradcomp/codec/topk.hpp>
#include <gradcomp/codec/value_section.hpp>
#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/spec.hpp>

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

GRADCOMP_NAMESPACE_BEGIN

/// A codec chosen at run time. Copyable (shares the immutable codec); satisfies
/// `codec_operations`, so it composes with error feedback like a static codec.
class any_codec {
 public:
  /// Wraps codec `c`.
  template <codec C>
  any_codec(C c) : impl_(std::make_shared<model<C>>(std::move(c))) {}  // NOLINT(implicit)

  [[nodiscard]] codec_id id() const noexcept { return impl_->id(); }
  [[nodiscard]] aggregation_kind aggregation() const noexcept { return impl_->aggregation(); }
  [[nodiscard]] bool unbiased() const noexcept { return impl_->unbiased(); }
  [[nodiscard]] char const* name() const noexcept { return codec_name(impl_->id()); }
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const { return impl_->max_bytes(n); }
  [[nodiscard]] double bits_per_element() const { return impl_->bits(); }

  /// Whether the codec is a sparsifier with a selection size (`with_budget` works).
  [[nodiscard]] bool has_budget() const noexcept { return impl_->has_budget(); }
  /// The same codec with selection size `b` (codec/budget.hpp); `config_error` for a codec
  /// without one (only top-k, approximate top-k and random-k have it).
  [[nodiscard]] any_codec with_budget(sparse_budget b) const {
    if (!impl_->has_budget()) {
      throw config_error(std::string("gradcomp: codec '") + name() +
                         "' has no selection size to set (with_budget takes topk, approx_topk and "
                         "randomk codecs)");
    }
    return any_codec(impl_->with_budget(b));
  }

  template <element T>
  std::size_t compress(tensor_view<T const> in, std::span<std::byte> out, codec_context const& ctx = {}) const {
    return impl_->compress(in, out, ctx);
  }
  template <element T>
  void decompress(std::span<std::byte const> packet, std::span<T> out, codec_context const& ctx = {}) const {
    impl_->decode(packet, out, 1.0f, false, ctx);
  }
  template <element T>
  void decompress_add(std::span<std::byte const> packet, std::span<T> out, float alpha = 1.0f,
                      codec_context const& ctx = {}) const {
    impl_->decode(packet, out, alpha, true, ctx);
  }
  /// Whether the held codec fuses error feedback with compression (`fused_feedback_codec`).
  [[nodiscard]] bool fusable() const noexcept { return impl_->fusable(); }
  /// The held codec's `compress_fused` (concepts/codec.hpp); `config_error` when it has none.
  std::size_t compress_fused(float* x, std::size_t n, tensor_id id, std::span<std::byte> out,
                             block_fill const& fill, block_fill const& refill, float alpha,
                             codec_context const& ctx = {}) const {
    return impl_->compress_fused(x, n, id, out, fill, refill, alpha, ctx);
  }

  /// The held codec's value section of `packet` (codec/value_section.hpp); `config_error` when
  /// the held codec declares none.
  [[nodiscard]] gradcomp::value_section value_section(std::span<std::byte const> packet) const {
    return impl_->section(packet);
  }

 private:
  struct interface {
    virtual ~interface() = default;
    virtual codec_id id() const noexcept = 0;
    virtual aggregation_kind aggregation() const noexcept = 0;
    virtual bool unbiased() const noexcept = 0;
    virtual std::size_t max_bytes(std::size_t) const = 0;
    virtual double bits() const = 0;
    virtual bool has_budget() const noexcept = 0;
    virtual std::shared_ptr<interface const> with_budget(sparse_budget) const = 0;
    virtual std::size_t compress(tensor_view<float const>, std::span<std::byte>, codec_context const&) const = 0;
    virtual std::size_t compress(tensor_view<half const>, std::span<std::byte>, codec_context const&) const = 0;
    virtual std::size_t compress(tensor_view<bfloat16 const>, std::span<std::byte>, codec_context const&) const = 0;
    virtual void decode(std::span<std::byte const>, std::span<float>, float, bool, codec_context const&) const = 0;
    virtual void decode(std::span<std::byte const>, std::span<half>, float, bool, codec_context const&) const = 0;
    virtual void decode(std::span<std::byte const>, std::span<bfloat16>, float, bool, codec_context const&) const = 0;
    virtual gradcomp::value_section section(std::span<std::byte const>) const = 0;
    virtual bool fusable() const noexcept = 0;
    virtual std::size_t compress_fused(float*, std::size_t, tensor_id, std::span<std::byte>, block_fill const&,
                                       block_fill const&, float, codec_context const&) const = 0;
  };

  template <class C>
  struct model final : interface {
    explicit model(C c) : c_(std::move(c)) {}
    codec_id id() const noexcept override { return C::id; }
    aggregation_kind aggregation() const noexcept override { return C::aggregation; }
    bool unbiased() const noexcept override { return C::unbiased; }
    std::size_t max_bytes(std::size_t n) const override { return c_.max_compressed_bytes(n); }
    double bits() const override { return c_.bits_per_element(); }
    bool has_budget() const noexcept override { return requires(C const& c, sparse_budget b) { c.with_budget(b); }; }
    std::shared_ptr<interface const> with_budget(sparse_budget b) const override {
      if constexpr (requires { c_.with_budget(b); }) {
        return std::make_shared<model<C>>(c_.with_budget(b));
      } else {
        return nullptr;
      }
    }
    std::size_t compress(tensor_view<float const> v, std::span<std::byte> o, codec_context const& x) const override { return c_.compress(v, o, x); }
    std::size_t compress(tensor_view<half const> v, std::span<std::byte> o, codec_context const& x) const override { return c_.compress(v, o, x); }
    std::size_t compress(tensor_view<bfloat16 const> v, std::span<std::byte> o, codec_context const& x) const override { return c_.compress(v, o, x); }
    void decode(std::span<std::byte const> p, std::span<float> o, float a, bool add, codec_context const& x) const override { add ? c_.decompress_add(p, o, a, x) : c_.decompress(p, o, x); }
    void decode(std::span<std::byte const> p, std::span<half> o, float a, bool add, codec_context const& x) const override { add ? c_.decompress_add(p, o, a, x) : c_.decompress(p, o, x); }
    void decode(std::span<std::byte const> p, std::span<bfloat16> o, float a, bool add, codec_context const& x) const override { add ? c_.decompress_add(p, o, a, x) : c_.decompress(p, o, x); }
    gradcomp::value_section section(std::span<std::byte const> p) const override {
      if constexpr (requires { { c_.value_section(p) } -> std::same_as<gradcomp::value_section>; }) {
        return c_.value_section(p);
      } else {
        throw config_error(std::string("gradcomp: codec '") + codec_name(C::id) + "' (" +
                           aggregation_name(C::aggregation) +
                           ") declares no value section; only codecs whose packets are summed in the "
                           "compressed domain (summable, shared support) have one");
      }
    }
    bool fusable() const noexcept override {
      if constexpr (fused_feedback_codec<C>) {
        return c_.fusable();
      } else {
        return false;
      }
    }
    std::size_t compress_fused(float* x, std::size_t n, tensor_id id, std::span<std::byte> o, block_fill const& fill,
                               block_fill const& refill, float alpha, codec_context const& ctx) const override {
      if constexpr (fused_feedback_codec<C>) {
        if (c_.fusable()) return c_.compress_fused(x, n, id, o, fill, refill, alpha, ctx);
      }
      throw config_error(std::string("gradcomp: codec '") + codec_name(C::id) +
                         "' does not fuse error feedback with compression (fusable() is false)");
    }
    C c_;
  };

  explicit any_codec(std::shared_ptr<interface const> impl) noexcept : impl_(std::move(impl)) {}

  std::shared_ptr<interface const> impl_;
};

/// Builds a codec from a spec `name[:key=value[,key=value...]]`:
/// `identity`, `fp16`, `bf16`, `int8:bucket=512,rounding=nearest|stochastic`, `int4:bucket=64`,
/// `onebit:scaling=mean_abs|none`, `qsgd:levels=7,bucket=512`, `terngrad:bucket=512`,
/// `natural:bucket=512`, `dithering:levels=2,partition=linear|natural,norm=max|l2,bucket=512`,
/// `chunk_topk:chunk=4096,k=64,values=f32|f16|bf16|int2|int4`,
/// `dct_sign:chunk=64,k=8`,
/// `topk:k=1000` or `topk:ratio=0.01` (exactly one of the two) with `values=f32|f16|bf16`,
/// `threshold:value=0.5,values=f32|f16|bf16`,
/// `randomk:ratio=0.01,scale=false|true,values=f32|f16|bf16` (or `k=`; also `random_k:`),
/// `approx_topk:ratio=0.01,sample=0.001,tolerance=0.1,values=f32|f16|bf16` (or `k=`).
/// Unknown names, keys or values raise `config_error` (grammar and messages: `spec_options`,
/// core/spec.hpp); so does `powersgd`, which is stateful and shaped (use `make_powersgd`, codec/powersgd.hpp; `decompress_any` decodes its packets).
inline any_codec make_codec(std::string_view spec) {
  spec_options opts(spec, "codec");
  std::string const& name = opts.name();
  auto num = [&](std::string_view key, std::uint32_t dflt) {
    return static_cast<std::uint32_t>(opts.count(key, dflt, UINT32_MAX));
  };
  auto real = [&](std::string_view key, double dflt) { return opts.number(key, dflt); };
  auto finish = [&](any_codec c) {
    opts.finish();
    return c;
  };
  auto choose = [&](std::string_view key, std::initializer_list<std::string_view> allowed) {
    return opts.choice(key, allowed);
  };
  if (name == "identity") return finish(identity_codec{});
  if (name == "fp16") return finish(fp16_codec{});
  if (name == "bf16") return finish(bf16_codec{});
  if (name == "int8") {
    std::uint32_t const b = num("bucket", 512);
    unsigned const r = choose("rounding", {"nearest", "stochastic"});
    return finish(int8_codec(b, r == 0 ? int8_rounding::nearest : int8_rounding::stochastic));
  }
  if (name == "int4") return finish(int4_codec(num("bucket", 64)));
  if (name == "onebit") {
    unsigned const s = choose("scaling", {"mean_abs", "none"});
    return finish(onebit_codec(s == 1 ? onebit_codec::scaling::none : onebit_codec::scaling::mean_abs));
  }
  if (name == "qsgd") {
    std::uint32_t const l = num("levels", 7);
    return finish(qsgd_codec(l, num("bucket", 512)));
  }
  if (name == "terngrad") return finish(terngrad_codec(num("bucket", 512)));
  if (name == "natural") return finish(natural_codec(num("bucket", 512)));
  if (name == "dithering") {
    std::uint32_t const l = num("levels", 2);
    unsigned const part = choose("partition", {"linear", "natural"});
    unsigned const norm = choose("norm", {"max", "l2"});
    std::uint32_t const b = num("bucket", 512);
    return finish(dithering_codec(l, part == 1 ? dither_partition::natural : dither_partition::linear,
                                  norm == 1 ? dither_norm::l2 : dither_norm::max, b));
  }
  if (name == "chunk_topk") {
    std::uint32_t const chunk = num("chunk", 4096);
    std::uint32_t const k = num("k", 64);
    unsigned const v = choose("values", {"f32", "f16", "bf16", "int2", "int4"});
    return finish(chunk_topk_codec(chunk, k, static_cast<chunk_values>(v)));
  }
  if (name == "dct_sign") {
    std::uint32_t const chunk = num("chunk", 64);
    return finish(dct_sign_codec(chunk, num("k", 8)));
  }
  auto values = [&] {
    unsigned const v = choose("values", {"f32", "f16", "bf16"});
    return v == 1 ? sparse_values::f16 : v == 2 ? sparse_values::bf16 : sparse_values::f32;
  };
  if (name == "topk") {
    bool const has_k = opts.has("k"), has_r = opts.has("ratio");
    if (has_k == has_r) throw config_error("gradcomp: codec 'topk' needs exactly one of k or ratio");
    sparse_values const v = values();
    if (has_k) return finish(topk_codec::count(num("k", 0), v));
    double const r = real("ratio", 0.0);
    return finish(topk_codec::ratio(r, v));
  }
  if (name == "threshold") {
    if (!opts.has("value")) throw config_error("gradcomp: codec 'threshold' needs value=");
    sparse_values const v = values();
    double const t = real("value", 0.0);
    return finish(threshold_codec(static_cast<float>(t), v));
  }
  if (name == "powersgd") {
    throw config_error("gradcomp: codec 'powersgd' keeps per-tensor state (its warm-start Q) and needs "
                       "each tensor's matrix shape, so it is not an any_codec; build it with "
                       "gradcomp::make_powersgd(\"" + std::string(spec) + "\") (codec/powersgd.hpp)");
  }
  if (name == "randomk" || name == "random_k") {
    bool const has_k = opts.has("k"), has_r = opts.has("ratio");
    if (has_k && has_r) throw config_error("gradcomp: codec 'randomk' takes k or ratio, not both");
    bool const scaled = choose("scale", {"false", "true"}) == 1;
    sparse_values const v = values();
    if (scaled) {
      if (has_k) return finish(scaled_random_k_codec::count(num("k", 0), v));
      return finish(scaled_random_k_codec::ratio(real("ratio", 0.01), v));
    }
    if (has_k) return finish(random_k_codec::count(num("k", 0), v));
    return finish(random_k_codec::ratio(real("ratio", 0.01), v));
  }
  if (name == "approx_topk") {
    bool const has_k = opts.has("k"), has_r = opts.has("ratio");
    if (has_k && has_r) throw config_error("gradcomp: codec 'approx_topk' takes k or ratio, not both");
    double const sample = real("sample", 0.001);
    double const tol = real("tolerance", 0.1);
    sparse_values const v = values();
    if (has_k) return finish(approx_topk_codec::count(num("k", 0), sample, tol, v));
    return finish(approx_topk_codec::ratio(real("ratio", 0.01), sample, tol, v));
  }
  throw config_error("gradcomp: unknown codec '" + std::string(name) +
                     "' (expected identity, fp16, bf16, int8, int4, onebit, qsgd, terngrad, natural, dithering, "
                     "topk, chunk_topk, dct_sign, threshold, randomk or approx_topk)");
}

/// Decodes `packet` whatever codec wrote it (read from its header) into `out`, or adds `alpha`
/// times it when `add`. random_k packets need the sender's seed and step in `ctx`.
template <element T>
void decompress_any(std::span<std::byte const> packet, std::span<T> out, float alpha = 1.0f,
                    bool add = false, codec_context const& ctx = {}) {
  packet_header const h = read_header(packet);
  auto run = [&](auto const& c) { add ? c.decompress_add(packet, out, alpha, ctx) : c.decompress(packet, out, ctx); };
  switch (h.codec) {
    case codec_id::identity: return run(identity_codec{});
    case codec_id::fp16: return run(fp16_codec{});
    case codec_id::bf16: return run(bf16_codec{});
    case codec_id::int8: return run(int8_codec{});
    case codec_id::int4: return run(int4_codec{});
    case codec_id::chunk_topk: return run(chunk_topk_codec{});
    case codec_id::dct_sign: return run(dct_sign_codec{});
    case codec_id::onebit: return run(onebit_codec{});
    case codec_id::qsgd: return run(qsgd_codec{});
    case codec_id::terngrad: return run(terngrad_codec{});
    case codec_id::natural: return run(natural_codec{});
    case codec_id::dithering: return run(dithering_codec{});
    case codec_id::topk: return run(topk_codec{});
    case codec_id::threshold: return run(threshold_codec{});
    case codec_id::random_k: return run(random_k_codec{});  // decodes scaled packets too
    case codec_id::approx_topk: return run(approx_topk_codec{});
    case codec_id::powersgd:  // stateless decoding of a stateful codec's packet
      return add ? powersgd::decompress_add(packet, out, alpha, ctx) : powersgd::decompress(packet, out, ctx);
  }
  throw format_error("gradcomp: packet has unknown codec id " + std::to_string(static_cast<unsigned>(h.codec)));
}

/// The codec types `make_codec` builds, one `X(type)` each. `GRADCOMP_EXTERN_TEMPLATES`
/// (config.hpp) declares their `any_codec` erasures here and <gradcomp/instantiate.hpp> makes
/// them; a codec added to `make_codec` is added here too.
#define GRADCOMP_DETAIL_MAKE_CODEC_TYPES(X)                                                       \
  X(identity_codec) X(fp16_codec) X(bf16_codec) X(int8_codec) X(int4_codec) X(onebit_codec)       \
  X(qsgd_codec) X(terngrad_codec) X(natural_codec) X(dithering_codec) X(chunk_topk_codec)         \
  X(dct_sign_codec) X(topk_codec) X(threshold_codec) X(random_k_codec) X(scaled_random_k_codec)   \
  X(approx_topk_codec)

#if GRADCOMP_EXTERN_TEMPLATES
#  define GRADCOMP_DETAIL_EXTERN_CODEC_MODEL(C) extern template struct any_codec::model<C>;
GRADCOMP_DETAIL_MAKE_CODEC_TYPES(GRADCOMP_DETAIL_EXTERN_CODEC_MODEL)
#  undef GRADCOMP_DETAIL_EXTERN_CODEC_MODEL
#endif

GRADCOMP_NAMESPACE_END
