// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `factored_onebit_adam`: 1-bit Adam without the dense warm-up. The momentum is compressed
/// from the first step (two-way collective, worker and server error feedback, as in
/// `onebit_adam`'s compressed phase); the second moment is Adafactor's factored estimate
/// (Shazeer & Stern, ICML 2018), which is small enough for the ranks to agree on it by a dense
/// all-reduce at a schedule.
///
/// Why: `onebit_adam` needs a few steps of exact Adam (a dense all-reduce of the gradient) to
/// obtain a second moment v, and those steps cost more bytes than a 30x budget allows with
/// onebit (docs/training.md, "Compressed Adam"). A v from fewer gradients is too noisy per
/// coordinate. Adafactor keeps, for a matrix parameter of r rows and c columns, only the
/// exponential averages of the row sums R and the column sums C of g*g, and estimates
/// v_ij = R_i C_j / sum_i R_i (exact when E[g*g] has rank one). Each entry of that estimate
/// averages over a whole row and a whole column, so it is usable from the first gradient, and
/// the ranks can average r + c floats instead of r * c.
///
/// Per iteration t = 1, 2, ... on every rank w (W ranks, local gradient g_w):
/// ```
///   g_w <- g_w + wd*x  (L2)   or   x <- x * (1 - lr*wd)  (decoupled, at the update)
///   local statistics, no communication:
///     matrix (rows > 0):  R_w <- b2*R_w + (1-b2) * rowsum(g_w*g_w)      r floats
///                         C_w <- b2*C_w + (1-b2) * colsum(g_w*g_w)      c floats
///     vector (rows = 0):  V_w <- b2*V_w + (1-b2) * g_w*g_w              n floats
///   if sync(t):  (R, C) or V <- (sum_w (R_w, C_w) or V_w) * (1/W)   dense float32 all-reduce,
///                T <- t                                              same values on every rank
///   v_ij = R_i C_j / sum_k R_k   (matrix; 0 where sum_k R_k = 0)   or   v_i = V_i   (vector)
///   m_w = b1*m + (1-b1)*g_w                                          local momentum
///   two-way all-reduce of m_w with worker and server error feedback; m = D(c~) * (1/W)
///   x <- x - (lr / (1 - b1^t)) * clip(m / (sqrt(v) / sqrt(1 - b2^T) + eps), -B, B)
/// ```
/// sync(t) holds for t <= `sync_first` (every step at the start, while the estimate is young)
/// and then for t = sync_first + k * `sync_every`, k = 1, 2, ... (never again when sync_every
/// is 0). Between syncs every rank uses the v of the last sync with that sync's bias
/// correction, so all ranks apply the same update and hold the same parameters. The local
/// statistics are never reset: the mean of the ranks' exponential averages is the exponential
/// average of the mean of their g*g, whatever the schedule. B is Adam's own bound on
/// |m / sqrt(v)| (`detail::adam_update_bound`, 7.27 for the default betas), as in
/// `onebit_adam`: v is not Adam's own v, so a coordinate whose row or column has seen no
/// gradient (a dead ReLU unit) would otherwise step by lr * m / eps.
///
/// The statistics are of the ranks' local gradients (batch b each), not of their mean (batch
/// W*b): E[g_w*g_w] carries W times the gradient noise of the mean's, so where noise dominates
/// the steps are somewhat smaller than All-Reduce Adam's (`onebit_adam`'s variance refresh
/// has the same property).
///
/// Bytes per step and rank (`wire_bytes`, the modeled ring traffic): the two-way collective of
/// the momentum, an all-to-all of the compressed shards and an all-gather of the server
/// packets, (W-1)/W of the compressed vector each (onebit: 2(W-1)/W * n/8 bytes plus a header
/// per packet and the agreement round, what `onebit_adam` pays after its warm-up; a dense
/// step pays 2(W-1)/W * 4n), plus on a sync step a ring all-reduce of s = r + c (matrix) or
/// n (vector) floats, 2(W-1)/W * 4s bytes. So a run of S steps with k syncs saves
/// 1 / (1/rho + k*s / (S*n)) over All-Reduce Adam for a codec saving rho. For the training
/// example's 784-1024-512-10 MLP (1,333,770 parameters) s summed over the six tensors is
/// 5,412 floats: 32.5 kB a sync on 4 ranks against 8.0 MB for a dense step, so the default
/// schedule's 16 syncs in 100 steps cost 0.5 MB, 0.07 of one dense step (docs/training.md,
/// "1-bit Adam without a warm-up").
///
/// Float32 parameters and gradients; one object per parameter span (a layer's weight matrix,
/// `rows` rows of size / rows columns, row-major; or a vector with `rows` = 0), the two-way
/// state keyed by the tensor id. `save` / `load` ("GCFA" v1) hold everything.

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
#include <span>
#include <string>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

namespace detail {

// The factored second moment's pieces, shared by `factored_onebit_adam` and
// `calibrated_onebit_adam` (optim/calibrated_onebit_adam.hpp).

// Whether the ranks average their statistics at step t (1-based): t <= first, then every
// `every` steps (never again for every = 0).
constexpr bool factored_sync_at(std::uint64_t t, std::uint64_t first, std::uint64_t every) noexcept {
  if (t == 0) return false;
  if (t <= first) return true;
  return every != 0 && (t - first) % every == 0;
}

// The last sync step at or before t (t >= 1).
constexpr std::uint64_t factored_last_sync(std::uint64_t t, std::uint64_t first,
                                           std::uint64_t every) noexcept {
  if (t <= first || every == 0) return std::min(t, first);
  return first + (t - first) / every * every;
}

// Statistics of n parameters: rows + columns (matrix) or n (vector, rows = 0).
constexpr std::size_t factored_stat_size(std::size_t n, std::size_t rows) noexcept {
  return rows == 0 ? n : rows + n / rows;
}

// config_error unless n is a multiple of rows (a rows x columns matrix) or rows = 0.
inline void check_factored_rows(std::size_t n, std::size_t rows, char const* who) {
  if (rows != 0 && n % rows != 0) {
    throw config_error(std::string("gradcomp: ") + who + " got " + std::to_string(n) +
                       " parameters, not a multiple of its rows (" + std::to_string(rows) +
                       "; expected a rows x columns matrix)");
  }
}

// b2 * old + (1-b2) * sq, elementwise (old empty: zeros), as the new local statistics.
inline std::vector<float> factored_statistics_update(std::span<float const> old,
                                                     std::vector<double> const& sq,
                                                     adam_coefficients const& c) {
  std::vector<float> loc(sq.size());
  for (std::size_t k = 0; k < sq.size(); ++k) {
    loc[k] = c.b2 * (old.empty() ? 0.0f : old[k]) + c.c2 * static_cast<float>(sq[k]);
  }
  return loc;
}

// The ranks' mean of `loc` (float32 all-reduce, then times 1/W): the same on every rank.
template <communicator Comm>
std::vector<float> factored_statistics_mean(Comm& comm, std::vector<float> mean) {
  comm.all_reduce(std::as_writable_bytes(std::span<float>(mean)), comm_type::f32, reduce_op::sum);
  auto const w = static_cast<std::size_t>(comm.size());
  if (w > 1) {
    float const inv = 1.0f / static_cast<float>(w);
    for (float& v : mean) v = v * inv;
  }
  return mean;
}

// sum of the row statistics R (the first `rows` floats).
inline double factored_row_total(std::span<float const> stats, std::size_t rows) noexcept {
  double total = 0.0;
  for (std::size_t i = 0; i < rows; ++i) total += static_cast<double>(stats[i]);
  return total;
}

// v written out from agreed statistics: v_ij = R_i C_j / sum_k R_k (matrix; 0 where the sum is
// 0) or V (vector; also when `stats` is empty).
inline std::vector<float> factored_second_moment(std::span<float const> stats, std::size_t rows) {
  if (rows == 0 || stats.empty()) return std::vector<float>(stats.begin(), stats.end());
  std::size_t const cols = stats.size() - rows;
  double const total = factored_row_total(stats, rows);
  std::vector<float> v(rows * cols, 0.0f);
  if (total <= 0.0) return v;
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < cols; ++j) {
      v[i * cols + j] = static_cast<float>(static_cast<double>(stats[i]) *
                                           static_cast<double>(stats[rows + j]) / total);
    }
  }
  return v;
}

// sqrt of the agreed statistics, cached per sync: vector sqrt(V_i); matrix sqrt(R_i / sum R)
// then sqrt(C_j), so that sqrt(v_ij) = f_i * f_(rows+j).
class factored_denominators {
 public:
  std::vector<float> const& of(std::span<float const> stats, std::size_t rows, std::uint64_t t_sync) {
    if (t_ == t_sync && f_.size() == stats.size()) return f_;
    f_.assign(stats.size(), 0.0f);
    if (rows == 0) {
      for (std::size_t i = 0; i < stats.size(); ++i) f_[i] = std::sqrt(stats[i]);
    } else {
      double const total = factored_row_total(stats, rows);
      for (std::size_t i = 0; i < rows; ++i) {
        f_[i] = total > 0.0 ? static_cast<float>(std::sqrt(static_cast<double>(stats[i]) / total))
                            : 0.0f;
      }
      for (std::size_t j = rows; j < stats.size(); ++j) f_[j] = std::sqrt(stats[j]);
    }
    t_ = t_sync;
    return f_;
  }

 private:
  std::vector<float> f_;
  std::uint64_t t_ = 0;
};

}  // namespace detail

/// Options of `factored_onebit_adam`.
struct factored_onebit_adam_options {
  adam_options adam{};  ///< lr, betas, eps, weight decay (Adam's meaning)
  /// Rows of the parameter matrix (row-major, size / rows columns): its second moment is
  /// factored into row and column statistics. 0: a vector (bias), one v per coordinate.
  std::size_t rows = 0;
  /// The ranks average their statistics at every step t <= sync_first (>= 1: step 1 needs a v).
  std::uint64_t sync_first = 4;
  /// ... and then every `sync_every` steps (t = sync_first + k * sync_every); 0: never again.
  std::uint64_t sync_every = 8;
};

/// 1-bit Adam with a factored second moment agreed at a schedule, no dense warm-up (file
/// comment).
template <codec_operations Codec>
class factored_onebit_adam {
 public:
  using two_way_type = two_way_compressor<Codec>;

  /// `config_error` for `sync_first` = 0 or invalid Adam options.
  explicit factored_onebit_adam(Codec codec, factored_onebit_adam_options o)
      : opt_(o), tw_(std::move(codec)) {
    opt_.adam.validate();
    if (o.sync_first == 0) {
      throw config_error(
          "gradcomp: factored_onebit_adam needs sync_first >= 1 (the first step's update needs "
          "the ranks' second moment), got 0");
    }
  }

  /// Whether the ranks average their statistics at step `t` (1-based; file comment).
  [[nodiscard]] bool sync_at(std::uint64_t t) const noexcept {
    return detail::factored_sync_at(t, opt_.sync_first, opt_.sync_every);
  }

  /// One iteration as a collective (file comment): every rank passes the same size, tensor id
  /// and codec. Returns the bytes of the step's collectives (`packet_bytes`: this rank's
  /// payload; `wire_bytes`: its modeled ring traffic), the statistics' all-reduce included.
  /// `config_error` for a size other than the earlier steps' or not a multiple of `rows`.
  template <communicator Comm>
  collective_result step(Comm& comm, std::span<float> x, tensor_view<float const> g,
                         codec_context const& ctx = {}) {
    std::size_t const n = x.size();
    detail::check_step_spans(n, g.size(), m_.size(), "factored_onebit_adam");
    detail::check_factored_rows(n, opt_.rows, "factored_onebit_adam");
    std::size_t const nstat = detail::factored_stat_size(n, opt_.rows);
    auto const w = static_cast<std::size_t>(comm.size());
    float const inv = 1.0f / static_cast<float>(w);
    std::uint64_t const t = t_ + 1;
    detail::adam_coefficients c = detail::adam_coefficients_for(opt_.adam, t);
    std::span<float const> const gs = g.span();

    // the local momentum and this step's g*g statistics
    local_.resize(n);
    std::vector<double> sq(nstat, 0.0);
    std::size_t const rows = opt_.rows, cols = rows != 0 ? n / rows : 0;
    std::size_t row = 0, col = 0;  // element i's (matrix), advanced without a division
    for (std::size_t i = 0; i < n; ++i) {
      float xi = x[i];
      float const gi = detail::adam_decay(xi, gs[i], c);  // L2: wd*x joins the gradient
      local_[i] = c.b1 * (m_.empty() ? 0.0f : m_[i]) + c.c1 * gi;
      double const q = static_cast<double>(gi) * gi;
      if (rows == 0) {
        sq[i] = q;
      } else {
        sq[row] += q;
        sq[rows + col] += q;
        if (++col == cols) {
          col = 0;
          ++row;
        }
      }
    }
    std::vector<float> loc = detail::factored_statistics_update(loc_, sq, c);
    bool const sync = sync_at(t);
    std::vector<float> mean;
    if (sync) mean = detail::factored_statistics_mean(comm, loc);  // the same on every rank
    next_.resize(n);
    collective_options co;
    co.op = reduction::sum;
    collective_result r = all_reduce_two_way(
        comm, tw_, tensor_view<float const>(std::span<float const>(local_), g.id()),
        std::span<float>(next_), ctx, co);
    // the collectives succeeded: commit (the same values on every rank, except loc_)
    loc_ = std::move(loc);
    if (sync) {
      synced_ = std::move(mean);
      t_sync_ = t;
      r.packet_bytes += nstat * sizeof(float);
      r.wire_bytes += detail::ring_all_reduce_bytes(nstat * sizeof(float), comm.size());
    }
    if (m_.empty()) m_.assign(n, 0.0f);
    c.bc2_sqrt = detail::adam_coefficients_for(opt_.adam, t_sync_).bc2_sqrt;
    float const bound = detail::adam_update_bound(opt_.adam);
    std::vector<float> const& f = factors_.of(synced_, opt_.rows, t_sync_);
    row = col = 0;
    for (std::size_t i = 0; i < n; ++i) {
      float const mi = w > 1 ? next_[i] * inv : next_[i];
      m_[i] = mi;
      float xi = x[i];
      (void)detail::adam_decay(xi, 0.0f, c);  // decoupled decay scales x
      float root = 0.0f;                      // sqrt(v_i)
      if (rows == 0) {
        root = f[i];
      } else {
        root = f[row] * f[rows + col];
        if (++col == cols) {
          col = 0;
          ++row;
        }
      }
      float const denom = root / c.bc2_sqrt + c.eps;
      x[i] = xi - c.step_size * std::clamp(mi / denom, -bound, bound);
    }
    t_ = t;
    return r;
  }

  /// Steps taken.
  [[nodiscard]] std::uint64_t steps() const noexcept { return t_; }
  /// The step of the last sync (0 before the first step): v and its bias correction are that
  /// step's.
  [[nodiscard]] std::uint64_t last_sync() const noexcept { return t_sync_; }
  [[nodiscard]] factored_onebit_adam_options const& options() const noexcept { return opt_; }
  [[nodiscard]] double lr() const noexcept { return opt_.adam.lr; }
  /// Sets the learning rate of the next steps (finite, >= 0).
  void set_lr(double lr) {
    adam_options a = opt_.adam;
    a.lr = lr;
    a.validate();
    opt_.adam = a;
  }
  /// The first moment: the decoded mean of the ranks' momenta of the last step.
  [[nodiscard]] std::span<float const> first_moment() const noexcept { return m_; }
  /// The momentum this rank compressed in the last step (before error feedback).
  [[nodiscard]] std::span<float const> local_momentum() const noexcept { return local_; }
  /// The statistics the ranks agreed on at the last sync, not bias-corrected: R (rows floats)
  /// then C (columns floats) for a matrix, V for a vector; empty before the first step.
  [[nodiscard]] std::span<float const> agreed_statistics() const noexcept { return synced_; }
  /// This rank's own statistics (same layout), updated every step.
  [[nodiscard]] std::span<float const> local_statistics() const noexcept { return loc_; }
  /// The second moment the update uses, written out (not bias-corrected):
  /// v_ij = R_i C_j / sum_k R_k for a matrix, V for a vector.
  [[nodiscard]] std::vector<float> second_moment() const {
    return detail::factored_second_moment(synced_, opt_.rows);
  }
  /// The two-way state: codecs and both sides' residuals (momentum units), keyed by shard.
  [[nodiscard]] two_way_type const& two_way() const noexcept { return tw_; }

  /// Serializes the whole state ("GCFA" v1: rows, the schedule, step count, last sync, m, this
  /// rank's and the agreed statistics, then the two-way state "GCTW").
  [[nodiscard]] std::vector<std::byte> save() const {
    detail::byte_writer w;
    w.begin("GCFA", 1);
    w.put_u64(opt_.rows);
    w.put_u64(opt_.sync_first);
    w.put_u64(opt_.sync_every);
    w.put_u64(t_);
    w.put_u64(t_sync_);
    w.put_floats(m_);
    w.put_floats(loc_);
    w.put_floats(synced_);
    w.put_bytes(tw_.save());
    return w.finish();
  }

  /// Restores `save`'s bytes into an optimizer with the same rows, schedule and codec;
  /// `format_error` for a malformed or mismatched state, which is then unchanged.
  void load(std::span<std::byte const> bytes) {
    detail::byte_reader r(bytes, "GCFA", 1, "factored_onebit_adam state");
    if (r.get_u64() != opt_.rows) r.fail("saved with another number of rows");
    if (r.get_u64() != opt_.sync_first || r.get_u64() != opt_.sync_every)
      r.fail("saved with another sync schedule");
    std::uint64_t const t = r.get_u64(), ts = r.get_u64();
    std::vector<float> m = r.get_floats(), loc = r.get_floats(), synced = r.get_floats();
    if ((t == 0) != m.empty() ||
        ts != (t == 0 ? 0 : detail::factored_last_sync(t, opt_.sync_first, opt_.sync_every)))
      r.fail("its step count and last sync do not match the schedule");
    if (opt_.rows != 0 && m.size() % opt_.rows != 0)
      r.fail("its size is not a multiple of its rows");
    std::size_t const nstat = t == 0 ? 0 : detail::factored_stat_size(m.size(), opt_.rows);
    if (loc.size() != nstat || synced.size() != nstat) r.fail("its statistics have the wrong size");
    two_way_type tw = tw_;
    std::vector<std::byte> const tstate = r.get_bytes();
    tw.load(tstate);
    r.expect_end();
    t_ = t;
    t_sync_ = ts;
    m_ = std::move(m);
    loc_ = std::move(loc);
    synced_ = std::move(synced);
    factors_ = {};
    tw_ = std::move(tw);
  }

 private:
  factored_onebit_adam_options opt_;
  two_way_type tw_;
  std::uint64_t t_ = 0, t_sync_ = 0;
  std::vector<float> m_;        // the agreed momentum
  std::vector<float> loc_;      // this rank's statistics
  std::vector<float> synced_;   // the statistics of the last sync (every rank alike)
  detail::factored_denominators factors_;  // sqrt factors of synced_, cached per sync
  std::vector<float> local_, next_;
};

GRADCOMP_NAMESPACE_END
