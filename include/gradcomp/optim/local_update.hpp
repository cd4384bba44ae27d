// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `local_update`: the synchronisation step of local-update training (the DiLoCo family). Each
/// rank runs its own inner optimizer (AdamW, say) on its own data for many steps without any
/// communication; at a synchronisation the ranks exchange, per tensor, the *pseudo-gradient*
///
///     delta_w = theta_sync - theta_w            (theta_w: rank w's local weights now)
///
/// through any gradcomp compressor (a `make_codec` spec plus a `make_feedback` spec, as in the
/// pipeline) and the compressed all-reduce (mean) over any communicator; an *outer optimizer*
/// then moves the synchronised weights theta_sync, which every replica takes as its weights.
///
/// Outer optimizers (`outer`; lr = `outer_lr`, mu = `outer_momentum`, m = the decoded mean of
/// the ranks' packets), per element, in float32 and in this order:
///
/// | outer        | update                                                         | defaults        |
/// |--------------|----------------------------------------------------------------|-----------------|
/// | `nesterov`   | u <- mu*u + m;  theta_sync <- theta_sync - lr*(m + mu*u)        | lr 0.7, mu 0.9  |
/// | `sparseloco` | e <- mu*e + delta_w; send C(e); e <- e - D(C(e)); theta_sync <- theta_sync - lr*m | lr 1, mu 0.95 |
/// | `average`    | theta_sync <- theta_sync - lr*m  (lr 1: the mean of the weights) | lr 1, mu 0      |
///
/// - **DiLoCo** (Douillard et al. 2023, arXiv 2311.08105): `nesterov`, the same update as
///   `torch.optim.SGD(nesterov=True)` on the pseudo-gradient; the paper's lr 0.7, momentum 0.9.
/// - **SparseLoCo** (Sarfi, Thérien, Lidin, Belilovsky 2025, arXiv 2508.15706): no outer
///   momentum; each rank's error-feedback accumulator e, decayed by mu (the paper's beta) plays
///   its part. The ranks send C(e) (the paper: chunk-wise top-k at 1-3 % density with 2-bit
///   values, e.g. codec `chunk_topk:chunk=4096,k=64,values=int2`), keep e - D(C(e)), and the
///   mean of the decoded packets moves theta_sync with lr 1. The accumulator is this step's
///   own: `feedback` must be `none` with it.
/// - `average`: local SGD / model averaging (lr 1, no momentum).
///
/// **Schedule.** Steps t = 1, 2, ... are the caller's inner steps (`step` is called after
/// each). With `fragments` F = 1 every tensor synchronises at t = H, 2H, ... (`sync_every` H).
/// With F > 1 (**Streaming DiLoCo**, Douillard et al. 2025, arXiv 2501.18512) tensor i belongs
/// to fragment i mod F (strided, as the paper's strided layer fragments), and fragment f
/// synchronises at the steps t >= 1 with (t - o_f) mod H = 0, o_f = floor(f*H/F): the
/// fragments' exchanges are staggered evenly over the H steps (peak traffic F times lower).
///
/// **Overlap** (`overlap` tau > 0, Streaming DiLoCo's delayed application): the fragment's
/// pseudo-gradient is the one of its sync step t, and theta_sync is updated with it at t, but
/// the replicas take the result only at step t + tau, mixed with what their inner steps did
/// meanwhile by the paper's rule
///
///     theta_w <- alpha * theta_w + (1 - alpha) * theta_sync        (alpha = `mix`, 0.5)
///
/// (alpha = 0 discards the tau local steps). With tau = 0 the replicas take theta_sync at
/// once. This implementation exchanges the fragment at its sync step (the collective blocks
/// there): the *arithmetic* is the paper's delayed application; hiding the transfer behind the
/// tau inner steps needs an asynchronous exchange, which this step does not start yet. `flush`
/// applies every pending mixing at once (before an evaluation or at the end).
///
/// **Agreement and failures.** A sync step starts with one agreement round
/// (collective/agreement.hpp) in which every rank reports the fingerprint of its options and
/// tensor layout, its step number, and whether its local checks passed (every tensor the size
/// `start` fixed, every pseudo-gradient of the sync finite). A rank whose check failed throws
/// its own error (`config_error` for a size, `numeric_error` naming the tensor and element),
/// the others `comm_error`; differing options or layouts are a `config_error` on every rank,
/// differing step numbers a `config_error` naming both. The exchanges' error feedback is staged
/// and one step-outcome round (collective/outcome.hpp) follows them; only then is anything
/// committed. A failed sync step (any of these, a transport error, a corrupted packet under
/// `checksum`) throws on every rank and leaves every rank's state (theta_sync, the outer
/// momenta, the accumulators and residuals, the pending mixings, the step count) and the
/// weights exactly as they were: calling `step` again retries the same step. Steps without a
/// sync communicate nothing (a rank that alone reaches a sync finds no partner and fails at
/// the transport's timeout).
///
/// **State.** `save` / `load` ("GCLU" v1, CRC32C-framed, core/serialize.hpp) hold the options'
/// fingerprint, the step count, theta_sync, the outer momenta, the accumulators, the pending
/// mixings, the byte counters and the compressor's state: a run resumed from them continues
/// bit for bit.
///
/// Cost: theta_sync (one copy of the weights) plus u (`nesterov`) or e (`sparseloco`) and the
/// compressor's residuals, float32. Bytes per sync: those of `all_reduce_compressed` for each
/// tensor of the fragment (each with its own agreement round), one more agreement round of 48 bytes
/// per rank (56 with `checksum`) and one outcome round.

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/fingerprint.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/feedback/make_feedback.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <type_traits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// The outer optimizer of `local_update` (file comment).
enum class outer_optimizer : std::uint8_t {
  nesterov = 0,    ///< DiLoCo: SGD with Nesterov momentum on the mean pseudo-gradient
  sparseloco = 1,  ///< SparseLoCo: a decayed error-feedback accumulator in place of momentum
  average = 2,     ///< model averaging (lr 1) or plain outer SGD
};

/// "nesterov", "sparseloco" or "average".
[[nodiscard]] constexpr char const* outer_optimizer_name(outer_optimizer o) noexcept {
  switch (o) {
    case outer_optimizer::nesterov: return "nesterov";
    case outer_optimizer::sparseloco: return "sparseloco";
    case outer_optimizer::average: return "average";
  }
  return "?";
}

/// The outer optimizer named `name`; `config_error` naming the option `outer` otherwise.
[[nodiscard]] inline outer_optimizer parse_outer_optimizer(std::string_view name) {
  if (name == "nesterov") return outer_optimizer::nesterov;
  if (name == "sparseloco") return outer_optimizer::sparseloco;
  if (name == "average") return outer_optimizer::average;
  throw config_error("gradcomp: local_update option 'outer' must be nesterov, sparseloco or average, got '" +
                     std::string(name) + "'");
}

/// Options of `local_update` (file comment). Every rank passes the same (checked at each sync).
struct local_update_options {
  /// The outer optimizer: "nesterov" (DiLoCo), "sparseloco" or "average".
  std::string outer = "nesterov";
  /// Outer learning rate (finite, > 0); unset: 0.7 (nesterov), 1 (sparseloco, average).
  std::optional<double> outer_lr{};
  /// Outer momentum mu in [0, 1) for nesterov (unset: 0.9), the accumulator's decay in [0, 1]
  /// for sparseloco (unset: 0.95); average takes 0 only (unset: 0).
  std::optional<double> outer_momentum{};
  /// H: inner steps between two synchronisations of a fragment (>= 1).
  std::uint64_t sync_every = 30;
  /// F: fragments (Streaming DiLoCo), 1 <= F <= H and at most the number of tensors.
  std::uint64_t fragments = 1;
  /// tau: inner steps between a fragment's exchange and its application, 0 <= tau < H.
  std::uint64_t overlap = 0;
  /// alpha of the delayed application (tau > 0): theta_w <- alpha*theta_w + (1-alpha)*theta_sync,
  /// in [0, 1].
  double mix = 0.5;
  /// Codec spec (`make_codec`, e.g. "int4:bucket=64", "chunk_topk:chunk=4096,k=64,values=int2").
  std::string codec = "identity";
  /// Error-feedback spec (`make_feedback`: none, residual, ef21, dgc); none with sparseloco.
  std::string feedback = "none";
  /// Seed of the codecs' random streams (rank-independent for shared-support codecs).
  std::uint64_t seed = 0;
  /// The collectives' integrity checks (`collective_options::checksum`).
  bool checksum = false;
  /// Threads, ISA level and parallel threshold of the codecs (its seed and step are set per sync).
  codec_context context{};
};

/// What one `local_update::step` did on this rank.
struct local_update_stats {
  std::uint64_t step = 0;                ///< the step number t (1-based)
  bool synced = false;                   ///< at least one fragment synchronised
  std::vector<std::uint64_t> fragments;  ///< the fragments that synchronised, ascending
  std::size_t tensors = 0;               ///< tensors exchanged
  std::size_t elements = 0;              ///< their elements
  std::vector<std::uint64_t> applied;    ///< fragments whose delayed result was applied
  std::size_t packet_bytes = 0;          ///< this rank's packets (payload it contributed)
  std::size_t wire_bytes = 0;            ///< modeled ring traffic, agreement and outcome rounds included
};

/// The synchronisation step of DiLoCo, Streaming DiLoCo and SparseLoCo over any codec, error
/// feedback and communicator (file comment).
class local_update {
 public:
  /// `config_error` naming the option for an invalid value (file comment has the ranges).
  explicit local_update(local_update_options o) : opt_(std::move(o)) {
    outer_ = parse_outer_optimizer(opt_.outer);
    double const lr_default = outer_ == outer_optimizer::nesterov ? 0.7 : 1.0;
    double const mu_default =
        outer_ == outer_optimizer::nesterov ? 0.9 : outer_ == outer_optimizer::sparseloco ? 0.95 : 0.0;
    double const lr = opt_.outer_lr.value_or(lr_default);
    double const mu = opt_.outer_momentum.value_or(mu_default);
    if (!(std::isfinite(lr) && lr > 0.0)) fail("outer_lr", "must be finite and > 0, got " + std::to_string(lr));
    if (outer_ == outer_optimizer::nesterov && !(mu >= 0.0 && mu < 1.0))
      fail("outer_momentum", "must be in [0, 1) for nesterov, got " + std::to_string(mu));
    if (outer_ == outer_optimizer::sparseloco && !(mu >= 0.0 && mu <= 1.0))
      fail("outer_momentum", "(the accumulator's decay) must be in [0, 1] for sparseloco, got " + std::to_string(mu));
    if (outer_ == outer_optimizer::average && mu != 0.0)
      fail("outer_momentum", "must be 0 for average (use outer='nesterov' for momentum), got " + std::to_string(mu));
    opt_.outer_lr = lr;
    opt_.outer_momentum = mu;
    lr_ = static_cast<float>(lr);
    mu_ = static_cast<float>(mu);
    if (opt_.sync_every == 0) fail("sync_every", "must be >= 1, got 0");
    if (opt_.fragments == 0 || opt_.fragments > opt_.sync_every)
      fail("fragments", "must be in [1, sync_every = " + std::to_string(opt_.sync_every) + "], got " +
                            std::to_string(opt_.fragments));
    if (opt_.overlap >= opt_.sync_every)
      fail("overlap", "must be < sync_every = " + std::to_string(opt_.sync_every) +
                          " (a fragment's result is applied before its next exchange), got " +
                          std::to_string(opt_.overlap));
    if (!(opt_.mix >= 0.0 && opt_.mix <= 1.0)) fail("mix", "must be in [0, 1], got " + std::to_string(opt_.mix));
    mix_ = static_cast<float>(opt_.mix);
    try {
      codec_ = make_codec(opt_.codec);
    } catch (config_error const& e) {
      fail("codec", e.what());
    }
    if (outer_ == outer_optimizer::sparseloco && opt_.feedback != "none")
      fail("feedback", "must be none with outer='sparseloco' (its accumulator is the error feedback), got '" +
                           opt_.feedback + "'");
    try {
      comp_ = make_feedback(opt_.feedback, codec_);
    } catch (config_error const& e) {
      fail("feedback", e.what());
    }
    pending_.assign(opt_.fragments, 0);
  }

  [[nodiscard]] local_update_options const& options() const noexcept { return opt_; }
  [[nodiscard]] outer_optimizer outer() const noexcept { return outer_; }
  /// Inner steps taken since `start` (the last step that succeeded).
  [[nodiscard]] std::uint64_t steps() const noexcept { return t_; }
  /// Synchronisation steps that succeeded.
  [[nodiscard]] std::uint64_t syncs() const noexcept { return syncs_; }
  /// Whether `start` ran.
  [[nodiscard]] bool started() const noexcept { return started_; }
  /// Bytes of this rank's packets over all syncs (`local_update_stats::packet_bytes`, summed).
  [[nodiscard]] std::uint64_t bytes_sent() const noexcept { return packet_total_; }
  /// Modeled ring traffic over all syncs, agreement and outcome rounds included.
  [[nodiscard]] std::uint64_t wire_bytes() const noexcept { return wire_total_; }

  /// The fragment of tensor `i`: i mod F.
  [[nodiscard]] std::uint64_t fragment_of(std::size_t i) const noexcept { return i % opt_.fragments; }
  /// The offset o_f = floor(f*H/F) of fragment `f`'s schedule.
  [[nodiscard]] std::uint64_t offset_of(std::uint64_t f) const noexcept {
    return f * opt_.sync_every / opt_.fragments;
  }
  /// Whether fragment `f` synchronises at step `t` (1-based): t >= o_f and (t - o_f) mod H = 0.
  [[nodiscard]] bool syncs_at(std::uint64_t f, std::uint64_t t) const noexcept {
    std::uint64_t const o = offset_of(f);
    return t >= 1 && t >= o && (t - o) % opt_.sync_every == 0;
  }

  /// theta_sync of tensor `i` (after `start`).
  [[nodiscard]] std::span<float const> synchronized_weights(std::size_t i) const { return sync_.at(i); }
  /// The outer momentum u of tensor `i` (nesterov; empty otherwise).
  [[nodiscard]] std::span<float const> momentum(std::size_t i) const { return mom_.at(i); }
  /// This rank's accumulator e of tensor `i` (sparseloco; empty otherwise).
  [[nodiscard]] std::span<float const> accumulator(std::size_t i) const { return acc_.at(i); }
  /// The step at which fragment `f`'s delayed result is applied (0: none pending).
  [[nodiscard]] std::uint64_t pending_application(std::uint64_t f) const { return pending_.at(f); }

  /// Makes the replicas identical and fixes the layout: every rank's `weights` (one span per
  /// tensor, the same count and sizes on every rank, checked) become rank 0's, which become
  /// theta_sync; the step count restarts at 0. Collective. `config_error` for an empty layout,
  /// fewer tensors than fragments, or ranks that disagree (on every rank; nothing changed).
  template <communicator Comm>
  void start(Comm& comm, std::span<std::span<float> const> weights) {
    std::exception_ptr local;
    try {
      if (weights.empty()) fail("weights", "start needs at least one tensor");
      if (weights.size() < opt_.fragments)
        fail("fragments", std::to_string(opt_.fragments) + " fragments need at least as many tensors, got " +
                              std::to_string(weights.size()));
      for (std::size_t i = 0; i < weights.size(); ++i)
        if (weights[i].empty()) fail("weights", "tensor " + std::to_string(i) + " is empty");
    } catch (...) {
      local = std::current_exception();
    }
    std::vector<std::size_t> sizes;
    for (auto const& w : weights) sizes.push_back(w.size());
    detail::report_round round;
    rank_report mine;
    mine.fingerprint = fingerprint_of(sizes);
    mine.status = local ? 1u : 0u;
    round.post(comm, mine, {}, opt_.checksum, "local_update.start");
    round.finish("local_update.start", local);
    for (auto const& w : weights) comm.broadcast(std::as_writable_bytes(w), 0);
    sync_.clear();
    for (auto const& w : weights) sync_.emplace_back(w.begin(), w.end());
    mom_.assign(weights.size(), {});
    acc_.assign(weights.size(), {});
    if (outer_ == outer_optimizer::nesterov)
      for (std::size_t i = 0; i < sizes.size(); ++i) mom_[i].assign(sizes[i], 0.0f);
    if (outer_ == outer_optimizer::sparseloco)
      for (std::size_t i = 0; i < sizes.size(); ++i) acc_[i].assign(sizes[i], 0.0f);
    comp_ = make_feedback(opt_.feedback, codec_);
    pending_.assign(opt_.fragments, 0);
    sizes_ = std::move(sizes);
    t_ = syncs_ = packet_total_ = wire_total_ = 0;
    started_ = true;
  }

  /// Call after every inner step with this rank's current weights (the spans `start` fixed):
  /// applies the delayed results due at this step and, where a fragment is due (file comment),
  /// synchronises it: a collective then, every rank at the same step. Returns what it did.
  /// A failure throws on every rank and changes nothing (file comment).
  template <communicator Comm>
  local_update_stats step(Comm& comm, std::span<std::span<float> const> weights) {
    if (!started_) fail("start", "call start(comm, weights) before the first step");
    std::uint64_t const t = t_ + 1;
    local_update_stats st;
    st.step = t;
    std::vector<std::uint64_t> due;
    for (std::uint64_t f = 0; f < opt_.fragments; ++f)
      if (syncs_at(f, t)) due.push_back(f);
    if (due.empty()) {
      check_layout(weights);  // local: nothing is exchanged, nothing changes on a bad call
      apply_pending(weights, t, st);
      t_ = t;
      return st;
    }
    std::vector<bool> in_sync(opt_.fragments, false);
    for (std::uint64_t f : due) in_sync[f] = true;
    std::vector<std::size_t> tensors;
    for (std::size_t i = 0; i < sizes_.size(); ++i)
      if (in_sync[fragment_of(i)]) tensors.push_back(i);

    // 1. local checks and the pseudo-gradients (sparseloco: the next accumulators), staged
    std::exception_ptr local;
    std::vector<std::vector<float>> staged(tensors.size());
    try {
      check_layout(weights);
      for (std::size_t k = 0; k < tensors.size(); ++k) {
        std::size_t const i = tensors[k];
        std::span<float const> const w = weights[i];
        std::vector<float> const& s = sync_[i];
        std::vector<float>& d = staged[k];
        d.resize(w.size());
        for (std::size_t j = 0; j < w.size(); ++j) {
          float const delta = s[j] - w[j];
          d[j] = outer_ == outer_optimizer::sparseloco ? mu_ * acc_[i][j] + delta : delta;
          if (!std::isfinite(d[j])) {
            throw numeric_error("gradcomp: local_update: the pseudo-gradient of tensor " + std::to_string(i) +
                                " is not finite at element " + std::to_string(j) + " (local weight " +
                                std::to_string(w[j]) + "): the sync at step " + std::to_string(t) +
                                " is refused on every rank, nothing changed");
          }
        }
      }
    } catch (...) {
      local = std::current_exception();
    }

    // 2. the agreement round: options and layout (fingerprint), the step number, local success
    detail::report_round round;
    rank_report mine;
    mine.fingerprint = fingerprint_of(sizes_);
    mine.status = local ? 1u : 0u;
    std::uint64_t const extra[2] = {t, syncs_};
    round.post(comm, mine, std::span<std::uint64_t const>(extra), opt_.checksum, "local_update");
    round.finish("local_update", local);
    for (std::size_t r = 1; r < round.reports().size(); ++r) {
      if (round.extra(r, 0) != round.extra(0, 0) || round.extra(r, 1) != round.extra(0, 1)) {
        throw config_error("gradcomp: local_update: ranks disagree on the step: rank 0 is at step " +
                           std::to_string(round.extra(0, 0)) + " (sync " + std::to_string(round.extra(0, 1)) +
                           "), rank " + std::to_string(r) + " at step " + std::to_string(round.extra(r, 0)) +
                           " (sync " + std::to_string(round.extra(r, 1)) +
                           "); every rank must call step once per inner step; no data moved");
      }
    }
    st.wire_bytes += round.wire_bytes();

    // 3. the exchanges (error feedback staged), then the outcome round; nothing committed yet
    std::vector<std::vector<float>> mean(tensors.size());
    std::vector<std::vector<float>> next_acc;
    collective_options co;
    co.op = reduction::average;
    co.checksum = opt_.checksum;
    codec_context ctx = opt_.context;
    ctx.step = static_cast<std::uint32_t>(t);
    bool const shared = codec_.aggregation() == aggregation_kind::shared_support;
    ctx.seed = opt_.seed + (shared ? 0u : static_cast<std::uint64_t>(comm.rank()));
    detail::step_check check(opt_.checksum);
    auto exchange_all = [&](auto& src, auto* pending) {
      for (std::size_t k = 0; k < tensors.size(); ++k) {
        mean[k].assign(staged[k].size(), 0.0f);
        tensor_view<float const> const g{std::span<float const>(staged[k]), static_cast<tensor_id>(tensors[k])};
        collective_result r;
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(*pending)>, std::monostate>) {
          detail::pending_commit<std::remove_reference_t<decltype(src)>> none(src);
          r = detail::compressed_exchange(comm, src, g, std::span<float>(mean[k]), ctx, co, check, none);
        } else {
          r = detail::compressed_exchange(comm, src, g, std::span<float>(mean[k]), ctx, co, check, *pending);
        }
        st.packet_bytes += r.packet_bytes;
        st.wire_bytes += r.wire_bytes;
      }
    };
    if (outer_ == outer_optimizer::sparseloco) {
      std::monostate none;
      exchange_all(codec_, &none);
      // this rank's own decoded packet, for e <- e - D(C(e)) (the same packet: same codec and context)
      next_acc.resize(tensors.size());
      check.guard([&] {
        std::vector<std::byte> packet;
        for (std::size_t k = 0; k < tensors.size(); ++k) {
          std::size_t const n = staged[k].size();
          packet.resize(codec_.max_compressed_bytes(n));
          tensor_view<float const> const g{std::span<float const>(staged[k]), static_cast<tensor_id>(tensors[k])};
          std::size_t const bytes = codec_.compress(g, std::span<std::byte>(packet), ctx);
          std::vector<float>& e = next_acc[k];
          e.assign(n, 0.0f);
          codec_.decompress(std::span<std::byte const>(packet.data(), bytes), std::span<float>(e), ctx);
          for (std::size_t j = 0; j < n; ++j) e[j] = staged[k][j] - e[j];
        }
      });
      detail::agree_outcome(comm, check, "local_update", t);
    } else {
      std::visit(
          [&](auto& comp) {
            detail::pending_commit<std::remove_reference_t<decltype(comp)>> pending(comp);
            exchange_all(comp, &pending);
            detail::agree_outcome(comm, check, "local_update", t);
            pending.apply();
            for (std::size_t k = 0; k < tensors.size(); ++k)
              detail::receive_output(comp, static_cast<tensor_id>(tensors[k]), std::span<float>(mean[k]));
          },
          comp_);
    }
    st.wire_bytes += detail::outcome_wire_bytes(opt_.checksum, comm.size());

    // 4. commit: the outer step, the accumulators, the replicas' weights (or their pending mixing)
    apply_pending(weights, t, st);
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      std::size_t const i = tensors[k];
      std::vector<float>& s = sync_[i];
      std::vector<float> const& m = mean[k];
      if (outer_ == outer_optimizer::nesterov) {
        std::vector<float>& u = mom_[i];
        for (std::size_t j = 0; j < s.size(); ++j) {
          u[j] = mu_ * u[j] + m[j];
          s[j] = s[j] - lr_ * (m[j] + mu_ * u[j]);
        }
      } else {
        for (std::size_t j = 0; j < s.size(); ++j) s[j] = s[j] - lr_ * m[j];
      }
      if (outer_ == outer_optimizer::sparseloco) acc_[i] = std::move(next_acc[k]);
      st.elements += s.size();
      if (opt_.overlap == 0) std::memcpy(weights[i].data(), s.data(), s.size() * sizeof(float));
    }
    if (opt_.overlap != 0)
      for (std::uint64_t f : due) pending_[f] = t + opt_.overlap;
    st.synced = true;
    st.fragments = std::move(due);
    st.tensors = tensors.size();
    packet_total_ += st.packet_bytes;
    wire_total_ += st.wire_bytes;
    ++syncs_;
    t_ = t;
    return st;
  }

  /// Applies every pending delayed result now (the mixing of the file comment), e.g. before an
  /// evaluation or at the end of training; local, no communication. Returns the fragments.
  std::vector<std::uint64_t> flush(std::span<std::span<float> const> weights) {
    if (!started_) fail("start", "call start(comm, weights) before flush");
    check_layout(weights);
    std::vector<std::uint64_t> done;
    for (std::uint64_t f = 0; f < opt_.fragments; ++f) {
      if (pending_[f] == 0) continue;
      mix_into(weights, f);
      pending_[f] = 0;
      done.push_back(f);
    }
    return done;
  }

  /// The whole state ("GCLU" v1, file comment).
  [[nodiscard]] std::vector<std::byte> save() const {
    detail::byte_writer w;
    w.begin(magic, 1);
    w.put_u64(fingerprint_of({}));
    w.put_bool(started_);
    w.put_u64(t_);
    w.put_u64(syncs_);
    w.put_u64(packet_total_);
    w.put_u64(wire_total_);
    w.put_u64(sync_.size());
    for (std::size_t i = 0; i < sync_.size(); ++i) {
      w.put_floats(sync_[i]);
      w.put_floats(mom_[i]);
      w.put_floats(acc_[i]);
    }
    for (std::uint64_t p : pending_) w.put_u64(p);
    w.put_bytes(std::visit([](auto const& c) { return c.save(); }, comp_));
    return w.finish();
  }

  /// Restores `save`'s bytes into a `local_update` with the same options; `format_error` for
  /// a damaged state (checksum), one saved with other options or malformed; then nothing
  /// changed.
  void load(std::span<std::byte const> bytes) {
    detail::byte_reader r(bytes, magic, 1, "local_update state");
    if (r.get_u64() != fingerprint_of({}))
      r.fail("saved with other options (outer, lr, momentum, schedule, codec, feedback, seed or checksum)");
    bool const started = r.get_bool();
    std::uint64_t const t = r.get_u64(), syncs = r.get_u64(), ptot = r.get_u64(), wtot = r.get_u64();
    std::uint64_t const count = r.get_u64();
    if (!started && (count != 0 || t != 0)) r.fail("not started but holds a step count or tensors");
    if (started && count < opt_.fragments) r.fail("holds fewer tensors than fragments");
    if (count > bytes.size()) r.fail("its tensor count is larger than the state");
    std::vector<std::vector<float>> sync, mom, acc;
    std::vector<std::size_t> sizes;
    for (std::uint64_t i = 0; i < count; ++i) {
      sync.push_back(r.get_floats());
      mom.push_back(r.get_floats());
      acc.push_back(r.get_floats());
      std::size_t const n = sync.back().size();
      bool const mom_ok = outer_ == outer_optimizer::nesterov ? mom.back().size() == n : mom.back().empty();
      bool const acc_ok = outer_ == outer_optimizer::sparseloco ? acc.back().size() == n : acc.back().empty();
      if (!mom_ok || !acc_ok) r.fail("the outer state of tensor " + std::to_string(i) + " has the wrong size");
      sizes.push_back(n);
    }
    std::vector<std::uint64_t> pending(opt_.fragments);
    for (auto& p : pending) {
      p = r.get_u64();
      if (p != 0 && (p <= t || p > t + opt_.overlap)) r.fail("a pending application is outside (t, t + overlap]");
    }
    feedback_compressor comp = make_feedback(opt_.feedback, codec_);
    std::vector<std::byte> const cstate = r.get_bytes();
    std::visit([&](auto& c) { c.load(cstate, state_check::container); }, comp);
    r.expect_end();
    started_ = started;
    t_ = t;
    syncs_ = syncs;
    packet_total_ = ptot;
    wire_total_ = wtot;
    sync_ = std::move(sync);
    mom_ = std::move(mom);
    acc_ = std::move(acc);
    sizes_ = std::move(sizes);
    pending_ = std::move(pending);
    comp_ = std::move(comp);
  }

  /// Magic of the saved state.
  static constexpr char const* magic = "GCLU";

 private:
  [[noreturn]] static void fail(char const* option, std::string const& why) {
    throw config_error(std::string("gradcomp: local_update option '") + option + "' " + why);
  }

  // The fingerprint of the options (and, non-empty, of the tensor sizes).
  [[nodiscard]] std::uint64_t fingerprint_of(std::vector<std::size_t> const& sizes) const {
    fingerprint f;
    f.add("local_update")
        .add(static_cast<std::uint64_t>(outer_))
        .add_double(*opt_.outer_lr)
        .add_double(*opt_.outer_momentum)
        .add(opt_.sync_every)
        .add(opt_.fragments)
        .add(opt_.overlap)
        .add_double(opt_.mix)
        .add(std::string_view(opt_.codec))
        .add(std::string_view(opt_.feedback))
        .add(opt_.seed)
        .add(static_cast<std::uint64_t>(opt_.checksum ? 1 : 0))
        .add(static_cast<std::uint64_t>(sizes.size()));
    for (std::size_t n : sizes) f.add(static_cast<std::uint64_t>(n));
    return f.value();
  }

  void check_layout(std::span<std::span<float> const> weights) const {
    if (weights.size() != sizes_.size())
      throw config_error("gradcomp: local_update: step got " + std::to_string(weights.size()) +
                         " tensors, start had " + std::to_string(sizes_.size()));
    for (std::size_t i = 0; i < sizes_.size(); ++i) {
      if (weights[i].size() != sizes_[i])
        throw config_error("gradcomp: local_update: tensor " + std::to_string(i) + " has " +
                           std::to_string(weights[i].size()) + " elements, start had " + std::to_string(sizes_[i]));
    }
  }

  // theta_w <- alpha*theta_w + (1-alpha)*theta_sync for every tensor of fragment f.
  void mix_into(std::span<std::span<float> const> weights, std::uint64_t f) const {
    float const keep = mix_, take = 1.0f - mix_;
    for (std::size_t i = 0; i < sizes_.size(); ++i) {
      if (fragment_of(i) != f) continue;
      std::span<float> const w = weights[i];
      std::vector<float> const& s = sync_[i];
      for (std::size_t j = 0; j < w.size(); ++j) w[j] = keep * w[j] + take * s[j];
    }
  }

  void apply_pending(std::span<std::span<float> const> weights, std::uint64_t t, local_update_stats& st) {
    for (std::uint64_t f = 0; f < opt_.fragments; ++f) {
      if (pending_[f] != t) continue;
      mix_into(weights, f);
      pending_[f] = 0;
      st.applied.push_back(f);
    }
  }

  local_update_options opt_;
  outer_optimizer outer_ = outer_optimizer::nesterov;
  float lr_ = 0.7f, mu_ = 0.9f, mix_ = 0.5f;
  any_codec codec_ = make_codec("identity");
  feedback_compressor comp_ = make_feedback("none", make_codec("identity"));
  bool started_ = false;
  std::uint64_t t_ = 0, syncs_ = 0, packet_total_ = 0, wire_total_ = 0;
  std::vector<std::size_t> sizes_;
  std::vector<std::vector<float>> sync_, mom_, acc_;  // theta_sync, u (nesterov), e (sparseloco)
  std::vector<std::uint64_t> pending_;                // per fragment: the step of its mixing (0: none)
};

GRADCOMP_NAMESPACE_END
