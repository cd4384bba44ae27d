// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The types of the per-step protocol between a training pipeline and a compression controller:
/// what the controller asks the pipeline to measure (`step_plan`), what the pipeline reports
/// (`step_stats`, with `step_timing`), and what the controller decides (`decision`, with
/// `send_kind` and `residual_rule`). They are the vocabulary of the `controller` concept
/// (`concepts/controller.hpp`), so they sit below every layer that uses them; `agree`, which
/// makes the statistics identical on every rank, is in `adapt/protocol.hpp`.
///
/// One step of a data-parallel pipeline driven by a controller `ctrl` (docs/adaptive.md):
/// 1. `step_plan const& p = ctrl.plan();` — which factors to compress at (`p.measure`, in
///    multi-level order) and whether to accumulate / report per-layer gradient norms.
/// 2. Backprop; g_ef = g + residual; compress g_ef at `p.measure[0]`; each further factor is
///    compressed from the previous packet (multi-level); record the squared norms.
/// 3. Fill a `step_stats`, call `agree(stats, sum, max)` with the communicator's all-reduce.
/// 4. `decision d = ctrl.decide(stats);` — what to send this step and how to update the
///    residual. Every rank computes the same `d` because the stats and the controller's state
///    are identical everywhere.
/// 5. Send what `d.send` names; update the residual as `d.residual` says; time the sync.

#include <gradcomp/config.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// What the pipeline must compute during the coming step. Returned by `ctrl.plan()`; the same
/// on every rank.
struct step_plan {
  /// The step this plan is for (0, 1, 2, ... in the order `decide` is called).
  std::uint64_t step = 0;
  /// Compression factors (original size / compressed size, each > 1) to compress g_ef at, in
  /// increasing order. `measure[0]` is compressed from g_ef directly; each later entry is
  /// compressed from the packet of the entry before it, by the ratio of the two factors
  /// (multi-level compression). Empty: this step is dense, nothing is compressed.
  std::vector<double> measure;
  /// Add this step's raw (local, uncompressed, before error feedback) gradient of each layer
  /// to a per-layer accumulator.
  bool accumulate_layers = false;
  /// Report the squared L2 norm of each layer's accumulator in `step_stats::layer_norms_sq`
  /// (after this step's gradient has been added), then zero the accumulators.
  bool report_layers = false;

  friend bool operator==(step_plan const&, step_plan const&) = default;
};

/// Wall-clock seconds of one finished step, as measured by the pipeline.
struct step_timing {
  double backprop = 0.0;  ///< forward + backward pass
  double compress = 0.0;  ///< every compression of the step, all levels together
  double sync = 0.0;      ///< the collective that exchanged what was sent

  friend bool operator==(step_timing const&, step_timing const&) = default;
};

/// What the pipeline reports to `decide` once per step. Make it identical on every rank first
/// (`agree`). A controller ignores the fields it does not use; which ones it needs is in its
/// documentation.
struct step_stats {
  /// The step being decided; must equal `ctrl.plan().step`.
  std::uint64_t step = 0;
  /// ‖g_ef‖²: squared L2 norm of the error-feedback-corrected gradient (gradient + residual),
  /// over all layers. After `agree`: the sum over ranks.
  double ef_norm_sq = 0.0;
  /// ‖C(g_ef)‖² at each factor of `plan().measure`, same order (the squared norm of the
  /// decoded packet; for a sparsifier, the sum of squares of the kept values). After `agree`:
  /// sums over ranks.
  std::vector<double> compressed_norm_sq;
  /// Squared norms of the per-layer accumulators when `plan().report_layers`, else empty.
  /// After `agree`: sums over ranks.
  std::vector<double> layer_norms_sq;
  /// Times of the *previous* step (all zero at the first step): its sync has finished, which
  /// this step's has not when `decide` is called. After `agree`: the maximum over ranks.
  step_timing last_step;
  /// Samples per worker per step.
  std::uint64_t batch_size = 0;
  /// Number of data-parallel workers (ranks).
  std::uint32_t workers = 0;
  /// Learning rate used by this step (0 when the pipeline does not report it).
  double learning_rate = 0.0;
  /// Learning rate the next step will use (0 when not reported). `next_learning_rate <
  /// learning_rate` announces a learning-rate decay.
  double next_learning_rate = 0.0;
  /// Training loss of the step: this rank's batch loss before `agree` (NaN: not reported);
  /// after `agree`, the mean over the ranks that reported one (NaN when none did).
  double loss = std::numeric_limits<double>::quiet_NaN();
};

/// What a step sends.
enum class send_kind : std::uint8_t {
  /// The base packet, compressed from g_ef at `plan().measure.front()`: GraVAC's θmin packet,
  /// and the only packet of a one-factor plan.
  minimum,
  /// The last packet of the multi-level chain, at `plan().measure.back()`: GraVAC's candidate.
  candidate,
  /// No compression: the dense gradient (which one, `residual_rule` says).
  dense,
};

/// Name of a send kind ("minimum", "candidate", "dense").
constexpr char const* send_kind_name(send_kind k) noexcept {
  switch (k) {
    case send_kind::minimum: return "minimum";
    case send_kind::candidate: return "candidate";
    case send_kind::dense: return "dense";
  }
  return "unknown";
}

/// How the pipeline updates its error-feedback residual r after the send.
enum class residual_rule : std::uint8_t {
  /// r ← g_ef − decode(sent packet). With `send_kind::minimum` or `candidate`.
  subtract_sent,
  /// Send g_ef dense (residual included) and set r ← 0. With `send_kind::dense` (GraVAC
  /// Algorithm 1, line 23). Same as `subtract_sent` applied to a lossless packet.
  zero,
  /// Send the raw gradient g dense and leave r as it is, to be sent later. With
  /// `send_kind::dense`.
  keep,
};

/// Name of a residual rule ("subtract_sent", "zero", "keep").
constexpr char const* residual_rule_name(residual_rule r) noexcept {
  switch (r) {
    case residual_rule::subtract_sent: return "subtract_sent";
    case residual_rule::zero: return "zero";
    case residual_rule::keep: return "keep";
  }
  return "unknown";
}

/// A controller's answer for one step. Every field is a deterministic function of the
/// statistics seen so far, so ranks that pass identical `step_stats` get identical decisions.
struct decision {
  /// The step this decision applies to (`step_stats::step`).
  std::uint64_t step = 0;
  /// What to send this step.
  send_kind send = send_kind::dense;
  /// Compression factor of what is sent: `plan().measure.front()` for `minimum`,
  /// `plan().measure.back()` for `candidate`, 1 for `dense`.
  double factor = 1.0;
  /// How to update the residual after sending.
  residual_rule residual = residual_rule::zero;
  /// The compression gain behind the choice (GraVAC's smoothed gain of the sent factor; 1 for
  /// dense; 1 for controllers that do not measure gains). Diagnostic only.
  double gain = 1.0;
  /// The plan of the next step (what `plan()` returns after this call).
  step_plan next;

  /// Index into `plan().measure` of the packet to send, or `npos` for dense.
  [[nodiscard]] std::size_t packet(std::size_t measured) const noexcept {
    if (send == send_kind::dense || measured == 0) return npos;
    return send == send_kind::minimum ? 0 : measured - 1;
  }
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
};

GRADCOMP_NAMESPACE_END
