// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `calibrated_onebit_adam`: compressed Adam without a warm-up that reaches All-Reduce Adam's
/// accuracy with onebit at about 30x fewer bytes (docs/training.md, "Calibrated 1-bit Adam").
/// It keeps `factored_onebit_adam`'s factored second moment and schedule and changes two
/// things, each measured in the training example:
///
/// 1. **Error feedback on each rank's exact momentum.** 1-bit Adam (and
///    `factored_onebit_adam`) builds the next local momentum on the decoded one,
///    m_w <- b1 * D(...) + (1-b1) * g_w, so a compression error enters the momentum recursion
///    and the parameters move by (1/(1-b1)) times the residual (10x) before error feedback
///    takes it back. Here every rank keeps its own exact momentum m_w <- b1*m_w + (1-b1)*g_w
///    and sends it through the two-way collective with worker and server error feedback; the
///    decoded mean m^ is used for the update only. With error feedback the deliveries then
///    telescope: sum_t m^_t = sum_t mean_w m_w,t - (the residuals now), so the parameters are
///    off by lr * residual / d at any time, not ten times that.
/// 2. **A second moment calibrated to the mean gradient.** The factored statistics are of each
///    rank's own gradient (batch b), but All-Reduce Adam's v is the second moment of the mean
///    over W ranks (batch W*b): where gradient noise dominates, E[g_w^2] is up to W times
///    E[gbar^2] and the steps are up to sqrt(W) times too small. The ranks estimate, per
///    tensor, rho = E||gbar||^2 / mean_w E||g_w||^2 and scale v by it. ||gbar||^2 comes from a
///    count sketch: element i adds s_t(i) * g_w,i to bucket h(i) of k, with random signs
///    s_t(i) = +-1 drawn afresh each step from Philox (seed, step, tensor id: the same on every
///    rank); the ranks sum their k buckets in one float32 all-reduce (with ||g_w||^2 as a
///    (k+1)-th float), and since the sketch is linear the summed buckets are the sketch of the
///    mean gradient, whose squared norm is an unbiased estimate of ||gbar||^2 (the cross
///    terms have random signs). rho = A / B with A, B the b2-averages of the two, clamped to
///    [1/W, 1] (a mean cannot have more energy than its terms on average, nor, for independent
///    noise, less than 1/W of it).
/// 3. **A precise estimate where it weighs most.** A and B are sums over all steps so far,
///    each step weighted by its gradient's energy, and the first steps' gradients are the
///    largest: an error of their sketches stays in rho for the whole run. The sketch therefore
///    has `sketch_first` buckets (1024) at the steps t <= sync_first and `sketch` (64) after,
///    at most one bucket per element, and the buckets are h(i) = floor(k * frac(i * phi))
///    (`sketch_bucket`) rather than i mod k, which for a row-major matrix whose row length k
///    divides (or that divides k) puts whole columns (one column) into a bucket, so that the
///    buckets' energies, and the estimate's variance (about 2 sum_b E_b^2), follow the
///    columns' spread. In the training example the per-tensor rho of W_1 was 40 % low at step 1
///    with 64 buckets i mod 64 and is within about 7 % of the exact ratio at every step now
///    (docs/training.md).
///
/// Per iteration t = 1, 2, ... on every rank w (W ranks, local gradient g_w):
/// ```
///   g_w <- g_w + wd*x  (L2)   or   x <- x * (1 - lr*wd)  (decoupled, at the update)
///   m_w <- b1*m_w + (1-b1)*g_w                       this rank's exact momentum, kept
///   R_w, C_w (or V_w) <- b2-averages of the row and column sums of g_w*g_w   (as factored)
///   k = sketch_first if t <= sync_first else sketch      (at most n; with k = n, h(i) = i)
///   z_w[b] = sum_{h(i) = b} s_t(i) * g_w,i,  q_w = ||g_w||^2           k + 1 floats
///   (z, q) <- sum_w (z_w, q_w)                       float32 all-reduce, every step
///   A <- b2*A + (1-b2) * ||z / W||^2,  B <- b2*B + (1-b2) * q / W,  rho = clamp(A/B, 1/W, 1)
///   if sync(t): (R, C) or V <- mean_w of the statistics, T <- t        (as factored)
///   two-way all-reduce of m_w with worker and server error feedback; m^ = D(c~) * (1/W)
///   x <- x - (lr / (1 - b1^t)) * clip(m^ / (sqrt(rho * v) / sqrt(1 - b2^T) + eps), -B, B)
/// ```
/// with v_ij = R_i C_j / sum R (matrix) or V_i (vector) of the last sync and B Adam's own
/// bound on |m / sqrt(v)| (`detail::adam_update_bound`), as in `factored_onebit_adam`. All
/// ranks apply the same m^, rho and v, so they hold the same parameters; only m_w, the
/// statistics and the worker residuals are a rank's own. `sketch` = 0 turns the calibration
/// off (rho = 1, no sketch all-reduce).
///
/// Bytes per step and rank (`wire_bytes`): the two-way collective of the momentum (what
/// `factored_onebit_adam` pays), the ring all-reduce of k + 1 floats (2(W-1)/W * 4(k+1)
/// bytes, 390 bytes for k = 64 on 4 ranks, 6150 for k = 1024), and on a sync step that of the
/// statistics. For the training example (6 tensors, 100 steps, 4 ranks) the sketches add
/// 0.31 MB to the 25.9 MB of `factored_onebit_adam` (0.11 MB of it at steps 1..4), and the
/// statistics' syncs every 4 steps (`sync_every`, 28 syncs in 100 steps where
/// `factored_onebit_adam`'s 8 make 16) 0.39 MB more: 26.5 MB, 30.2x fewer bytes than
/// All-Reduce Adam. The shorter period spends the byte budget's remainder on a fresher v
/// (docs/training.md, "Fresher second moments").
///
/// Float32 parameters and gradients; one object per parameter span (a layer's weight matrix,
/// `rows` rows of size / rows columns, row-major; or a vector with `rows` = 0), the two-way
/// state keyed by the tensor id. `save` / `load` ("GCCA" v2) hold everything.

#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/optim/adam.hpp>
#include <gradcomp/optim/factored_onebit_adam.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Options of `calibrated_onebit_adam`.
struct calibrated_onebit_adam_options {
  adam_options adam{};  ///< lr, betas, eps, weight decay (Adam's meaning)
  /// Rows of the parameter matrix (row-major, size / rows columns): its second moment is
  /// factored into row and column statistics. 0: a vector (bias), one v per coordinate.
  std::size_t rows = 0;
  /// The ranks average their statistics at every step t <= sync_first (>= 1: step 1 needs a v).
  std::uint64_t sync_first = 4;
  /// ... and then every `sync_every` steps (t = sync_first + k * sync_every); 0: never again.
  /// 4, half of `factored_onebit_adam`'s period (file comment).
  std::uint64_t sync_every = 4;
  /// Buckets k of the count sketch that calibrates v to the mean gradient (at most one per
  /// element); 0: no calibration.
  std::size_t sketch = 64;
  /// Buckets of the sketch at steps t <= sync_first instead of `sketch` (at most one per
  /// element; 0: `sketch` there too). The gradients are largest there, so these steps weigh
  /// most in the b2-averages A and B, and an error of their estimates stays in rho for the
  /// rest of the run (file comment).
  std::size_t sketch_first = 1024;
  /// Seed of the sketch's random signs (every rank must pass the same).
  std::uint64_t seed = 0;
};

/// 1-bit Adam with exact local momenta under error feedback and a factored second moment
/// calibrated to the mean gradient, no warm-up (file comment).
template <codec_operations Codec>
class calibrated_onebit_adam {
 public:
  using two_way_type = two_way_compressor<Codec>;

  /// `config_error` for `sync_first` = 0 or invalid Adam options.
  explicit calibrated_onebit_adam(Codec codec, calibrated_onebit_adam_options o)
      : opt_(o), tw_(std::move(codec)) {
    opt_.adam.validate();
    if (o.sync_first == 0) {
      throw config_error(
          "gradcomp: calibrated_onebit_adam needs sync_first >= 1 (the first step's update needs "
          "the ranks' second moment), got 0");
    }
  }

  /// Whether the ranks average their statistics at step `t` (1-based; file comment).
  [[nodiscard]] bool sync_at(std::uint64_t t) const noexcept {
    return detail::factored_sync_at(t, opt_.sync_first, opt_.sync_every);
  }

  /// The sign s_t(i) in {-1, +1} that element `i` of tensor `id` gets in the sketch of step
  /// `t`: bit i % 128 of Philox4x32-10 at counter (i / 128, step, id) under the seed.
  [[nodiscard]] float sketch_sign(std::uint64_t t, std::uint32_t id, std::size_t i) const noexcept {
    philox_block const b = sign_block(t, id, i / 128);
    return sign_bit(b, i) ? -1.0f : 1.0f;
  }

  /// One iteration as a collective (file comment): every rank passes the same size, tensor id
  /// and codec. Returns the bytes of the step's collectives (`packet_bytes`: this rank's
  /// payload; `wire_bytes`: its modeled ring traffic), the sketch's and statistics'
  /// all-reduces included. `config_error` for a size other than the earlier steps' or not a
  /// multiple of `rows`; the state is then unchanged.
  template <communicator Comm>
  collective_result step(Comm& comm, std::span<float> x, tensor_view<float const> g,
                         codec_context const& ctx = {}) {
    std::size_t const n = x.size();
    detail::check_step_spans(n, g.size(), m_.size(), "calibrated_onebit_adam");
    detail::check_factored_rows(n, opt_.rows, "calibrated_onebit_adam");
    std::size_t const nstat = detail::factored_stat_size(n, opt_.rows);
    auto const w = static_cast<std::size_t>(comm.size());
    float const inv = 1.0f / static_cast<float>(w);
    std::uint64_t const t = t_ + 1;
    detail::adam_coefficients c = detail::adam_coefficients_for(opt_.adam, t);
    std::span<float const> const gs = g.span();
    std::size_t const k = sketch_buckets(t, n);

    // this rank's momentum, statistics and sketch of this step (committed with the step)
    local_.resize(n);
    std::vector<double> sq(nstat, 0.0);
    std::vector<float> zq(k + 1, 0.0f);  // k buckets, then ||g_w||^2
    double norm2 = 0.0;
    std::size_t const rows = opt_.rows, cols = rows != 0 ? n / rows : 0;
    std::size_t row = 0, col = 0;  // element i's (matrix), advanced without a division
    philox_block signs{};
    auto const id = static_cast<std::uint32_t>(g.id());
    for (std::size_t i = 0; i < n; ++i) {
      float xi = x[i];
      float const gi = detail::adam_decay(xi, gs[i], c);  // L2: wd*x joins the gradient
      local_[i] = c.b1 * (m_.empty() ? 0.0f : m_[i]) + c.c1 * gi;
      double const q = static_cast<double>(gi) * gi;
      norm2 += q;
      if (k != 0) {
        if (i % 128 == 0) signs = sign_block(t, id, i / 128);
        zq[sketch_bucket(i, k, n)] += sign_bit(signs, i) ? -gi : gi;
      }
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
    collective_result r;
    double a = a_, b = b_;
    if (k != 0) {  // the sketch of the mean gradient and the ranks' mean energy
      zq[k] = static_cast<float>(norm2);
      comm.all_reduce(std::as_writable_bytes(std::span<float>(zq)), comm_type::f32,
                      reduce_op::sum);
      double z2 = 0.0;
      for (std::size_t j = 0; j < k; ++j) {
        double const zj = static_cast<double>(zq[j]) / static_cast<double>(w);
        z2 += zj * zj;
      }
      double const b2 = opt_.adam.beta2;
      a = b2 * a + (1.0 - b2) * z2;
      b = b2 * b + (1.0 - b2) * static_cast<double>(zq[k]) / static_cast<double>(w);
      r.packet_bytes += zq.size() * sizeof(float);
      r.wire_bytes += detail::ring_all_reduce_bytes(zq.size() * sizeof(float), comm.size());
    }
    bool const sync = sync_at(t);
    std::vector<float> mean;
    if (sync) {  // the ranks' statistics, averaged: the same on every rank
      mean = detail::factored_statistics_mean(comm, loc);
      r.packet_bytes += nstat * sizeof(float);
      r.wire_bytes += detail::ring_all_reduce_bytes(nstat * sizeof(float), comm.size());
    }
    next_.resize(n);
    collective_options co;
    co.op = reduction::sum;
    collective_result const rt = all_reduce_two_way(
        comm, tw_, tensor_view<float const>(std::span<float const>(local_), g.id()),
        std::span<float>(next_), ctx, co);
    r.path = rt.path;
    r.packet_bytes += rt.packet_bytes;
    r.wire_bytes += rt.wire_bytes;
    // the collectives succeeded: commit (the same values on every rank, except m_ and loc_)
    if (m_.empty()) m_.assign(n, 0.0f);
    m_.swap(local_);
    loc_ = std::move(loc);
    a_ = a;
    b_ = b;
    if (sync) {
      synced_ = std::move(mean);
      t_sync_ = t;
    }
    c.bc2_sqrt = detail::adam_coefficients_for(opt_.adam, t_sync_).bc2_sqrt;
    float const bound = detail::adam_update_bound(opt_.adam);
    float const calib = static_cast<float>(std::sqrt(calibration(w)));
    std::vector<float> const& f = factors_.of(synced_, opt_.rows, t_sync_);
    decoded_.resize(n);
    row = col = 0;
    for (std::size_t i = 0; i < n; ++i) {
      float const mi = w > 1 ? next_[i] * inv : next_[i];
      decoded_[i] = mi;
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
      float const denom = calib * root / c.bc2_sqrt + c.eps;
      x[i] = xi - c.step_size * std::clamp(mi / denom, -bound, bound);
    }
    t_ = t;
    return r;
  }

  /// Steps taken.
  [[nodiscard]] std::uint64_t steps() const noexcept { return t_; }
  /// The step of the last sync (0 before the first step).
  [[nodiscard]] std::uint64_t last_sync() const noexcept { return t_sync_; }
  [[nodiscard]] calibrated_onebit_adam_options const& options() const noexcept { return opt_; }
  [[nodiscard]] double lr() const noexcept { return opt_.adam.lr; }
  /// Sets the learning rate of the next steps (finite, >= 0).
  void set_lr(double lr) {
    adam_options a = opt_.adam;
    a.lr = lr;
    a.validate();
    opt_.adam = a;
  }
  /// This rank's exact momentum (b1-average of its own gradients).
  [[nodiscard]] std::span<float const> local_momentum() const noexcept { return m_; }
  /// The momentum the last update used: the decoded mean of the ranks' momenta.
  [[nodiscard]] std::span<float const> decoded_momentum() const noexcept { return decoded_; }
  /// The statistics the ranks agreed on at the last sync (layout of `factored_onebit_adam`).
  [[nodiscard]] std::span<float const> agreed_statistics() const noexcept { return synced_; }
  /// This rank's own statistics, updated every step.
  [[nodiscard]] std::span<float const> local_statistics() const noexcept { return loc_; }
  /// The bucket of element `i` of a tensor of `n` elements in a sketch of `k` buckets (0 < k <=
  /// n): i itself where k = n, else floor(k * frac(i * phi)), phi the golden ratio (Fibonacci
  /// hashing). It spreads every arithmetic progression of indices, a matrix column included,
  /// evenly over the buckets, where i mod k would put whole columns into one bucket (k divides
  /// the row length) or one column alone into a bucket (the row length divides k), and the
  /// estimate's variance grows with the spread of the buckets' energies.
  [[nodiscard]] static std::size_t sketch_bucket(std::size_t i, std::size_t k,
                                                 std::size_t n) noexcept {
    if (k == n) return i;
    std::uint64_t const h = static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull;
    return static_cast<std::size_t>(((h >> 32) * static_cast<std::uint64_t>(k)) >> 32);
  }
  /// Buckets of the sketch at step `t` (1-based) for a tensor of `n` elements: `sketch_first`
  /// at t <= sync_first (where it is not 0), else `sketch`; at most n; 0 without calibration.
  [[nodiscard]] std::size_t sketch_buckets(std::uint64_t t, std::size_t n) const noexcept {
    if (opt_.sketch == 0) return 0;
    std::size_t const k =
        t <= opt_.sync_first && opt_.sketch_first != 0 ? opt_.sketch_first : opt_.sketch;
    return std::min(k, n);
  }
  /// The b2-averages A (of the sketched ||gbar||^2) and B (of the ranks' mean ||g_w||^2).
  [[nodiscard]] std::pair<double, double> energies() const noexcept { return {a_, b_}; }
  /// rho = clamp(A / B, 1/W, 1) for `ranks` = W ranks; 1 without a sketch or before step 1.
  [[nodiscard]] double calibration(std::size_t ranks) const noexcept {
    if (opt_.sketch == 0 || !(b_ > 0.0)) return 1.0;
    double const lo = 1.0 / static_cast<double>(std::max<std::size_t>(ranks, 1));
    return std::clamp(a_ / b_, lo, 1.0);
  }
  /// The uncalibrated factored second moment of the last sync, written out (v_ij or V_i).
  [[nodiscard]] std::vector<float> second_moment() const {
    return detail::factored_second_moment(synced_, opt_.rows);
  }
  /// The two-way state: codecs and both sides' residuals (momentum units), keyed by shard.
  [[nodiscard]] two_way_type const& two_way() const noexcept { return tw_; }

  /// Serializes the whole state ("GCCA" v2: rows, schedule, sketch sizes and seed, step count,
  /// last sync, A, B, m_w, the decoded momentum, this rank's and the agreed statistics, then
  /// the two-way state "GCTW").
  [[nodiscard]] std::vector<std::byte> save() const {
    detail::byte_writer w;
    w.begin("GCCA", 2);
    w.put_u64(opt_.rows);
    w.put_u64(opt_.sync_first);
    w.put_u64(opt_.sync_every);
    w.put_u64(opt_.sketch);
    w.put_u64(opt_.sketch_first);
    w.put_u64(opt_.seed);
    w.put_u64(t_);
    w.put_u64(t_sync_);
    w.put_f64(a_);
    w.put_f64(b_);
    w.put_floats(m_);
    w.put_floats(decoded_);
    w.put_floats(loc_);
    w.put_floats(synced_);
    w.put_bytes(tw_.save());
    return w.finish();
  }

  /// Restores `save`'s bytes into an optimizer with the same options and codec; `format_error`
  /// for a malformed or mismatched state, which is then unchanged.
  void load(std::span<std::byte const> bytes) {
    detail::byte_reader r(bytes, "GCCA", 2, "calibrated_onebit_adam state");
    if (r.get_u64() != opt_.rows) r.fail("saved with another number of rows");
    if (r.get_u64() != opt_.sync_first || r.get_u64() != opt_.sync_every)
      r.fail("saved with another sync schedule");
    if (r.get_u64() != opt_.sketch || r.get_u64() != opt_.sketch_first ||
        r.get_u64() != opt_.seed)
      r.fail("saved with other sketch sizes or another seed");
    std::uint64_t const t = r.get_u64(), ts = r.get_u64();
    double const a = r.get_f64(), b = r.get_f64();
    std::vector<float> m = r.get_floats(), dec = r.get_floats(), loc = r.get_floats(),
                       synced = r.get_floats();
    if ((t == 0) != m.empty() || dec.size() != m.size() ||
        ts != (t == 0 ? 0 : detail::factored_last_sync(t, opt_.sync_first, opt_.sync_every)))
      r.fail("its step count, last sync and momenta do not match");
    if (opt_.rows != 0 && m.size() % opt_.rows != 0)
      r.fail("its size is not a multiple of its rows");
    std::size_t const nstat = t == 0 ? 0 : detail::factored_stat_size(m.size(), opt_.rows);
    if (loc.size() != nstat || synced.size() != nstat) r.fail("its statistics have the wrong size");
    if (!(std::isfinite(a) && std::isfinite(b) && a >= 0.0 && b >= 0.0))
      r.fail("its sketch energies are not finite and >= 0");
    two_way_type tw = tw_;
    std::vector<std::byte> const tstate = r.get_bytes();
    tw.load(tstate);
    r.expect_end();
    t_ = t;
    t_sync_ = ts;
    a_ = a;
    b_ = b;
    m_ = std::move(m);
    decoded_ = std::move(dec);
    loc_ = std::move(loc);
    synced_ = std::move(synced);
    factors_ = {};
    tw_ = std::move(tw);
  }

 private:
  // Whether element i's sign is -1: bit i % 32 of word (i % 128) / 32 of its group's block.
  static bool sign_bit(philox_block const& b, std::size_t i) noexcept {
    return ((b[static_cast<unsigned>((i % 128) / 32)] >> (i % 32)) & 1u) != 0;
  }

  [[nodiscard]] philox_block sign_block(std::uint64_t t, std::uint32_t id,
                                        std::uint64_t group) const noexcept {
    philox_block const ctr{static_cast<std::uint32_t>(group),
                           static_cast<std::uint32_t>(group >> 32),
                           static_cast<std::uint32_t>(t), id};
    philox_key const key{static_cast<std::uint32_t>(opt_.seed),
                         static_cast<std::uint32_t>(opt_.seed >> 32)};
    return philox4x32<10>(ctr, key);
  }

  calibrated_onebit_adam_options opt_;
  two_way_type tw_;
  std::uint64_t t_ = 0, t_sync_ = 0;
  double a_ = 0.0, b_ = 0.0;    // b2-averages of ||gbar||^2 (sketched) and mean_w ||g_w||^2
  std::vector<float> m_;        // this rank's exact momentum
  std::vector<float> decoded_;  // the decoded mean momentum of the last step
  std::vector<float> loc_;      // this rank's statistics
  std::vector<float> synced_;   // the statistics of the last sync (every rank alike)
  detail::factored_denominators factors_;  // sqrt factors of synced_, cached per sync
  std::vector<float> local_, next_;
};

GRADCOMP_NAMESPACE_END
