// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// BytePS-Compress style compressed Adam: the pieces a two-way compression pipeline calls.
///
/// Per iteration t (docs/decentralized.md, "Compressed Adam"):
/// ```
///   worker w:  [Nesterov]  m_w <- mu*m_w + g;  g <- g + mu*m_w
///              p = g + (lr_{t-1}/lr_t) * e_w;  c_w = C(p);  e_w = p - D(c_w)     worker_compress
///   server:    s = (1/n) sum_w D(c_w)                                           aggregate
///              p~ = s + (lr_{t-1}/lr_t) * e~;  c~ = C(p~);  e~ = p~ - D(c~)    server_compress
///   worker w:  g^ = D(c~);  Adam/AdamW step on g^ (moments from the aggregate)   apply
/// ```
/// The residuals and the Nesterov momentum are kept per tensor id, so one object serves all
/// shards a rank owns as a "server" in a reduce-scatter / all-gather pipeline. Every worker holds
/// identical Adam state because every worker applies the same decoded aggregate. With the identity
/// codec and no momentum the residuals stay zero and the parameters are bit-identical to `adam` run
/// on the same aggregate.

#include <gradcomp/codec/context.hpp>
#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/feedback/policies.hpp>
#include <gradcomp/optim/adam.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
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

/// Residual error feedback whose residual is rescaled by lr_prev / lr when the learning rate
/// changes (per tensor id). Mass is conserved in units of lr * gradient.
template <codec_operations Codec>
class lr_corrected_compressor {
 public:
  explicit lr_corrected_compressor(Codec c = Codec{}) : inner_(std::move(c)) {}

  /// Compresses g + (lr_prev / lr) * e into `out` (returns its size); `lr` is this step's
  /// learning rate (finite, >= 0). A step with lr = 0 (e.g. the start of a warm-up) neither
  /// rescales nor is remembered as lr_prev.
  std::size_t compress(tensor_view<float const> g, std::span<std::byte> out, double lr,
                       codec_context const& ctx = {}) {
    if (!(std::isfinite(lr) && lr >= 0.0)) {
      throw config_error(
          "gradcomp: lr_corrected_compressor needs a finite learning rate >= 0; got " +
          std::to_string(lr));
    }
    if (lr > 0.0) {
      auto const it = last_lr_.find(g.id());
      if (it == last_lr_.end()) {
        last_lr_.emplace(g.id(), lr);
      } else if (it->second != lr) {
        rescale_residual(std::span<float>(inner_.state(g.id()).data),
                         lr_correction(it->second, lr));
        it->second = lr;  // residual and recorded lr change together, whatever compress does
      }
    }
    return inner_.compress(g, out, ctx);
  }

  [[nodiscard]] Codec const& codec() const noexcept { return inner_.codec(); }
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    return inner_.max_compressed_bytes(n);
  }
  /// The residual compressor (state save/restore).
  [[nodiscard]] compressor<Codec, residual_feedback>& inner() noexcept { return inner_; }
  /// The residual of tensor `id` (empty until its first step).
  [[nodiscard]] std::span<float const> residual(tensor_id id) { return inner_.state(id).values(); }

 private:
  compressor<Codec, residual_feedback> inner_;
  std::map<tensor_id, double> last_lr_;
};

/// Options of `compressed_adam`.
struct compressed_adam_options {
  adam_options adam{};         ///< the Adam / AdamW applied to the aggregate
  double nesterov = 0.0;       ///< worker-side Nesterov momentum mu (0: off)
  bool correct_for_lr = true;  ///< rescale residuals by lr_prev / lr (false: plain EF)
};

/// Two-way compressed Adam (file comment) for one flat parameter span.
template <codec_operations Codec>
class compressed_adam {
 public:
  explicit compressed_adam(Codec codec, compressed_adam_options o = {})
      : opt_(o), adam_(o.adam), worker_(codec), server_(codec) {
    if (o.nesterov != 0.0) (void)nesterov_momentum(o.nesterov);  // validates mu
  }

  /// Worker side: (Nesterov,) error feedback and compression of the local gradient `g`.
  std::size_t worker_compress(tensor_view<float const> g, std::span<std::byte> out,
                              codec_context const& ctx = {}) {
    if (opt_.nesterov == 0.0) return worker_.compress(g, out, ef_lr(), ctx);
    // One momentum per tensor id (each shard of its size), as the residuals.
    auto it = momentum_.try_emplace(g.id(), opt_.nesterov).first;
    scratch_.assign(g.span().begin(), g.span().end());
    it->second.apply(scratch_);
    return worker_.compress(tensor_view<float const>(scratch_, g.id()), out, ef_lr(), ctx);
  }

  /// Server side: decodes the workers' packets into `out` and scales the sum by `scale`
  /// (1/n for the mean): out = scale * sum_w D(packets[w]), summed in the given order.
  void aggregate(std::span<std::span<std::byte const> const> packets, std::span<float> out,
                 double scale, codec_context const& ctx = {}) const {
    if (packets.empty())
      throw config_error("gradcomp: compressed_adam::aggregate needs at least one packet");
    worker_.codec().decompress(packets[0], out, ctx);
    for (std::size_t w = 1; w < packets.size(); ++w)
      worker_.codec().decompress_add(packets[w], out, 1.0f, ctx);
    if (scale != 1.0) {
      float const s = static_cast<float>(scale);
      for (float& v : out) v = v * s;
    }
  }

  /// Server side: error feedback and compression of an aggregate (one shard, keyed by id).
  std::size_t server_compress(tensor_view<float const> aggregate, std::span<std::byte> out,
                              codec_context const& ctx = {}) {
    return server_.compress(aggregate, out, ef_lr(), ctx);
  }

  /// Worker side: decodes the server's packet and takes the Adam step with it.
  void apply(std::span<float> x, std::span<std::byte const> packet, codec_context const& ctx = {}) {
    decoded_.resize(x.size());
    worker_.codec().decompress(packet, std::span<float>(decoded_), ctx);
    adam_.step(x, decoded_);
  }

  /// Adam step with an already decoded aggregate `g_hat`.
  void step(std::span<float> x, std::span<float const> g_hat) { adam_.step(x, g_hat); }

  [[nodiscard]] double lr() const noexcept { return adam_.lr(); }
  /// Sets the learning rate of the next steps; the residuals are rescaled at their next use.
  void set_lr(double lr) { adam_.set_lr(lr); }
  [[nodiscard]] adam& optimizer() noexcept { return adam_; }
  [[nodiscard]] lr_corrected_compressor<Codec>& worker_feedback() noexcept { return worker_; }
  [[nodiscard]] lr_corrected_compressor<Codec>& server_feedback() noexcept { return server_; }
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    return worker_.max_compressed_bytes(n);
  }

 private:
  // With the correction off the residual is never rescaled: use a constant "learning rate".
  [[nodiscard]] double ef_lr() const noexcept { return opt_.correct_for_lr ? adam_.lr() : 1.0; }

  compressed_adam_options opt_;
  adam adam_;
  lr_corrected_compressor<Codec> worker_;
  lr_corrected_compressor<Codec> server_;
  std::map<tensor_id, nesterov_momentum> momentum_;
  std::vector<float> scratch_, decoded_;
};

GRADCOMP_NAMESPACE_END
