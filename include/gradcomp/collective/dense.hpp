// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The dense baselines every compressed collective is measured against: a float32 all-reduce,
/// and a 16-bit one that rounds the gradient to binary16 or bfloat16 (nearest even), sums in
/// that type, and widens the result.
///
/// Precision of the 16-bit sums: the communicator adds one peer at a time and rounds each
/// partial sum to 16 bits, as NCCL and MPI do for 16-bit types. With W ranks the result carries
/// the rounding of the inputs (relative 2^-11 for binary16, 2^-8 for bfloat16) plus up to W-1
/// roundings of partial sums; binary16 partial sums beyond 65504 overflow to infinity (scale the
/// loss, or use bfloat16 or float32). Averaging scales the widened sum, after the reduction.

#include <gradcomp/codec/cast.hpp>
#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/config.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Element type of a dense all-reduce.
enum class dense_format : std::uint8_t {
  f32 = 0,   ///< float32, exact sums in rank order
  f16 = 1,   ///< IEEE binary16
  bf16 = 2,  ///< bfloat16
};

/// Name of a dense format ("f32", "f16", "bf16").
constexpr char const* dense_format_name(dense_format f) noexcept {
  switch (f) {
    case dense_format::f32: return "f32";
    case dense_format::f16: return "f16";
    case dense_format::bf16: return "bf16";
  }
  return "unknown";
}

namespace detail {

inline std::uint64_t dense_fingerprint(dense_format f, std::size_t n, reduction op) {
  return fingerprint{}.add("dense").add(static_cast<std::uint64_t>(f)).add(n).add(static_cast<std::uint64_t>(op)).value();
}

// Dense all-reduce without the agreement round (the caller has agreed on n and f).
template <communicator Comm>
std::size_t dense_payload(Comm& comm, std::span<float const> grad, std::span<float> out, dense_format f,
                          float alpha, codec_context const& ctx) {
  std::size_t const n = out.size();
  if (f == dense_format::f32) {
    if (grad.empty()) {
      std::fill(out.begin(), out.end(), 0.0f);
    } else if (grad.data() != out.data()) {
      std::memmove(out.data(), grad.data(), n * sizeof(float));
    }
    comm.all_reduce(std::as_writable_bytes(out), comm_type::f32, reduce_op::sum);
    if (alpha != 1.0f) {
      for (float& v : out) v *= alpha;
    }
    return ring_all_reduce_bytes(n * 4, comm.size());
  }
  raw_buffer storage(header_bytes + 2 * n);
  std::span<std::byte> const buf = storage.span();
  auto run = [&](auto const& codec) {
    if (grad.empty()) {
      std::vector<float> const zero(n, 0.0f);
      codec.compress(tensor_view<float const>(zero), buf, ctx);
    } else {
      codec.compress(tensor_view<float const>(grad), buf, ctx);
    }
    comm.all_reduce(buf.subspan(header_bytes),
                    f == dense_format::f16 ? comm_type::f16 : comm_type::bf16, reduce_op::sum);
    if (alpha != 1.0f) {
      std::fill(out.begin(), out.end(), 0.0f);
      codec.decompress_add(std::span<std::byte const>(buf), out, alpha, ctx);
    } else {
      codec.decompress(std::span<std::byte const>(buf), out, ctx);
    }
  };
  if (f == dense_format::f16) {
    run(fp16_codec{});
  } else {
    run(bf16_codec{});
  }
  return ring_all_reduce_bytes(n * 2, comm.size());
}

}  // namespace detail

/// Dense all-reduce of `grad` into `out` in format `f` (see file comment). `grad` may be
/// `out` itself (in place) or empty (this rank contributes nothing). Collective: every rank
/// calls it with the same `out.size()`, format and options, which are checked first
/// (`config_error` on every rank if they differ).
template <communicator Comm>
collective_result all_reduce_dense(Comm& comm, std::span<float const> grad, std::span<float> out,
                                   dense_format f = dense_format::f32, collective_options const& opt = {},
                                   codec_context const& ctx = {}) {
  detail::check_contribution(grad.size(), out.size(), "all_reduce_dense");
  if (f != dense_format::f32 && f != dense_format::f16 && f != dense_format::bf16) {
    throw config_error("gradcomp: all_reduce_dense got an unknown dense_format " +
                       std::to_string(static_cast<unsigned>(f)));
  }
  detail::report_round round;
  rank_report mine;
  mine.fingerprint = detail::dense_fingerprint(f, out.size(), opt.op);
  mine.count = out.size();
  round.post(comm, mine, {});
  round.finish("all_reduce_dense");
  collective_result res;
  res.path = f == dense_format::f32 ? collective_path::dense_f32
             : f == dense_format::f16 ? collective_path::dense_f16
                                      : collective_path::dense_bf16;
  res.packet_bytes = grad.empty() ? 0 : out.size() * (f == dense_format::f32 ? 4 : 2);
  res.wire_bytes = round.wire_bytes() +
                   detail::dense_payload(comm, grad, out, f, detail::reduction_scale(opt.op, comm.size()), ctx);
  return res;
}

/// `all_reduce_dense` of a 16-bit gradient (`half` or `bfloat16`) into a 16-bit output: the
/// gradient is widened to float32 (exact), reduced in format `f` exactly as the float32
/// overload does, and the float32 result (scaled for `reduction::average`) is rounded once into
/// `out`. With `dense_format::f32` the sum is therefore accumulated in float32 and rounded once;
/// with `f16`/`bf16` the wire and the partial sums are 16-bit (see file comment).
template <communicator Comm, element T>
  requires(!std::same_as<T, float>)
collective_result all_reduce_dense(Comm& comm, std::span<T const> grad, std::span<T> out,
                                   dense_format f = dense_format::f32, collective_options const& opt = {},
                                   codec_context const& ctx = {}) {
  return detail::through_f32(tensor_view<T const>(grad), out, ctx, "all_reduce_dense",
                             [&](tensor_view<float const> g, std::span<float> o) {
                               return all_reduce_dense(comm, g.span(), o, f, opt, ctx);
                             });
}

GRADCOMP_NAMESPACE_END
