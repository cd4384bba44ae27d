// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The rounds of `gradient_pipeline`'s step protocol (pipeline/pipeline.hpp, docs/pipeline.md)
/// that every exchange mode shares, as functions over the step in progress, and what the
/// protocol lends them and the modes' exchange steps (`step_services`):
///
/// - `agree_step`: the agreement round (layout, configuration and every rank's local status);
/// - `check_guard`: the divergence guard's round; `skip_step`, a step the guard skips;
///   `report_guard`, a trip that did not raise;
/// - `decide_step`: the controller's decision over the statistics summed over the ranks;
///   `gain_round`: `measure_gain`'s ratio without a controller;
/// - `outcome_round`: the step-outcome round before anything is committed;
/// - `write_back`: the 16-bit outputs; `complete` and `close_step`: the statistics of a
///   completed step, the step counter, the guard's history and the hook.
///
/// Each is one step of the protocol's sequence; the protocol calls the opening rounds, the
/// exchange step of its mode (`exchange_step` in flat_mode.hpp, exchange.hpp, device_mode.hpp)
/// the others. They change only the state `step_services` names, the way the pipeline did
/// before they moved here.

#include <gradcomp/adapt/any_controller.hpp>
#include <gradcomp/adapt/protocol.hpp>
#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/step_protocol.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/fingerprint.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/feedback/make_feedback.hpp>
#include <gradcomp/pipeline/guard.hpp>
#include <gradcomp/pipeline/options.hpp>
#include <gradcomp/pipeline/step_state.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// What a pipeline keeps across steps and its rounds update: the step counter, the timing the
/// controller sees, the last statistics and the hooks.
struct step_history {
  std::uint64_t step = 0;   ///< the next step's number (steps completed so far)
  step_timing last_timing;  ///< the last completed step's, for the controller
  pipeline_stats last;      ///< the last completed step's statistics
  std::function<void(pipeline_stats const&)> on_step;  ///< every completed step's statistics
  std::function<void(guard_verdict const&)> on_guard;  ///< every guard trip that did not raise
};

/// The layer accumulators a step changed, each with its value before the step (empty: it did
/// not exist), put back if the step fails.
using accumulator_undo = std::vector<std::pair<tensor_id, std::optional<std::vector<float>>>>;

/// What the step protocol lends its rounds and the modes' exchange steps for one step: the
/// pipeline's configuration, codec, error feedback and controller, the step in progress, the
/// dense buckets' slots, PowerSGD's shapes, the layer accumulators, the guard and the history.
/// Every member refers to the pipeline's own; the services live for one call.
struct step_services {
  pipeline_options const& opt;
  pipeline_mode_traits const& traits;
  any_codec const& base;
  feedback_compressor& comp;
  std::optional<any_controller>& ctrl;
  step_state& cur;
  detail::bucket_slot (&slots)[2];  ///< the dense buckets' (reused across steps)
  std::map<tensor_id, std::pair<std::size_t, std::size_t>> const& shapes;
  std::map<tensor_id, std::vector<float>>& accumulators;  ///< the controller's layer accumulators
  accumulator_undo& undo;                                 ///< the step's accumulators before it
  divergence_guard& guard;
  step_history& history;
  detail::step_clock::time_point begun;  ///< when the step began

  /// The controller measures the gain of several levels.
  [[nodiscard]] bool needs_gains() const noexcept { return ctrl && cur.plan.measure.size() > 1; }
  /// The matrix shape PowerSGD gives tensor `id` of `n` elements: `set_shape`'s, else
  /// n / c × c with c the largest divisor of n up to √n.
  [[nodiscard]] std::pair<std::size_t, std::size_t> shape_of(tensor_id id, std::size_t n) const {
    if (auto it = shapes.find(id); it != shapes.end()) return it->second;
    std::size_t c = 1;
    for (std::size_t d = 1; d * d <= n; ++d) {
      if (n % d == 0) c = d;
    }
    return {n / c, c};
  }
};

/// The step's agreement round: layout (ids, sizes, order, bucketing of `items`), configuration
/// (codec, feedback, controller, step; what `plan_mode(fp)` adds, the hierarchical mode's plan)
/// and each rank's local status; its bytes added to `br`. Returns the bucket plan; throws on
/// every rank when one rank failed or disagrees.
template <communicator Comm, class PlanMode>
std::vector<detail::bucket_plan> agree_step(step_services& sv, Comm& comm,
                                            std::vector<bucket_item> const& items,
                                            bucket_result& br, PlanMode&& plan_mode) {
  pipeline_options const& opt = sv.opt;
  std::exception_ptr local = sv.cur.local;
  rank_report mine;
  mine.count = items.size();
  mine.codec = static_cast<std::uint32_t>(sv.base.id());
  std::vector<detail::bucket_plan> plan;
  try {
    plan = detail::plan_buckets(std::span<bucket_item const>(items), opt.buckets);
    fingerprint fp;
    fp.add("gradient_pipeline").add(opt.codec).add(opt.feedback).add(opt.controller);
    plan_mode(fp);
    fp.add(opt.two_way ? 1 : 0)
        .add(sv.history.step)
        .add(opt.buckets.bucket_bytes)
        .add(opt.buckets.min_compress_elements);
    fp.add(static_cast<std::uint64_t>(opt.buckets.small_format))
        .add(static_cast<std::uint64_t>(opt.buckets.op));
    fp.add(opt.measure_gain ? 1 : 0).add(opt.guard);
    if (opt.buckets.checksum) fp.add("checksum");
    for (auto const& it : items)
      fp.add(it.out.size()).add(static_cast<std::uint64_t>(it.grad.id()));
    mine.fingerprint = fp.value();
  } catch (...) {
    if (!local) local = std::current_exception();
  }
  if (local) mine.status = 1;
  detail::report_round round;
  round.post(comm, mine, {}, opt.buckets.checksum, "gradient_pipeline");
  round.finish("gradient_pipeline", local);
  br.wire_bytes += round.wire_bytes();
  return plan;
}

/// A guard trip that did not raise: to the `on_guard` hook, or without one printed by rank 0.
inline void report_guard(step_services& sv, guard_verdict const& gv) {
  if (sv.history.on_guard) {
    sv.history.on_guard(gv);
  } else if (sv.cur.rank == 0) {
    std::fprintf(stderr, "%s\n", gv.message.c_str());
  }
}

/// The divergence guard's round (guard.hpp): every rank gets the same verdict, recorded in
/// `st`; a verdict that raises throws here (`numeric_error`). Its time is added to
/// `communicate`.
template <communicator Comm>
guard_verdict check_guard(step_services& sv, Comm& comm, bucket_result& br, pipeline_stats& st,
                          double& communicate) {
  step_state& cur = sv.cur;
  auto const t0 = detail::step_clock::now();
  // In tensor id order, so that the sums over the tensors do not depend on the order in which
  // they were submitted (whole step, bucket by bucket).
  std::sort(cur.guard_tensors.begin(), cur.guard_tensors.end(),
            [](guard_tensor const& a, guard_tensor const& b) {
              return static_cast<std::uint32_t>(a.id) < static_cast<std::uint32_t>(b.id);
            });
  bool const watch = sv.traits.stages && sv.opt.feedback != "none";
  guard_verdict gv = sv.guard.check_with(
      [&](std::span<double> v) { cur.sum(comm, v); }, comm.size(), sv.history.step,
      std::span<guard_tensor const>(cur.guard_tensors), watch, cur.info.loss, br.wire_bytes);
  communicate += detail::seconds_between(t0, detail::step_clock::now());
  st.gradient_norm = gv.gradient;
  st.residual_norm = gv.residual;
  st.loss = gv.loss;
  if (gv.raise_it) throw numeric_error(gv.message);
  return gv;
}

/// A step the guard skips, its stages already discarded: nothing is sent and no state changes
/// (the step counter kept); each output is set to zero by `zero(out32)` (host or device memory)
/// on every rank. Returns the step's statistics.
template <class Zero>
pipeline_stats skip_step(step_services& sv, pipeline_stats st, guard_verdict const& gv,
                         double communicate, Zero&& zero) {
  for (auto& e : sv.cur.entries) {
    zero(e.out32);
    if (e.write_back) e.write_back();
    e.staged = false;
  }
  sv.guard.commit(gv);
  st.guard = guard_action::skipped;
  st.sent = send_kind::dense;
  st.factor = 1.0;
  st.communicate_s = communicate;
  st.compress_s = sv.cur.compress_s;
  st.total_s = detail::seconds_between(sv.begun, detail::step_clock::now());
  report_guard(sv, gv);
  sv.history.last = st;
  if (sv.history.on_step) sv.history.on_step(st);
  return st;
}

/// `measure_gain` without a controller: ‖C(g_ef)‖² / ‖g_ef‖² over all ranks, in `st.gain`.
/// Its time is added to `communicate`.
template <communicator Comm>
void gain_round(step_services& sv, Comm& comm, pipeline_stats& st, double& communicate) {
  step_state& cur = sv.cur;
  double sums[2] = {cur.ef_norm, cur.levels > 0 ? cur.comp_norms[0] : 0.0};
  auto const t0 = detail::step_clock::now();
  cur.sum(comm, std::span<double>(sums));
  communicate += detail::seconds_between(t0, detail::step_clock::now());
  st.gain = sums[0] > 0.0 ? sums[1] / sums[0] : 1.0;
}

/// The controller's decision (host and device steps): the step's statistics summed over the
/// ranks (`agree`), the level k to send (`decision::npos`: dense) and the residual rule, the
/// sent kind, factor and gain in `st`; the controller before the decision kept in `snapshot`
/// (put back if the step fails). Its time is added to `communicate`.
template <communicator Comm>
std::pair<std::size_t, residual_rule> decide_step(step_services& sv, Comm& comm, pipeline_stats& st,
                                                  std::optional<any_controller>& snapshot,
                                                  double& communicate) {
  step_state& cur = sv.cur;
  auto const t0 = detail::step_clock::now();
  step_stats s = cur.controller_stats(sv.history.last_timing);
  agree(
      s, [&](std::span<double> v) { cur.sum(comm, v); },
      [&](std::span<double> v) { cur.max(comm, v); });
  communicate += detail::seconds_between(t0, detail::step_clock::now());
  snapshot.emplace(*sv.ctrl);
  decision const d = sv.ctrl->decide(s);
  std::size_t const k = d.packet(cur.levels);
  residual_rule rule = d.residual;
  st.sent = d.send;
  st.factor = d.factor;
  if (k != decision::npos && s.ef_norm_sq > 0.0 && (sv.opt.measure_gain || sv.needs_gains())) {
    st.gain = s.compressed_norm_sq[k] / s.ef_norm_sq;
  } else if (k == decision::npos) {
    st.gain = 1.0;
  }
  // A receiving policy (EF21) sends increments: g with the residual kept is no increment.
  bool const receives =
      std::visit([](auto const& c) { return std::remove_cvref_t<decltype(c)>::receives; }, sv.comp);
  if (k == decision::npos && rule == residual_rule::keep && receives) rule = residual_rule::zero;
  return {k, rule};
}

/// Every rank decoded everything (and, with the checksum option, got intact data) before
/// anyone commits: the step-outcome round (collective/outcome.hpp), its bytes added to `br`.
/// The layer accumulators of the step are kept from then on.
template <communicator Comm>
void outcome_round(step_services& sv, Comm& comm, bucket_result& br) {
  detail::agree_outcome(comm, sv.cur.check, "gradient_pipeline", sv.history.step);
  br.wire_bytes += detail::outcome_wire_bytes(sv.opt.buckets.checksum, sv.cur.size);
  sv.undo.clear();
}

/// 16-bit gradients: the result rounded once into each.
inline void write_back(step_services& sv) {
  for (auto const& e : sv.cur.entries) {
    if (e.write_back) e.write_back();
  }
}

/// The end of a completed step (every mode): timing for the controller, the step counter, the
/// guard's history and report, the statistics and the hook. Returns `st`, completed.
inline pipeline_stats close_step(step_services& sv, pipeline_stats& st, guard_verdict const& gv) {
  step_history& h = sv.history;
  st.total_s = detail::seconds_between(sv.begun, detail::step_clock::now());
  // PowerSGD has no bits per element: its factor is what the step saved, the bytes of its
  // gradients sent dense (float32, the baseline of every codec's factor) over the bytes sent.
  if (sv.traits.factor_from_bytes && st.sent != send_kind::dense && st.bytes_sent > 0) {
    std::size_t dense = 0;
    for (auto const& e : sv.cur.entries) dense += 4 * e.n;
    st.factor = static_cast<double>(dense) / static_cast<double>(st.bytes_sent);
  }
  h.last_timing = sv.opt.measured_timing
                      ? step_timing{sv.cur.info.backprop_s, st.compress_s, st.communicate_s}
                      : step_timing{sv.cur.info.backprop_s, 0.0, 0.0};
  ++h.step;
  if (sv.guard.enabled()) {
    sv.guard.commit(gv);
    st.guard = gv.action;
    if (gv.tripped) report_guard(sv, gv);
  }
  h.last = st;
  if (h.on_step) h.on_step(st);
  return st;
}

/// The statistics of opened step `s` from its exchange (the bytes and buckets of `s.br`, the
/// staging time plus the exchange's own `compress_s`, its communication and decoding time),
/// then `close_step`.
inline pipeline_stats complete(step_services& sv, opened_step& s, double compress_s,
                               double decode) {
  s.st.bytes_sent = s.br.packet_bytes;
  s.st.wire_bytes = s.br.wire_bytes;
  s.st.buckets = s.br.buckets;
  s.st.compress_s = sv.cur.compress_s + compress_s;
  s.st.communicate_s = s.communicate;
  s.st.decode_s = decode;
  return close_step(sv, s.st, s.gv);
}

GRADCOMP_NAMESPACE_END
