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
/// `cuda::device_compressor<C, Rule>` (feedback "residual", "ef21" or "dgc:...", the rule's,
/// with DGC's parameters) or a `cuda::stream_codec<C>` (feedback "none") of a CUDA codec,
/// element-wise or sparsifier — the pipeline takes float32, float16 and
/// bfloat16 gradients in device memory through the same `step` (or `begin` / `submit` /
/// `finish`). The step runs the same agreement round and divergence guard (its norms computed on
/// the device, in the same canonical order), then the bucketed collective of that source
/// (`bucketed_all_reduce`, payloads in device memory, control messages on the host), or with
/// `two_way` the two-way collective of the source's codec and feedback per compressed tensor
/// (worker and server residuals in device memory); outputs, residuals, statistics and `save`
/// are byte for byte those of the CPU pipeline with the CPU codec of `pipeline_options::codec`.
/// The divergence guard's raise, skip and dense actions work as on the CPU. PowerSGD
/// ("powersgd:..." codec specs) takes `cuda::stream_codec<cuda::identity_codec>` as the source
/// (the small tensors go dense through it) and keeps one `cuda::powersgd_session` per tensor,
/// made by the memory space (`make_low_rank_session`, cuda/powersgd.cuh); outputs and `save`
/// are the CPU pipeline's with `backend=builtin`. The hierarchical all-reduce
/// (`pipeline_options::hierarchical`) runs per compressed tensor over the node and lane
/// communicators given to `set_hierarchical_groups` (e.g. from `nccl_communicator::split`),
/// payloads on the device, outputs and the owners' residuals the CPU pipeline's. `measure_gain`
/// gives the CPU pipeline's gain to the bit (each compressed tensor compressed and decoded once
/// more on the device for it). A controller over a device sparsifier stages each tensor's
/// packets at every level of its plan on the device (`device_source_base::stage_levels`; the
/// further levels re-compressed from a host copy of the first packet), keeps Accordion's layer
/// accumulators in device memory and sends the decided level's packets (or a dense step) with
/// the CPU pipeline's outputs, states, statistics and `save`. Not taken by a device source
/// (`config_error` at construction): `buckets.checksum`, a 16-bit `buckets.small_format` and a
/// controller over a codec without a selection size.
///
/// **Structure.** This header is the step protocol; the exchange is the mode's, one per
/// header, chosen once at construction from the table of pipeline/options.hpp and held in
/// `exchange_mode`: `flat_mode` (bucketed, multi-level, controller-driven), `two_way_mode`,
/// `hierarchical_mode`, `low_rank_mode`. The host step opens (agreement and guard rounds),
/// then dispatches once to the exchange step of its mode (`exchange_step`), as Gloo's
/// `allreduce` switches to one function per algorithm. A device source (pipeline/device_source.hpp)
/// runs the same protocol with its own exchanges (`run_device_step`).

#include <gradcomp/adapt/any_controller.hpp>
#include <gradcomp/adapt/protocol.hpp>
#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/codec/codec_spec.hpp>
#include <gradcomp/codec/powersgd.hpp>
#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/hierarchical.hpp>
#include <gradcomp/collective/memory.hpp>
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
#include <gradcomp/pipeline/device_source.hpp>
#include <gradcomp/pipeline/exchange.hpp>
#include <gradcomp/pipeline/flat_mode.hpp>
#include <gradcomp/pipeline/guard.hpp>
#include <gradcomp/pipeline/hierarchical_mode.hpp>
#include <gradcomp/pipeline/low_rank_mode.hpp>
#include <gradcomp/pipeline/options.hpp>
#include <gradcomp/pipeline/two_way_mode.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// The exchange mode a `gradient_pipeline` holds (pipeline/options.hpp's table): `flat_mode`
/// for `pipeline_mode::flat` and `controlled`, and one type per other mode.
using exchange_mode = std::variant<flat_mode, two_way_mode, hierarchical_mode, low_rank_mode>;

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
  /// with feedback "none", C a CUDA codec. `opt.codec` is
  /// the spec of the CPU codec with the same wire format (e.g. "int8:bucket=100,rounding=
  /// stochastic" for `cuda::int8_codec{100, int8_rounding::stochastic}`): the pipeline's
  /// agreement round, statistics and checkpoints use it. `config_error` for what a device source
  /// does not take (`check_device_options`, `check_device_source`, pipeline/options.hpp), and
  /// for a codec spec whose codec differs from `src`'s in the collectives' fingerprint (codec,
  /// aggregation, packet sizes, bits per element).
  template <pipeline_device_source Source>
  gradient_pipeline(pipeline_options opt, Source src) : gradient_pipeline(std::move(opt)) {
    check_device_options(opt_);
    auto model =
        std::make_unique<detail::device_source_model<Source>>(std::move(src), opt_.buckets);
    device_source_facts facts{
        model->has_budget(), model->makes_low_rank_sessions(), model->feedback(), {}};
    if (facts.feedback == feedback_id::dgc) facts.dgc = model->dgc_parameters();
    check_device_source(opt_, kind_, comp_, facts);
    for (std::size_t const n : {std::size_t{1}, std::size_t{4099}, (std::size_t{1} << 20) + 3}) {
      if (model->fingerprint(n, opt_.buckets.op) !=
          detail::codec_fingerprint(base_, n, opt_.buckets.op, codec_context{},
                                    "gradient_pipeline source")) {
        throw config_error("gradcomp: gradient_pipeline with a device source: codec spec '" +
                           opt_.codec +
                           "' does not describe the device codec (another codec, packet size or "
                           "bits per element at " +
                           std::to_string(n) + " elements)");
      }
    }
    device_ = std::move(model);
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
    hierarchical_mode* const h = std::get_if<hierarchical_mode>(&mode_);
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
    if (device_) return device_->state(id);
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
    info_ = info;
    step_check_ = detail::step_check(opt_.buckets.checksum);
    t_begin_ = clock::now();
    rank_ = comm.rank();
    size_ = comm.size();
    pending_.clear();
    guard_tensors_.clear();
    guard_nonfinite_ = false;
    local_ = nullptr;
    plan_ = ctrl_ ? ctrl_->plan() : step_plan{};
    levels_ = !traits_.leveled ? 0 : (traits_.plan_levels ? plan_.measure.size() : 1);
    if (flat_mode* const f = std::get_if<flat_mode>(&mode_); f && !device_) {
      f->begin_step(traits_.plan_levels
                        ? std::optional(std::span<double const>(plan_.measure).first(levels_))
                        : std::nullopt);
    }
    ef_norm_ = 0.0;
    comp_norms_.assign(levels_, 0.0);
    layer_norms_.clear();
    compress_s_ = 0.0;
    ctx_ = opt_.context;
    ctx_.step = static_cast<std::uint32_t>(step_);
    // Shared-support codecs draw the same coordinates on every rank, and PowerSGD starts every
    // rank from the same Q: their seed is shared; the others add the rank (independent noise).
    bool const shared =
        traits_.shared_seed || base_.aggregation() == aggregation_kind::shared_support;
    ctx_.seed = opt_.seed + (shared ? 0u : static_cast<std::uint64_t>(rank_));
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

  /// Saves the whole state ("GCPL" v2, docs/pipeline.md): codec, feedback and controller
  /// specs, the two-way flag, the step counter and timing, then the sections — error feedback
  /// (the pipeline's compressor, the hierarchical shard owners' or a device source's),
  /// controller, layer accumulators, PowerSGD sessions, two-way state, guard; a mode that keeps
  /// none of a section writes it empty. Not during an open step.
  [[nodiscard]] std::vector<std::byte> save() const {
    if (open_) throw config_error("gradcomp: gradient_pipeline::save during a step (call finish first)");
    detail::byte_writer w;
    w.begin(checkpoint_magic, checkpoint_version);
    w.put_string(opt_.codec);
    w.put_string(opt_.feedback);
    w.put_string(opt_.controller);
    w.put_u64(opt_.two_way ? 1 : 0);
    w.put_u64(step_);
    w.put_f64(last_timing_.backprop);
    w.put_f64(last_timing_.compress);
    w.put_f64(last_timing_.sync);
    auto const* hier = std::get_if<hierarchical_mode>(&mode_);
    if (device_) {
      w.put_bytes(device_state());
    } else if (hier) {
      hier->save(w);  // the shard owners' feedback
    } else {
      w.put_bytes(std::visit([](auto const& c) { return c.save(); }, comp_));
    }
    w.put_bytes(ctrl_ ? ctrl_->save() : std::vector<std::byte>{});
    std::map<tensor_id, std::vector<float>> const device_layers =
        device_ ? device_->layers_on_host() : std::map<tensor_id, std::vector<float>>{};
    auto const& accumulators = device_ ? device_layers : accumulators_;
    w.put_u64(accumulators.size());
    for (auto const& [id, acc] : accumulators) {
      w.put_u64(static_cast<std::uint64_t>(id));
      w.put_floats(acc);
    }
    if (device_) {
      device_->low_rank_save(w);
      if (std::holds_alternative<two_way_mode>(mode_)) {
        w.put_bytes(device_->two_way_save());
      } else {
        two_way_mode::save_none(w);
      }
    } else {
      save_mode_sections(w, mode_);
    }
    w.put_bytes(guard_->save());
    return w.finish();
  }

  /// Restores a state written by `save` of a pipeline with the same codec, feedback,
  /// controller, two-way and guard options. A malformed, corrupted (the checkpoint ends in a
  /// CRC32C of all its bytes, core/serialize.hpp) or mismatched checkpoint is a `format_error`
  /// and leaves the state unchanged; so is one saved before checkpoints carried a checksum. With a
  /// device source the residuals are copied to the device (on the source's stream).
  void load(std::span<std::byte const> bytes) {
    if (open_) throw config_error("gradcomp: gradient_pipeline::load during a step");
    detail::byte_reader r(bytes, checkpoint_magic, checkpoint_version,
                          "gradient_pipeline checkpoint");
    auto expect = [&](std::string const& got, std::string const& mine, char const* what) {
      if (got != mine) {
        r.fail(std::string("saved with ") + what + " '" + got + "', this pipeline has '" + mine + "'");
      }
    };
    expect(r.get_string(), opt_.codec, "codec");
    expect(r.get_string(), opt_.feedback, "feedback");
    expect(r.get_string(), opt_.controller, "controller");
    if (r.get_u64() != (opt_.two_way ? 1u : 0u)) r.fail("saved with another two_way setting");
    std::uint64_t const step = r.get_u64();
    step_timing timing;
    timing.backprop = r.get_f64();
    timing.compress = r.get_f64();
    timing.sync = r.get_f64();
    // Everything is restored into copies first, then swapped in: a failure changes nothing.
    feedback_compressor comp = comp_;
    std::optional<exchange_mode> mode;  // host tensors: the mode's state, restored
    std::vector<std::byte> const cstate = r.get_bytes();
    if (auto const* h = std::get_if<hierarchical_mode>(&mode_); h && !device_) {
      mode.emplace(h->loaded_from(cstate));  // the owners' feedback is the mode's
    } else {
      std::visit([&](auto& c) { c.load(cstate, state_check::container); }, comp);  // GCPL checked it
    }
    // A device source: the states (and EF21's receivers) validated by the host compressor
    // above, then copied.
    std::map<tensor_id, std::vector<float>> device_states, device_receivers;
    std::set<tensor_id> device_tensors;
    if (device_) {
      std::visit(
          [&](auto const& c) {
            c.for_each_committed([&](tensor_id id, std::span<float const> v) {
              device_states.emplace(id, std::vector<float>(v.begin(), v.end()));
              device_tensors.insert(id);
            });
            c.for_each_receiver([&](tensor_id id, std::span<float const> v) {
              device_receivers.emplace(id, std::vector<float>(v.begin(), v.end()));
            });
          },
          comp);
    }
    std::optional<any_controller> ctrl = ctrl_;
    std::vector<std::byte> const kstate = r.get_bytes();
    if (ctrl) {
      ctrl->load(kstate);
    } else if (!kstate.empty()) {
      r.fail("holds controller state, this pipeline has no controller");
    }
    std::map<tensor_id, std::vector<float>> acc;
    std::uint64_t const nacc = r.get_u64();
    for (std::uint64_t i = 0; i < nacc; ++i) {
      auto const id = static_cast<tensor_id>(r.get_u32_of_u64("accumulator id"));
      if (!acc.emplace(id, r.get_floats()).second) r.fail("an accumulator id appears twice");
    }
    std::map<tensor_id, std::tuple<std::size_t, std::size_t, std::vector<std::byte>>> device_sessions;
    std::vector<std::byte> tstate;
    if (!device_) {
      if (std::optional<exchange_mode> m = loaded_mode_sections(r, mode_)) mode = std::move(m);
    } else {
      // A device source: the sections validated by a host mode, loaded into the source at the end.
      if (auto const* lr = std::get_if<low_rank_mode>(&mode_)) {
        low_rank_mode const loaded = lr->loaded(r);
        for (auto const& [id, s] : loaded.sessions()) {
          detail::byte_writer rec;
          rec.begin(detail::low_rank_record_magic, 1);
          s.state().save_exact(rec);
          device_sessions[id] = {s.state().rows(), s.state().cols(), rec.finish()};
        }
      } else {
        low_rank_mode::expect_none(r);
      }
      if (auto const* tw = std::get_if<two_way_mode>(&mode_)) {
        tstate = r.get_bytes();
        (void)tw->loaded_from(tstate);
      } else {
        two_way_mode::expect_none(r);
      }
    }
    std::optional<divergence_guard> guard(std::in_place, opt_.guard);
    {
      std::vector<std::byte> const gstate = r.get_bytes();
      try {
        guard->load(gstate);
      } catch (format_error const& e) {
        r.fail(e.what());
      }
    }
    r.expect_end();
    if (device_) {
      // the steps that may fail come first; each changes nothing when it fails, and at most one
      // of them has anything to load (two-way and PowerSGD exclude each other, and the
      // residuals of either are empty, so their assignment allocates nothing)
      if (std::holds_alternative<two_way_mode>(mode_)) device_->two_way_load(tstate);
      if (auto const* lr = std::get_if<low_rank_mode>(&mode_))
        device_->low_rank_load(device_sessions, lr->options());
      device_->layers_assign(acc);  // (empty but for a controller, which excludes both above)
      device_->assign_states(device_states, device_receivers);
      device_tensors_ = std::move(device_tensors);
    } else {
      comp_ = std::move(comp);
      accumulators_ = std::move(acc);
      if (mode) mode_ = std::move(*mode);
    }
    ctrl_ = std::move(ctrl);
    guard_ = std::move(guard);
    step_ = step;
    last_timing_ = timing;
  }

  /// Magic and version of the checkpoint format.
  static constexpr char const* checkpoint_magic = "GCPL";
  static constexpr std::uint8_t checkpoint_version = 2;

 private:
  using clock = std::chrono::steady_clock;
  static double seconds(clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

  // One tensor of the step in progress.
  struct entry {
    tensor_id id{};
    std::size_t n = 0;
    bool large = false;                      // at least min_compress_elements (else sent dense)
    bool staged = false;     // a device source staged its levels (host: flat_mode's)
    std::span<float> out32;  // float32 output (the caller's tensor or `wide_`)
    std::span<float const> raw32;            // float32 view of the raw gradient
    std::function<void()> write_back;        // rounds `wide_` into a 16-bit tensor
  };

  // Adds one tensor to the step: checks it, converts a 16-bit one, stages and compresses it.
  // A local failure is recorded (every rank learns of it in the agreement round).
  template <element T>
  void add_tensor(tensor_view<T> const& g) {
    auto const t0 = clock::now();
    for (auto const& e : pending_) {
      if (e.id == g.id()) {
        // recorded, not thrown: every rank must reach the step's agreement round, which then
        // fails on all of them (this rank with this error)
        if (!local_) {
          local_ = std::make_exception_ptr(config_error("gradcomp: gradient_pipeline: tensor id " +
                                                        std::to_string(static_cast<unsigned>(g.id())) +
                                                        " appears twice in one step"));
        }
        return;
      }
    }
    entry e;
    e.id = g.id();
    e.n = g.size();
    e.large = g.size() >= opt_.buckets.min_compress_elements;
    if (device_) {
      add_device_tensor(e, g);
    } else {
      add_host_tensor(e, g);
    }
    pending_.push_back(std::move(e));
    compress_s_ += seconds(t0, clock::now());
  }

  template <element T>
  void add_host_tensor(entry& e, tensor_view<T> const& g) {
    if constexpr (std::same_as<T, float>) {
      e.out32 = g.span();
      e.raw32 = g.span();
    } else {
      std::vector<float>& wide = wide_[g.id()];
      wide.resize(g.size());
      detail::widen_to_f32(std::span<T const>(g.span()), std::span<float>(wide), ctx_);
      e.out32 = std::span<float>(wide);
      e.raw32 = std::span<float const>(wide);
      std::span<T> const dst = g.span();
      std::vector<float>* w = &wide;
      codec_context const* ctx = &ctx_;
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
      guard_tensors_.push_back(gt);
      if (!std::isfinite(gt.gradient_sq) || !std::isfinite(gt.residual_sq)) guard_nonfinite_ = true;
      if (guard_nonfinite_) stages = false;
    }
    if (stages && !local_) {
      try {
        std::get<flat_mode>(mode_).stage(
            comp_, tensor_view<T const>(std::span<T const>(g.span()), g.id()),
            std::span<double const>(plan_.measure), ctx_, opt_.measure_gain || ctrl_needs_gains(),
            ef_norm_, std::span<double>(comp_norms_));
      } catch (...) {
        local_ = std::current_exception();
      }
    }
  }

  // Device memory: nothing is read here, the exchange compresses.
  template <element T>
  void add_device_tensor(entry& e, tensor_view<T> const& g) {
    if constexpr (std::same_as<T, float>) {
      e.out32 = g.span();
      e.raw32 = g.span();
    } else {
      // As `wide_` on the host: widened (exact) into a float32 device buffer kept for the
      // tensor, the step's result rounded back once after the exchange.
      try {
        std::span<float> const w = device_->wide(g.id(), g.size());
        device_->widen(std::span<T const>(g.span()), w);
        e.out32 = w;
        e.raw32 = w;
        std::span<T> const dst = g.span();
        detail::device_source_base const* dev = device_.get();
        e.write_back = [dev, w, dst] { dev->narrow(std::span<float const>(w), dst); };
      } catch (...) {
        if (!local_) local_ = std::current_exception();
      }
    }
    // The check the CPU pipeline's stage makes (the feedback policy's), so that the step
    // fails with the same error on the same ranks: here, before the agreement round.
    std::size_t const held = e.large ? device_->state(e.id).size() : 0;
    if (held != 0 && held != device_->state_floats(e.n) && !local_) {
      local_ = std::make_exception_ptr(
          config_error("gradcomp: " + opt_.feedback + " feedback state of tensor " +
                       std::to_string(static_cast<unsigned>(e.id)) + " holds " +
                       std::to_string(held) + " floats but the gradient has " +
                       std::to_string(e.n) + " elements (one state per tensor id)"));
    }
    // The guard's local norms, as the host computes them (the residual of a compressed tensor
    // only), in the same canonical order on the device (the hierarchical source's per-tensor
    // states are empty: its owners' are keyed by shard).
    if (guard_->enabled()) {
      guard_tensor gt{e.id, device_->sum_of_squares(e.raw32), 0.0};
      if (e.large && kind_ != pipeline_mode::two_way && kind_ != pipeline_mode::low_rank) {
        gt.residual_sq = device_->sum_of_squares(device_->state(e.id));
      }
      guard_tensors_.push_back(gt);
      if (!std::isfinite(gt.gradient_sq) || !std::isfinite(gt.residual_sq)) guard_nonfinite_ = true;
    }
    if (guard_nonfinite_ || local_ || !e.large) return;
    // A controller: the tensor staged and its packets written at every level of the plan, as
    // the host's flat mode does, with the statistics the controller needs. Without one, the
    // compression gain's terms where the host adds them (a failure is this rank's, told in the
    // agreement round).
    try {
      if (kind_ == pipeline_mode::controlled) {
        device_->stage_levels(tensor_view<float const>(e.raw32, e.id), ctx_,
                              std::span<double const>(plan_.measure).first(levels_),
                              opt_.measure_gain || ctrl_needs_gains(), ef_norm_,
                              std::span<double>(comp_norms_));
        e.staged = true;
      } else if (kind_ == pipeline_mode::flat && opt_.measure_gain) {
        auto const [input_sq, compressed_sq] =
            device_->gain_terms(tensor_view<float const>(e.raw32, e.id), ctx_);
        ef_norm_ += input_sq;
        comp_norms_[0] += compressed_sq;
      }
    } catch (...) {
      local_ = std::current_exception();
    }
  }

  void accumulate_layer(entry const& e) {
    auto const found = accumulators_.find(e.id);
    accumulator_undo_.emplace_back(e.id, found == accumulators_.end() ? std::nullopt : std::optional(found->second));
    std::vector<float>& acc = accumulators_[e.id];  // (put back if the step fails)
    if (plan_.accumulate_layers) {
      if (acc.size() != e.n) acc.assign(e.n, 0.0f);
      for (std::size_t i = 0; i < e.n; ++i) acc[i] += e.raw32[i];
    }
    if (plan_.report_layers) {
      layer_norms_.push_back(acc.empty() ? 0.0 : detail::norm_sq(acc));
      acc.clear();
    }
  }

  [[nodiscard]] bool ctrl_needs_gains() const noexcept { return ctrl_ && plan_.measure.size() > 1; }

  // Leaves the step without sending: every stage is discarded, nothing is committed.
  void abandon() noexcept {
    discard_stages();
    pending_.clear();
    open_ = false;
  }
  void discard_stages() noexcept {
    if (!device_) {
      if (flat_mode* const f = std::get_if<flat_mode>(&mode_)) f->discard(comp_);
      return;
    }
    for (auto const& e : pending_) {
      if (e.staged) device_->discard(e.id);
    }
  }

  template <communicator Comm>
  pipeline_stats finish_step(Comm& comm) {
    std::optional<any_controller> snapshot;
    try {
      pipeline_stats st = device_ ? run_device_step(comm, snapshot) : run_step(comm, snapshot);
      open_ = false;
      pending_.clear();
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
      if (device_) {
        device_rollback();
      } else {
        std::visit(
            [](auto& m) {
              if constexpr (!std::same_as<std::remove_cvref_t<decltype(m)>, flat_mode>)
                m.rollback();
            },
            mode_);
      }
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
  // is then complete (`st` its statistics).
  template <communicator Comm>
  bool open_step(Comm& comm, pipeline_stats& st, std::vector<bucket_item>& items, bucket_result& br,
                 double& communicate, guard_verdict& gv, std::vector<detail::bucket_plan>& plan) {
    st.step = step_;
    st.tensors = pending_.size();
    auto const t_agree = clock::now();
    items.reserve(pending_.size());
    for (auto const& e : pending_) items.push_back({tensor_view<float const>(e.raw32, e.id), e.out32});
    plan = agree_step(comm, items, br);
    communicate += seconds(t_agree, clock::now());
    if (!guard_->enabled()) return false;
    gv = check_guard(comm, br, st, communicate);
    if (gv.action != guard_action::skipped) return false;
    st = skip_step(st, gv, communicate);
    return true;
  }

  // What the exchange step of every mode shares: the step after the agreement and guard rounds,
  // with their results.
  struct opened_step {
    pipeline_stats st;
    double communicate = 0.0;
    std::vector<bucket_item> items;
    bucket_result br;
    guard_verdict gv;
    std::vector<detail::bucket_plan> plan;
    std::optional<any_controller>* snapshot = nullptr;
    [[nodiscard]] bool guard_dense() const noexcept { return gv.action == guard_action::dense; }
  };

  // A host step: the protocol's opening, then the exchange step of the mode, chosen once.
  template <communicator Comm>
  pipeline_stats run_step(Comm& comm, std::optional<any_controller>& snapshot) {
    opened_step s;
    s.snapshot = &snapshot;
    if (open_step(comm, s.st, s.items, s.br, s.communicate, s.gv, s.plan)) return s.st;
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
    if (plan_.accumulate_layers || plan_.report_layers) {
      for (auto const& e : pending_) accumulate_layer(e);
    }
    std::size_t k = 0;
    residual_rule rule = residual_rule::subtract_sent;
    st.factor = 32.0 / base_.bits_per_element();
    if (guard_dense) {  // every tensor's own g, dense; the controller is not asked
      k = decision::npos;
      rule = residual_rule::keep;
      dense_step(st);
    } else if (ctrl_) {
      std::tie(k, rule) = decide_step(comm, st, *s.snapshot, s.communicate);
    } else if (opt_.measure_gain) {
      gain_round(comm, st, s.communicate);
    }
    for (auto const& e : pending_) st.compressed_tensors += e.large && k != decision::npos ? 1 : 0;

    // The next residuals for the packets to be sent are computed now (the packets may be summed
    // in place on the wire); they become current only once the exchange has succeeded.
    std::span<bucket_item const> const items(s.items);
    auto const t_prepare = clock::now();
    if (k != decision::npos) m.prepare(comp_, items, k, ctx_);
    double const prepare_s = seconds(t_prepare, clock::now());

    double decode = 0.0;
    auto const t_send = clock::now();
    if (k == decision::npos) {
      m.exchange_dense(comm, comp_, items, rule, size_, ctx_, step_check_, slots_, s.br, decode);
    } else {
      m.exchange_level(comm, s.plan, k, items, size_, ctx_, step_check_, slots_, s.br, decode);
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
      dense_step(st);
    } else if (traits_.gain_round && opt_.measure_gain) {
      gain_round(comm, st, s.communicate);
    }
    for (auto const& e : pending_) st.compressed_tensors += e.large && !guard_dense ? 1 : 0;
    double decode = 0.0;
    auto const t_send = clock::now();
    if (guard_dense) {
      send_raw_dense(comm, std::span<bucket_item const>(s.items), dense_format::f32, s.br, decode);
    } else {
      collective_options const copt{opt_.buckets.op, opt_.buckets.checksum};
      std::vector<bucket_item> const dense = for_each_compressed(s.br, [&](entry const& e,
                                                                           tensor_view<float const>
                                                                               g) {
        auto const [rows, cols] =
            shape_of(e.id, e.n);  // (PowerSGD's; the other modes take no shape)
        return m.exchange(comm, exchange_tensor{g, e.out32, rows, cols}, ctx_, copt, step_check_);
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

  // Every rank decoded everything (and, with the checksum option, got intact data) before
  // anyone commits: the step-outcome round (collective/outcome.hpp). The layer accumulators of
  // the step are kept from then on.
  template <communicator Comm>
  void outcome_round(Comm& comm, bucket_result& br) {
    detail::agree_outcome(comm, step_check_, "gradient_pipeline", step_);
    br.wire_bytes += detail::outcome_wire_bytes(opt_.buckets.checksum, size_);
    accumulator_undo_.clear();
  }

  // The statistics of a host step from its exchange, then `close_step`.
  pipeline_stats complete(opened_step& s, double compress_s, double decode) {
    s.st.bytes_sent = s.br.packet_bytes;
    s.st.wire_bytes = s.br.wire_bytes;
    s.st.buckets = s.br.buckets;
    s.st.compress_s = compress_s_ + compress_s;
    s.st.communicate_s = s.communicate;
    s.st.decode_s = decode;
    return close_step(s.st, s.gv);
  }

  // The guard's dense step in the statistics: every tensor's own g sent dense.
  static void dense_step(pipeline_stats& st) noexcept {
    st.sent = send_kind::dense;
    st.factor = 1.0;
    st.gain = 1.0;
  }

  // `measure_gain` without a controller: ‖C(g_ef)‖² / ‖g_ef‖² over all ranks, in `st.gain`.
  template <communicator Comm>
  void gain_round(Comm& comm, pipeline_stats& st, double& communicate) {
    double sums[2] = {ef_norm_, levels_ > 0 ? comp_norms_[0] : 0.0};
    auto const t0 = clock::now();
    sum_stats(comm, std::span<double>(sums));
    communicate += seconds(t0, clock::now());
    st.gain = sums[0] > 0.0 ? sums[1] / sums[0] : 1.0;
  }

  // 16-bit gradients: the result rounded once.
  void write_back() {
    for (auto const& e : pending_) {
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
        comm, items, o, base_, size_, ctx_, step_check_, slots_,
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
    step_stats s;
    s.step = plan_.step;
    s.ef_norm_sq = ef_norm_;
    s.compressed_norm_sq = comp_norms_;
    s.layer_norms_sq = layer_norms_;
    s.last_step = last_timing_;
    s.batch_size = info_.batch_size;
    s.workers = static_cast<std::uint32_t>(size_);
    s.learning_rate = info_.learning_rate;
    s.next_learning_rate = info_.next_learning_rate;
    if (info_.loss) s.loss = *info_.loss;
    agree(s, [&](std::span<double> v) { sum_stats(comm, v); }, [&](std::span<double> v) { max_stats(comm, v); });
    communicate += seconds(t0, clock::now());
    snapshot.emplace(*ctrl_);
    decision const d = ctrl_->decide(s);
    std::size_t const k = d.packet(levels_);
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
      for (auto const& e : pending_) dense += 4 * e.n;
      st.factor = static_cast<double>(dense) / static_cast<double>(st.bytes_sent);
    }
    last_timing_ = opt_.measured_timing
                       ? step_timing{info_.backprop_s, st.compress_s, st.communicate_s}
                       : step_timing{info_.backprop_s, 0.0, 0.0};
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

  // The checkpoint's PowerSGD and two-way sections (adjacent in "GCPL") of host mode `m`: the
  // mode's own where it keeps one, the other empty.
  static void save_mode_sections(detail::byte_writer& w, exchange_mode const& m) {
    std::visit(
        [&](auto const& mode) {
          using M = std::remove_cvref_t<decltype(mode)>;
          if constexpr (std::same_as<M, low_rank_mode>)
            mode.save(w);
          else
            low_rank_mode::save_none(w);
          if constexpr (std::same_as<M, two_way_mode>)
            mode.save(w);
          else
            two_way_mode::save_none(w);
        },
        m);
  }
  // Reads those sections for host mode `m`: a copy of `m` holding the state read where the mode
  // keeps one (`r.fail` where a section that must be empty is not).
  static std::optional<exchange_mode> loaded_mode_sections(detail::byte_reader& r,
                                                           exchange_mode const& m) {
    return std::visit(
        [&](auto const& mode) {
          using M = std::remove_cvref_t<decltype(mode)>;
          std::optional<exchange_mode> out;
          if constexpr (std::same_as<M, low_rank_mode>)
            out.emplace(mode.loaded(r));
          else
            low_rank_mode::expect_none(r);
          if constexpr (std::same_as<M, two_way_mode>)
            out.emplace(mode.loaded(r));
          else
            two_way_mode::expect_none(r);
          return out;
        },
        m);
  }

  // ---- A device source's steps (pipeline/device_source.hpp holds its state) ----

  // The rest of a device source's step with a controller (after `run_device_step`'s agreement
  // and guard rounds), as the flat mode's step does it for host tensors: the layer
  // accumulators, the decision, then the packets of the decided level (staged by `add_tensor`)
  // in the source's bucketed collective, or every tensor dense (p = g + residual, or g with the
  // residual kept, as the decision says).
  template <communicator Comm>
  pipeline_stats run_device_controlled_step(Comm& comm, std::optional<any_controller>& snapshot, pipeline_stats& st,
                                            std::vector<bucket_item> const& items, bucket_result const& br,
                                            guard_verdict const& gv, double communicate) {
    bool const guard_dense = gv.action == guard_action::dense;
    if (plan_.accumulate_layers || plan_.report_layers) {
      for (auto const& e : pending_) {
        double const sq = device_->accumulate_layer(e.id, e.raw32, plan_.accumulate_layers, plan_.report_layers);
        if (plan_.report_layers) layer_norms_.push_back(sq);
      }
    }
    std::size_t k = decision::npos;
    residual_rule rule = residual_rule::keep;
    if (guard_dense) {  // every tensor's own g, dense; the controller is not asked
      dense_step(st);
    } else {
      std::tie(k, rule) = decide_step(comm, st, snapshot, communicate);
    }
    for (auto const& e : pending_) st.compressed_tensors += e.large && !guard_dense && k != decision::npos ? 1 : 0;

    // The exchange: the decided level's packets, or dense.
    bool const lossless = !guard_dense && k == decision::npos && rule != residual_rule::keep;
    auto const t_send = clock::now();
    bucket_result r;
    with_erased(comm, [&](any_communicator& c) {
      if (k != decision::npos && !guard_dense) {
        r = device_->exchange_level(c, std::span<bucket_item const>(items), k, plan_.measure[k], ctx_);
      } else if (lossless) {  // p sent dense, delivered exactly
        std::vector<bucket_item> sent = items;
        for (std::size_t i = 0; i < sent.size(); ++i) {
          std::span<float const> const p =
              pending_[i].staged ? device_->staged_input(pending_[i].id) : std::span<float const>{};
          if (!p.empty()) sent[i].grad = tensor_view<float const>(p, pending_[i].id);
        }
        r = device_->exchange_dense(c, std::span<bucket_item const>(sent), ctx_);
      } else {  // g dense, the residual kept
        r = device_->exchange_dense(c, std::span<bucket_item const>(items), ctx_);
      }
    });
    device_->layers_commit();
    // Commit: a level's packets were committed by the exchange after its outcome round.
    for (auto const& e : pending_) {
      if (!e.staged) continue;
      if (lossless) device_->commit_lossless(e.id);
      if (guard_dense || (k == decision::npos && !lossless)) {
        device_->discard(e.id);
      } else {
        device_tensors_.insert(e.id);
      }
    }
    if (gv.reset_residual) {
      device_->reset_states();
      device_tensors_.clear();
    }
    if (lossless) {  // EF21's receiver side (the exchange did it for a level's packets)
      for (auto const& e : pending_) {
        if (e.staged) device_->receive(e.id, e.out32);
      }
    }
    write_back();
    st.bytes_sent = r.packet_bytes;
    st.wire_bytes = br.wire_bytes + r.wire_bytes;
    st.buckets = r.buckets;
    st.compress_s = compress_s_;
    st.communicate_s = communicate + seconds(t_send, clock::now());
    return close_step(st, gv);
  }

  // Runs `f` with `comm` as an `any_communicator` (the device source's exchanges take one).
  template <communicator Comm, class F>
  static void with_erased(Comm& comm, F&& f) {
    if constexpr (std::same_as<Comm, any_communicator>) {
      f(comm);
    } else {
      any_communicator erased = any_communicator::borrow(comm);
      f(erased);
    }
  }

  // A step of a device source: the agreement round of `run_step` (layout, configuration, local
  // status), then the source's bucketed collective, which compresses, exchanges, decodes and,
  // after its outcome round, commits the residuals.
  template <communicator Comm>
  pipeline_stats run_device_step(Comm& comm, std::optional<any_controller>& snapshot) {
    pipeline_stats st;
    double agree_s = 0.0;
    std::vector<bucket_item> items;
    bucket_result br;
    guard_verdict gv;
    std::vector<detail::bucket_plan> plan;  // (the source's collective plans its own buckets)
    if (open_step(comm, st, items, br, agree_s, gv, plan)) return st;
    if (ctrl_) return run_device_controlled_step(comm, snapshot, st, items, br, gv, agree_s);
    bool const guard_dense = gv.action == guard_action::dense;
    // `measure_gain`: the gain over all ranks, in the host step's round.
    if (!guard_dense && opt_.measure_gain && traits_.gain_round) gain_round(comm, st, agree_s);
    auto const t_send = clock::now();
    bucket_result r;
    with_erased(comm, [&](any_communicator& c) {
      if (guard_dense) {  // every tensor's own g, dense; the residuals kept (or reset below)
        r = device_->exchange_dense(c, std::span<bucket_item const>(items), ctx_);
      } else if (!traits_.stages) {
        r = exchange_per_tensor_on_device(c);
      } else {
        r = device_->exchange(c, std::span<bucket_item const>(items), ctx_);
      }
    });
    write_back();
    double const send_s = seconds(t_send, clock::now());
    auto const* hier = std::get_if<hierarchical_mode>(&mode_);
    if (guard_dense) {
      dense_step(st);
      if (gv.reset_residual && kind_ != pipeline_mode::two_way) {  // as the CPU's compressor reset
        device_->reset_states();
        device_tensors_.clear();
      }
    } else {
      for (auto const& e : pending_) {
        if (!e.large) continue;
        ++st.compressed_tensors;
        // two-way and PowerSGD keep their own state; the hierarchical all-reduce's is the shard
        // owners' (a tensor's shard, compressed between nodes)
        if (hier) {
          detail::hierarchical_plan const& hp = hier->plan();
          int const local = hp.layout.local_rank(comm.rank());
          if (local < hp.lanes && hp.layout.nodes() > 1)
            device_tensors_.insert(hierarchical_shard_id(e.id, local, hp.lanes));
        } else if (traits_.stages) {
          device_tensors_.insert(e.id);
        }
      }
      st.factor = traits_.factor_from_bytes ? 1.0 : 32.0 / base_.bits_per_element();
    }
    st.bytes_sent = r.packet_bytes;
    st.wire_bytes = br.wire_bytes + r.wire_bytes;
    st.buckets = r.buckets;
    st.compress_s = compress_s_;
    st.communicate_s = agree_s + send_s;  // compression and decoding run inside the exchange
    return close_step(st, gv);
  }

  // The per-tensor modes with a device source, as their host step does them: the mode's
  // exchange per compressed tensor in the source (two-way: its residuals; PowerSGD: its
  // sessions; hierarchical: the owners' feedback), the small tensors dense in the source's
  // bucketed collective, then the step-outcome round; the source's state becomes current only
  // after it (a failure puts it back, `rollback`).
  bucket_result exchange_per_tensor_on_device(any_communicator& comm) {
    bucket_result br;
    collective_options const copt{opt_.buckets.op, opt_.buckets.checksum};
    hierarchical_mode* const hier = std::get_if<hierarchical_mode>(&mode_);
    low_rank_mode const* const sessions = std::get_if<low_rank_mode>(&mode_);
    if (kind_ == pipeline_mode::two_way) device_->two_way_begin();
    std::vector<bucket_item> const dense =
        for_each_compressed(br, [&](entry const& e, tensor_view<float const> g) {
          if (sessions) {
            auto const [rows, cols] = shape_of(e.id, e.n);
            return device_->low_rank_exchange(comm, e.id, rows, cols, sessions->options(), g,
                                              e.out32, ctx_, copt, step_check_);
          }
          if (hier) {
            hierarchical_result const hr =
                device_->hierarchical_exchange(comm, *hier->node(), hier->lane(), hier->plan(), g,
                                               e.out32, ctx_, hier->options(), step_check_);
            collective_result r;
            r.packet_bytes = hr.packet_bytes;
            r.wire_bytes = hr.wire_bytes;
            return r;
          }
          return device_->two_way_exchange(comm, g, e.out32, ctx_, copt, step_check_);
        });
    if (!dense.empty()) {
      bucket_result const d = device_->exchange(comm, std::span<bucket_item const>(dense), ctx_);
      br.packet_bytes += d.packet_bytes;
      br.wire_bytes += d.wire_bytes;
      br.buckets += d.buckets;
    }
    detail::agree_outcome(comm, step_check_, "gradient_pipeline", step_);
    br.wire_bytes += detail::outcome_wire_bytes(opt_.buckets.checksum, size_);
    switch (kind_) {
      case pipeline_mode::two_way: device_->two_way_commit(); break;
      case pipeline_mode::low_rank: device_->low_rank_commit(); break;
      case pipeline_mode::hierarchical: device_->hierarchical_commit(); break;
      default: break;
    }
    return br;
  }

  // A failed step of a device source: the state its mode staged goes back.
  void device_rollback() {
    switch (kind_) {
      case pipeline_mode::two_way: device_->two_way_rollback(); break;
      case pipeline_mode::low_rank: device_->low_rank_rollback(); break;
      case pipeline_mode::hierarchical: device_->hierarchical_rollback(); break;
      case pipeline_mode::controlled: device_->layers_rollback(); break;
      case pipeline_mode::flat: break;
    }
  }

  // The error-feedback state of a device source in `compressor::save`'s format, as the CPU
  // pipeline's compressor writes it: one record per tensor that completed a step, ascending
  // ids, its state copied to the host (feedback "none": no values); with EF21 then one
  // receiver record per such tensor (the CPU's receivers are the tensors it received, the
  // same set).
  [[nodiscard]] std::vector<std::byte> device_state() const {
    feedback_id const id_of = feedback_of(comp_);
    bool const receivers = id_of == feedback_id::ef21;
    std::vector<std::byte> out =
        detail::feedback_state_head(id_of, device_tensors_.size(), receivers ? device_tensors_.size() : 0);
    for (tensor_id const id : device_tensors_) detail::put_feedback_record(out, id, device_->state_on_host(id));
    if (receivers) {
      for (tensor_id const id : device_tensors_) detail::put_feedback_record(out, id, device_->receiver_on_host(id));
    }
    detail::seal_feedback_state(out);  // version 3, with its checksum, as `compressor::save`
    return out;
  }

  // ---- The rounds every step shares ----

  // The divergence guard's round (guard.hpp): every rank gets the same verdict, recorded in
  // `st`; a verdict that raises throws here. Its time is added to `communicate`.
  template <communicator Comm>
  guard_verdict check_guard(Comm& comm, bucket_result& br, pipeline_stats& st, double& communicate) {
    auto const t0 = clock::now();
    // In tensor id order, so that the sums over the tensors do not depend on the order in which
    // they were submitted (whole step, bucket by bucket).
    std::sort(guard_tensors_.begin(), guard_tensors_.end(), [](guard_tensor const& a, guard_tensor const& b) {
      return static_cast<std::uint32_t>(a.id) < static_cast<std::uint32_t>(b.id);
    });
    bool const watch = traits_.stages && opt_.feedback != "none";
    guard_verdict gv = guard_->check_with([&](std::span<double> v) { sum_stats(comm, v); }, comm.size(), step_,
                                          std::span<guard_tensor const>(guard_tensors_), watch, info_.loss,
                                          br.wire_bytes);
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
    for (auto& e : pending_) {
      if (device_) {
        device_->zero(e.out32);
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
    st.compress_s = compress_s_;
    st.total_s = seconds(t_begin_, clock::now());
    report_guard(gv);
    last_ = st;
    if (hook_) hook_(st);
    return st;
  }

  void report_guard(guard_verdict const& gv) {
    if (guard_hook_) {
      guard_hook_(gv);
    } else if (rank_ == 0) {
      std::fprintf(stderr, "%s\n", gv.message.c_str());
    }
  }

  // The statistics all-reduces (sums and maxima over ranks), covered by the step check: with
  // the checksum option a corrupted statistic fails the step rather than steer a decision.
  template <communicator Comm>
  void sum_stats(Comm& comm, std::span<double> v) {
    step_check_.before_sum(std::as_bytes(v), comm_type::f64);
    comm.all_reduce(std::as_writable_bytes(v), comm_type::f64, reduce_op::sum);
    step_check_.after_sum(std::as_bytes(v), comm_type::f64);
    step_check_.result(std::as_bytes(v));
  }
  template <communicator Comm>
  void max_stats(Comm& comm, std::span<double> v) {
    comm.all_reduce(std::as_writable_bytes(v), comm_type::f64, reduce_op::max);
    step_check_.result(std::as_bytes(v));
  }

  // The step's agreement round: layout (ids, sizes, order, bucketing), configuration
  // (codec, feedback, controller, step; the hierarchical mode's plan) and each rank's local
  // status.
  template <communicator Comm>
  std::vector<detail::bucket_plan> agree_step(Comm& comm, std::vector<bucket_item> const& items, bucket_result& br) {
    std::exception_ptr local = local_;
    rank_report mine;
    mine.count = items.size();
    mine.codec = static_cast<std::uint32_t>(base_.id());
    std::vector<detail::bucket_plan> plan;
    try {
      plan = detail::plan_buckets(std::span<bucket_item const>(items), opt_.buckets);
      fingerprint fp;
      fp.add("gradient_pipeline").add(opt_.codec).add(opt_.feedback).add(opt_.controller);
      if (auto* h = std::get_if<hierarchical_mode>(&mode_))
        h->plan_step(comm.size(), comm.rank(), device_ != nullptr, fp);
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

  // The per-tensor modes' split of the step (host and device sources): `one(entry, g)` runs
  // the collective of each compressed tensor (its result counted in `br`, one bucket each); the
  // small tensors are returned, to go dense in buckets.
  template <class One>
  std::vector<bucket_item> for_each_compressed(bucket_result& br, One&& one) {
    std::vector<bucket_item> dense;
    for (auto const& e : pending_) {
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
  std::unique_ptr<detail::device_source_base> device_;  // a device source (else null)
  std::set<tensor_id> device_tensors_;  // its tensors with a completed step (saved state)

  // The step in progress.
  bool open_ = false;
  pipeline_step_info info_;
  clock::time_point t_begin_;
  int rank_ = 0, size_ = 1;
  std::vector<entry> pending_;
  std::exception_ptr local_;
  step_plan plan_;
  std::size_t levels_ = 0;
  double ef_norm_ = 0.0;
  std::vector<double> comp_norms_, layer_norms_;
  double compress_s_ = 0.0;
  codec_context ctx_;
  detail::step_check step_check_;  // failures after the data moved, checksums (outcome round)
  std::vector<std::pair<tensor_id, std::optional<std::vector<float>>>> accumulator_undo_;  // the same, accumulators

  // Across steps.
  std::uint64_t step_ = 0;
  step_timing last_timing_;
  pipeline_stats last_;
  std::function<void(pipeline_stats const&)> hook_;
  std::optional<divergence_guard> guard_;
  std::function<void(guard_verdict const&)> guard_hook_;
  std::vector<guard_tensor> guard_tensors_;  // the step in progress
  bool guard_nonfinite_ = false;
};

GRADCOMP_NAMESPACE_END
