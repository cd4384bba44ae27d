// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `gradient_pipeline`: the training step of compressed data-parallel training, the one front
/// door. A training loop calls it once per step with its gradient tensors (or bucket by bucket
/// as the backward pass produces them, `submit` / `finish`); it writes the average over all
/// ranks of what was sent back into the tensors. What it promises:
///
/// - **Atomic steps.** A failure anywhere (a NaN gradient on one rank, mismatched layouts, a
///   lost peer, a packet one rank cannot decode) throws on every rank and leaves the pipeline's
///   state exactly as it was before the step (`save` gives the same bytes), so a retry computes
///   what the step would have; the gradient tensors may hold partial output then.
/// - **Error feedback for exactly what was sent**: each residual is prepared before the
///   exchange and made current only after the step-outcome round said every rank succeeded.
/// - **Checkpoints** (`save` / `load`, "GCPL"): a resumed run is bit-identical to one that
///   never stopped; a malformed or corrupted checkpoint changes nothing.
/// - **Device sources** (docs/cuda.md): gradients in device memory give outputs, residuals,
///   statistics and checkpoints byte for byte those of the CPU pipeline.
///
/// This header is the step protocol: plan → stage → agree → guard → exchange → outcome →
/// commit or roll back; save / load. The exchange is the mode's, one per header, chosen once at
/// construction from the table of pipeline/options.hpp and held in `exchange_mode`
/// (`flat_mode`, `two_way_mode`, `hierarchical_mode`, `low_rank_mode`, or `device_mode` for a
/// device source); the shared rounds are pipeline/rounds.hpp's, the step in progress
/// pipeline/step_state.hpp's, the checkpoint's container pipeline/checkpoint.hpp. The phases of
/// a step, the divergence guard, the statistics and the checkpoint format are described in
/// docs/pipeline.md.

#include <gradcomp/adapt/any_controller.hpp>
#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/codec/codec_spec.hpp>
#include <gradcomp/codec/powersgd.hpp>
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
#include <gradcomp/pipeline/rounds.hpp>
#include <gradcomp/pipeline/step_state.hpp>
#include <gradcomp/pipeline/two_way_mode.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

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
  [[nodiscard]] std::uint64_t step_count() const noexcept { return hist_.step; }
  /// The controller, if any.
  [[nodiscard]] any_controller const* controller() const noexcept { return ctrl_ ? &*ctrl_ : nullptr; }
  /// Statistics of the last completed step.
  [[nodiscard]] pipeline_stats const& last_stats() const noexcept { return hist_.last; }
  /// Called with the statistics of every completed step (e.g. for logging); empty: none.
  void on_step(std::function<void(pipeline_stats const&)> hook) { hist_.on_step = std::move(hook); }
  /// The divergence guard (history and counters).
  [[nodiscard]] divergence_guard const& guard() const noexcept { return *guard_; }
  /// Called on every rank with each guard trip that did not raise (a skipped or dense step),
  /// before the step returns. Without one, rank 0 prints the verdict's message to stderr.
  void on_guard(std::function<void(guard_verdict const&)> hook) { hist_.on_guard = std::move(hook); }

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
    cur_.number = hist_.step;
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
    cur_.ctx.step = static_cast<std::uint32_t>(hist_.step);
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
    detail::checkpoint_writer w(checkpoint_of(), hist_.step, hist_.last_timing);
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
    detail::save_mode_sections(w.mode_sections(), mode_);
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
    } else if (std::optional<exchange_mode> m = detail::loaded_mode_sections(r.mode_sections(), mode_)) {
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
    hist_.step = r.step();
    hist_.last_timing = r.timing();
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
      d->add(e, g, cur_, guard_->enabled(), opt_.measure_gain || services().needs_gains());
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
                                         opt_.measure_gain || services().needs_gains(), cur_.ef_norm,
                                         std::span<double>(cur_.comp_norms));
      } catch (...) {
        cur_.local = std::current_exception();
      }
    }
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
      for (auto& [id, acc] : undo_) {
        if (acc) accumulators_[id] = std::move(*acc);
        else accumulators_.erase(id);
      }
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory while restoring
    }
    undo_.clear();
  }

  // The opening of every step: the statistics' counts, the pending tensors as bucket items, the
  // agreement round (layout, configuration and every rank's local success, in one round), which
  // gives the bucket `plan`, and the divergence guard's round (every rank gets the same verdict
  // `gv`); their time is added to `communicate`. Returns true for a step the guard skips, which
  // is then complete (`s.st` its statistics).
  template <communicator Comm>
  bool open_step(Comm& comm, opened_step& s) {
    s.st.step = hist_.step;
    s.st.tensors = cur_.entries.size();
    auto const t_agree = clock::now();
    s.items.reserve(cur_.entries.size());
    for (auto const& e : cur_.entries)
      s.items.push_back({tensor_view<float const>(e.raw32, e.id), e.out32});
    step_services sv = services();
    s.plan = agree_step(sv, comm, s.items, s.br, [&](fingerprint& fp) {
      if (hierarchical_mode* const h = hierarchical())
        h->plan_step(comm.size(), comm.rank(), std::holds_alternative<device_mode>(mode_), fp);
    });
    s.communicate += seconds(t_agree, clock::now());
    if (!guard_->enabled()) return false;
    s.gv = check_guard(sv, comm, s.br, s.st, s.communicate);
    if (s.gv.action != guard_action::skipped) return false;
    discard_stages();  // a skipped step: nothing is sent, every output is zero
    device_mode const* const dev = std::get_if<device_mode>(&mode_);
    s.st = skip_step(sv, s.st, s.gv, s.communicate, [&](std::span<float> out) {
      if (dev) {
        dev->zero(out);
      } else {
        std::fill(out.begin(), out.end(), 0.0f);
      }
    });
    return true;
  }

  // A step: the protocol's opening, then the exchange step of the mode, chosen once.
  template <communicator Comm>
  pipeline_stats run_step(Comm& comm, std::optional<any_controller>& snapshot) {
    opened_step s;
    s.snapshot = &snapshot;
    if (open_step(comm, s)) return s.st;
    step_services sv = services();
    return std::visit([&](auto& m) { return exchange_step(comm, m, s, sv); }, mode_);
  }

  // What the rounds and the modes' exchange steps use of this pipeline (pipeline/rounds.hpp).
  [[nodiscard]] step_services services() {
    return {opt_,          traits_, base_,  comp_, ctrl_, cur_, slots_, shapes_,
            accumulators_, undo_,   *guard_, hist_, t_begin_};
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
  accumulator_undo undo_;  // the step's accumulators before it

  // Across steps.
  step_history hist_;  // the step counter, the controller's timing, the last statistics, hooks
  std::optional<divergence_guard> guard_;
};

GRADCOMP_NAMESPACE_END
