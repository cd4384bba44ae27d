// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Two-way compressed Adam (BytePS-Compress): the one implementation, built on the two-way
/// collective (`collective/two_way.hpp`: worker and server error feedback per tensor shard).
///
/// Per iteration t (docs/decentralized.md, "Compressed Adam"):
/// ```
///   worker w:  [Nesterov]  m_w <- mu*m_w + g;  g <- g + mu*m_w            (per tensor id)
///              p = g + (lr_{t-1}/lr_t) * e_w;  c_w = C(p);  e_w = p - D(c_w)   worker side
///   server:    s = sum_w D(c_w)                                  (summed in worker order)
///              p~ = s + (lr_{t-1}/lr_t) * e~;  c~ = C(p~);  e~ = p~ - D(c~)    server side
///   worker w:  g^ = D(c~) * (1/W);  Adam/AdamW step on g^
/// ```
/// `step(comm, x, g)` runs one iteration as a collective (`all_reduce_two_way`: every rank is
/// a worker and the server of one shard). A pipeline that moves the bytes itself calls the
/// pieces: `worker_compress`, `server_reduce`, `apply`. The Nesterov momentum and the
/// learning rate the residuals were accumulated under are kept per tensor id, so one object
/// serves every tensor (and every shard) a rank owns. Every worker holds identical Adam state
/// because every worker applies the same decoded aggregate. With the identity codec and no
/// momentum the residuals stay zero and the parameters are bit-identical to `adam` run on the
/// mean gradient (sum in rank order, times 1/W).
///
/// Element types: gradients may be float, half or bfloat16 (`worker_compress` widens a 16-bit
/// gradient exactly; momentum, residuals, the aggregate and the Adam moments are float32), and
/// `apply` / `step` take float32 master parameters or 16-bit ones (rounded once per step, see
/// optim/adam.hpp). A 16-bit gradient gives the packets of its float32 widening.

#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/optim/adam.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Error-feedback correction factor lr_prev / lr for a learning-rate change (BytePS
/// "corrected" EF): the residual was accumulated under lr_prev, so it is rescaled to the units
/// of the new step. Both must be finite and > 0.
[[nodiscard]] inline double lr_correction(double lr_prev, double lr) {
  if (!(std::isfinite(lr_prev) && lr_prev > 0.0 && std::isfinite(lr) && lr > 0.0)) {
    throw config_error(
        "gradcomp: the learning-rate correction needs finite learning rates > 0; got " +
        std::to_string(lr_prev) + " and " + std::to_string(lr));
  }
  return lr_prev / lr;
}

/// Multiplies a residual by `factor` (no-op for 1).
inline void rescale_residual(std::span<float> residual, double factor) {
  if (factor == 1.0) return;
  float const f = static_cast<float>(factor);
  for (float& v : residual) v = v * f;
}

/// Nesterov momentum applied to the gradient before compression (BytePS `nesterov_momentum`):
/// m <- mu*m + g; g <- g + mu*m.
class nesterov_momentum {
 public:
  explicit nesterov_momentum(double mu) : mu_(mu) {
    if (!(mu >= 0.0 && mu < 1.0)) {
      throw config_error("gradcomp: nesterov momentum must be in [0, 1), got " +
                         std::to_string(mu));
    }
  }
  /// Replaces `g` by its Nesterov-corrected value and updates the momentum.
  void apply(std::span<float> g) {
    if (m_.empty()) m_.assign(g.size(), 0.0f);
    if (m_.size() != g.size()) {
      throw config_error("gradcomp: nesterov momentum holds " + std::to_string(m_.size()) +
                         " elements but the gradient has " + std::to_string(g.size()));
    }
    float const mu = static_cast<float>(mu_);
    for (std::size_t i = 0; i < g.size(); ++i) {
      float const m = mu * m_[i] + g[i];
      m_[i] = m;
      g[i] = g[i] + mu * m;
    }
  }
  [[nodiscard]] double mu() const noexcept { return mu_; }
  [[nodiscard]] std::span<float const> momentum() const noexcept { return m_; }

 private:
  double mu_;
  std::vector<float> m_;
};

/// Options of `compressed_adam`.
struct compressed_adam_options {
  adam_options adam{};         ///< the Adam / AdamW applied to the aggregate
  double nesterov = 0.0;       ///< worker-side Nesterov momentum mu (0: off)
  bool correct_for_lr = true;  ///< rescale residuals by lr_prev / lr (false: plain EF)
};

/// Two-way compressed Adam (file comment) for one flat parameter span per tensor id; the Adam
/// moments are those of one parameter span (use one object per span).
template <codec_operations Codec>
class compressed_adam {
 public:
  using two_way_type = two_way_compressor<Codec>;

  explicit compressed_adam(Codec codec, compressed_adam_options o = {})
      : opt_(o), adam_(o.adam), tw_(std::move(codec)) {
    if (o.nesterov != 0.0) (void)nesterov_momentum(o.nesterov);  // validates mu
  }

  /// One iteration as a collective: the two-way all-reduce of `g` (Nesterov and corrected
  /// error feedback on both sides), then the Adam step on x with the mean of the decoded sum.
  /// Collective: every rank passes the same codec, size and tensor id. Returns the collective's
  /// byte counts.
  template <communicator Comm>
  collective_result step(Comm& comm, std::span<float> x, tensor_view<float const> g,
                         codec_context const& ctx = {}) {
    if (x.size() != g.size()) {
      throw config_error("gradcomp: compressed_adam::step got " + std::to_string(x.size()) +
                         " parameters and " + std::to_string(g.size()) +
                         " gradients; expected as many of each");
    }
    tensor_view<float const> const in = with_momentum(g);
    correct(worker_lr_, two_way_side::worker, g.id());
    correct(server_lr_, two_way_side::server, g.id());
    decoded_.resize(x.size());
    collective_options co;
    co.op = reduction::sum;
    collective_result const r =
        all_reduce_two_way(comm, tw_, in, std::span<float>(decoded_), ctx, co);
    commit_momentum(g.id());
    scale_down(static_cast<std::size_t>(comm.size()));
    adam_.step(x, decoded_);
    return r;
  }

  /// Worker side: (Nesterov,) corrected error feedback and compression of the local gradient
  /// `g` (tensor `g.id()`, one shard) into `out`; returns the packet size.
  std::size_t worker_compress(tensor_view<float const> g, std::span<std::byte> out,
                              codec_context const& ctx = {}) {
    tensor_view<float const> const in = with_momentum(g);
    correct(worker_lr_, two_way_side::worker, g.id());
    std::size_t const bytes = tw_.compress_shard(in.span(), key(g.id()), out, ctx);
    commit_momentum(g.id());
    return bytes;
  }

  /// `worker_compress` of a 16-bit gradient (`half`, `bfloat16`): compresses its exact float32
  /// widening (file comment).
  template <element T>
    requires(!std::same_as<T, float>)
  std::size_t worker_compress(tensor_view<T const> g, std::span<std::byte> out, codec_context const& ctx = {}) {
    wide_.resize(g.size());
    detail::widen_to_f32(g.span(), std::span<float>(wide_), ctx);
    return worker_compress(tensor_view<float const>(std::span<float const>(wide_), g.id()), out, ctx);
  }

  /// Server side: decodes the workers' non-empty `packets` of tensor `id` (n elements), sums
  /// them in order, and compresses the sum with the corrected server error feedback into `out`;
  /// returns the packet size.
  std::size_t server_reduce(std::span<std::span<std::byte const> const> packets, std::size_t n,
                            tensor_id id, std::span<std::byte> out, codec_context const& ctx = {}) {
    correct(server_lr_, two_way_side::server, id);
    return tw_.reduce_shard(packets, n, key(id), 1.0f, out, ctx);
  }

  /// Worker side: decodes the server's packet (the sum of `workers` workers' gradients), takes
  /// the mean and the Adam step with it.
  void apply(std::span<float> x, std::span<std::byte const> packet, std::size_t workers,
             codec_context const& ctx = {}) {
    decoded_.resize(x.size());
    tw_.server_codec().decompress(packet, std::span<float>(decoded_), ctx);
    scale_down(workers);
    adam_.step(x, decoded_);
  }

  /// `apply` to 16-bit parameters (`half`, `bfloat16`): decoded in float32, rounded once.
  template <element P>
    requires(!std::same_as<P, float>)
  void apply(std::span<P> x, std::span<std::byte const> packet, std::size_t workers, codec_context const& ctx = {}) {
    decoded_.resize(x.size());
    tw_.server_codec().decompress(packet, std::span<float>(decoded_), ctx);
    scale_down(workers);
    adam_.step(x, std::span<float const>(decoded_));
  }

  /// Adam step with an already decoded aggregate `g_hat`.
  void step(std::span<float> x, std::span<float const> g_hat) { adam_.step(x, g_hat); }

  [[nodiscard]] double lr() const noexcept { return adam_.lr(); }
  /// Sets the learning rate of the next steps; the residuals are rescaled at their next use.
  void set_lr(double lr) { adam_.set_lr(lr); }
  [[nodiscard]] adam& optimizer() noexcept { return adam_; }
  /// The two-way state: codecs and both sides' residuals per tensor shard.
  [[nodiscard]] two_way_type& two_way() noexcept { return tw_; }
  [[nodiscard]] two_way_type const& two_way() const noexcept { return tw_; }
  /// The Nesterov momentum of tensor `id` (empty before its first step or without momentum).
  [[nodiscard]] std::span<float const> momentum(tensor_id id) const {
    auto it = momentum_.find(id);
    return it == momentum_.end() ? std::span<float const>{} : it->second.momentum();
  }
  /// The worker / server residual that `worker_compress` / `server_reduce` keep for tensor `id`.
  [[nodiscard]] std::span<float const> worker_residual(tensor_id id) const {
    return tw_.worker_residual(key(id));
  }
  [[nodiscard]] std::span<float const> server_residual(tensor_id id) const {
    return tw_.server_residual(key(id));
  }
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    return std::max(tw_.worker_codec().max_compressed_bytes(n),
                    tw_.server_codec().max_compressed_bytes(n));
  }

 private:
  static shard_key key(tensor_id id) noexcept { return shard_key{id, 0, 1}; }

  // With the correction off the residual is never rescaled: use a constant "learning rate".
  [[nodiscard]] double ef_lr() const noexcept { return opt_.correct_for_lr ? adam_.lr() : 1.0; }

  // g with this step's Nesterov correction (into scratch_; the momentum is committed once the
  // step has succeeded), or g itself without momentum.
  tensor_view<float const> with_momentum(tensor_view<float const> g) {
    if (opt_.nesterov == 0.0) return g;
    auto it = momentum_.find(g.id());
    next_momentum_ = it == momentum_.end() ? nesterov_momentum(opt_.nesterov) : it->second;
    scratch_.assign(g.span().begin(), g.span().end());
    next_momentum_->apply(scratch_);
    return tensor_view<float const>(std::span<float const>(scratch_), g.id());
  }

  void commit_momentum(tensor_id id) {
    if (!next_momentum_) return;
    momentum_.insert_or_assign(id, std::move(*next_momentum_));
    next_momentum_.reset();
  }

  // Rescales side's residuals of tensor `id` by lr_prev / lr when the learning rate changed
  // since their last use. A step with lr = 0 (e.g. the start of a warm-up) neither rescales nor
  // is remembered as lr_prev.
  void correct(std::map<tensor_id, double>& last, two_way_side side, tensor_id id) {
    double const lr = ef_lr();
    if (!(std::isfinite(lr) && lr >= 0.0)) {
      throw config_error("gradcomp: compressed_adam needs a finite learning rate >= 0; got " +
                         std::to_string(lr));
    }
    if (lr == 0.0) return;
    auto const it = last.find(id);
    if (it == last.end()) {
      last.emplace(id, lr);
      return;
    }
    if (it->second == lr) return;
    double const factor = lr_correction(it->second, lr);
    tw_.for_each_state(side, id, [&](shard_key const&, auto& st) {
      rescale_residual(std::span<float>(st.data), factor);
    });
    it->second = lr;  // residuals and recorded lr change together
  }

  void scale_down(std::size_t workers) {
    if (workers <= 1) return;
    float const inv = 1.0f / static_cast<float>(workers);
    for (float& v : decoded_) v = v * inv;
  }

  compressed_adam_options opt_;
  adam adam_;
  two_way_type tw_;
  std::map<tensor_id, nesterov_momentum> momentum_;
  std::optional<nesterov_momentum> next_momentum_;
  std::map<tensor_id, double> worker_lr_, server_lr_;
  std::vector<float> scratch_, decoded_, wide_;
};

GRADCOMP_NAMESPACE_END
