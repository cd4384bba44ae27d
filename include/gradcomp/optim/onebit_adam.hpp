// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `onebit_adam`: the warm-up-then-compress scheme of 1-bit Adam (Tang et al., ICML 2021;
/// DeepSpeed's `OnebitAdam`), with any codec, next to `compressed_adam` (BytePS-Compress).
///
/// Adam's second moment v is what gradient compression damages most: computed from a decoded
/// aggregate (BytePS-Compress), it sees the codec's magnitudes (onebit: the same mean |p| in
/// every coordinate; top-k: zeros and spikes), so Adam's per-coordinate scaling goes wrong.
/// 1-bit Adam observes that v stabilises early and freezes it; then Adam is a momentum method
/// with a fixed per-coordinate preconditioner, and the momentum is what gets compressed, with
/// error feedback on both sides.
///
/// Per iteration t = 1, 2, ... (docs/training.md, "Compressed Adam"):
/// ```
///   t <= warmup (exact Adam):  g^ = (sum_w g_w) * (1/W)   dense float32 all-reduce, rank order
///                              adam step with g^ (m, v, bias corrections as `adam`)
///   t >  warmup (v frozen):    m_w = b1*m + (1-b1)*g_w                        local momentum
///                              two-way all-reduce of m_w: worker error feedback, the shard
///                              owner sums and re-compresses with server error feedback
///                              m = D(c~) * (1/W)                   the same m on every rank
///                              x <- x - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^T) + eps)
/// ```
/// with T = `warmup`, the step at which v froze (its bias correction freezes with it). Weight
/// decay works as in `adam` (decoupled, or L2 added to the local gradient). The residuals are
/// in momentum units, which a learning-rate change does not alter: no lr correction. During
/// the warm-up the parameters are bit-identical to `adam` on the mean gradient (sum in rank
/// order, times 1/W), i.e. to All-Reduce Adam in process.
///
/// Bytes: the warm-up moves 2(W-1)/W of the float32 gradient per step (ring all-reduce), the
/// compressed phase what the codec makes of the momentum twice (all-to-all of shards, all-gather
/// of the server packets), so the saving over a run of S steps is at most
/// 1 / (warmup/S + (1 - warmup/S) / ratio) for a codec of `ratio`: a warm-up is paid for in
/// bytes, and onebit's 32x leaves no room for one under a 30x target.
///
/// **Preconditioned compression** (`precondition`). Under a frozen v the update is linear in
/// the momentum, u = m / d with a fixed per-coordinate d = sqrt(v)/sqrt(1-b2^T) + eps, so the
/// ranks may as well compress u_w = m_w / d: the mean of the u_w is the update, and error
/// feedback in u's units is error feedback in m's units times the fixed 1/d. The codec then
/// selects and scales by the quantity that moves the parameters: top-k keeps the coordinates
/// that move most rather than those with the largest momentum (better in the training example:
/// docs/training.md, "Compressed Adam"); a scaled sign gains nothing from it (the sign of m
/// already gives every coordinate the same magnitude), and did slightly worse there.
///
/// **The update bound.** A frozen v cannot follow a coordinate whose gradient was zero all
/// through the warm-up (a ReLU unit that was dead then): its v stays 0, and once the unit
/// revives m / (sqrt(v) + eps) would step by lr * m / eps (the run ends in NaN). Adam's own
/// moments never let |m / sqrt(v)| exceed B = (1-b1) / sqrt((1-b2)(1-b1^2/b2)) (Cauchy-Schwarz
/// on the two averages; 7.27 with the default betas), so after the warm-up each coordinate's
/// normalized step m / (sqrt(v)/sqrt(1-b2^T) + eps) is clipped to [-B, B] where it is applied
/// (the momentum and the residuals keep their whole mass). No step of a coordinate with a sound
/// v comes near it.
///
/// **Variance refresh** (`refresh_variance`). A v frozen after a short warm-up is an estimate
/// from a handful of gradients: coordinates whose few samples happened to be small get a large
/// step for the rest of the run. With the refresh, each rank keeps updating a local
/// v_w <- b2*v_w + (1-b2)*g_w^2 (starting from the warm-up's v, no communication) and at steps
/// 2T, 4T, 8T, ... the ranks average it (v = sum_w v_w / W, float32 all-reduce, rank order) and
/// the update uses that v with the bias correction of its step. The estimate then rests on
/// W local gradients a step over the whole run, for log2(S/T) dense all-reduces. v_w sees a
/// local batch, so it estimates E[g^2] at 1/W of the global batch (more noise in it, smaller
/// steps where noise dominates).
///
/// Float32 parameters and gradients; one object per parameter span (its Adam state), the
/// two-way state keyed by the tensor id. `save` / `load` ("GC1A" v1) hold everything.

#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/optim/adam.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Options of `onebit_adam`.
struct onebit_adam_options {
  adam_options adam{};       ///< the Adam / AdamW of both phases
  std::uint64_t warmup = 1;  ///< steps of exact Adam (dense all-reduce) before v freezes, >= 1
  /// Refresh the frozen v instead of keeping it (file comment, "Variance refresh"): every rank
  /// goes on updating its own second moment from its local gradient, and the ranks average it
  /// at steps 2T, 4T, 8T, ... (T = `warmup`) with one float32 all-reduce each. false: v stays
  /// as the warm-up left it (1-bit Adam).
  bool refresh_variance = false;
  /// What the ranks compress after the warm-up: their momentum (1-bit Adam; the decoded mean
  /// becomes m), or their gradient (m <- b1*m + (1-b1)*decoded mean gradient on every rank).
  bool compress_momentum = true;
  /// Compress the preconditioned momentum u = m / (sqrt(v)/sqrt(1-b2^T) + eps), the update
  /// itself, instead of m (file comment, "Preconditioned compression"); with
  /// `compress_momentum` only, and not with `refresh_variance` (v must stay fixed).
  bool precondition = false;
};

/// 1-bit Adam's scheme with any codec (file comment).
template <codec_operations Codec>
class onebit_adam {
 public:
  using two_way_type = two_way_compressor<Codec>;

  /// `config_error` for a warm-up of 0 steps (v would be zero) or invalid Adam options.
  explicit onebit_adam(Codec codec, onebit_adam_options o)
      : opt_(o), adam_(o.adam), tw_(std::move(codec)) {
    if (o.precondition && (!o.compress_momentum || o.refresh_variance)) {
      throw config_error(
          "gradcomp: onebit_adam: precondition compresses the momentum under a fixed v (needs "
          "compress_momentum and no refresh_variance)");
    }
    if (o.warmup == 0) {
      throw config_error(
          "gradcomp: onebit_adam needs a warm-up of at least 1 step (its second moment freezes "
          "there)");
    }
  }

  /// One iteration as a collective (file comment): every rank passes the same size, tensor id
  /// and codec. Returns the bytes of the step's collective (`packet_bytes`: this rank's payload;
  /// `wire_bytes`: its modeled ring traffic).
  template <communicator Comm>
  collective_result step(Comm& comm, std::span<float> x, tensor_view<float const> g,
                         codec_context const& ctx = {}) {
    detail::check_step_spans(x.size(), g.size(), m_.size(), "onebit_adam");
    auto const w = static_cast<std::size_t>(comm.size());
    float const inv = 1.0f / static_cast<float>(w);
    collective_result r;
    if (!compressing()) {  // exact Adam on the mean gradient
      mean_.assign(g.span().begin(), g.span().end());
      comm.all_reduce(std::as_writable_bytes(std::span<float>(mean_)), comm_type::f32,
                      reduce_op::sum);
      if (w > 1) {
        for (float& v : mean_) v = v * inv;
      }
      adam_.step(x, std::span<float const>(mean_));
      r.packet_bytes = x.size() * sizeof(float);
      r.wire_bytes = detail::ring_all_reduce_bytes(x.size() * sizeof(float), comm.size());
      if (adam_.steps() == opt_.warmup) freeze();
      return r;
    }
    // v frozen: compress the local momentum with error feedback on both sides.
    std::uint64_t const t = t_ + 1;
    detail::adam_coefficients c = detail::adam_coefficients_for(opt_.adam, t);
    c.bc2_sqrt = bc2_sqrt_;
    float const bound = update_bound();
    local_.resize(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      float xi = x[i];
      float const gi = detail::adam_decay(xi, g.span()[i], c);  // L2: wd*x joins the gradient
      local_[i] = opt_.compress_momentum ? c.b1 * m_[i] + c.c1 * gi : gi;
      if (opt_.precondition) local_[i] = local_[i] / (std::sqrt(v_[i]) / c.bc2_sqrt + c.eps);
    }
    std::vector<float> vloc;  // the local second moment of this step (committed with the step)
    bool const refresh = opt_.refresh_variance && refresh_at(t);
    if (opt_.refresh_variance) {
      vloc.resize(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        float xi = x[i];
        float const gi = detail::adam_decay(xi, g.span()[i], c);
        vloc[i] = c.b2 * vloc_[i] + c.c2 * (gi * gi);
      }
    }
    std::vector<float> vnew;
    if (refresh) {  // the ranks' local second moments, averaged
      vnew = vloc;
      comm.all_reduce(std::as_writable_bytes(std::span<float>(vnew)), comm_type::f32,
                      reduce_op::sum);
      if (w > 1) {
        for (float& v : vnew) v = v * inv;
      }
    }
    next_.resize(x.size());
    collective_options co;
    co.op = reduction::sum;
    r = all_reduce_two_way(comm, tw_,
                           tensor_view<float const>(std::span<float const>(local_), g.id()),
                           std::span<float>(next_), ctx, co);
    // the collectives succeeded: commit v, the momentum and step (same values on every rank)
    if (opt_.refresh_variance) vloc_ = std::move(vloc);
    if (refresh) {
      v_ = std::move(vnew);
      bc2_sqrt_ = c.bc2_sqrt = detail::adam_coefficients_for(opt_.adam, t).bc2_sqrt;
      r.packet_bytes += x.size() * sizeof(float);
      r.wire_bytes += detail::ring_all_reduce_bytes(x.size() * sizeof(float), comm.size());
    }
    for (std::size_t i = 0; i < x.size(); ++i) {
      float const di = w > 1 ? next_[i] * inv : next_[i];
      float xi = x[i];
      (void)detail::adam_decay(xi, 0.0f, c);  // decoupled decay scales x
      float const denom = std::sqrt(v_[i]) / c.bc2_sqrt + c.eps;
      if (opt_.precondition) {  // di is the update u; m = u * denominator
        m_[i] = di * denom;
        x[i] = xi - c.step_size * std::clamp(di, -bound, bound);
        continue;
      }
      float const mi = opt_.compress_momentum ? di : c.b1 * m_[i] + c.c1 * di;
      m_[i] = mi;
      x[i] = xi - c.step_size * std::clamp(mi / denom, -bound, bound);
    }
    t_ = t;
    return r;
  }

  /// Whether the warm-up is over (v frozen, the momentum compressed).
  [[nodiscard]] bool compressing() const noexcept { return frozen_; }
  /// Steps taken (both phases).
  [[nodiscard]] std::uint64_t steps() const noexcept { return frozen_ ? t_ : adam_.steps(); }
  [[nodiscard]] onebit_adam_options const& options() const noexcept { return opt_; }
  [[nodiscard]] double lr() const noexcept { return opt_.adam.lr; }
  /// Sets the learning rate of the next steps (finite, >= 0).
  void set_lr(double lr) {
    adam_.set_lr(lr);
    opt_.adam.lr = lr;
  }
  /// The first moment (after a compressed step: the decoded mean of the ranks' momenta).
  [[nodiscard]] std::span<float const> first_moment() const noexcept {
    return frozen_ ? std::span<float const>(m_) : adam_.first_moment();
  }
  /// The second moment (frozen after the warm-up).
  [[nodiscard]] std::span<float const> second_moment() const noexcept {
    return frozen_ ? std::span<float const>(v_) : adam_.second_moment();
  }
  /// The two-way state: codecs and both sides' residuals (momentum units), keyed by shard
  /// (`shard_key{id, s, W}`: this rank's worker residual of shard s, its server residual of
  /// shard `rank`).
  [[nodiscard]] two_way_type const& two_way() const noexcept { return tw_; }
  /// The momentum this rank compressed in the last compressed step (before error feedback).
  [[nodiscard]] std::span<float const> local_momentum() const noexcept { return local_; }

  /// Serializes the whole state ("GC1A" v1: warm-up length, phase, step count, the frozen
  /// bias correction, m, v, the refresh flag and the local second moment, then the two-way
  /// state "GCTW").
  [[nodiscard]] std::vector<std::byte> save() const {
    detail::byte_writer w;
    w.begin("GC1A", 1);
    w.put_u64(opt_.warmup);
    w.put_bool(frozen_);
    w.put_u64(steps());
    w.put_f64(static_cast<double>(bc2_sqrt_));
    w.put_floats(first_moment());
    w.put_floats(second_moment());
    w.put_bool(opt_.refresh_variance);
    w.put_floats(vloc_);
    w.put_bytes(tw_.save());
    return w.finish();
  }

  /// Restores `save`'s bytes into an optimizer with the same warm-up and codec; `format_error`
  /// for a malformed or mismatched state, which is then unchanged.
  void load(std::span<std::byte const> bytes) {
    detail::byte_reader r(bytes, "GC1A", 1, "onebit_adam state");
    if (r.get_u64() != opt_.warmup) r.fail("saved with another warm-up length");
    bool const frozen = r.get_bool();
    std::uint64_t const t = r.get_u64();
    auto const bc2 = static_cast<float>(r.get_f64());
    std::vector<float> m = r.get_floats(), v = r.get_floats();
    if (m.size() != v.size()) r.fail("its moments differ in size");
    if (frozen != (t >= opt_.warmup)) r.fail("its phase does not match its step count");
    if (r.get_bool() != opt_.refresh_variance)
      r.fail("saved with another refresh_variance setting");
    std::vector<float> vloc = r.get_floats();
    if (vloc.size() != (frozen && opt_.refresh_variance ? m.size() : 0))
      r.fail("its local second moment has the wrong size");
    two_way_type tw = tw_;
    std::vector<std::byte> const tstate = r.get_bytes();
    tw.load(tstate);
    r.expect_end();
    adam a(opt_.adam);
    if (!frozen) a.restore(m, v, t);
    adam_ = std::move(a);
    frozen_ = frozen;
    t_ = frozen ? t : 0;
    bc2_sqrt_ = bc2;
    m_ = frozen ? std::move(m) : std::vector<float>{};
    v_ = frozen ? std::move(v) : std::vector<float>{};
    vloc_ = std::move(vloc);
    tw_ = std::move(tw);
  }

 private:
  [[nodiscard]] float update_bound() const noexcept { return detail::adam_update_bound(opt_.adam); }

  // A refresh step: 2T, 4T, 8T, ...
  [[nodiscard]] bool refresh_at(std::uint64_t t) const noexcept {
    if (t % opt_.warmup != 0) return false;
    std::uint64_t const k = t / opt_.warmup;
    return k >= 2 && (k & (k - 1)) == 0;
  }

  void freeze() {
    m_.assign(adam_.first_moment().begin(), adam_.first_moment().end());
    v_.assign(adam_.second_moment().begin(), adam_.second_moment().end());
    if (opt_.refresh_variance) vloc_ = v_;
    t_ = adam_.steps();
    bc2_sqrt_ = detail::adam_coefficients_for(opt_.adam, t_).bc2_sqrt;
    frozen_ = true;
  }

  onebit_adam_options opt_;
  adam adam_;  // the warm-up
  two_way_type tw_;
  bool frozen_ = false;
  std::uint64_t t_ = 0;  // steps, once frozen
  float bc2_sqrt_ = 1.0f;
  std::vector<float> m_, v_;  // once frozen
  std::vector<float> vloc_;   // refresh_variance: this rank's own second moment
  std::vector<float> mean_, local_, next_;
};

GRADCOMP_NAMESPACE_END
