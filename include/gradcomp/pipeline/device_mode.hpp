// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `device_mode`: a `gradient_pipeline` whose gradients live in device memory, compressed by a
/// device source (pipeline/device_source.hpp, docs/cuda.md). It is a sibling of the host
/// modes: the pipeline holds it instead of one of them and reaches it through the same one-time
/// dispatch. It owns
///
/// - the source (`std::unique_ptr<detail::device_source_base>`), which keeps every state in
///   device memory: the residuals, the per-mode state (two-way residuals, PowerSGD sessions,
///   the hierarchical owners' feedback, the controller's level packets and Accordion's layer
///   accumulators) and the 16-bit tensors' float32 copies;
/// - the host mode of the options' table it runs (`host_exchange_mode`), for what is not data:
///   the hierarchical groups and plan, the PowerSGD options, and the checks of the checkpoint's
///   PowerSGD and two-way sections;
/// - the tensors with a completed step, whose residuals the checkpoint holds.
///
/// **What runs where** (docs/cuda.md). The source is a `cuda::device_compressor<C, Rule>`
/// (feedback "residual", "ef21" or "dgc:...", the rule's, with DGC's parameters) or a
/// `cuda::stream_codec<C>` (feedback "none") of a CUDA codec, element-wise or sparsifier; the
/// gradients are float32, float16 or bfloat16 in device memory. Flat steps run the bucketed
/// collective of that source (`bucketed_all_reduce`, payloads in device memory, control
/// messages on the host); with `two_way` the two-way collective of the source's codec and
/// feedback per compressed tensor (worker and server residuals in device memory). PowerSGD
/// ("powersgd:..." codec specs) takes `cuda::stream_codec<cuda::identity_codec>` as the source
/// (the small tensors go dense through it) and keeps one `cuda::powersgd_session` per tensor,
/// made by the memory space (`make_low_rank_session`, cuda/powersgd.cuh); outputs and `save`
/// are the CPU pipeline's with `backend=builtin`. The hierarchical all-reduce runs per
/// compressed tensor over the node and lane communicators given to
/// `gradient_pipeline::set_hierarchical_groups` (e.g. from `nccl_communicator::split`),
/// payloads on the device, outputs and the owners' residuals the CPU pipeline's.
/// `measure_gain` gives the CPU pipeline's gain to the bit (each compressed tensor compressed
/// and decoded once more on the device for it). A controller over a device sparsifier stages
/// each tensor's packets at every level of its plan on the device
/// (`device_source_base::stage_levels`; the further levels re-compressed from a host copy of the
/// first packet), keeps Accordion's layer accumulators in device memory and sends the decided
/// level's packets (or a dense step). The divergence guard's raise, skip and dense actions work
/// as on the CPU. Not taken by a device source (`config_error` at construction):
/// `buckets.checksum`, a 16-bit `buckets.small_format` and a controller over a codec without a
/// selection size.
///
/// A step runs the protocol of pipeline/pipeline.hpp: `add` per tensor (the checks the host's
/// stage makes, the guard's norms on the device in the canonical order, and with a controller
/// the packets of every level of the plan staged on the device), the agreement and guard rounds
/// (the protocol's), then `exchange`: the source's bucketed collective (which compresses,
/// exchanges, decodes and, after its outcome round, commits), or with a per-tensor mode the
/// mode's exchange per compressed tensor in the source and the outcome round, or with a
/// controller the decided level's packets (or a dense step). `rollback` puts the staged state
/// back when the step failed anywhere.
///
/// Outputs, residuals, statistics and checkpoints are byte for byte those of the CPU pipeline
/// with the CPU codec of `pipeline_options::codec`: the checkpoint's sections are written in the
/// host formats (`feedback_section`: `compressor::save`'s, one record per tensor that completed
/// a step, ascending ids; `accumulators`; `save`: the PowerSGD and two-way sections), and a
/// checkpoint is read back through the host formats' checks (`restore_feedback`,
/// `read_sections`) before anything is copied to the device (`load`).

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/hierarchical.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/comm/any_communicator.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/concepts/step_protocol.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/feedback/make_feedback.hpp>
#include <gradcomp/pipeline/device_source.hpp>
#include <gradcomp/pipeline/flat_mode.hpp>
#include <gradcomp/pipeline/guard.hpp>
#include <gradcomp/pipeline/hierarchical_mode.hpp>
#include <gradcomp/pipeline/low_rank_mode.hpp>
#include <gradcomp/pipeline/options.hpp>
#include <gradcomp/pipeline/rounds.hpp>
#include <gradcomp/pipeline/step_state.hpp>
#include <gradcomp/pipeline/two_way_mode.hpp>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <exception>
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

/// The exchange modes of host tensors (pipeline/options.hpp's table): `flat_mode` for
/// `pipeline_mode::flat` and `controlled`, and one type per other mode.
using host_exchange_mode = std::variant<flat_mode, two_way_mode, hierarchical_mode, low_rank_mode>;

/// A device source's exchange (file comment).
class device_mode {
 public:
  /// The mode of device source `src` running host mode `host` (of kind `kind`) for a pipeline
  /// with options `opt`, error-feedback compressor `feedback` and codec `base`.
  /// `config_error` for what a device source does not take (`check_device_options`,
  /// `check_device_source`, pipeline/options.hpp), and for a codec spec whose codec differs
  /// from `src`'s in the collectives' fingerprint (codec, aggregation, packet sizes, bits per
  /// element).
  template <pipeline_device_source Source>
  device_mode(Source src, host_exchange_mode host, pipeline_options const& opt, pipeline_mode kind,
              feedback_compressor const& feedback, any_codec const& base)
      : host_(std::move(host)),
        kind_(kind),
        traits_(pipeline_mode_traits_of(kind)),
        base_(base),
        feedback_(feedback_of(feedback)),
        feedback_spec_(opt.feedback),
        measure_gain_(opt.measure_gain),
        copt_{opt.buckets.op, opt.buckets.checksum} {
    check_device_options(opt);
    auto model = std::make_unique<detail::device_source_model<Source>>(std::move(src), opt.buckets);
    device_source_facts facts{
        model->has_budget(), model->makes_low_rank_sessions(), model->feedback(), {}};
    if (facts.feedback == feedback_id::dgc) facts.dgc = model->dgc_parameters();
    check_device_source(opt, kind, feedback, facts);
    for (std::size_t const n : {std::size_t{1}, std::size_t{4099}, (std::size_t{1} << 20) + 3}) {
      if (model->fingerprint(n, opt.buckets.op) !=
          detail::codec_fingerprint(base, n, opt.buckets.op, codec_context{},
                                    "gradient_pipeline source")) {
        throw config_error("gradcomp: gradient_pipeline with a device source: codec spec '" +
                           opt.codec +
                           "' does not describe the device codec (another codec, packet size or "
                           "bits per element at " +
                           std::to_string(n) + " elements)");
      }
    }
    src_ = std::move(model);
  }

  /// The host mode it runs (its groups, plan and options; its data is not used).
  [[nodiscard]] host_exchange_mode const& host() const noexcept { return host_; }
  /// The hierarchical mode it runs, if any (its groups and plan).
  [[nodiscard]] hierarchical_mode* hierarchical() noexcept {
    return std::get_if<hierarchical_mode>(&host_);
  }
  /// The source.
  [[nodiscard]] detail::device_source_base const& source() const noexcept { return *src_; }
  /// The committed error-feedback state of tensor `id`, in device memory.
  [[nodiscard]] std::span<float const> state(tensor_id id) const { return src_->state(id); }
  /// The tensors with a completed step (the checkpoint's records).
  [[nodiscard]] std::set<tensor_id> const& tensors() const noexcept { return tensors_; }

  /// Adds tensor `g` (in device memory) to step `s` as entry `e`: a 16-bit one widened into a
  /// float32 device buffer (its output rounded back by `e.write_back`), the feedback policy's
  /// size check the host's stage makes, the guard's norms (`guard`), and with a controller its
  /// packets at every level of the plan (`gains`: with the compression gain's terms; flat with
  /// `measure_gain`: the gain's terms only). A failure is recorded in `s` (every rank learns of
  /// it in the agreement round).
  template <element T>
  void add(step_entry& e, tensor_view<T> const& g, step_state& s, bool guard, bool gains) {
    if constexpr (std::same_as<T, float>) {
      e.out32 = g.span();
      e.raw32 = g.span();
    } else {
      // As the host's wide copy: widened (exact) into a float32 device buffer kept for the
      // tensor, the step's result rounded back once after the exchange.
      try {
        std::span<float> const w = src_->wide(g.id(), g.size());
        src_->widen(std::span<T const>(g.span()), w);
        e.out32 = w;
        e.raw32 = w;
        std::span<T> const dst = g.span();
        detail::device_source_base const* dev = src_.get();
        e.write_back = [dev, w, dst] { dev->narrow(std::span<float const>(w), dst); };
      } catch (...) {
        s.fail(std::current_exception());
      }
    }
    // The check the CPU pipeline's stage makes (the feedback policy's), so that the step
    // fails with the same error on the same ranks: here, before the agreement round.
    std::size_t const held = e.large ? src_->state(e.id).size() : 0;
    if (held != 0 && held != src_->state_floats(e.n) && !s.local) {
      s.local = std::make_exception_ptr(
          config_error("gradcomp: " + feedback_spec_ + " feedback state of tensor " +
                       std::to_string(static_cast<unsigned>(e.id)) + " holds " +
                       std::to_string(held) + " floats but the gradient has " +
                       std::to_string(e.n) + " elements (one state per tensor id)"));
    }
    // The guard's local norms, as the host computes them (the residual of a compressed tensor
    // only), in the same canonical order on the device (the hierarchical source's per-tensor
    // states are empty: its owners' are keyed by shard).
    if (guard) {
      guard_tensor gt{e.id, src_->sum_of_squares(e.raw32), 0.0};
      if (e.large && kind_ != pipeline_mode::two_way && kind_ != pipeline_mode::low_rank) {
        gt.residual_sq = src_->sum_of_squares(src_->state(e.id));
      }
      s.guard_tensors.push_back(gt);
      if (!std::isfinite(gt.gradient_sq) || !std::isfinite(gt.residual_sq))
        s.guard_nonfinite = true;
    }
    if (s.guard_nonfinite || s.local || !e.large) return;
    // A controller: the tensor staged and its packets written at every level of the plan, as
    // the host's flat mode does, with the statistics the controller needs. Without one, the
    // compression gain's terms where the host adds them.
    try {
      if (kind_ == pipeline_mode::controlled) {
        src_->stage_levels(tensor_view<float const>(e.raw32, e.id), s.ctx,
                           std::span<double const>(s.plan.measure).first(s.levels), gains,
                           s.ef_norm, std::span<double>(s.comp_norms));
        e.staged = true;
      } else if (kind_ == pipeline_mode::flat && measure_gain_) {
        auto const [input_sq, compressed_sq] =
            src_->gain_terms(tensor_view<float const>(e.raw32, e.id), s.ctx);
        s.ef_norm += input_sq;
        s.comp_norms[0] += compressed_sq;
      }
    } catch (...) {
      s.local = std::current_exception();
    }
  }

  /// The exchange of opened step `o` of `s` (file comment): its messages and bytes added to
  /// `o.br`, its time to `o.communicate`, the sent kind, factor, gain and compressed tensors
  /// to `o.st`. `decide(st)`: the controller's decision, the level to send and the residual
  /// rule (`gradient_pipeline`'s, summing the statistics over the ranks); `gain(st)`:
  /// `measure_gain`'s round; `shape(id, n)`: PowerSGD's matrix shape of a tensor.
  template <communicator Comm, class Decide, class Gain, class Shape>
  void exchange(Comm& comm, step_state& s, opened_step& o, Decide&& decide, Gain&& gain,
                Shape&& shape) {
    bucket_result const r = kind_ == pipeline_mode::controlled
                                ? exchange_controlled(comm, s, o, decide)
                                : exchange_plain(comm, s, o, gain, shape);
    o.br.packet_bytes += r.packet_bytes;
    o.br.wire_bytes += r.wire_bytes;
    o.br.buckets += r.buckets;
  }

  /// Sets `x` (device memory) to zero: a skipped step's output.
  void zero(std::span<float> x) const { src_->zero(x); }
  /// Leaves a step without sending: the packets each entry staged are dropped.
  void discard(std::span<step_entry const> entries) noexcept {
    for (auto const& e : entries) {
      if (e.staged) src_->discard(e.id);
    }
  }
  /// The step failed: the state its mode staged goes back.
  void rollback() noexcept {
    try {
      switch (kind_) {
        case pipeline_mode::two_way: src_->two_way_rollback(); break;
        case pipeline_mode::low_rank: src_->low_rank_rollback(); break;
        case pipeline_mode::hierarchical: src_->hierarchical_rollback(); break;
        case pipeline_mode::controlled: src_->layers_rollback(); break;
        case pipeline_mode::flat: break;
      }
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory while restoring
    }
  }

  /// The checkpoint's error-feedback section, as the CPU pipeline's compressor writes it: one
  /// record per tensor that completed a step, ascending ids, its state copied to the host
  /// (feedback "none": no values); with EF21 then one receiver record per such tensor (the
  /// CPU's receivers are the tensors it received, the same set).
  [[nodiscard]] std::vector<std::byte> feedback_section() const {
    bool const receivers = feedback_ == feedback_id::ef21;
    std::vector<std::byte> out =
        detail::feedback_state_head(feedback_, tensors_.size(), receivers ? tensors_.size() : 0);
    for (tensor_id const id : tensors_)
      detail::put_feedback_record(out, id, src_->state_on_host(id));
    if (receivers) {
      for (tensor_id const id : tensors_)
        detail::put_feedback_record(out, id, src_->receiver_on_host(id));
    }
    detail::seal_feedback_state(out);  // version 3, with its checksum, as `compressor::save`
    return out;
  }
  /// The layer accumulators (the checkpoint's section), copied to the host.
  [[nodiscard]] std::map<tensor_id, std::vector<float>> accumulators() const {
    return src_->layers_on_host();
  }
  /// The checkpoint's PowerSGD and two-way sections, in the host modes' formats.
  void save(detail::byte_writer& w) const {
    src_->low_rank_save(w);
    if (kind_ == pipeline_mode::two_way) {
      w.put_bytes(src_->two_way_save());
    } else {
      two_way_mode::save_none(w);
    }
  }

  /// A checkpoint's state read on the host and checked, before it goes to the device.
  struct restored {
    std::map<tensor_id, std::vector<float>> states, receivers;
    std::set<tensor_id> tensors;
    std::map<tensor_id, std::tuple<std::size_t, std::size_t, std::vector<std::byte>>> sessions;
    std::vector<std::byte> two_way;
  };
  /// The residuals (and EF21's receivers) of `checked`, a host compressor that loaded (and so
  /// validated) the checkpoint's error-feedback section.
  [[nodiscard]] restored restore_feedback(feedback_compressor const& checked) const {
    restored out;
    std::visit(
        [&](auto const& c) {
          c.for_each_committed([&](tensor_id id, std::span<float const> v) {
            out.states.emplace(id, std::vector<float>(v.begin(), v.end()));
            out.tensors.insert(id);
          });
          c.for_each_receiver([&](tensor_id id, std::span<float const> v) {
            out.receivers.emplace(id, std::vector<float>(v.begin(), v.end()));
          });
        },
        checked);
    return out;
  }
  /// Reads the PowerSGD and two-way sections from `r` into `out`, checked by the host mode
  /// (`r.fail` for a malformed section, or one that must be empty and is not).
  void read_sections(detail::byte_reader& r, restored& out) const {
    if (auto const* lr = std::get_if<low_rank_mode>(&host_)) {
      low_rank_mode const loaded = lr->loaded(r);
      for (auto const& [id, s] : loaded.sessions()) {
        detail::byte_writer rec;
        rec.begin(detail::low_rank_record_magic, 1);
        s.state().save_exact(rec);
        out.sessions[id] = {s.state().rows(), s.state().cols(), rec.finish()};
      }
    } else {
      low_rank_mode::expect_none(r);
    }
    if (auto const* tw = std::get_if<two_way_mode>(&host_)) {
      out.two_way = r.get_bytes();
      (void)tw->loaded_from(out.two_way);
    } else {
      two_way_mode::expect_none(r);
    }
  }
  /// Copies `in` and the layer accumulators `acc` to the device. The steps that may fail come
  /// first; each changes nothing when it fails, and at most one of them has anything to load
  /// (two-way and PowerSGD exclude each other, and the residuals of either are empty, so their
  /// assignment allocates nothing).
  void load(restored&& in, std::map<tensor_id, std::vector<float>> const& acc) {
    if (kind_ == pipeline_mode::two_way) src_->two_way_load(in.two_way);
    if (auto const* lr = std::get_if<low_rank_mode>(&host_))
      src_->low_rank_load(in.sessions, lr->options());
    src_->layers_assign(acc);  // (empty but for a controller, which excludes both above)
    src_->assign_states(in.states, in.receivers);
    tensors_ = std::move(in.tensors);
  }

 private:
  // Runs `f` with `comm` as an `any_communicator` (the source's exchanges take one).
  template <communicator Comm, class F>
  static void with_erased(Comm& comm, F&& f) {
    if constexpr (std::same_as<Comm, any_communicator>) {
      f(comm);
    } else {
      any_communicator erased = any_communicator::borrow(comm);
      f(erased);
    }
  }

  // A step without a controller: the source's bucketed collective (every tensor's own g dense
  // on the guard's dense step, the residuals kept or reset), or a per-tensor mode's exchange.
  template <communicator Comm, class Gain, class Shape>
  bucket_result exchange_plain(Comm& comm, step_state& s, opened_step& o, Gain& gain,
                               Shape& shape) {
    pipeline_stats& st = o.st;
    bool const guard_dense = o.guard_dense();
    // `measure_gain`: the gain over all ranks, in the host step's round.
    if (!guard_dense && measure_gain_ && traits_.gain_round) gain(st);
    auto const t_send = detail::step_clock::now();
    bucket_result r;
    with_erased(comm, [&](any_communicator& c) {
      if (guard_dense) {
        r = src_->exchange_dense(c, std::span<bucket_item const>(o.items), s.ctx);
      } else if (!traits_.stages) {
        r = exchange_per_tensor(c, s, shape);
      } else {
        r = src_->exchange(c, std::span<bucket_item const>(o.items), s.ctx);
      }
    });
    o.communicate += detail::seconds_between(t_send, detail::step_clock::now());
    if (guard_dense) {
      detail::dense_step_stats(st);
      if (o.gv.reset_residual &&
          kind_ != pipeline_mode::two_way) {  // as the CPU's compressor reset
        src_->reset_states();
        tensors_.clear();
      }
      return r;
    }
    hierarchical_mode const* const hier = std::get_if<hierarchical_mode>(&host_);
    for (auto const& e : s.entries) {
      if (!e.large) continue;
      ++st.compressed_tensors;
      // two-way and PowerSGD keep their own state; the hierarchical all-reduce's is the shard
      // owners' (a tensor's shard, compressed between nodes)
      if (hier) {
        detail::hierarchical_plan const& hp = hier->plan();
        int const local = hp.layout.local_rank(comm.rank());
        if (local < hp.lanes && hp.layout.nodes() > 1)
          tensors_.insert(hierarchical_shard_id(e.id, local, hp.lanes));
      } else if (traits_.stages) {
        tensors_.insert(e.id);
      }
    }
    st.factor = traits_.factor_from_bytes ? 1.0 : 32.0 / base_.bits_per_element();
    return r;
  }

  // The per-tensor modes, as their host step does them: the mode's exchange per compressed
  // tensor in the source (two-way: its residuals; PowerSGD: its sessions; hierarchical: the
  // owners' feedback), the small tensors dense in the source's bucketed collective, then the
  // step-outcome round; the source's state becomes current only after it (a failure puts it
  // back, `rollback`).
  template <class Shape>
  bucket_result exchange_per_tensor(any_communicator& comm, step_state& s, Shape& shape) {
    bucket_result br;
    hierarchical_mode* const hier = std::get_if<hierarchical_mode>(&host_);
    low_rank_mode const* const sessions = std::get_if<low_rank_mode>(&host_);
    if (kind_ == pipeline_mode::two_way) src_->two_way_begin();
    std::vector<bucket_item> const dense = detail::for_each_compressed(
        std::span<step_entry const>(s.entries), br,
        [&](step_entry const& e, tensor_view<float const> g) {
          if (sessions) {
            auto const [rows, cols] = shape(e.id, e.n);
            return src_->low_rank_exchange(comm, e.id, rows, cols, sessions->options(), g, e.out32,
                                           s.ctx, copt_, s.check);
          }
          if (hier) {
            hierarchical_result const hr =
                src_->hierarchical_exchange(comm, *hier->node(), hier->lane(), hier->plan(), g,
                                            e.out32, s.ctx, hier->options(), s.check);
            collective_result r;
            r.packet_bytes = hr.packet_bytes;
            r.wire_bytes = hr.wire_bytes;
            return r;
          }
          return src_->two_way_exchange(comm, g, e.out32, s.ctx, copt_, s.check);
        });
    if (!dense.empty()) {
      bucket_result const d = src_->exchange(comm, std::span<bucket_item const>(dense), s.ctx);
      br.packet_bytes += d.packet_bytes;
      br.wire_bytes += d.wire_bytes;
      br.buckets += d.buckets;
    }
    detail::agree_outcome(comm, s.check, "gradient_pipeline", s.number);
    br.wire_bytes += detail::outcome_wire_bytes(copt_.checksum, s.size);
    switch (kind_) {
      case pipeline_mode::two_way: src_->two_way_commit(); break;
      case pipeline_mode::low_rank: src_->low_rank_commit(); break;
      case pipeline_mode::hierarchical: src_->hierarchical_commit(); break;
      default: break;
    }
    return br;
  }

  // A step with a controller, as the flat mode's step does it for host tensors: the layer
  // accumulators, the decision, then the packets of the decided level (staged by `add`) in
  // the source's bucketed collective, or every tensor dense (p = g + residual, or g with the
  // residual kept, as the decision says).
  template <communicator Comm, class Decide>
  bucket_result exchange_controlled(Comm& comm, step_state& s, opened_step& o, Decide& decide) {
    pipeline_stats& st = o.st;
    bool const guard_dense = o.guard_dense();
    if (s.plan.accumulate_layers || s.plan.report_layers) {
      for (auto const& e : s.entries) {
        double const sq =
            src_->accumulate_layer(e.id, e.raw32, s.plan.accumulate_layers, s.plan.report_layers);
        if (s.plan.report_layers) s.layer_norms.push_back(sq);
      }
    }
    std::size_t k = decision::npos;
    residual_rule rule = residual_rule::keep;
    if (guard_dense) {  // every tensor's own g, dense; the controller is not asked
      detail::dense_step_stats(st);
    } else {
      std::tie(k, rule) = decide(st);
    }
    for (auto const& e : s.entries)
      st.compressed_tensors += e.large && !guard_dense && k != decision::npos ? 1 : 0;

    // The exchange: the decided level's packets, or dense.
    bool const lossless = !guard_dense && k == decision::npos && rule != residual_rule::keep;
    auto const t_send = detail::step_clock::now();
    bucket_result r;
    with_erased(comm, [&](any_communicator& c) {
      if (k != decision::npos && !guard_dense) {
        r = src_->exchange_level(c, std::span<bucket_item const>(o.items), k, s.plan.measure[k],
                                 s.ctx);
      } else if (lossless) {  // p sent dense, delivered exactly
        std::vector<bucket_item> sent = o.items;
        for (std::size_t i = 0; i < sent.size(); ++i) {
          std::span<float const> const p =
              s.entries[i].staged ? src_->staged_input(s.entries[i].id) : std::span<float const>{};
          if (!p.empty()) sent[i].grad = tensor_view<float const>(p, s.entries[i].id);
        }
        r = src_->exchange_dense(c, std::span<bucket_item const>(sent), s.ctx);
      } else {  // g dense, the residual kept
        r = src_->exchange_dense(c, std::span<bucket_item const>(o.items), s.ctx);
      }
    });
    src_->layers_commit();
    // Commit: a level's packets were committed by the exchange after its outcome round.
    for (auto const& e : s.entries) {
      if (!e.staged) continue;
      if (lossless) src_->commit_lossless(e.id);
      if (guard_dense || (k == decision::npos && !lossless)) {
        src_->discard(e.id);
      } else {
        tensors_.insert(e.id);
      }
    }
    if (o.gv.reset_residual) {
      src_->reset_states();
      tensors_.clear();
    }
    if (lossless) {  // EF21's receiver side (the exchange did it for a level's packets)
      for (auto const& e : s.entries) {
        if (e.staged) src_->receive(e.id, e.out32);
      }
    }
    o.communicate += detail::seconds_between(t_send, detail::step_clock::now());
    return r;
  }

  host_exchange_mode host_;
  pipeline_mode kind_;
  pipeline_mode_traits traits_;
  any_codec base_;             // the pipeline's codec (its bits per element: the factor)
  feedback_id feedback_;       // the pipeline's error feedback (the checkpoint's records)
  std::string feedback_spec_;  // its spec (error messages)
  bool measure_gain_;
  collective_options copt_;  // the buckets' reduction and checksum
  std::unique_ptr<detail::device_source_base> src_;
  std::set<tensor_id> tensors_;  // the tensors with a completed step (saved state)
};

/// The exchange mode a `gradient_pipeline` holds (pipeline/options.hpp's table): a host mode
/// (`host_exchange_mode`'s alternatives), or `device_mode` for a device source.
using exchange_mode =
    std::variant<flat_mode, two_way_mode, hierarchical_mode, low_rank_mode, device_mode>;

namespace detail {

/// The checkpoint's PowerSGD and two-way sections (adjacent in "GCPL") of mode `m`: the mode's
/// own where it keeps one, the other empty (a device source: its own, in the host formats).
inline void save_mode_sections(byte_writer& w, exchange_mode const& m) {
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

/// Reads those sections for host mode `m`: a copy of `m` holding the state read where the mode
/// keeps one (`r.fail` where a section that must be empty is not), else none. (A device source
/// reads them itself, `device_mode::read_sections`.)
inline std::optional<exchange_mode> loaded_mode_sections(byte_reader& r, exchange_mode const& m) {
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

}  // namespace detail

/// A device source's exchange step of opened step `s` (pipeline/rounds.hpp's services `sv`):
/// its mode's exchange in the source (`device_mode::exchange`), with the protocol's decision,
/// gain round and PowerSGD shapes; decoding runs inside it. Returns the completed step's
/// statistics.
template <communicator Comm>
pipeline_stats exchange_step(Comm& comm, device_mode& m, opened_step& s, step_services& sv) {
  m.exchange(
      comm, sv.cur, s,
      [&](pipeline_stats& st) { return decide_step(sv, comm, st, *s.snapshot, s.communicate); },
      [&](pipeline_stats& st) { gain_round(sv, comm, st, s.communicate); },
      [&](tensor_id id, std::size_t n) { return sv.shape_of(id, n); });
  write_back(sv);
  return complete(sv, s, 0.0, 0.0);
}

GRADCOMP_NAMESPACE_END
