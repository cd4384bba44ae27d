// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The step in progress of a `gradient_pipeline` (pipeline/pipeline.hpp), as the step protocol
/// keeps it and an exchange mode reads it: what a mode's staging and exchange need of the
/// protocol's step, without reaching into the pipeline.
///
/// - `step_entry`: one tensor of the step (its id and size, whether it is compressed, its
///   float32 gradient and output, the 16-bit write-back).
/// - `step_state`: the step from `begin` to its end — the tensors in submission order, this
///   rank's local failure (told to every rank in the agreement round), the controller's plan
///   and the statistics staging adds to, the codec context, the outcome check, and the
///   divergence guard's local norms; the statistics' all-reduces over the ranks (covered by
///   the outcome check) and the controller's view of the step.
/// - `opened_step`: the step after its agreement and guard rounds, with their results (the
///   statistics so far, the bucket items and plan, the guard's verdict), which an exchange
///   step completes.
/// - `detail::for_each_compressed`: the per-tensor modes' split of a step (host and device
///   tensors alike): each compressed tensor through one call, the small ones returned for the
///   dense buckets.
///
/// The protocol owns every field; a mode changes only what its phase of the step fills in
/// (a staged flag, the statistics' norms, a recorded failure, the statistics of its exchange).

#include <gradcomp/adapt/any_controller.hpp>
#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/concepts/step_protocol.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/pipeline/guard.hpp>
#include <gradcomp/pipeline/options.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// One tensor of the step in progress.
struct step_entry {
  tensor_id id{};
  std::size_t n = 0;
  bool large = false;                ///< at least `min_compress_elements` (else sent dense)
  bool staged = false;               ///< a device source staged its levels (host: `flat_mode`'s)
  std::span<float> out32;            ///< float32 output (the caller's tensor or a wide copy)
  std::span<float const> raw32;      ///< float32 view of the raw gradient
  std::function<void()> write_back;  ///< rounds the wide copy into a 16-bit tensor (else empty)
};

/// The step in progress (file comment): set by `begin`, filled by each added tensor.
struct step_state {
  std::uint64_t number = 0;  ///< the step's number (steps completed before it)
  pipeline_step_info info;
  int rank = 0;
  int size = 1;
  std::vector<step_entry> entries;  ///< in submission order
  std::exception_ptr local;         ///< this rank's first local failure (null: none)
  step_plan plan;                   ///< the controller's (empty without one)
  std::size_t levels = 0;           ///< packet levels staged per tensor
  double ef_norm = 0.0;             ///< ‖g_ef‖² over the staged tensors
  std::vector<double> comp_norms;   ///< ‖C(g_ef)‖² per level
  std::vector<double> layer_norms;  ///< Accordion's per-layer norms
  double compress_s = 0.0;          ///< time spent staging
  codec_context ctx;                ///< the step's context (seed, step)
  detail::step_check check;         ///< failures after the data moved, checksums (outcome round)
  std::vector<guard_tensor> guard_tensors;  ///< the divergence guard's local norms
  bool guard_nonfinite = false;             ///< one of them is not finite

  /// Records `e` as this rank's local failure unless one is recorded already.
  void fail(std::exception_ptr e) noexcept {
    if (!local) local = std::move(e);
  }

  /// Sums the statistics `v` over the ranks of `comm`, covered by the step check: with the
  /// checksum option a corrupted statistic fails the step rather than steer a decision.
  template <communicator Comm>
  void sum(Comm& comm, std::span<double> v) {
    check.before_sum(std::as_bytes(v), comm_type::f64);
    comm.all_reduce(std::as_writable_bytes(v), comm_type::f64, reduce_op::sum);
    check.after_sum(std::as_bytes(v), comm_type::f64);
    check.result(std::as_bytes(v));
  }
  /// The maxima of the statistics `v` over the ranks of `comm`, covered by the step check.
  template <communicator Comm>
  void max(Comm& comm, std::span<double> v) {
    comm.all_reduce(std::as_writable_bytes(v), comm_type::f64, reduce_op::max);
    check.result(std::as_bytes(v));
  }

  /// This rank's statistics of the step for the controller (`agree` sums them over the ranks),
  /// the step before having taken `last`.
  [[nodiscard]] step_stats controller_stats(step_timing const& last) const {
    step_stats s;
    s.step = plan.step;
    s.ef_norm_sq = ef_norm;
    s.compressed_norm_sq = comp_norms;
    s.layer_norms_sq = layer_norms;
    s.last_step = last;
    s.batch_size = info.batch_size;
    s.workers = static_cast<std::uint32_t>(size);
    s.learning_rate = info.learning_rate;
    s.next_learning_rate = info.next_learning_rate;
    if (info.loss) s.loss = *info.loss;
    return s;
  }
};

/// The step after its agreement and guard rounds (file comment); an exchange step adds its
/// messages to `br`, its time to `communicate` and its statistics to `st`.
struct opened_step {
  pipeline_stats st;
  double communicate = 0.0;
  std::vector<bucket_item> items;  ///< every entry's gradient and output, in entry order
  bucket_result br;
  guard_verdict gv;
  std::vector<detail::bucket_plan> plan;
  std::optional<any_controller>* snapshot = nullptr;  ///< the controller before its decision
  [[nodiscard]] bool guard_dense() const noexcept { return gv.action == guard_action::dense; }
};

namespace detail {

/// The clock of a step's timings.
using step_clock = std::chrono::steady_clock;
/// Seconds from `a` to `b`.
inline double seconds_between(step_clock::time_point a, step_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

/// The guard's dense step in the statistics: every tensor's own g sent dense.
inline void dense_step_stats(pipeline_stats& st) noexcept {
  st.sent = send_kind::dense;
  st.factor = 1.0;
  st.gain = 1.0;
}

/// The per-tensor modes' split of a step (host and device tensors): `one(entry, g)` runs the
/// collective of each compressed tensor (its result counted in `br`, one bucket each); the
/// small tensors are returned, to go dense in buckets.
template <class One>
std::vector<bucket_item> for_each_compressed(std::span<step_entry const> entries, bucket_result& br,
                                             One&& one) {
  std::vector<bucket_item> dense;
  for (auto const& e : entries) {
    if (!e.large) {
      dense.push_back({tensor_view<float const>(e.raw32, e.id), e.out32});
      continue;
    }
    collective_result const r = one(e, tensor_view<float const>(e.raw32, e.id));
    br.packet_bytes += r.packet_bytes;
    br.wire_bytes += r.wire_bytes;
    ++br.buckets;
  }
  return dense;
}

}  // namespace detail

GRADCOMP_NAMESPACE_END
