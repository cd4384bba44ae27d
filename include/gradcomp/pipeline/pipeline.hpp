// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `gradient_pipeline`: the training step of compressed data-parallel training, the one front
/// door. A training loop calls it once per step with its gradient tensors (or bucket by bucket
/// as the backward pass produces them, `submit` / `finish`); it writes the average over all
/// ranks of what was sent back into the tensors. One step:
///
/// 1. **Plan.** The controller (static, schedule, GraVAC, Accordion; none: the codec as given)
///    names the factors to compress at.
/// 2. **Stage.** Each large tensor's g + residual (per the error-feedback policy) is compressed
///    at the first factor; each further factor is re-compressed from the packet before it
///    (`recompress_sparse`, O(m)). The residual is not touched yet. The controller's
///    statistics (‖g_ef‖², ‖C(g_ef)‖² per factor, per-layer norms) are computed where it needs
///    them.
/// 3. **Agree.** One round checks that every rank has the same layout and configuration and
///    that every rank's local step succeeded; with a controller the statistics are summed over
///    ranks (`agree`) and every rank takes the same `decision`.
/// 4. **Send.** The decided packets go through the bucketed collective chosen by the codec's
///    aggregation kind (summable: all-reduce in the compressed domain; shared support:
///    all-reduce of the values; gather: all-gather-v and decode in rank order), small tensors
///    in dense buckets, buckets pipelined (collective/bucket.hpp). A dense decision sends every
///    tensor dense (g + residual, or g with the residual kept, as the decision says). Low-rank
///    codecs (PowerSGD) run one `powersgd_session` per tensor (`all_reduce_low_rank`); with
///    `two_way` the packets go through `all_reduce_two_way` with worker and server feedback.
/// 5. **Commit.** Each residual is updated for exactly what was sent: computed before the
///    exchange (`compressor::prepare_commit` with the packet to send), made current only after
///    the exchange succeeded (`apply_commit`); `commit_lossless` for g + residual sent dense,
///    nothing when g was sent and the residual kept. With EF21 the receiver side turns the
///    averaged increments into the gradient estimate.
///
/// A failure anywhere (a NaN gradient on one rank, mismatched layouts, a lost peer, a packet
/// one rank cannot decode) throws on every rank and leaves the pipeline's state — residuals,
/// controller, PowerSGD sessions, two-way residuals, layer accumulators, step counter — exactly
/// as it was before the step (`save` gives the same bytes), so a retry computes what the step
/// would have; the gradient tensors may hold partial output then. The exchange ends with the
/// step-outcome round of collective/outcome.hpp (one all-reduce of 12 bytes per step) before
/// anything is committed; `buckets.checksum` turns on its checksums.
///
/// Between the agreement and the decision, the divergence guard (pipeline/guard.hpp, on by
/// default) sums the ranks' gradient and residual norms and losses in one small all-reduce and
/// acts on a non-finite value or an explosion against the recent history: raise (the
/// default), skip the step, or send it dense (`pipeline_options::guard`).
///
/// Gradients are float32, float16 or bfloat16 (`tensor_view<T>`); residuals, sums and decoding
/// are float32, and a 16-bit tensor receives its average rounded once. The whole state (every
/// residual, controller state with its history, PowerSGD factors, the step counter) is saved by
/// `save` and restored by `load` (format: docs/pipeline.md, "Checkpoints"); a resumed run is
/// bit-identical to one that never stopped.
///
/// **Device sources** (docs/cuda.md): constructed with a device packet source — a
/// `cuda::device_compressor<C, Rule>` or a `cuda::stream_codec<C>` of a CUDA codec — the
/// pipeline takes float32, float16 and bfloat16 gradients in device memory through the same
/// `step` (or `begin` / `submit` / `finish`), in every mode, with the same agreement round and
/// divergence guard; outputs, residuals, statistics and `save` are byte for byte those of the
/// CPU pipeline with the CPU codec of `pipeline_options::codec` (pipeline/device_mode.hpp says
/// what runs where and what a device source does not take).
///
/// **Structure.** This header is the step protocol; the exchange is the mode's, one per
/// header, chosen once at construction from the table of pipeline/options.hpp and held in
/// `exchange_mode`: `flat_mode` (bucketed, multi-level, controller-driven), `two_way_mode`,
/// `hierarchical_mode`, `low_rank_mode`, or, for a device source, `device_mode`, which runs one
/// of them in the source. The step opens (agreement and guard rounds), then dispatches once to
/// the exchange step of its mode (`exchange_step`), as Gloo's `allreduce` switches to one
/// function per algorithm. The step in progress is a `step_state` (pipeline/step_state.hpp),
/// which the modes read; the checkpoint's container is pipeline/checkpoint.hpp, each mode
/// writing and reading its own sections.

#include <gradcomp/adapt/any_controller.hpp>
#include <gradcomp/adapt/protocol.hpp>
#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/codec/codec_spec.hpp>
#include <gradcomp/codec/powersgd.hpp>
#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/comm/any_communicator.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/concepts/step_protocol.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/fingerprint.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/feedback/make_feedback.hpp>
#include <gradcomp/feedback/policies.hpp>
#include <gradcomp/pipeline/checkpoint.hpp>
#include <gradcomp/pipeline/device_mode.hpp>
#include <gradcomp/pipeline/device_source.hpp>
#include <gradcomp/pipeline/exchange.hpp>
#include <gradcomp/pipeline/flat_mode.hpp>
#include <gradcomp/pipeline/guard.hpp>
#include <gradcomp/pipeline/hierarchical_mode.hpp>
#include <gradcomp/pipeline/low_rank_mode.hpp>
#include <gradcomp/pipeline/options.hpp>
#include <gradcomp/pipeline/step_state.hpp>
#include <gradcomp/pipeline/two_way_mode.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// The exchange mode a `gradient_pipeline` holds (pipeline/options.hpp's table): a host mode
/// (`host_exchange_mode`'s alternatives), or `device_mode` for a device source.
using exchange_mode =
    std::variant<flat_mode, two_way_mode, hierarchical_mode, low_rank_mode, device_mode>;

/// The training step of compressed data-parallel training (see file comment). One object per
/// model (or per group of tensors that share a configuration); every rank makes one with the
/// same options and calls it in the same order. Not thread-safe.
class gradient_pipeline {
 public:
  /// Builds the pipeline; `config_error` for an invalid or inconsistent configuration.
  explicit gradient_pipeline(pipeline_options opt) : opt_(std::move(opt)) {
    codec_spec codec = make_codec_spec(opt_.codec);
    kind_ = check_pipeline_options(opt_, codec);  // the one table of which modes combine
    traits_ = pipeline_mode_traits_of(kind_);
    std::optional<powersgd_options> low_rank;
    if (kind_ == pipeline_mode::low_rank) {
      low_rank = std::get<powersgd_options>(codec);
      low_rank->error_feedback = opt_.feedback == "residual";
      base_ = make_codec("identity");  // unused; keeps the compressor well-formed
    } else {
      base_ = std::get<any_codec>(std::move(codec));
    }
    comp_ = make_feedback(opt_.feedback, base_);
    if (kind_ == pipeline_mode::controlled) ctrl_.emplace(make_controller(opt_.controller));
    switch (kind_) {  // the mode, once
      case pipeline_mode::flat:
      case pipeline_mode::controlled: mode_.emplace<flat_mode>(base_, opt_.buckets); break;
      case pipeline_mode::two_way: mode_.emplace<two_way_mode>(opt_.feedback, base_); break;
      case pipeline_mode::hierarchical:
        opt_.hierarchical.op = opt_.buckets.op;
        opt_.hierarchical.checksum = opt_.buckets.checksum;
        mode_.emplace<hierarchical_mode>(opt_.hierarchical, opt_.feedback, base_);
        break;
      case pipeline_mode::low_rank: mode_.emplace<low_rank_mode>(*low_rank); break;
    }
    guard_.emplace(opt_.guard);
  }

  /// Builds a pipeline whose gradients are tensors in device memory, compressed by `src` (file
  /// comment): `cuda::device_compressor<C>` with feedback "residual", `cuda::stream_codec<C>`
  /// with feedback "none", C a CUDA codec. `opt.codec` is the spec of the CPU codec with the
  /// same wire format (e.g. "int8:bucket=100,rounding=stochastic" for
  /// `cuda::int8_codec{100, int8_rounding::stochastic}`): the pipeline's agreement round,
  /// statistics and checkpoints use it. `config_error` for what a device source does not take
  /// (`device_mode`'s constructor).
  template <pipeline_device_source Source>
  gradient_pipeline(pipeline_options opt, Source src) : gradient_pipeline(std::move(opt)) {
    host_exchange_mode host = std::visit(
        [](auto& m) -> host_exchange_mode {
          if constexpr (std::same_as<std::remove_cvref_t<decltype(m)>, device_mode>) {
            throw std::logic_error("gradcomp: gradient_pipeline: a device mode made twice");
          } else {
            return std::move(m);
          }
        },
        mode_);
    mode_.emplace<device_mode>(std::move(src), std::move(host), opt_, kind_, comp_, base_);
  }

  [[nodiscard]] pipeline_options const& options() const noexcept { return opt_; }
  /// The exchange mode the options select (pipeline/options.hpp).
  [[nodiscard]] pipeline_mode mode() const noexcept { return kind_; }
  /// The next step's number (steps completed so far).
  [[nodiscard]] std::uint64_t step_count() const noexcept { return step_; }
  /// The controller, if any.
  [[nodiscard]] any_controller const* controller() const noexcept { return ctrl_ ? &*ctrl_ : nullptr; }
  /// Statistics of the last completed step.
  [[nodiscard]] pipeline_stats const& last_stats() const noexcept { return last_; }
  /// Called with the statistics of every completed step (e.g. for logging); empty: none.
  void on_step(std::function<void(pipeline_stats const&)> hook) { hook_ = std::move(hook); }
  /// The divergence guard (history and counters).
  [[nodiscard]] divergence_guard const& guard() const noexcept { return *guard_; }
  /// Called on every rank with each guard trip that did not raise (a skipped or dense step),
  /// before the step returns. Without one, rank 0 prints the verdict's message to stderr.
  void on_guard(std::function<void(guard_verdict const&)> hook) { guard_hook_ = std::move(hook); }

  /// The matrix shape (rows × cols, row-major) PowerSGD gives tensor `id`. Without one a
  /// tensor of n elements is taken as n / c × c with c the largest divisor of n up to √n.
  /// `config_error` unless rows · cols > 0; a size mismatch is found at the step.
  void set_shape(tensor_id id, std::size_t rows, std::size_t cols) {
    if (rows == 0 || cols == 0) throw config_error("gradcomp: gradient_pipeline::set_shape needs rows and cols > 0");
    shapes_[id] = {rows, cols};
  }

  /// The node and lane communicators of this rank for the hierarchical all-reduce
  /// (`pipeline_options::hierarchical`), as `hierarchical_groups` describes them
  /// (collective/hierarchical.hpp): `node` holds the ranks of this rank's node, numbered as the
  /// grouping numbers them; `lane`, on a rank that owns a shard, the j-th ranks of every node,
  /// numbered by node. Kept for every later step (pass `any_communicator::borrow(c)` to keep a
  /// reference to a communicator that lives elsewhere, e.g. one from
  /// `nccl_communicator::split`). Required with a device source, whose payloads stay on these
  /// communicators; with host tensors the steps use them instead of point-to-point groups over
  /// the step's communicator (the same bits). Every rank sets them or none does (the step's
  /// agreement round checks, and checks them against the grouping). `config_error` without
  /// the hierarchical option.
  void set_hierarchical_groups(any_communicator node, std::optional<any_communicator> lane = std::nullopt) {
    hierarchical_mode* const h = hierarchical();
    if (!h) {
      throw config_error("gradcomp: gradient_pipeline::set_hierarchical_groups without pipeline_options::hierarchical");
    }
    if (open_) throw config_error("gradcomp: gradient_pipeline::set_hierarchical_groups during a step");
    h->set_groups(std::move(node), std::move(lane));
  }

  /// The committed error-feedback state of tensor `id` (the residual for "residual", h for
  /// "ef21", [u | v] for "dgc"); empty before its first step or without feedback.
  /// With a device source: the residual in device memory.
  [[nodiscard]] std::span<float const> feedback_state(tensor_id id) {
    if (device_mode const* const d = std::get_if<device_mode>(&mode_)) return d->state(id);
    hierarchical_mode* const h = std::get_if<hierarchical_mode>(&mode_);
    feedback_compressor& comp = h ? h->feedback() : comp_;  // the shard owners', by shard id
    return std::visit([&](auto& c) -> std::span<float const> { return c.state(id).values(); }, comp);
  }

  /// One step over all of the model's gradients (see file comment): averages them over the
  /// ranks of `comm` in place. Collective: every rank calls it with the same tensors (ids,
  /// sizes, order). Returns this rank's statistics.
  template <communicator Comm, element T>
  pipeline_stats step(Comm& comm, std::span<tensor_view<T> const> grads, pipeline_step_info const& info = {}) {
    begin(comm, info);
    try {
      for (auto const& g : grads) add_tensor(g);
    } catch (...) {
      abandon();
      throw;
    }
    return finish_step(comm);
  }
  /// `step` for a vector of tensors.
  template <communicator Comm, element T>
  pipeline_stats step(Comm& comm, std::vector<tensor_view<T>> const& grads, pipeline_step_info const& info = {}) {
    return step(comm, std::span<tensor_view<T> const>(grads), info);
  }

  /// Overlapped use, first call of a step: the backward pass is about to produce gradients.
  template <communicator Comm>
  void begin(Comm& comm, pipeline_step_info const& info = {}) {
    if (open_) {
      rollback();
      abandon();
    }
    open_ = true;
    t_begin_ = clock::now();
    cur_.number = step_;
    cur_.info = info;
    cur_.check = detail::step_check(opt_.buckets.checksum);
    cur_.rank = comm.rank();
    cur_.size = comm.size();
    cur_.entries.clear();
    cur_.guard_tensors.clear();
    cur_.guard_nonfinite = false;
    cur_.local = nullptr;
    cur_.plan = ctrl_ ? ctrl_->plan() : step_plan{};
    cur_.levels = !traits_.leveled ? 0 : (traits_.plan_levels ? cur_.plan.measure.size() : 1);
    if (flat_mode* const f = std::get_if<flat_mode>(&mode_)) {
      f->begin_step(
          traits_.plan_levels
              ? std::optional(std::span<double const>(cur_.plan.measure).first(cur_.levels))
              : std::nullopt);
    }
    cur_.ef_norm = 0.0;
    cur_.comp_norms.assign(cur_.levels, 0.0);
    cur_.layer_norms.clear();
    cur_.compress_s = 0.0;
    cur_.ctx = opt_.context;
    cur_.ctx.step = static_cast<std::uint32_t>(step_);
    // Shared-support codecs draw the same coordinates on every rank, and PowerSGD starts every
    // rank from the same Q: their seed is shared; the others add the rank (independent noise).
    bool const shared =
        traits_.shared_seed || base_.aggregation() == aggregation_kind::shared_support;
    cur_.ctx.seed = opt_.seed + (shared ? 0u : static_cast<std::uint64_t>(cur_.rank));
  }

  /// Overlapped use: a bucket of gradients is ready (e.g. from a DDP bucket hook). Its tensors
  /// are compressed now, while the backward pass goes on; they are sent and written back by
  /// `finish`. The tensors must stay alive and unchanged by the caller until then.
  template <element T>
  void submit(std::span<tensor_view<T> const> grads) {
    if (!open_) throw config_error("gradcomp: gradient_pipeline::submit before begin");
    for (auto const& g : grads) add_tensor(g);
  }
  /// `submit` for a vector of tensors.
  template <element T>
  void submit(std::vector<tensor_view<T>> const& grads) {
    submit(std::span<tensor_view<T> const>(grads));
  }

  /// Overlapped use, last call of a step: agrees, decides, sends, commits and writes every
  /// submitted tensor's average back. Collective.
  template <communicator Comm>
  pipeline_stats finish(Comm& comm) {
    if (!open_) throw config_error("gradcomp: gradient_pipeline::finish before begin");
    return finish_step(comm);
  }

  /// Saves the whole state ("GCPL" v2, pipeline/checkpoint.hpp, docs/pipeline.md): codec,
  /// feedback and controller specs, the two-way flag, the step counter and timing, then the
  /// sections — error feedback (the pipeline's compressor, the hierarchical shard owners' or a
  /// device source's), controller, layer accumulators, the mode's PowerSGD sessions and two-way
  /// state, guard; a mode that keeps none of a section writes it empty. Not during an open step.
  [[nodiscard]] std::vector<std::byte> save() const {
    if (open_) throw config_error("gradcomp: gradient_pipeline::save during a step (call finish first)");
    detail::checkpoint_writer w(checkpoint_of(), step_, last_timing_);
    device_mode const* const dev = std::get_if<device_mode>(&mode_);
    if (dev) {
      w.feedback(dev->feedback_section());
    } else {
      hierarchical_mode const* const h = std::get_if<hierarchical_mode>(&mode_);
      w.feedback(std::visit([](auto const& c) { return c.save(); }, h ? h->feedback() : comp_));
    }
    w.controller(ctrl_ ? ctrl_->save() : std::vector<std::byte>{});
    if (dev) {
      w.accumulators(dev->accumulators());
    } else {
      w.accumulators(accumulators_);
    }
    save_mode_sections(w.mode_sections(), mode_);
    w.guard(guard_->save());
    return w.finish();
  }

  /// Restores a state written by `save` of a pipeline with the same codec, feedback,
  /// controller, two-way and guard options. A malformed, corrupted (the checkpoint ends in a
  /// CRC32C of all its bytes, core/serialize.hpp) or mismatched checkpoint is a `format_error`
  /// and leaves the state unchanged; so is one saved before checkpoints carried a checksum. With a
  /// device source the residuals are copied to the device (on the source's stream).
  void load(std::span<std::byte const> bytes) {
    if (open_) throw config_error("gradcomp: gradient_pipeline::load during a step");
    detail::checkpoint_reader r(bytes, checkpoint_of());
    // Everything is restored into copies first, then swapped in: a failure changes nothing.
    feedback_compressor comp = comp_;
    std::optional<exchange_mode> mode;  // host tensors: the mode's state, restored
    std::vector<std::byte> const fstate = r.feedback();
    if (auto const* h = std::get_if<hierarchical_mode>(&mode_)) {
      mode.emplace(h->loaded_from(fstate));  // the owners' feedback is the mode's
    } else {
      std::visit([&](auto& c) { c.load(fstate, state_check::container); },
                 comp);  // GCPL checked it
    }
    // A device source: the states (and EF21's receivers) validated by the host compressor
    // above, the other sections by its host mode, copied at the end.
    device_mode* const dev = std::get_if<device_mode>(&mode_);
    device_mode::restored restored;
    if (dev) restored = dev->restore_feedback(comp);
    std::optional<any_controller> ctrl = ctrl_;
    std::vector<std::byte> const kstate = r.controller();
    if (ctrl) {
      ctrl->load(kstate);
    } else if (!kstate.empty()) {
      r.fail("holds controller state, this pipeline has no controller");
    }
    std::map<tensor_id, std::vector<float>> acc = r.accumulators();
    if (dev) {
      dev->read_sections(r.mode_sections(), restored);
    } else if (std::optional<exchange_mode> m = loaded_mode_sections(r.mode_sections(), mode_)) {
      mode = std::move(m);
    }
    std::optional<divergence_guard> guard(std::in_place, opt_.guard);
    {
      std::vector<std::byte> const gstate = r.guard();
      try {
        guard->load(gstate);
      } catch (format_error const& e) {
        r.fail(e.what());
      }
    }
    r.end();
    if (dev) {
      dev->load(std::move(restored), acc);
    } else {
      comp_ = std::move(comp);
      accumulators_ = std::move(acc);
      if (mode) mode_ = std::move(*mode);
    }
    ctrl_ = std::move(ctrl);
    guard_ = std::move(guard);
    step_ = r.step();
    last_timing_ = r.timing();
  }

  /// Magic and version of the checkpoint format (pipeline/checkpoint.hpp).
  static constexpr char const* checkpoint_magic = detail::pipeline_checkpoint_magic;
  static constexpr std::uint8_t checkpoint_version = detail::pipeline_checkpoint_version;

 private:
  using clock = detail::step_clock;
  static double seconds(clock::time_point a, clock::time_point b) {
    return detail::seconds_between(a, b);
  }

  // The configuration the checkpoint is saved with and checked against.
  [[nodiscard]] checkpoint_config checkpoint_of() const {
    return {opt_.codec, opt_.feedback, opt_.controller, opt_.two_way};
  }

  // The hierarchical mode the pipeline runs (with host tensors or a device source), if any.
  [[nodiscard]] hierarchical_mode* hierarchical() noexcept {
    if (device_mode* const d = std::get_if<device_mode>(&mode_)) return d->hierarchical();
    return std::get_if<hierarchical_mode>(&mode_);
  }

  // Adds one tensor to the step: checks it, converts a 16-bit one, stages and compresses it
  // (the device mode: in its source). A local failure is recorded (every rank learns of it in
  // the agreement round).
  template <element T>
  void add_tensor(tensor_view<T> const& g) {
    auto const t0 = clock::now();
    for (auto const& e : cur_.entries) {
      if (e.id == g.id()) {
        // recorded, not thrown: every rank must reach the step's agreement round, which then
        // fails on all of them (this rank with this error)
        if (!cur_.local) {
          cur_.local = std::make_exception_ptr(config_error(
              "gradcomp: gradient_pipeline: tensor id " +
              std::to_string(static_cast<unsigned>(g.id())) + " appears twice in one step"));
        }
        return;
      }
    }
    step_entry e;
    e.id = g.id();
    e.n = g.size();
    e.large = g.size() >= opt_.buckets.min_compress_elements;
    if (device_mode* const d = std::get_if<device_mode>(&mode_)) {
      d->add(e, g, cur_, guard_->enabled(), opt_.measure_gain || ctrl_needs_gains());
    } else {
      add_host_tensor(e, g);
    }
    cur_.entries.push_back(std::move(e));
    cur_.compress_s += seconds(t0, clock::now());
  }

  template <element T>
  void add_host_tensor(step_entry& e, tensor_view<T> const& g) {
    if constexpr (std::same_as<T, float>) {
      e.out32 = g.span();
      e.raw32 = g.span();
    } else {
      std::vector<float>& wide = wide_[g.id()];
      wide.resize(g.size());
      detail::widen_to_f32(std::span<T const>(g.span()), std::span<float>(wide), cur_.ctx);
      e.out32 = std::span<float>(wide);
      e.raw32 = std::span<float const>(wide);
      std::span<T> const dst = g.span();
      std::vector<float>* w = &wide;
      codec_context const* ctx = &cur_.ctx;
      e.write_back = [dst, w, ctx] {
        detail::round_from_f32(std::span<float const>(*w), dst, *ctx);
      };
    }
    bool stages = e.large && traits_.stages;
    if (guard_->enabled()) {
      // The guard's local norms; a non-finite one is not staged (the codec would throw): the
      // guard's round tells every rank, and no packet of this step is sent then.
      guard_tensor gt{e.id, detail::norm_sq(e.raw32), 0.0};
      if (stages) {
        gt.residual_sq =
            detail::norm_sq(std::visit([&](auto& c) { return c.state(e.id).values(); }, comp_));
      }
      cur_.guard_tensors.push_back(gt);
      if (!std::isfinite(gt.gradient_sq) || !std::isfinite(gt.residual_sq))
        cur_.guard_nonfinite = true;
      if (cur_.guard_nonfinite) stages = false;
    }
    if (stages && !cur_.local) {
      try {
        std::get<flat_mode>(mode_).stage(comp_,
                                         tensor_view<T const>(std::span<T const>(g.span()), g.id()),
                                         std::span<double const>(cur_.plan.measure), cur_.ctx,
                                         opt_.measure_gain || ctrl_needs_gains(), cur_.ef_norm,
                                         std::span<double>(cur_.comp_norms));
      } catch (...) {
        cur_.local = std::current_exception();
      }
    }
  }

  void accumulate_layer(step_entry const& e) {
    auto const found = accumulators_.find(e.id);
    accumulator_undo_.emplace_back(e.id, found == accumulators_.end() ? std::nullopt : std::optional(found->second));
    std::vector<float>& acc = accumulators_[e.id];  // (put back if the step fails)
    if (cur_.plan.accumulate_layers) {
      if (acc.size() != e.n) acc.assign(e.n, 0.0f);
      for (std::size_t i = 0; i < e.n; ++i) acc[i] += e.raw32[i];
    }
    if (cur_.plan.report_layers) {
      cur_.layer_norms.push_back(acc.empty() ? 0.0 : detail::norm_sq(acc));
      acc.clear();
    }
  }

  [[nodiscard]] bool ctrl_needs_gains() const noexcept {
    return ctrl_ && cur_.plan.measure.size() > 1;
  }

  // Leaves the step without sending: every stage is discarded, nothing is committed.
  void abandon() noexcept {
    discard_stages();
    cur_.entries.clear();
    open_ = false;
  }
  void discard_stages() noexcept {
    if (flat_mode* const f = std::get_if<flat_mode>(&mode_)) f->discard(comp_);
    if (device_mode* const d = std::get_if<device_mode>(&mode_)) d->discard(cur_.entries);
  }

  template <communicator Comm>
  pipeline_stats finish_step(Comm& comm) {
    std::optional<any_controller> snapshot;
    try {
      pipeline_stats st = run_step(comm, snapshot);
      open_ = false;
      cur_.entries.clear();
      return st;
    } catch (...) {
      if (snapshot) ctrl_ = std::move(snapshot);
      rollback();
      abandon();
      throw;
    }
  }

  // A failed step: the mode's state (PowerSGD sessions, two-way residuals, the hierarchical
  // owners' feedback; a device source's) and the layer accumulators go back to what they were
  // before it (the flat mode's residuals were only prepared, `abandon` discards them).
  void rollback() noexcept {
    try {
      std::visit(
          [](auto& m) {
            if constexpr (!std::same_as<std::remove_cvref_t<decltype(m)>, flat_mode>) m.rollback();
          },
          mode_);
      for (auto& [id, acc] : accumulator_undo_) {
        if (acc) accumulators_[id] = std::move(*acc);
        else accumulators_.erase(id);
      }
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory while restoring
    }
    accumulator_undo_.clear();
  }

  // The opening of every step: the statistics' counts, the pending tensors as bucket items, the
  // agreement round (layout, configuration and every rank's local success, in one round), which
  // gives the bucket `plan`, and the divergence guard's round (every rank gets the same verdict
  // `gv`); their time is added to `communicate`. Returns true for a step the guard skips, which
  // is then complete (`s.st` its statistics).
  template <communicator Comm>
  bool open_step(Comm& comm, opened_step& s) {
    s.st.step = step_;
    s.st.tensors = cur_.entries.size();
    auto const t_agree = clock::now();
    s.items.reserve(cur_.entries.size());
    for (auto const& e : cur_.entries)
      s.items.push_back({tensor_view<float const>(e.raw32, e.id), e.out32});
    s.plan = agree_step(comm, s.items, s.br);
    s.communicate += seconds(t_agree, clock::now());
    if (!guard_->enabled()) return false;
    s.gv = check_guard(comm, s.br, s.st, s.communicate);
    if (s.gv.action != guard_action::skipped) return false;
    s.st = skip_step(s.st, s.gv, s.communicate);
    return true;
  }

  // A step: the protocol's opening, then the exchange step of the mode, chosen once.
  template <communicator Comm>
  pipeline_stats run_step(Comm& comm, std::optional<any_controller>& snapshot) {
    opened_step s;
    s.snapshot = &snapshot;
    if (open_step(comm, s)) return s.st;
    return std::visit([&](auto& m) { return exchange_step(comm, m, s); }, mode_);
  }

  // The flat mode's step: the layer accumulators, the decision (the controller's, or the codec
  // as given), the next residuals prepared, the packets of the decided level (or every tensor
  // dense) in the bucketed collective, the outcome round, then the commit of exactly what was
  // sent, the receiver side and the 16-bit outputs.
  template <communicator Comm>
  pipeline_stats exchange_step(Comm& comm, flat_mode& m, opened_step& s) {
    pipeline_stats& st = s.st;
    bool const guard_dense = s.guard_dense();
    // Accordion's per-layer gradients, once the step is known to go through.
    if (cur_.plan.accumulate_layers || cur_.plan.report_layers) {
      for (auto const& e : cur_.entries) accumulate_layer(e);
    }
    std::size_t k = 0;
    residual_rule rule = residual_rule::subtract_sent;
    st.factor = 32.0 / base_.bits_per_element();
    if (guard_dense) {  // every tensor's own g, dense; the controller is not asked
      k = decision::npos;
      rule = residual_rule::keep;
      detail::dense_step_stats(st);
    } else if (ctrl_) {
      std::tie(k, rule) = decide_step(comm, st, *s.snapshot, s.communicate);
    } else if (opt_.measure_gain) {
      gain_round(comm, st, s.communicate);
    }
    for (auto const& e : cur_.entries)
      st.compressed_tensors += e.large && k != decision::npos ? 1 : 0;

    // The next residuals for the packets to be sent are computed now (the packets may be summed
    // in place on the wire); they become current only once the exchange has succeeded.
    std::span<bucket_item const> const items(s.items);
    auto const t_prepare = clock::now();
    if (k != decision::npos) m.prepare(comp_, items, k, cur_.ctx);
    double const prepare_s = seconds(t_prepare, clock::now());

    double decode = 0.0;
    auto const t_send = clock::now();
    if (k == decision::npos) {
      m.exchange_dense(comm, comp_, items, rule, cur_.size, cur_.ctx, cur_.check, slots_, s.br,
                       decode);
    } else {
      m.exchange_level(comm, s.plan, k, items, cur_.size, cur_.ctx, cur_.check, slots_, s.br,
                       decode);
    }
    outcome_round(comm, s.br);
    s.communicate += seconds(t_send, clock::now()) - decode;

    // Commit exactly what was sent, then the receiver side and the 16-bit outputs.
    auto const t_commit = clock::now();
    m.commit(comp_, items, k, rule, s.gv.reset_residual);
    double const commit_s = seconds(t_commit, clock::now());
    auto const t_out = clock::now();
    if (!guard_dense) m.receive(comp_, items);
    write_back();
    decode += seconds(t_out, clock::now());
    return complete(s, prepare_s + commit_s, decode);
  }

  // A per-tensor mode's step (two-way, hierarchical, PowerSGD): each compressed tensor through
  // the mode's collective, the small ones dense in buckets (every tensor dense on the guard's
  // dense step), the outcome round, then the mode's commit.
  template <communicator Comm, class Mode>
  pipeline_stats exchange_step(Comm& comm, Mode& m, opened_step& s) {
    pipeline_stats& st = s.st;
    bool const guard_dense = s.guard_dense();
    st.factor = traits_.factor_from_bytes ? 1.0 : 32.0 / base_.bits_per_element();
    if (guard_dense) {
      detail::dense_step_stats(st);
    } else if (traits_.gain_round && opt_.measure_gain) {
      gain_round(comm, st, s.communicate);
    }
    for (auto const& e : cur_.entries) st.compressed_tensors += e.large && !guard_dense ? 1 : 0;
    double decode = 0.0;
    auto const t_send = clock::now();
    if (guard_dense) {
      send_raw_dense(comm, std::span<bucket_item const>(s.items), dense_format::f32, s.br, decode);
    } else {
      collective_options const copt{opt_.buckets.op, opt_.buckets.checksum};
      std::vector<bucket_item> const dense = detail::for_each_compressed(
          std::span<step_entry const>(cur_.entries), s.br,
          [&](step_entry const& e, tensor_view<float const> g) {
            auto const [rows, cols] =
                shape_of(e.id, e.n);  // (PowerSGD's; the other modes take no shape)
            return m.exchange(comm, exchange_tensor{g, e.out32, rows, cols}, cur_.ctx, copt,
                              cur_.check);
          });
      if (!dense.empty()) {
        send_raw_dense(comm, std::span<bucket_item const>(dense), opt_.buckets.small_format, s.br,
                       decode);
      }
    }
    outcome_round(comm, s.br);
    m.commit();
    s.communicate += seconds(t_send, clock::now()) - decode;
    auto const t_out = clock::now();
    write_back();
    decode += seconds(t_out, clock::now());
    return complete(s, 0.0, decode);
  }

  // A device source's step: its mode's exchange in the source (pipeline/device_mode.hpp), with
  // the protocol's decision, gain round and PowerSGD shapes; decoding runs inside it.
  template <communicator Comm>
  pipeline_stats exchange_step(Comm& comm, device_mode& m, opened_step& s) {
    m.exchange(
        comm, cur_, s,
        [&](pipeline_stats& st) { return decide_step(comm, st, *s.snapshot, s.communicate); },
        [&](pipeline_stats& st) { gain_round(comm, st, s.communicate); },
        [&](tensor_id id, std::size_t n) { return shape_of(id, n); });
    write_back();
    return complete(s, 0.0, 0.0);
  }

  // Every rank decoded everything (and, with the checksum option, got intact data) before
  // anyone commits: the step-outcome round (collective/outcome.hpp). The layer accumulators of
  // the step are kept from then on.
  template <communicator Comm>
  void outcome_round(Comm& comm, bucket_result& br) {
    detail::agree_outcome(comm, cur_.check, "gradient_pipeline", step_);
    br.wire_bytes += detail::outcome_wire_bytes(opt_.buckets.checksum, cur_.size);
    accumulator_undo_.clear();
  }

  // The statistics of a step from its exchange, then `close_step`.
  pipeline_stats complete(opened_step& s, double compress_s, double decode) {
    s.st.bytes_sent = s.br.packet_bytes;
    s.st.wire_bytes = s.br.wire_bytes;
    s.st.buckets = s.br.buckets;
    s.st.compress_s = cur_.compress_s + compress_s;
    s.st.communicate_s = s.communicate;
    s.st.decode_s = decode;
    return close_step(s.st, s.gv);
  }

  // `measure_gain` without a controller: ‖C(g_ef)‖² / ‖g_ef‖² over all ranks, in `st.gain`.
  template <communicator Comm>
  void gain_round(Comm& comm, pipeline_stats& st, double& communicate) {
    double sums[2] = {cur_.ef_norm, cur_.levels > 0 ? cur_.comp_norms[0] : 0.0};
    auto const t0 = clock::now();
    cur_.sum(comm, std::span<double>(sums));
    communicate += seconds(t0, clock::now());
    st.gain = sums[0] > 0.0 ? sums[1] / sums[0] : 1.0;
  }

  // 16-bit gradients: the result rounded once.
  void write_back() {
    for (auto const& e : cur_.entries) {
      if (e.write_back) e.write_back();
    }
  }

  // `items` sent dense as they are (the guard's dense step, the per-tensor modes' small
  // tensors), dense buckets in format `small`.
  template <communicator Comm>
  void send_raw_dense(Comm& comm, std::span<bucket_item const> items, dense_format small,
                      bucket_result& br, double& decode) {
    bucket_options o = opt_.buckets;
    o.small_format = small;
    detail::exchange_dense_buckets(
        comm, items, o, base_, cur_.size, cur_.ctx, cur_.check, slots_,
        [&](std::size_t i) { return items[i].grad.span(); }, br, decode);
  }

  // The controller's decision (host and device steps): the step's statistics summed over the
  // ranks (`agree`), the level k to send (`decision::npos`: dense) and the residual rule, the
  // sent kind, factor and gain in `st`; the controller before the decision kept in `snapshot`
  // (put back if the step fails). Its time is added to `communicate`.
  template <communicator Comm>
  std::pair<std::size_t, residual_rule> decide_step(Comm& comm, pipeline_stats& st,
                                                    std::optional<any_controller>& snapshot, double& communicate) {
    auto const t0 = clock::now();
    step_stats s = cur_.controller_stats(last_timing_);
    agree(
        s, [&](std::span<double> v) { cur_.sum(comm, v); },
        [&](std::span<double> v) { cur_.max(comm, v); });
    communicate += seconds(t0, clock::now());
    snapshot.emplace(*ctrl_);
    decision const d = ctrl_->decide(s);
    std::size_t const k = d.packet(cur_.levels);
    residual_rule rule = d.residual;
    st.sent = d.send;
    st.factor = d.factor;
    if (k != decision::npos && s.ef_norm_sq > 0.0 && (opt_.measure_gain || ctrl_needs_gains())) {
      st.gain = s.compressed_norm_sq[k] / s.ef_norm_sq;
    } else if (k == decision::npos) {
      st.gain = 1.0;
    }
    // A receiving policy (EF21) sends increments: g with the residual kept is no increment.
    bool const receives = std::visit([](auto const& c) { return std::remove_cvref_t<decltype(c)>::receives; }, comp_);
    if (k == decision::npos && rule == residual_rule::keep && receives) rule = residual_rule::zero;
    return {k, rule};
  }

  // The end of a completed step (every kind): timing for the controller, the step counter, the
  // guard's history and report, the statistics and the hook.
  pipeline_stats close_step(pipeline_stats& st, guard_verdict const& gv) {
    st.total_s = seconds(t_begin_, clock::now());
    // PowerSGD has no bits per element: its factor is what the step saved, the bytes of its
    // gradients sent dense (float32, the baseline of every codec's factor) over the bytes sent.
    if (traits_.factor_from_bytes && st.sent != send_kind::dense && st.bytes_sent > 0) {
      std::size_t dense = 0;
      for (auto const& e : cur_.entries) dense += 4 * e.n;
      st.factor = static_cast<double>(dense) / static_cast<double>(st.bytes_sent);
    }
    last_timing_ = opt_.measured_timing
                       ? step_timing{cur_.info.backprop_s, st.compress_s, st.communicate_s}
                       : step_timing{cur_.info.backprop_s, 0.0, 0.0};
    ++step_;
    if (guard_->enabled()) {
      guard_->commit(gv);
      st.guard = gv.action;
      if (gv.tripped) report_guard(gv);
    }
    last_ = st;
    if (hook_) hook_(st);
    return st;
  }

  // The checkpoint's PowerSGD and two-way sections (adjacent in "GCPL") of mode `m`: the mode's
  // own where it keeps one, the other empty (a device source: its own, in the host formats).
  static void save_mode_sections(detail::byte_writer& w, exchange_mode const& m) {
    std::visit(
        [&](auto const& mode) {
          using M = std::remove_cvref_t<decltype(mode)>;
          if constexpr (std::same_as<M, device_mode>) {
            mode.save(w);
          } else {
            if constexpr (std::same_as<M, low_rank_mode>)
              mode.save(w);
            else
              low_rank_mode::save_none(w);
            if constexpr (std::same_as<M, two_way_mode>)
              mode.save(w);
            else
              two_way_mode::save_none(w);
          }
        },
        m);
  }
  // Reads those sections for host mode `m`: a copy of `m` holding the state read where the mode
  // keeps one (`r.fail` where a section that must be empty is not). (A device source reads them
  // itself, `device_mode::read_sections`.)
  static std::optional<exchange_mode> loaded_mode_sections(detail::byte_reader& r,
                                                           exchange_mode const& m) {
    return std::visit(
        [&](auto const& mode) {
          using M = std::remove_cvref_t<decltype(mode)>;
          std::optional<exchange_mode> out;
          if constexpr (!std::same_as<M, device_mode>) {
            if constexpr (std::same_as<M, low_rank_mode>)
              out.emplace(mode.loaded(r));
            else
              low_rank_mode::expect_none(r);
            if constexpr (std::same_as<M, two_way_mode>)
              out.emplace(mode.loaded(r));
            else
              two_way_mode::expect_none(r);
          }
          return out;
        },
        m);
  }

  // ---- The rounds every step shares ----

  // The divergence guard's round (guard.hpp): every rank gets the same verdict, recorded in
  // `st`; a verdict that raises throws here. Its time is added to `communicate`.
  template <communicator Comm>
  guard_verdict check_guard(Comm& comm, bucket_result& br, pipeline_stats& st, double& communicate) {
    auto const t0 = clock::now();
    // In tensor id order, so that the sums over the tensors do not depend on the order in which
    // they were submitted (whole step, bucket by bucket).
    std::sort(cur_.guard_tensors.begin(), cur_.guard_tensors.end(),
              [](guard_tensor const& a, guard_tensor const& b) {
                return static_cast<std::uint32_t>(a.id) < static_cast<std::uint32_t>(b.id);
              });
    bool const watch = traits_.stages && opt_.feedback != "none";
    guard_verdict gv = guard_->check_with(
        [&](std::span<double> v) { cur_.sum(comm, v); }, comm.size(), step_,
        std::span<guard_tensor const>(cur_.guard_tensors), watch, cur_.info.loss, br.wire_bytes);
    communicate += seconds(t0, clock::now());
    st.gradient_norm = gv.gradient;
    st.residual_norm = gv.residual;
    st.loss = gv.loss;
    if (gv.raise_it) throw numeric_error(gv.message);
    return gv;
  }

  // A step the guard skips: nothing is sent and no state changes (stages discarded, the step
  // counter kept); the gradient tensors are set to zero on every rank.
  pipeline_stats skip_step(pipeline_stats st, guard_verdict const& gv, double communicate) {
    discard_stages();
    device_mode const* const dev = std::get_if<device_mode>(&mode_);
    for (auto& e : cur_.entries) {
      if (dev) {
        dev->zero(e.out32);
      } else {
        std::fill(e.out32.begin(), e.out32.end(), 0.0f);
      }
      if (e.write_back) e.write_back();
      e.staged = false;
    }
    guard_->commit(gv);
    st.guard = guard_action::skipped;
    st.sent = send_kind::dense;
    st.factor = 1.0;
    st.communicate_s = communicate;
    st.compress_s = cur_.compress_s;
    st.total_s = seconds(t_begin_, clock::now());
    report_guard(gv);
    last_ = st;
    if (hook_) hook_(st);
    return st;
  }

  void report_guard(guard_verdict const& gv) {
    if (guard_hook_) {
      guard_hook_(gv);
    } else if (cur_.rank == 0) {
      std::fprintf(stderr, "%s\n", gv.message.c_str());
    }
  }

  // The step's agreement round: layout (ids, sizes, order, bucketing), configuration
  // (codec, feedback, controller, step; the hierarchical mode's plan) and each rank's local
  // status.
  template <communicator Comm>
  std::vector<detail::bucket_plan> agree_step(Comm& comm, std::vector<bucket_item> const& items, bucket_result& br) {
    std::exception_ptr local = cur_.local;
    rank_report mine;
    mine.count = items.size();
    mine.codec = static_cast<std::uint32_t>(base_.id());
    std::vector<detail::bucket_plan> plan;
    try {
      plan = detail::plan_buckets(std::span<bucket_item const>(items), opt_.buckets);
      fingerprint fp;
      fp.add("gradient_pipeline").add(opt_.codec).add(opt_.feedback).add(opt_.controller);
      if (hierarchical_mode* const h = hierarchical())
        h->plan_step(comm.size(), comm.rank(), std::holds_alternative<device_mode>(mode_), fp);
      fp.add(opt_.two_way ? 1 : 0).add(step_).add(opt_.buckets.bucket_bytes).add(opt_.buckets.min_compress_elements);
      fp.add(static_cast<std::uint64_t>(opt_.buckets.small_format)).add(static_cast<std::uint64_t>(opt_.buckets.op));
      fp.add(opt_.measure_gain ? 1 : 0).add(opt_.guard);
      if (opt_.buckets.checksum) fp.add("checksum");
      for (auto const& it : items) fp.add(it.out.size()).add(static_cast<std::uint64_t>(it.grad.id()));
      mine.fingerprint = fp.value();
    } catch (...) {
      if (!local) local = std::current_exception();
    }
    if (local) mine.status = 1;
    detail::report_round round;
    round.post(comm, mine, {}, opt_.buckets.checksum, "gradient_pipeline");
    round.finish("gradient_pipeline", local);
    br.wire_bytes += round.wire_bytes();
    return plan;
  }

  [[nodiscard]] std::pair<std::size_t, std::size_t> shape_of(tensor_id id, std::size_t n) const {
    if (auto it = shapes_.find(id); it != shapes_.end()) return it->second;
    std::size_t c = 1;
    for (std::size_t d = 1; d * d <= n; ++d) {
      if (n % d == 0) c = d;
    }
    return {n / c, c};
  }

  pipeline_options opt_;
  pipeline_mode kind_ = pipeline_mode::flat;
  pipeline_mode_traits traits_ = pipeline_mode_traits_of(pipeline_mode::flat);
  any_codec base_ = make_codec("identity");
  // The error feedback of `opt_.feedback`: the flat mode's residuals, and in every mode the
  // checkpoint's feedback section (but the hierarchical one's) and a device source's format.
  feedback_compressor comp_ = compressor<any_codec, no_feedback>(make_codec("identity"));
  exchange_mode mode_{std::in_place_type<flat_mode>, make_codec("identity"), bucket_options{}};
  std::optional<any_controller> ctrl_;
  std::map<tensor_id, std::pair<std::size_t, std::size_t>> shapes_;
  std::map<tensor_id, std::vector<float>>
      wide_;  // float32 copy of a 16-bit gradient, then its output
  std::map<tensor_id, std::vector<float>> accumulators_;  // the controller's layer accumulators
  detail::bucket_slot slots_[2];

  // The step in progress.
  bool open_ = false;
  clock::time_point t_begin_;
  step_state cur_;
  std::vector<std::pair<tensor_id, std::optional<std::vector<float>>>>
      accumulator_undo_;  // the step's accumulators before it

  // Across steps.
  std::uint64_t step_ = 0;
  step_timing last_timing_;
  pipeline_stats last_;
  std::function<void(pipeline_stats const&)> hook_;
  std::optional<divergence_guard> guard_;
  std::function<void(guard_verdict const&)> guard_hook_;
};

GRADCOMP_NAMESPACE_END
