// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The low-rank collective: drives a `low_rank_session` (PowerSGD and kin) through its factor
/// all-reduces. One agreement round first (the session's shape fingerprint, the tensor size and
/// the options; a rank whose `begin` threw makes every rank throw), then one float32 sum
/// all-reduce per factor, in place, then `finish`.

#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/low_rank_session.hpp>
#include <gradcomp/config.hpp>

#include <concepts>
#include <cstddef>
#include <exception>
#include <span>

GRADCOMP_NAMESPACE_BEGIN

/// Low-rank all-reduce of `grad` into `out` with `session` (see file comment). `grad` empty:
/// this rank contributes nothing. Collective.
template <communicator Comm, low_rank_session Session>
collective_result all_reduce_low_rank(Comm& comm, Session& session, tensor_view<float const> grad,
                                      std::span<float> out, codec_context const& ctx = {},
                                      collective_options const& opt = {}) {
  detail::check_contribution(grad.size(), out.size(), "all_reduce_low_rank");
  std::size_t const n = out.size();
  rank_report mine;
  mine.count = n;
  std::exception_ptr local;
  try {
    mine.fingerprint = fingerprint{}
                           .add("low_rank")
                           .add(n)
                           .add(static_cast<std::uint64_t>(opt.op))
                           .add(session.shape_fingerprint(n))
                           .value();
    session.begin(grad, n, ctx);
  } catch (...) {
    local = std::current_exception();
    mine.status = 1;
  }
  detail::report_round round;
  round.post(comm, mine, {});
  round.finish("all_reduce_low_rank", local);
  collective_result res;
  res.path = collective_path::low_rank;
  res.wire_bytes = round.wire_bytes();
  for (std::size_t i = 0; i < session.factor_count(); ++i) {
    std::span<float> f = session.factor(i, ctx);
    comm.all_reduce(std::as_writable_bytes(f), comm_type::f32, reduce_op::sum);
    res.packet_bytes += f.size_bytes();
    res.wire_bytes += detail::ring_all_reduce_bytes(f.size_bytes(), comm.size());
  }
  if (grad.empty()) res.packet_bytes = 0;
  session.finish(out, detail::reduction_scale(opt.op, comm.size()), ctx);
  return res;
}

/// `all_reduce_low_rank` of a 16-bit gradient into a 16-bit output: the session works in
/// float32 (the gradient widened exactly, the factors summed in float32) and its float32 result
/// is rounded once into `out`; bit-identical to the float32 overload on the widened gradient,
/// rounded once.
template <communicator Comm, low_rank_session Session, element T>
  requires(!std::same_as<T, float>)
collective_result all_reduce_low_rank(Comm& comm, Session& session, tensor_view<T const> grad, std::span<T> out,
                                      codec_context const& ctx = {}, collective_options const& opt = {}) {
  return detail::through_f32(grad, out, ctx, "all_reduce_low_rank",
                             [&](tensor_view<float const> g, std::span<float> o) {
                               return all_reduce_low_rank(comm, session, g, o, ctx, opt);
                             });
}

GRADCOMP_NAMESPACE_END
