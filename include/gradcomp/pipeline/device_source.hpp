// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Device sources of `gradient_pipeline` (pipeline/pipeline.hpp, docs/cuda.md): the type
/// erasure through which the pipeline drives a packet source whose payloads live in device
/// memory (`cuda::device_compressor<C, Rule>`, `cuda::stream_codec<C>`, cuda/collective.cuh).
///
/// - `pipeline_device_source`: the concept a source must meet (a `bucketed_all_reduce` source
///   of float32 tensors whose payloads are not in host memory).
/// - `detail::device_source_base`: the pipeline's view of such a source, one virtual function
///   per thing a step asks of it — the bucketed exchange, the guard's norms and dense step,
///   the controller's staged levels, Accordion's layer accumulators, 16-bit casts, and the
///   two-way, hierarchical and PowerSGD exchanges with their commit and rollback — so that
///   `gradient_pipeline` itself is not a template over the source.
/// - `detail::device_source_model<Source>`: its one implementation, a `bucketed_all_reduce`
///   of `Source` plus the state of each mode (device residuals of two-way compression, the
///   hierarchical step's staged ids, PowerSGD sessions made by the memory space, the
///   controller's level packets and layer accumulators), each staged until the step's outcome
///   round and put back on a failure.
///
/// Outputs, states, statistics and checkpoints through a device source are byte for byte those
/// of the CPU pipeline with the CPU codec of `pipeline_options::codec` (docs/cuda.md).

#include <gradcomp/codec/budget.hpp>
#include <gradcomp/codec/powersgd.hpp>
#include <gradcomp/codec/recompress.hpp>
#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/dense.hpp>
#include <gradcomp/collective/hierarchical.hpp>
#include <gradcomp/collective/low_rank.hpp>
#include <gradcomp/collective/memory.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/comm/any_communicator.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/concepts/feedback.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/feedback/policies.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

namespace detail {

/// The pipeline's view of a device source (type-erased; `device_source_model` is the one
/// implementation). The communicator comes in erased as well (`any_communicator::borrow`).
class device_source_base {
 public:
  device_source_base() = default;
  device_source_base(device_source_base const&) = delete;
  device_source_base& operator=(device_source_base const&) = delete;
  virtual ~device_source_base() = default;
  /// The source's error feedback: none (`stream_codec`), or its rule's (`device_compressor<C,
  /// Rule>`: residual, EF21 or DGC).
  [[nodiscard]] virtual feedback_id feedback() const noexcept = 0;
  /// A DGC source's momentum, clipping norm and workers (`config_error` for another source).
  [[nodiscard]] virtual std::tuple<float, double, std::uint32_t> dgc_parameters() const = 0;
  /// Floats of the feedback state of an n-element tensor (2n for DGC's [u | v]; 0 for none).
  [[nodiscard]] virtual std::size_t state_floats(std::size_t n) const noexcept = 0;
  /// The collectives' fingerprint of the source's codec for `n` elements.
  [[nodiscard]] virtual std::uint64_t fingerprint(std::size_t n, reduction op) const = 0;
  /// One step of the bucketed collective over `items` (device spans); commits the residuals
  /// after the outcome round only, so a failure leaves them as they were.
  virtual bucket_result exchange(any_communicator& comm, std::span<bucket_item const> items,
                                 codec_context const& ctx) = 0;
  /// The guard's dense action: one step of `items` sent as they are, every tensor in float32
  /// buckets (the bucketed collective of the source's codec without feedback, options of the
  /// pipeline with no tensor compressed); the residuals are not touched.
  virtual bucket_result exchange_dense(any_communicator& comm, std::span<bucket_item const> items,
                                       codec_context const& ctx) = 0;
  /// Forgets every feedback state and EF21 receiver (the guard's reset after a non-finite
  /// residual).
  virtual void reset_states() = 0;
  /// The committed feedback state of `id` in device memory — the residual, EF21's h or DGC's
  /// [u | v] (empty: none yet, or feedback "none").
  [[nodiscard]] virtual std::span<float const> state(tensor_id id) const = 0;
  /// A host copy of `state(id)`.
  [[nodiscard]] virtual std::vector<float> state_on_host(tensor_id id) const = 0;
  /// A host copy of EF21's receiver estimate of `id` (empty: none, or another rule).
  [[nodiscard]] virtual std::vector<float> receiver_on_host(tensor_id id) const = 0;
  /// Replaces every state and EF21 receiver by host values (empty: zero); on an error nothing
  /// changes.
  virtual void assign_states(std::map<tensor_id, std::vector<float>> const& states,
                             std::map<tensor_id, std::vector<float>> const& receivers) = 0;
  /// Σ x² of device floats, the bits of `norm_sq` (the memory space's `sum_of_squares`).
  [[nodiscard]] virtual double sum_of_squares(std::span<float const> x) const = 0;
  /// The compression gain's terms of one tensor (`pipeline_options::measure_gain`): ‖p‖² and
  /// ‖D(C(p))‖² of the input p the source compresses (g + residual, EF21's g − h, DGC's v; g
  /// without feedback), with the bits of `norm_sq`. The packet is the one the exchange then
  /// sends (same codec, context and tensor id), compressed once more into a scratch buffer; the
  /// feedback state is not touched (the stage is discarded). A non-finite p throws what the
  /// exchange would throw.
  virtual std::pair<double, double> gain_terms(tensor_view<float const> g, codec_context const& ctx) = 0;
  /// Controllers (`pipeline_options::controller`). Whether the source's codec takes a selection
  /// size (`with_budget`: top-k, approximate top-k, random-k).
  [[nodiscard]] virtual bool has_budget() const noexcept = 0;
  /// A controller's stage of one tensor, as the CPU pipeline's `stage`: the source's input p is
  /// staged (g + residual, EF21's g − h, DGC's v; g without feedback) and, for each factor of
  /// `factors`, a packet written in device memory and kept for the exchange — the codec at the
  /// first factor compresses p, each further level is `recompress_sparse` of the level before
  /// (on a host copy of the first packet, m elements, then copied back: its bytes are the CPU's
  /// by construction). With `norms`, ‖p‖² is added to `input_sq` and ‖D(packet l)‖² to
  /// `level_sq[l]` (the bits of `norm_sq`). A failure discards the stage and throws.
  virtual void stage_levels(tensor_view<float const> g, codec_context const& ctx, std::span<double const> factors,
                            bool norms, double& input_sq, std::span<double> level_sq) = 0;
  /// One step of the bucketed collective sending the level-`level` packets of the staged
  /// tensors (written by `stage_levels`, the codec at `factor`), the small tensors of `items`
  /// dense; the feedback steps are prepared from the packets sent and committed after the
  /// outcome round (EF21's receivers take the outputs then).
  virtual bucket_result exchange_level(any_communicator& comm, std::span<bucket_item const> items, std::size_t level,
                                       double factor, codec_context const& ctx) = 0;
  /// The staged input p of `id` (device memory; g itself for a source without feedback: empty).
  [[nodiscard]] virtual std::span<float const> staged_input(tensor_id id) const = 0;
  /// The staged input of `id` was delivered exactly (a dense send of p): the residual becomes
  /// zero, EF21's h takes p, DGC's u and v become zero.
  virtual void commit_lossless(tensor_id id) = 0;
  /// Drops the staged step of `id` (the state stays).
  virtual void discard(tensor_id id) noexcept = 0;
  /// EF21's receiver side for a dense output of `id` (nothing for another rule).
  virtual void receive(tensor_id id, std::span<float> io) = 0;
  /// Accordion's per-layer gradients (the CPU pipeline's `accumulate_layer`), in device memory:
  /// with `accumulate` x is added to the accumulator of `id` (zeros when its size differs);
  /// with `report` its ‖·‖² is returned (0 when empty) and it is emptied. Staged until
  /// `layers_commit`; `layers_rollback` puts every accumulator back.
  virtual double accumulate_layer(tensor_id id, std::span<float const> x, bool accumulate, bool report) = 0;
  virtual void layers_commit() noexcept = 0;
  virtual void layers_rollback() noexcept = 0;
  /// Host copies of the accumulators (as the CPU pipeline saves them: an emptied one is empty).
  [[nodiscard]] virtual std::map<tensor_id, std::vector<float>> layers_on_host() const = 0;
  /// Replaces every accumulator by host values; nothing changes on an error.
  virtual void layers_assign(std::map<tensor_id, std::vector<float>> const& acc) = 0;
  /// Sets device floats to zero (the outputs of a step the guard skips).
  virtual void zero(std::span<float> x) const = 0;
  /// A device float32 buffer of `n` floats kept for tensor `id` across steps (a 16-bit
  /// gradient is widened into it and its result rounded back from it).
  virtual std::span<float> wide(tensor_id id, std::size_t n) = 0;
  /// Device casts with the bits of `widen_to_f32` and `round_from_f32` (the memory space's
  /// `widen` and `narrow`); `config_error` for a source whose memory space has none.
  virtual void widen(std::span<half const> src, std::span<float> dst) const = 0;
  virtual void widen(std::span<bfloat16 const> src, std::span<float> dst) const = 0;
  virtual void narrow(std::span<float const> src, std::span<half> dst) const = 0;
  virtual void narrow(std::span<float const> src, std::span<bfloat16> dst) const = 0;

  /// Two-way compression (`pipeline_options::two_way`): the source's codec on the worker and
  /// the server side, with its feedback on both (device residuals for a source that keeps
  /// residuals, none else), a `two_way_compressor` kept in device memory. `two_way_begin`
  /// opens a step, `two_way_exchange` runs `all_reduce_two_way`'s exchange of one tensor
  /// (the outcome round is the caller's), `two_way_commit` keeps the step's changes and
  /// `two_way_rollback` puts every state back.
  virtual void two_way_begin() = 0;
  virtual collective_result two_way_exchange(any_communicator& comm, tensor_view<float const> g, std::span<float> out,
                                             codec_context const& ctx, collective_options const& copt,
                                             step_check& check) = 0;
  virtual void two_way_commit() noexcept = 0;
  virtual void two_way_rollback() noexcept = 0;
  /// The two-way state in `two_way_compressor::save`'s format (host copies of the residuals).
  [[nodiscard]] virtual std::vector<std::byte> two_way_save() const = 0;
  /// Restores a state written by `two_way_save` (or by the CPU pipeline's two-way compressor
  /// with the same feedback); `format_error` and nothing changed on a malformed one.
  virtual void two_way_load(std::span<std::byte const> bytes) = 0;

  /// The hierarchical all-reduce (`pipeline_options::hierarchical`) of one compressed tensor
  /// over the node and lane communicators of `gradient_pipeline::set_hierarchical_groups`
  /// (`hierarchical_exchange_over`; the outcome round is the caller's). The shard owners'
  /// feedback steps stay staged until `hierarchical_commit`; `hierarchical_rollback` discards
  /// them.
  virtual hierarchical_result hierarchical_exchange(any_communicator& comm, any_communicator& node,
                                                    any_communicator* lane, hierarchical_plan const& plan,
                                                    tensor_view<float const> g, std::span<float> out,
                                                    codec_context const& ctx, hierarchical_options const& opt,
                                                    step_check& check) = 0;
  virtual void hierarchical_commit() = 0;
  virtual void hierarchical_rollback() noexcept = 0;

  /// PowerSGD (a "powersgd" codec spec): whether the source's memory space makes device
  /// sessions (`make_low_rank_session`, found by argument-dependent lookup on the memory space:
  /// cuda/powersgd.cuh for `cuda::device_memory`).
  [[nodiscard]] virtual bool makes_low_rank_sessions() const noexcept = 0;
  /// `all_reduce_low_rank`'s exchange of tensor `id` (the outcome round is the caller's) with
  /// its session, made at its first step for a rows × cols matrix with `opt`; the session's
  /// state before the step is kept until `low_rank_commit` (`low_rank_rollback` puts it back).
  virtual collective_result low_rank_exchange(any_communicator& comm, tensor_id id, std::size_t rows,
                                              std::size_t cols, powersgd_options const& opt,
                                              tensor_view<float const> g, std::span<float> out,
                                              codec_context const& ctx, collective_options const& copt,
                                              step_check& check) = 0;
  virtual void low_rank_commit() noexcept = 0;
  virtual void low_rank_rollback() noexcept = 0;
  /// The sessions in the CPU pipeline's checkpoint format (count, then per session its id,
  /// rows, cols and `save_exact`), in ascending id order.
  virtual void low_rank_save(byte_writer& w) const = 0;
  /// Replaces every session by `saved` (id → rows, cols and a "GCPS" v1 record of
  /// `save_exact`, already validated by a host session); nothing changes on an error.
  virtual void low_rank_load(
      std::map<tensor_id, std::tuple<std::size_t, std::size_t, std::vector<std::byte>>> const& saved,
      powersgd_options const& opt) = 0;
};

/// The record format `low_rank_load` takes (one session's `save_exact`).
inline constexpr char const* low_rank_record_magic = "GCPS";

/// The PowerSGD sessions of a device source whose memory space `M` makes them
/// (`make_low_rank_session(m, rows, cols, options, id)`, found by argument-dependent lookup:
/// cuda/powersgd.cuh), with the states to put back if the step fails; empty for another space.
template <class M>
struct low_rank_store {};
template <class M>
  requires requires(M const& m, powersgd_options const& o) {
    make_low_rank_session(m, std::size_t{}, std::size_t{}, o, tensor_id{});
  }
struct low_rank_store<M> {
  using session_type = decltype(make_low_rank_session(std::declval<M const&>(), std::size_t{}, std::size_t{},
                                                      std::declval<powersgd_options const&>(), tensor_id{}));
  std::map<tensor_id, session_type> sessions;
  std::vector<std::pair<tensor_id, std::optional<decltype(std::declval<session_type const&>().snapshot())>>> undo;
};

/// The packet source of a controller's exchange (`device_source_base::exchange_level`): its
/// codec is the source's codec at the decided level, its packets are the ones written before
/// the decision (copied into the collective's buffers), and the feedback steps go to the source
/// that staged them (`Source`'s `prepare_commit`, `apply_commit`, `discard`, EF21's `receive`).
template <class Source, class Codec>
class prepared_source {
 public:
  prepared_source(Source& src, Codec const& codec) noexcept : src_(&src), codec_(&codec) {}
  /// The level's codec and packets of the step (the packets stay owned by the caller).
  void bind(Codec const& codec, std::map<tensor_id, std::span<std::byte const>> packets) {
    codec_ = &codec;
    packets_ = std::move(packets);
  }
  [[nodiscard]] Codec const& codec() const noexcept { return *codec_; }
  std::size_t compress(tensor_view<float const> g, std::span<std::byte> out, codec_context const& = {}) {
    return copy(g.id(), out);
  }
  std::size_t stage(tensor_view<float const> g, std::span<std::byte> out, codec_context const& = {})
    requires two_phase_source<Source>
  {
    return copy(g.id(), out);
  }
  template <class D>
  void prepare_commit(tensor_id id, D const& codec, std::span<std::byte const> sent, codec_context const& ctx = {})
    requires two_phase_source<Source>
  {
    src_->prepare_commit(id, codec, sent, ctx);
  }
  void apply_commit(tensor_id id)
    requires two_phase_source<Source>
  {
    src_->apply_commit(id);
  }
  void discard(tensor_id id)
    requires two_phase_source<Source>
  {
    src_->discard(id);
  }
  void receive(tensor_id id, std::span<float> io)
    requires requires(Source& x, tensor_id i, std::span<float> o) { x.receive(i, o); }
  {
    src_->receive(id, io);
  }

 private:
  std::size_t copy(tensor_id id, std::span<std::byte> out) const {
    auto const it = packets_.find(id);
    if (it == packets_.end()) {
      throw config_error("gradcomp: gradient_pipeline: tensor " + std::to_string(static_cast<unsigned>(id)) +
                         " has no staged packet for the controller's exchange");
    }
    std::span<std::byte const> const p = it->second;
    if (out.size() < p.size()) {
      throw config_error("gradcomp: gradient_pipeline: a staged packet of " + std::to_string(p.size()) +
                         " bytes does not fit the collective's buffer of " + std::to_string(out.size()));
    }
    memory_of(*codec_).copy(out.first(p.size()), p);
    return p.size();
  }
  Source* src_;
  Codec const* codec_;
  std::map<tensor_id, std::span<std::byte const>> packets_;
};

/// `device_source_base` over a `Source` (its payloads in device memory, a `bucketed_all_reduce`
/// of it doing the exchange).
template <class Source>
class device_source_model final : public device_source_base {
 public:
  device_source_model(Source src, bucket_options const& opt) : opt_(opt), buckets_(std::move(src), opt) {}

  [[nodiscard]] feedback_id feedback() const noexcept override { return feedback_kind; }
  [[nodiscard]] std::tuple<float, double, std::uint32_t> dgc_parameters() const override {
    if constexpr (feedback_kind == feedback_id::dgc) {
      auto const& r = buckets_source().rule();
      return {r.momentum(), r.clip_norm(), r.workers()};
    } else {
      throw config_error("gradcomp: gradient_pipeline: the device source keeps no DGC state");
    }
  }
  [[nodiscard]] std::size_t state_floats(std::size_t n) const noexcept override {
    if constexpr (feedback_kind == feedback_id::none) {
      (void)n;
      return 0;
    } else {
      return Source::rule_type::state_floats(n);
    }
  }
  [[nodiscard]] std::uint64_t fingerprint(std::size_t n, reduction op) const override {
    return codec_fingerprint(buckets_source(), n, op, codec_context{}, "gradient_pipeline source");
  }
  bucket_result exchange(any_communicator& comm, std::span<bucket_item const> items,
                         codec_context const& ctx) override {
    return buckets_.run(comm, items, ctx);
  }
  bucket_result exchange_dense(any_communicator& comm, std::span<bucket_item const> items,
                               codec_context const& ctx) override {
    if (!dense_) {
      bucket_options o = opt_;
      o.min_compress_elements = std::numeric_limits<std::size_t>::max();
      o.small_format = dense_format::f32;
      dense_.emplace(codec_of(buckets_source()), o);
    }
    return dense_->run(comm, items, ctx);
  }
  void reset_states() override {
    if constexpr (feedback_kind != feedback_id::none) buckets_.source().reset();
  }
  [[nodiscard]] std::span<float const> state(tensor_id id) const override {
    if constexpr (feedback_kind != feedback_id::none) {
      return buckets_source().state(id);
    } else {
      (void)id;
      return {};
    }
  }
  [[nodiscard]] std::vector<float> state_on_host(tensor_id id) const override { return on_host(state(id)); }
  [[nodiscard]] std::vector<float> receiver_on_host(tensor_id id) const override {
    if constexpr (receiving) {
      return on_host(buckets_source().receiver(id));
    } else {
      (void)id;
      return {};
    }
  }
  void assign_states(std::map<tensor_id, std::vector<float>> const& states,
                     std::map<tensor_id, std::vector<float>> const& receivers) override {
    if constexpr (receiving) {
      buckets_.source().assign_states(states, receivers);
    } else if constexpr (feedback_kind != feedback_id::none) {
      if (!receivers.empty()) throw config_error("gradcomp: gradient_pipeline: receiver states for a source without a receiver side");
      buckets_.source().assign_states(states);
    } else {
      (void)states, (void)receivers;  // no feedback: nothing to load
    }
  }
  [[nodiscard]] double sum_of_squares(std::span<float const> x) const override {
    return memory_of(buckets_source()).sum_of_squares(x);
  }
  void zero(std::span<float> x) const override { memory_of(buckets_source()).zero(std::as_writable_bytes(x)); }
  std::pair<double, double> gain_terms(tensor_view<float const> g, codec_context const& ctx) override {
    auto const mem = memory_of(buckets_source());
    auto const& c = codec_of(buckets_source());
    std::span<float const> const p = stage_input(g, ctx);
    try {
      if (!gain_packet_) gain_packet_.emplace(mem.make_buffer());
      gain_packet_->resize(c.max_compressed_bytes(g.size()));
      std::size_t const bytes = c.compress(tensor_view<float const>(p, g.id()), gain_packet_->span(), ctx);
      std::pair<double, double> const terms{
          mem.sum_of_squares(p),
          decoded_norm(c, std::span<std::byte const>(gain_packet_->span().first(bytes)), g.size(), ctx)};
      discard(g.id());
      return terms;
    } catch (...) {
      discard(g.id());
      throw;
    }
  }

  [[nodiscard]] bool has_budget() const noexcept override { return budgeted; }
  void stage_levels(tensor_view<float const> g, codec_context const& ctx, std::span<double const> factors,
                    bool norms, double& input_sq, std::span<double> level_sq) override {
    if constexpr (!budgeted) {
      (void)g, (void)ctx, (void)factors, (void)norms, (void)input_sq, (void)level_sq;
      throw config_error("gradcomp: gradient_pipeline: the device source's codec has no selection size");
    } else {
      auto const mem = memory_of(buckets_source());
      std::span<float const> const p = stage_input(g, ctx);
      try {
        if (norms) input_sq += mem.sum_of_squares(p);
        if (factors.empty()) return;  // a dense step: the input only
        std::vector<level_packet>& lv = levels_[g.id()];
        while (lv.size() < factors.size()) lv.push_back({mem.make_buffer(), 0});
        codec_type const& c0 = level_codec(factors[0]);
        lv[0].buf.resize(c0.max_compressed_bytes(g.size()));
        lv[0].bytes = c0.compress(tensor_view<float const>(p, g.id()), lv[0].buf.span(), ctx);
        if (factors.size() > 1 && direct_levels()) {
          // Re-compression equals compressing p at the level's size: on the device.
          for (std::size_t l = 1; l < factors.size(); ++l) {
            codec_type const& c = level_codec(factors[l]);
            lv[l].buf.resize(c.max_compressed_bytes(g.size()));
            lv[l].bytes = c.compress(tensor_view<float const>(p, g.id()), lv[l].buf.span(), ctx);
          }
        } else if (factors.size() > 1) {
          // The further levels from the packet before, on the host (m elements, not n).
          std::vector<std::byte> prev(lv[0].bytes);
          mem.read(std::span<std::byte const>(lv[0].packet()),
                   [&](std::span<std::byte const> h) { std::memcpy(prev.data(), h.data(), h.size()); });
          for (std::size_t l = 1; l < factors.size(); ++l) {
            std::uint64_t const k = sparse_budget::factor(factors[l]).kept(g.size());
            std::vector<std::byte> next(max_recompressed_bytes(std::span<std::byte const>(prev), k));
            next.resize(recompress_sparse(std::span<std::byte const>(prev), k, std::span<std::byte>(next), ctx));
            lv[l].buf.resize(next.size());
            mem.write(lv[l].buf.span(), std::span<std::byte const>(next));
            lv[l].bytes = next.size();
            prev = std::move(next);
          }
        }
        if (norms) {
          for (std::size_t l = 0; l < factors.size(); ++l)
            level_sq[l] += decoded_norm(level_codec(factors[l]), lv[l].packet(), g.size(), ctx);
        }
      } catch (...) {
        discard(g.id());
        throw;
      }
    }
  }
  bucket_result exchange_level(any_communicator& comm, std::span<bucket_item const> items, std::size_t level,
                               double factor, codec_context const& ctx) override {
    if constexpr (!budgeted) {
      (void)comm, (void)items, (void)level, (void)factor, (void)ctx;
      throw config_error("gradcomp: gradient_pipeline: the device source's codec has no selection size");
    } else {
      codec_type const& c = level_codec(factor);
      std::map<tensor_id, std::span<std::byte const>> packets;
      for (auto const& it : items) {
        auto const found = levels_.find(it.grad.id());
        if (found != levels_.end() && found->second.size() > level)
          packets.emplace(it.grad.id(), found->second[level].packet());
      }
      if (!prepared_) prepared_.emplace(prepared_type(buckets_.source(), c), opt_);
      prepared_->source().bind(c, std::move(packets));
      return prepared_->run(comm, items, ctx);
    }
  }
  [[nodiscard]] std::span<float const> staged_input(tensor_id id) const override {
    if constexpr (feedback_kind != feedback_id::none) {
      return buckets_source().staged_input(id);
    } else {
      (void)id;
      return {};
    }
  }
  void commit_lossless(tensor_id id) override {
    if constexpr (feedback_kind != feedback_id::none) buckets_.source().commit_lossless(id);
  }
  void discard(tensor_id id) noexcept override {
    if constexpr (feedback_kind != feedback_id::none) buckets_.source().discard(id);
  }
  void receive(tensor_id id, std::span<float> io) override {
    if constexpr (receiving) {
      buckets_.source().receive(id, io);
    } else {
      (void)id, (void)io;
    }
  }
  double accumulate_layer(tensor_id id, std::span<float const> x, bool accumulate, bool report) override {
    auto const mem = memory_of(buckets_source());
    auto const [it, fresh] = layers_.try_emplace(id, layer_slot{mem.make_buffer(), mem.make_buffer()});
    if (fresh) layers_fresh_.push_back(id);
    layers_touched_.push_back(id);
    layer_slot& a = it->second;
    // The step's value goes to `a.next` (accumulated) or stays `a.cur`; made current at
    // `layers_commit`.
    a.use_next = accumulate;
    a.next_n = a.n;
    if (accumulate) {
      a.next.resize(x.size_bytes());
      std::span<float> const nx = float_span(a.next, x.size());
      if (a.n == x.size()) {
        mem.copy(std::as_writable_bytes(nx), a.cur.span().first(x.size_bytes()));
      } else {
        mem.zero(std::as_writable_bytes(nx));
      }
      mem.add(x, nx);
      a.next_n = x.size();
    }
    if (!report) return 0.0;
    auto const& v = a.use_next ? a.next : a.cur;
    double const sq =
        a.next_n == 0 ? 0.0 : mem.sum_of_squares(std::span<float const>(reinterpret_cast<float const*>(v.data()), a.next_n));
    a.next_n = 0;  // emptied once reported
    return sq;
  }
  void layers_commit() noexcept override {
    for (tensor_id id : layers_touched_) {
      layer_slot& a = layers_.at(id);
      if (a.use_next) std::swap(a.cur, a.next);
      a.n = a.next_n;
      a.use_next = false;
    }
    layers_touched_.clear();
    layers_fresh_.clear();
  }
  void layers_rollback() noexcept override {
    for (tensor_id id : layers_touched_) {
      auto const it = layers_.find(id);
      if (it != layers_.end()) it->second.use_next = false;
    }
    for (tensor_id id : layers_fresh_) layers_.erase(id);
    layers_touched_.clear();
    layers_fresh_.clear();
  }
  [[nodiscard]] std::map<tensor_id, std::vector<float>> layers_on_host() const override {
    std::map<tensor_id, std::vector<float>> out;
    for (auto const& [id, a] : layers_) {  // (between steps: nothing is staged)
      out.emplace(id, on_host(std::span<float const>(reinterpret_cast<float const*>(a.cur.data()), a.n)));
    }
    return out;
  }
  void layers_assign(std::map<tensor_id, std::vector<float>> const& acc) override {
    auto const mem = memory_of(buckets_source());
    std::map<tensor_id, layer_slot> fresh;
    for (auto const& [id, v] : acc) {
      layer_slot& a = fresh.try_emplace(id, layer_slot{mem.make_buffer(), mem.make_buffer()}).first->second;
      a.cur.resize(v.size() * sizeof(float));
      mem.write(a.cur.span(), std::as_bytes(std::span<float const>(v)));
      a.n = v.size();
    }
    layers_ = std::move(fresh);
    layers_touched_.clear();
    layers_fresh_.clear();
  }
  std::span<float> wide(tensor_id id, std::size_t n) override {
    auto it = wides_.find(id);
    if (it == wides_.end()) it = wides_.emplace(id, memory_of(buckets_source()).make_buffer()).first;
    it->second.resize(n * sizeof(float));
    return {reinterpret_cast<float*>(it->second.data()), n};
  }
  void widen(std::span<half const> src, std::span<float> dst) const override { cast(src, dst); }
  void widen(std::span<bfloat16 const> src, std::span<float> dst) const override { cast(src, dst); }
  void narrow(std::span<float const> src, std::span<half> dst) const override { cast(src, dst); }
  void narrow(std::span<float const> src, std::span<bfloat16> dst) const override { cast(src, dst); }

  void two_way_begin() override { two_way().begin_step(); }
  collective_result two_way_exchange(any_communicator& comm, tensor_view<float const> g, std::span<float> out,
                                     codec_context const& ctx, collective_options const& copt,
                                     step_check& check) override {
    return detail::two_way_exchange(comm, two_way(), g, out, ctx, copt, check);
  }
  void two_way_commit() noexcept override {
    if (two_way_) two_way_->commit_step();
  }
  void two_way_rollback() noexcept override {
    try {
      if (two_way_) two_way_->rollback_step();
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory while restoring
    }
  }
  [[nodiscard]] std::vector<std::byte> two_way_save() const override {
    return two_way_ ? two_way_->save() : two_way_type(codec_of(buckets_source())).save();
  }
  void two_way_load(std::span<std::byte const> bytes) override { two_way().load(bytes); }

  hierarchical_result hierarchical_exchange(any_communicator& comm, any_communicator& node, any_communicator* lane,
                                            hierarchical_plan const& plan, tensor_view<float const> g,
                                            std::span<float> out, codec_context const& ctx,
                                            hierarchical_options const& opt, step_check& check) override {
    Source& src = buckets_.source();
    pending_commit<Source> staged(src);
    hierarchical_result res;
    hierarchical_exchange_over(comm, node, lane, plan, src, g, out, ctx, opt, check, staged, res);
    for (tensor_id id : staged.release()) hier_staged_.push_back(id);
    return res;
  }
  void hierarchical_commit() override {
    if constexpr (two_phase_source<Source>) {
      for (tensor_id id : hier_staged_) buckets_.source().apply_commit(id);
    }
    hier_staged_.clear();
  }
  void hierarchical_rollback() noexcept override {
    try {
      if constexpr (two_phase_source<Source>) {
        for (tensor_id id : hier_staged_) buckets_.source().discard(id);
      }
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory while restoring
    }
    hier_staged_.clear();
  }

  [[nodiscard]] bool makes_low_rank_sessions() const noexcept override { return sessions_made; }
  collective_result low_rank_exchange(any_communicator& comm, tensor_id id, std::size_t rows, std::size_t cols,
                                      powersgd_options const& opt, tensor_view<float const> g,
                                      std::span<float> out, codec_context const& ctx,
                                      collective_options const& copt, step_check& check) override {
    if constexpr (sessions_made) {
      auto it = low_rank_.sessions.find(id);
      if (it == low_rank_.sessions.end()) {
        it = low_rank_.sessions.emplace(id, make_low_rank_session(memory_of(buckets_source()), rows, cols, opt, id)).first;
        low_rank_.undo.emplace_back(id, std::nullopt);
      } else {
        low_rank_.undo.emplace_back(id, it->second.snapshot());
      }
      return detail::low_rank_exchange(comm, it->second, g, out, ctx, copt, check);
    } else {
      (void)comm, (void)id, (void)rows, (void)cols, (void)opt, (void)g, (void)out, (void)ctx, (void)copt, (void)check;
      throw config_error("gradcomp: gradient_pipeline: this device source's memory space makes no PowerSGD sessions");
    }
  }
  void low_rank_commit() noexcept override {
    if constexpr (sessions_made) low_rank_.undo.clear();
  }
  void low_rank_rollback() noexcept override {
    if constexpr (sessions_made) {
      try {
        for (auto& [id, before] : low_rank_.undo) {
          if (before) low_rank_.sessions.at(id).restore(std::move(*before));
          else low_rank_.sessions.erase(id);
        }
      } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory while restoring
      }
      low_rank_.undo.clear();
    }
  }
  void low_rank_save(byte_writer& w) const override {
    if constexpr (sessions_made) {
      w.put_u64(low_rank_.sessions.size());
      for (auto const& [id, s] : low_rank_.sessions) {
        w.put_u64(static_cast<std::uint64_t>(id));
        w.put_u64(s.state().rows());
        w.put_u64(s.state().cols());
        s.save_exact(w);
      }
    } else {
      w.put_u64(0);
    }
  }
  void low_rank_load(std::map<tensor_id, std::tuple<std::size_t, std::size_t, std::vector<std::byte>>> const& saved,
                     powersgd_options const& opt) override {
    if constexpr (sessions_made) {
      decltype(low_rank_.sessions) fresh;
      for (auto const& [id, rec] : saved) {
        auto const& [rows, cols, bytes] = rec;
        auto it = fresh.emplace(id, make_low_rank_session(memory_of(buckets_source()), rows, cols, opt, id)).first;
        byte_reader r(std::span<std::byte const>(bytes), low_rank_record_magic, 1, "PowerSGD session");
        it->second.load_exact(r);
        r.expect_end();
      }
      low_rank_.sessions = std::move(fresh);
      low_rank_.undo.clear();
    } else if (!saved.empty()) {
      (void)opt;
      throw config_error("gradcomp: gradient_pipeline: this device source's memory space makes no PowerSGD sessions");
    }
  }

 private:
  // The source's feedback: its rule's, or none (`stream_codec`).
  static constexpr feedback_id feedback_kind = [] {
    if constexpr (requires { Source::rule_type::id; }) {
      return Source::rule_type::id;
    } else {
      return feedback_id::none;
    }
  }();
  static constexpr bool residuals = feedback_kind == feedback_id::residual;
  static constexpr bool receiving = feedback_kind == feedback_id::ef21;
  // A host copy of device floats.
  [[nodiscard]] std::vector<float> on_host(std::span<float const> d) const {
    std::vector<float> out(d.size());
    if (!d.empty()) {
      memory_of(buckets_source()).read(std::as_bytes(d), [&](std::span<std::byte const> h) {
        std::memcpy(out.data(), h.data(), h.size());
      });
    }
    return out;
  }
  // Two-way compression with the source's codec and feedback (made at its first use).
  using codec_type = std::remove_cvref_t<decltype(codec_of(std::declval<Source const&>()))>;
  using two_way_feedback = std::conditional_t<residuals, residual_feedback_for<codec_type>, no_feedback>;
  using two_way_type = two_way_compressor<codec_type, two_way_feedback, two_way_feedback>;
  two_way_type& two_way() {
    if (!two_way_) two_way_.emplace(codec_of(buckets_source()));
    return *two_way_;
  }
  std::optional<two_way_type> two_way_;
  // PowerSGD sessions (a "powersgd" codec spec), of the type the memory space makes.
  using memory_type = memory_of_t<Source>;
  static constexpr bool sessions_made = requires { typename low_rank_store<memory_type>::session_type; };
  low_rank_store<memory_type> low_rank_;
  std::vector<tensor_id> hier_staged_;  // the hierarchical step's staged feedback
  bucket_options opt_;
  std::optional<bucketed_all_reduce<codec_type>> dense_;  // the guard's dense steps
  [[nodiscard]] Source const& buckets_source() const noexcept { return buckets_.source(); }
  // A widening (16-bit source) or a rounding (16-bit destination) in the source's memory space.
  template <class A, class B>
  void cast(std::span<A const> src, std::span<B> dst) const {
    auto const mem = memory_of(buckets_source());
    if constexpr (std::same_as<B, float> && requires { mem.widen(src, dst); }) {
      mem.widen(src, dst);
    } else if constexpr (!std::same_as<B, float> && requires { mem.narrow(src, dst); }) {
      mem.narrow(src, dst);
    } else {
      throw config_error("gradcomp: gradient_pipeline: this device source's memory space has no 16-bit casts; "
                         "pass float32 gradients");
    }
  }
  mutable bucketed_all_reduce<Source> buckets_;  // `source()` is a non-const member
  std::map<tensor_id, typename memory_of_t<Source>::buffer> wides_;  // 16-bit gradients, widened
  std::optional<typename memory_of_t<Source>::buffer> gain_packet_, gain_decoded_;  // `gain_terms`

  // The source's input p of g, staged (g itself without feedback).
  std::span<float const> stage_input(tensor_view<float const> g, codec_context const& ctx) {
    if constexpr (feedback_kind != feedback_id::none) {
      return buckets_.source().stage_input(g, ctx);
    } else {
      (void)ctx;
      return g.span();
    }
  }
  // ‖D(packet)‖², decoded into zeros (the CPU pipeline's `packet_norm_sq`).
  template <class Codec>
  double decoded_norm(Codec const& c, std::span<std::byte const> packet, std::size_t n, codec_context const& ctx) {
    auto const mem = memory_of(buckets_source());
    if (!gain_decoded_) gain_decoded_.emplace(mem.make_buffer());
    gain_decoded_->resize(n * sizeof(float));
    std::span<float> const d = float_span(*gain_decoded_, n);
    mem.zero(std::as_writable_bytes(d));
    c.decompress_add(packet, d, 1.0f, ctx);
    return mem.sum_of_squares(std::span<float const>(d));
  }

  // Controllers: the source's codec at each factor (made once per factor, as the CPU
  // pipeline's `codec_cache_`), the packets of each level per tensor, the exchange of a level.
  static constexpr bool budgeted = requires(codec_type const& c) { c.with_budget(sparse_budget::factor(1.0)); };
  codec_type const& level_codec(double f)
    requires budgeted
  {
    auto it = level_codecs_.find(f);
    if (it == level_codecs_.end())
      it = level_codecs_.emplace(f, codec_of(buckets_source()).with_budget(sparse_budget::factor(f))).first;
    return it->second;
  }
  // Whether `recompress_sparse` of a packet gives the packet of p compressed directly at the
  // smaller size (codec/recompress.hpp): exact top-k with float32 values, unscaled random-k.
  // Approximate top-k, 16-bit top-k values and scaled random-k are re-compressed from the
  // packet.
  [[nodiscard]] bool direct_levels() const noexcept {
    if constexpr (codec_type::id == codec_id::topk) {
      return codec_of(buckets_source()).device_codec().value_type() == sparse_values::f32;
    } else if constexpr (codec_type::id == codec_id::random_k) {
      return !codec_type::device_codec_type::scaled;
    } else {
      return false;
    }
  }
  struct level_packet {
    typename memory_of_t<Source>::buffer buf;
    std::size_t bytes = 0;
    [[nodiscard]] std::span<std::byte const> packet() const noexcept { return buf.span().first(bytes); }
  };
  std::map<double, codec_type> level_codecs_;
  std::map<tensor_id, std::vector<level_packet>> levels_;
  using prepared_type = prepared_source<Source, codec_type>;
  std::optional<bucketed_all_reduce<prepared_type>> prepared_;
  // Accordion's accumulators: the current value (`n` floats, 0: empty) and the step's next one.
  struct layer_slot {
    typename memory_of_t<Source>::buffer cur, next;
    std::size_t n = 0, next_n = 0;
    bool use_next = false;
  };
  std::map<tensor_id, layer_slot> layers_;
  std::vector<tensor_id> layers_touched_, layers_fresh_;
};

}  // namespace detail

/// A packet source `gradient_pipeline` takes for device gradients: its payloads live in device
/// memory (its codec's `memory()` is not host memory; `cuda::stream_codec<C>` for feedback
/// "none", `cuda::device_compressor<C>` for "residual", cuda/collective.cuh), it compresses
/// float32 tensors and is a source of `bucketed_all_reduce`.
template <class S>
concept pipeline_device_source =
    std::move_constructible<S> && detail::packet_source<S, float> && !detail::host_payloads<S>;

GRADCOMP_NAMESPACE_END
