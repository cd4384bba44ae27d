// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `flat_mode`: the flat exchange mode of `gradient_pipeline` (pipeline/options.hpp's
/// `pipeline_mode::flat` and `pipeline_mode::controlled`), host tensors. Every rank's packets
/// of a step travel together through the bucketed collective chosen by the codec's aggregation
/// kind (collective/bucket.hpp: summable codecs all-reduced in the compressed domain,
/// shared-support ones as values, the others all-gathered and decoded in rank order), small
/// tensors in dense buckets. With a controller each tensor is staged at every level of the
/// step's plan (multi-level: level 0 compressed from g + residual, each further level
/// re-compressed from the packet before it, `recompress_sparse`) and the decided level is sent;
/// a dense decision sends every tensor dense.
///
/// The mode owns what its exchange keeps: the codec of each level of the plan (one per factor,
/// cached across steps), the staged packets of each tensor (buffers reused across steps) and
/// the set of tensors the step staged. The residuals themselves are the pipeline's
/// error-feedback compressor (`feedback_compressor`, feedback/make_feedback.hpp), which the
/// mode stages, prepares, commits and discards through, passed to each call: it is also the
/// checkpoint's feedback section in the modes that do not use it and the reference of a device
/// source's state, so the pipeline keeps it. A step of the mode:
///
/// 1. `begin_step`: the codecs of the plan's levels.
/// 2. `stage` per tensor (in `add_tensor`, overlapped with the backward pass): g + residual
///    compressed at every level, with the statistics the controller or `measure_gain` needs.
/// 3. after the decision, `prepare(k)`: each staged tensor's next residual for the packet of
///    level k, computed before the packets are sent (they may be summed in place on the wire);
/// 4. `exchange_level(k)` or `exchange_dense` (g + residual, or g with the residual kept);
/// 5. after the pipeline's outcome round, `commit`: exactly what was sent becomes the
///    residual; on failure `discard` drops what the step staged.
///
/// `exchange_step` is the mode's step in the protocol (pipeline/rounds.hpp's services): the
/// layer accumulators, the decision, then 3–5 with the outcome round between them.
///
/// The dense bucketed send that every mode shares (the divergence guard's dense step, the
/// small tensors of the per-tensor modes) is `detail::exchange_dense_buckets`, here too.
/// The checkpoint has no section of this mode: the residuals are the feedback section, the
/// staged packets live within a step. The interface differs from the per-tensor modes'
/// (pipeline/exchange.hpp): the flat mode exchanges all tensors of a step at once.

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/codec/budget.hpp>
#include <gradcomp/codec/recompress.hpp>
#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/dense.hpp>
#include <gradcomp/collective/memory.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/collective/sections.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/concepts/step_protocol.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/fingerprint.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/feedback/make_feedback.hpp>
#include <gradcomp/pipeline/rounds.hpp>
#include <gradcomp/pipeline/step_state.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

namespace detail {

/// Sum of squares of a host float span, in double, in the canonical order of
/// core/quant/dither.hpp (`host_memory::sum_of_squares`): the guard's norms of a device source
/// (`device_memory::sum_of_squares`) have the same bits.
inline double norm_sq(std::span<float const> v) noexcept { return host_memory{}.sum_of_squares(v); }

/// Sends `items` dense in bucketed calls of `codec`'s bucket engine (every tensor dense:
/// `opt.min_compress_elements` is taken as unbounded; `opt.small_format` as given), `input(i)`
/// the values item i contributes, the average (or `opt.op`) over `size` ranks written to each
/// item's `out`. Counts messages in `br`, decoding time in `decode`.
template <communicator Comm, class Input>
void exchange_dense_buckets(Comm& comm, std::span<bucket_item const> items, bucket_options opt,
                            any_codec const& codec, int size, codec_context const& ctx,
                            step_check& check, bucket_slot (&slots)[2], Input&& input,
                            bucket_result& br, double& decode) {
  opt.min_compress_elements = std::numeric_limits<std::size_t>::max();
  std::vector<bucket_plan> const plan = plan_buckets(items, opt);
  bucket_engine<any_codec> engine(codec, codec.aggregation(), opt, reduction_scale(opt.op, size),
                                  check);
  engine.ctx_ = ctx;
  auto prepare = [&](std::size_t bi, bucket_slot& s) {
    s.reset();
    engine.prepare_dense(plan[bi], s, input, ctx);
  };
  auto done = [&](std::size_t bi, bucket_slot& s) { scatter_fused(plan[bi], s, items); };
  engine.run(comm, std::span<bucket_plan const>(plan), slots, prepare, done, br);
  br.buckets += plan.size();
  decode += engine.decode_s;
}

}  // namespace detail

/// The flat (bucketed, multi-level, controller-driven) exchange mode (file comment).
class flat_mode {
 public:
  /// A mode without staged tensors over the pipeline's codec `base` (a controller's levels are
  /// `base` at the plan's factors, `any_codec::with_budget`) and bucket options `buckets`.
  flat_mode(any_codec base, bucket_options const& buckets)
      : base_(std::move(base)), buckets_(buckets) {}

  /// The codec of level `l` of the step in progress.
  [[nodiscard]] any_codec const& level_codec(std::size_t l) const { return level_codecs_.at(l); }
  /// The number of levels of the step in progress (0: a dense step).
  [[nodiscard]] std::size_t levels() const noexcept { return level_codecs_.size(); }
  /// Whether the step staged tensor `id`.
  [[nodiscard]] bool staged(tensor_id id) const { return staged_.contains(id); }

  /// Opens a step: the codec as given at one level (`factors` empty, no controller), or one
  /// level per factor of the controller's plan (`factors` of `step_plan::measure`, none: a
  /// dense step).
  void begin_step(std::optional<std::span<double const>> factors) {
    level_codecs_.clear();
    staged_.clear();
    if (!factors) {
      level_codecs_.push_back(base_);
      return;
    }
    for (double const f : *factors) {
      auto it = codec_cache_.find(f);
      if (it == codec_cache_.end())
        it = codec_cache_.emplace(f, base_.with_budget(sparse_budget::factor(f))).first;
      level_codecs_.push_back(it->second);
    }
  }

  /// Stages tensor `g` (its `n` elements, float32 or 16-bit): g + residual through `comp`,
  /// compressed at level 0, each further level re-compressed from the packet before it at the
  /// plan's factor `factors[l]`; with no level (a dense step) only g + residual. With
  /// `need_gain` adds ‖g + residual‖² to `ef_norm` and each level's ‖D(packet)‖² to
  /// `comp_norms[l]`. The tensor counts as staged from the call on, also when it throws.
  template <element T>
  void stage(feedback_compressor& comp, tensor_view<T const> g, std::span<double const> factors,
             codec_context const& ctx, bool need_gain, double& ef_norm,
             std::span<double> comp_norms) {
    tensor_id const id = g.id();
    std::size_t const n = g.size();
    staged_.insert(id);
    std::size_t const levels = level_codecs_.size();
    if (levels == 0) {  // a dense step: g + residual only
      std::span<float const> const staged =
          std::visit([&](auto& c) { return c.stage_input(g, ctx); }, comp);
      if (need_gain) ef_norm += detail::norm_sq(staged);
      return;
    }
    std::vector<detail::local_packet>& packets = packets_[id];
    if (packets.size() < levels) packets.resize(levels);
    detail::local_packet& p0 = packets[0];
    any_codec const& c0 = level_codecs_[0];
    p0.buf.resize(c0.max_compressed_bytes(n));
    std::visit(
        [&](auto& c) {
          c.codec() = c0;
          p0.bytes = c.stage(g, p0.buf.span(), ctx);
        },
        comp);
    if (need_gain) {
      std::span<float const> const staged =
          std::visit([&](auto& c) { return c.staged_input(id); }, comp);
      ef_norm += detail::norm_sq(staged);
    }
    for (std::size_t l = 1; l < levels; ++l) {
      detail::local_packet const& prev = packets[l - 1];
      detail::local_packet& p = packets[l];
      std::uint64_t const k = sparse_budget::factor(factors[l]).kept(n);
      p.buf.resize(max_recompressed_bytes(prev.packet(), k));
      p.bytes = recompress_sparse(prev.packet(), k, p.buf.span(), ctx);
    }
    for (std::size_t l = 0; l < levels; ++l) {
      detail::local_packet& p = packets[l];
      aggregation_kind const kind = level_codecs_[l].aggregation();
      p.section = {};
      if (kind == aggregation_kind::summable || kind == aggregation_kind::shared_support) {
        p.section = detail::section_of(level_codecs_[l], p.packet());
      }
      if (need_gain) comp_norms[l] += packet_norm_sq(level_codecs_[l], p.packet(), n, ctx);
    }
  }

  /// Each staged tensor of `items`' next residual for its packet of level `k`, made current by
  /// `commit`.
  void prepare(feedback_compressor& comp, std::span<bucket_item const> items, std::size_t k,
               codec_context const& ctx) {
    for (auto const& it : items) {
      tensor_id const id = it.grad.id();
      if (!staged(id)) continue;
      std::visit(
          [&](auto& c) { c.prepare_commit(id, level_codecs_[k], packets_[id][k].packet(), ctx); },
          comp);
    }
  }

  /// Sends the packets of level `k` of `items` (the step's tensors in order, `plan` their
  /// buckets from the agreement round) in the bucketed collective of that level's codec, the
  /// small tensors dense; the average is written to each item's `out`.
  template <communicator Comm>
  void exchange_level(Comm& comm, std::vector<detail::bucket_plan> const& plan, std::size_t k,
                      std::span<bucket_item const> items, int size, codec_context const& ctx,
                      detail::step_check& check, detail::bucket_slot (&slots)[2], bucket_result& br,
                      double& decode) {
    any_codec const& codec = level_codecs_[k];
    aggregation_kind const kind = codec.aggregation();
    detail::bucket_engine<any_codec> engine(codec, kind, buckets_,
                                            detail::reduction_scale(buckets_.op, size), check);
    engine.ctx_ = ctx;
    auto prepare = [&](std::size_t bi, detail::bucket_slot& s) {
      detail::bucket_plan const& b = plan[bi];
      s.reset();
      if (b.dense) {
        engine.prepare_dense(
            b, s, [&](std::size_t i) { return items[i].grad.span(); }, ctx);
        return;
      }
      fingerprint fp;
      fp.add(detail::codec_fingerprint(codec, b.elements, buckets_.op, ctx, "bucket"));
      for (std::size_t i : b.items) {
        s.units.push_back({items[i].grad, items[i].out});
        s.packets.push_back(&packets_[items[i].grad.id()][k]);
      }
      engine.assemble(s, fp, b.elements);
    };
    auto done = [&](std::size_t bi, detail::bucket_slot& s) {
      if (plan[bi].dense) detail::scatter_fused(plan[bi], s, items);
    };
    engine.run(comm, std::span<detail::bucket_plan const>(plan), slots, prepare, done, br);
    br.buckets += plan.size();
    decode += engine.decode_s;
  }

  /// Sends every tensor of `items` dense: g + residual of a staged tensor (`rule` zero or
  /// subtract) or g (`rule` keep), g of the others.
  template <communicator Comm>
  void exchange_dense(Comm& comm, feedback_compressor& comp, std::span<bucket_item const> items,
                      residual_rule rule, int size, codec_context const& ctx,
                      detail::step_check& check, detail::bucket_slot (&slots)[2], bucket_result& br,
                      double& decode) {
    bucket_options o = buckets_;
    o.small_format = dense_format::f32;
    auto input = [&](std::size_t i) -> std::span<float const> {
      tensor_id const id = items[i].grad.id();
      if (staged(id) && rule != residual_rule::keep) {
        return std::visit([&](auto& c) { return c.staged_input(id); }, comp);
      }
      return items[i].grad.span();
    };
    detail::exchange_dense_buckets(comm, items, o, base_, size, ctx, check, slots, input, br,
                                   decode);
  }

  /// The step completed on every rank: each staged tensor's residual becomes what was sent —
  /// the prepared one for level `k`, g + residual delivered exactly (`k` npos, `rule` not
  /// keep), or the residual kept (`rule` keep); then all residuals reset where `reset` (the
  /// divergence guard's dense step with a residual reset).
  void commit(feedback_compressor& comp, std::span<bucket_item const> items, std::size_t k,
              residual_rule rule, bool reset) {
    for (auto const& it : items) {
      tensor_id const id = it.grad.id();
      if (!staged(id)) continue;
      std::visit(
          [&](auto& c) {
            if (k != decision::npos) {
              c.apply_commit(id);
            } else if (rule == residual_rule::keep) {
              c.discard(id);
            } else {
              c.commit_lossless(id);
            }
          },
          comp);
    }
    if (reset) std::visit([](auto& c) { c.reset(); }, comp);
  }

  /// The receiver side of a receiving policy (EF21): each staged tensor's output becomes its
  /// gradient estimate. After `commit` (the step's staged set is kept until the next
  /// `begin_step`).
  void receive(feedback_compressor& comp, std::span<bucket_item const> items) {
    for (auto const& it : items) {
      if (staged(it.grad.id())) std::visit([&](auto& c) { c.receive(it.grad.id(), it.out); }, comp);
    }
  }

  /// The step is left without sending (failed or skipped): what it staged is discarded.
  void discard(feedback_compressor& comp) noexcept {
    for (tensor_id const id : staged_) std::visit([&](auto& c) { c.discard(id); }, comp);
    staged_.clear();
  }

 private:
  // ‖D(packet)‖² (decoded into a scratch buffer).
  double packet_norm_sq(any_codec const& c, std::span<std::byte const> packet, std::size_t n,
                        codec_context const& ctx) {
    scratch_.assign(n, 0.0f);
    c.decompress_add(packet, std::span<float>(scratch_), 1.0f, ctx);
    return detail::norm_sq(scratch_);
  }

  any_codec base_;
  bucket_options buckets_;
  std::map<double, any_codec> codec_cache_;  // a controller's levels, by factor
  std::vector<any_codec> level_codecs_;      // the step's levels
  std::map<tensor_id, std::vector<detail::local_packet>> packets_;  // per tensor, per level
  std::set<tensor_id> staged_;                                      // the step's staged tensors
  std::vector<float> scratch_;
};

namespace detail {

/// Accordion's per-layer gradients of entry `e`, once the step is known to go through: the
/// accumulator of its tensor (its value before the step kept in `sv.undo`) adds the gradient
/// where the plan accumulates, and gives its norm to the statistics where the plan reports.
inline void accumulate_layer(step_services& sv, step_entry const& e) {
  auto const found = sv.accumulators.find(e.id);
  sv.undo.emplace_back(e.id, found == sv.accumulators.end() ? std::nullopt : std::optional(found->second));
  std::vector<float>& acc = sv.accumulators[e.id];  // (put back if the step fails)
  if (sv.cur.plan.accumulate_layers) {
    if (acc.size() != e.n) acc.assign(e.n, 0.0f);
    for (std::size_t i = 0; i < e.n; ++i) acc[i] += e.raw32[i];
  }
  if (sv.cur.plan.report_layers) {
    sv.cur.layer_norms.push_back(acc.empty() ? 0.0 : norm_sq(acc));
    acc.clear();
  }
}

}  // namespace detail

/// The flat mode's exchange step of opened step `s` (pipeline/rounds.hpp's services `sv`): the
/// layer accumulators, the decision (the controller's, or the codec as given), the next
/// residuals prepared, the packets of the decided level (or every tensor dense) in the bucketed
/// collective, the outcome round, then the commit of exactly what was sent, the receiver side
/// and the 16-bit outputs. Returns the completed step's statistics.
template <communicator Comm>
pipeline_stats exchange_step(Comm& comm, flat_mode& m, opened_step& s, step_services& sv) {
  using clock = detail::step_clock;
  step_state& cur = sv.cur;
  pipeline_stats& st = s.st;
  bool const guard_dense = s.guard_dense();
  // Accordion's per-layer gradients, once the step is known to go through.
  if (cur.plan.accumulate_layers || cur.plan.report_layers) {
    for (auto const& e : cur.entries) detail::accumulate_layer(sv, e);
  }
  std::size_t k = 0;
  residual_rule rule = residual_rule::subtract_sent;
  st.factor = 32.0 / sv.base.bits_per_element();
  if (guard_dense) {  // every tensor's own g, dense; the controller is not asked
    k = decision::npos;
    rule = residual_rule::keep;
    detail::dense_step_stats(st);
  } else if (sv.ctrl) {
    std::tie(k, rule) = decide_step(sv, comm, st, *s.snapshot, s.communicate);
  } else if (sv.opt.measure_gain) {
    gain_round(sv, comm, st, s.communicate);
  }
  for (auto const& e : cur.entries)
    st.compressed_tensors += e.large && k != decision::npos ? 1 : 0;

  // The next residuals for the packets to be sent are computed now (the packets may be summed
  // in place on the wire); they become current only once the exchange has succeeded.
  std::span<bucket_item const> const items(s.items);
  auto const t_prepare = clock::now();
  if (k != decision::npos) m.prepare(sv.comp, items, k, cur.ctx);
  double const prepare_s = detail::seconds_between(t_prepare, clock::now());

  double decode = 0.0;
  auto const t_send = clock::now();
  if (k == decision::npos) {
    m.exchange_dense(comm, sv.comp, items, rule, cur.size, cur.ctx, cur.check, sv.slots,
                     s.br, decode);
  } else {
    m.exchange_level(comm, s.plan, k, items, cur.size, cur.ctx, cur.check, sv.slots, s.br,
                     decode);
  }
  outcome_round(sv, comm, s.br);
  s.communicate += detail::seconds_between(t_send, clock::now()) - decode;

  // Commit exactly what was sent, then the receiver side and the 16-bit outputs.
  auto const t_commit = clock::now();
  m.commit(sv.comp, items, k, rule, s.gv.reset_residual);
  double const commit_s = detail::seconds_between(t_commit, clock::now());
  auto const t_out = clock::now();
  if (!guard_dense) m.receive(sv.comp, items);
  write_back(sv);
  decode += detail::seconds_between(t_out, clock::now());
  return complete(sv, s, prepare_s + commit_s, decode);
}

GRADCOMP_NAMESPACE_END
