// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The low-rank collective: drives a `low_rank_session` (PowerSGD and kin) through its factor
/// all-reduces. One agreement round first (the session's shape fingerprint, the tensor size and
/// the options; a rank whose `begin` threw makes every rank throw), then one float32 sum
/// all-reduce per factor, in place, then `finish`, then the step-outcome round
/// (collective/outcome.hpp): a rank whose `finish` failed makes every rank fail the step.

#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/memory.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/low_rank_session.hpp>
#include <gradcomp/config.hpp>

#include <concepts>
#include <cstddef>
#include <exception>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

namespace detail {

/// The exchange of `all_reduce_low_rank` without its outcome round: the agreement round, the
/// factor all-reduces, `finish`. A failure of `finish` is recorded in `check`; the caller runs
/// the outcome round (`agree_outcome`) before committing anything.
template <communicator Comm, low_rank_session Session>
collective_result low_rank_exchange(Comm& comm, Session& session, tensor_view<float const> grad, std::span<float> out,
                                    codec_context const& ctx, collective_options const& opt, step_check& check) {
  std::size_t const n = out.size();
  rank_report mine;
  mine.count = n;
  std::exception_ptr local;
  try {
    fingerprint fp;
    fp.add("low_rank").add(n).add(static_cast<std::uint64_t>(opt.op)).add(session.shape_fingerprint(n));
    if (opt.checksum) fp.add("checksum");
    mine.fingerprint = fp.value();
    if constexpr (requires { { session.memory() } -> memory_space; }) {
      // a device session (cuda/powersgd.cuh): its factors are device memory
      if (!std::remove_cvref_t<decltype(session.memory())>::on_host && opt.checksum) {
        throw config_error("gradcomp: all_reduce_low_rank: the session keeps its factors in device memory; the "
                           "checksum option reads every payload on the host and is available for host sessions only");
      }
    }
    session.begin(grad, n, ctx);
  } catch (...) {
    local = std::current_exception();
    mine.status = 1;
  }
  report_round round;
  round.post(comm, mine, {}, opt.checksum, "all_reduce_low_rank");
  round.finish("all_reduce_low_rank", local);
  collective_result res;
  res.path = collective_path::low_rank;
  res.wire_bytes = round.wire_bytes();
  std::vector<float> zeros;
  for (std::size_t i = 0; i < session.factor_count(); ++i) {
    // A factor computed from the previous sum (PowerSGD's Q) may fail on a rank whose sum was
    // corrupted. A session that states its factor sizes lets that rank go on with zeros (the
    // outcome round fails the step on every rank); another session's rank leaves here, and
    // its peers fail on the transport.
    std::span<float> f;
    if constexpr (requires(Session const& s) { { s.factor_size(i) } -> std::convertible_to<std::size_t>; }) {
      if (!check.failed()) {
        try {
          f = session.factor(i, ctx);
        } catch (...) {
          check.fail(std::current_exception());
        }
      }
      if (check.failed()) {
        zeros.assign(session.factor_size(i), 0.0f);
        f = std::span<float>(zeros);
      }
    } else {
      f = session.factor(i, ctx);
    }
    check.before_sum(std::as_bytes(f), comm_type::f32);
    comm.all_reduce(std::as_writable_bytes(f), comm_type::f32, reduce_op::sum);
    check.after_sum(std::as_bytes(f), comm_type::f32);
    res.packet_bytes += f.size_bytes();
    res.wire_bytes += ring_all_reduce_bytes(f.size_bytes(), comm.size());
  }
  if (grad.empty()) res.packet_bytes = 0;
  check.guard([&] { session.finish(out, reduction_scale(opt.op, comm.size()), ctx); });
  if (!check.failed()) check.output(out);
  return res;
}

}  // namespace detail

/// Low-rank all-reduce of `grad` into `out` with `session` (see file comment). `grad` empty:
/// this rank contributes nothing. Collective. A session with `snapshot()` / `restore(...)`
/// (`powersgd_session` has them) is restored to its state before the call when the step fails
/// on any rank; the step ends with the outcome round of collective/outcome.hpp.
template <communicator Comm, low_rank_session Session>
collective_result all_reduce_low_rank(Comm& comm, Session& session, tensor_view<float const> grad,
                                      std::span<float> out, codec_context const& ctx = {},
                                      collective_options const& opt = {}) {
  detail::check_contribution(grad.size(), out.size(), "all_reduce_low_rank");
  if constexpr (requires(Session& s) { s.restore(s.snapshot()); }) {
    // The session's state is restored unless every rank completed the step.
    auto saved = session.snapshot();
    try {
      detail::step_check check(opt.checksum);
      collective_result res = detail::low_rank_exchange(comm, session, grad, out, ctx, opt, check);
      detail::agree_outcome(comm, check, "all_reduce_low_rank");
      res.wire_bytes += detail::outcome_wire_bytes(opt.checksum, comm.size());
      return res;
    } catch (...) {
      session.restore(std::move(saved));
      throw;
    }
  } else {
    detail::step_check check(opt.checksum);
    collective_result res = detail::low_rank_exchange(comm, session, grad, out, ctx, opt, check);
    detail::agree_outcome(comm, check, "all_reduce_low_rank");
    res.wire_bytes += detail::outcome_wire_bytes(opt.checksum, comm.size());
    return res;
  }
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
