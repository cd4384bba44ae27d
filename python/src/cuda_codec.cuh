// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of cuda_codec.hpp: `device_codec::make` reads a codec spec as `make_codec`
// does (which checks it first, so a bad spec gets the CPU's message) and holds the CUDA codec
// of the same parameters; each call binds it to the caller's stream as a
// `gradcomp::cuda::stream_codec` (include/gradcomp/cuda/collective.cuh), the codec interface of
// the CPU codecs over device spans, whose workspace is allocated and freed stream-ordered on
// that stream.
//
// It defines non-inline functions, so one translation unit of a program includes it:
// cuda_codec.cu in the extension (Thrust's CUDA system), tests/cuda/python_codec_host.cu in its
// test (Thrust's CPP system: the same code on the host, compared with the CPU codecs byte for
// byte). To keep the extension's compile time small, this is the
// only place the device codecs are instantiated for it: the codecs below, each for float32,
// float16 and bfloat16, compress, decompress and decompress-add.
//
// Not carried (a config_error names them): approx_topk (whose CPU codec falls back to exact
// top-k on one tensor anyway), powersgd (stateful and shaped: the CPU `Codec` only) and
// dct_sign (no CUDA version yet).

#include "cuda_codec.hpp"

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/spec.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/cuda/cast.cuh>
#include <gradcomp/cuda/chunk_topk.cuh>
#include <gradcomp/cuda/collective.cuh>
#include <gradcomp/cuda/dithering.cuh>
#include <gradcomp/cuda/int4.cuh>
#include <gradcomp/cuda/int8.cuh>
#include <gradcomp/cuda/natural.cuh>
#include <gradcomp/cuda/onebit.cuh>
#include <gradcomp/cuda/randomk.cuh>
#include <gradcomp/cuda/threshold.cuh>
#include <gradcomp/cuda/topk.cuh>

#include <memory>
#include <span>
#include <type_traits>
#include <string>
#include <utility>
#include <variant>

namespace gradcomp_python {
namespace cuda_codec_detail {

namespace gc = ::gradcomp;
namespace gcu = ::gradcomp::cuda;

using any_device_codec =
    std::variant<gcu::identity_codec, gcu::fp16_codec, gcu::bf16_codec, gcu::int8_codec, gcu::int4_codec, gcu::onebit_codec,
                 gcu::qsgd_codec, gcu::terngrad_codec, gcu::natural_codec, gcu::dithering_codec, gcu::topk_codec,
                 gcu::threshold_codec, gcu::random_k_codec, gcu::scaled_random_k_codec, gcu::chunk_topk_codec>;

inline constexpr char const* carried =
    "identity, fp16, bf16, int8, int4, onebit, qsgd, terngrad, natural, dithering, topk, threshold, randomk, chunk_topk";

// The CUDA codec of a spec make_codec has accepted: the same options, read the same way.
inline any_device_codec parse(std::string const& spec) {
  gc::spec_options opts(spec, "codec");
  std::string const name = opts.name();
  auto num = [&](std::string_view key, std::uint32_t dflt) {
    return static_cast<std::uint32_t>(opts.count(key, dflt, UINT32_MAX));
  };
  auto values = [&] {
    unsigned const v = opts.choice("values", {"f32", "f16", "bf16"});
    return v == 1 ? gc::sparse_values::f16 : v == 2 ? gc::sparse_values::bf16 : gc::sparse_values::f32;
  };
  if (name == "identity") return gcu::identity_codec{};
  if (name == "fp16") return gcu::fp16_codec{};
  if (name == "bf16") return gcu::bf16_codec{};
  if (name == "int8") {
    std::uint32_t const b = num("bucket", 512);
    unsigned const r = opts.choice("rounding", {"nearest", "stochastic"});
    return gcu::int8_codec(b, r == 0 ? gc::int8_rounding::nearest : gc::int8_rounding::stochastic);
  }
  if (name == "int4") return gcu::int4_codec(num("bucket", 64));
  if (name == "onebit") {
    unsigned const s = opts.choice("scaling", {"mean_abs", "none"});
    return gcu::onebit_codec(s == 1 ? gcu::onebit_codec::scaling::none : gcu::onebit_codec::scaling::mean_abs);
  }
  if (name == "qsgd") {
    std::uint32_t const l = num("levels", 7);
    return gcu::qsgd_codec(l, num("bucket", 512));
  }
  if (name == "terngrad") return gcu::terngrad_codec(num("bucket", 512));
  if (name == "natural") return gcu::natural_codec(num("bucket", 512));
  if (name == "dithering") {
    std::uint32_t const l = num("levels", 2);
    unsigned const part = opts.choice("partition", {"linear", "natural"});
    unsigned const norm = opts.choice("norm", {"max", "l2"});
    std::uint32_t const b = num("bucket", 512);
    return gcu::dithering_codec(l, part == 1 ? gc::dither_partition::natural : gc::dither_partition::linear,
                                norm == 1 ? gc::dither_norm::l2 : gc::dither_norm::max, b);
  }
  if (name == "chunk_topk") {
    std::uint32_t const chunk = num("chunk", 4096);
    std::uint32_t const k = num("k", 64);
    unsigned const v = opts.choice("values", {"f32", "f16", "bf16", "int2", "int4"});
    return gcu::chunk_topk_codec(chunk, k, static_cast<gc::chunk_values>(v));
  }
  if (name == "topk") {
    gc::sparse_values const v = values();
    if (opts.has("k")) return gcu::topk_codec::count(num("k", 0), v);
    return gcu::topk_codec::ratio(opts.number("ratio", 0.0), v);
  }
  if (name == "threshold") {
    gc::sparse_values const v = values();
    return gcu::threshold_codec(static_cast<float>(opts.number("value", 0.0)), v);
  }
  if (name == "randomk" || name == "random_k") {
    bool const has_k = opts.has("k");
    bool const scaled = opts.choice("scale", {"false", "true"}) == 1;
    gc::sparse_values const v = values();
    if (scaled) {
      if (has_k) return gcu::scaled_random_k_codec::count(num("k", 0), v);
      return gcu::scaled_random_k_codec::ratio(opts.number("ratio", 0.01), v);
    }
    if (has_k) return gcu::random_k_codec::count(num("k", 0), v);
    return gcu::random_k_codec::ratio(opts.number("ratio", 0.01), v);
  }
  throw gc::config_error("gradcomp: codec '" + name + "' has no CUDA implementation in the Python package; on CUDA "
                         "tensors it takes " + std::string(carried) + " (compress a CPU tensor instead)");
}

// `f` of the n elements at `p` as a span of the element type `t` names (V: void or void const).
template <class V, class F>
decltype(auto) with_type(value_type t, V* p, std::size_t n, F&& f) {
  constexpr bool read_only = std::is_const_v<V>;
  auto as = [&]<class T>() {
    using E = std::conditional_t<read_only, T const, T>;
    return std::span<E>(static_cast<E*>(p), n);
  };
  switch (t) {
    case value_type::f16: return f(as.template operator()<gc::half>());
    case value_type::bf16: return f(as.template operator()<gc::bfloat16>());
    case value_type::f32: break;
  }
  return f(as.template operator()<float>());
}

class device_codec_impl final : public device_codec {
 public:
  explicit device_codec_impl(any_device_codec c) : codec_(std::move(c)) {}

  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const override {
    return std::visit([&](auto const& c) { return c.max_compressed_bytes(n); }, codec_);
  }

  std::size_t compress(value_type type, void const* in, std::size_t n, std::byte* out, std::size_t capacity,
                       device_call const& call) const override {
    gc::codec_context ctx;
    ctx.seed = call.seed;
    ctx.step = call.step;
    return std::visit(
        [&](auto const& c) {
          gcu::stream_codec sc(c, static_cast<cudaStream_t>(call.stream));
          return with_type(type, in, n, [&](auto s) {
            using T = std::remove_const_t<typename decltype(s)::element_type>;
            return sc.compress(gc::tensor_view<T const>(s, static_cast<gc::tensor_id>(call.tensor)),
                               std::span<std::byte>(out, capacity), ctx);
          });
        },
        codec_);
  }

  void decompress(std::byte const* packet, std::size_t bytes, value_type type, void* out, std::size_t n, bool add,
                  float alpha, device_call const& call) const override {
    gc::codec_context ctx;
    ctx.seed = call.seed;
    ctx.step = call.step;
    std::span<std::byte const> const p(packet, bytes);
    std::visit(
        [&](auto const& c) {
          gcu::stream_codec sc(c, static_cast<cudaStream_t>(call.stream));
          with_type(type, out, n, [&](auto o) {
            if (add) sc.decompress_add(p, o, alpha, ctx);
            else sc.decompress(p, o, ctx);
            return 0;
          });
        },
        codec_);
  }

 private:
  any_device_codec codec_;
};

}  // namespace cuda_codec_detail

std::unique_ptr<device_codec> device_codec::make(std::string const& spec) {
  (void)::gradcomp::make_codec(spec);  // the CPU's checks and messages for a bad spec
  return std::make_unique<cuda_codec_detail::device_codec_impl>(cuda_codec_detail::parse(spec));
}

std::string device_codec_names() { return cuda_codec_detail::carried; }

}  // namespace gradcomp_python
