// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The data-parallel training loop of the example. Every rank holds the whole model and its
/// own shard of the training set (rank r of N: examples [r·n/N, (r+1)·n/N)). A step is:
///
///   1. draw this rank's batch from its shard;
///   2. forward, loss, backward: one gradient tensor per parameter tensor;
///   3. `gradient_exchange::exchange`: compress / communicate / average (exchange.hpp);
///   4. SGD with momentum on the averaged gradient, identical on every rank.
///
/// That is `optimizer_kind::sgd`, the default. The other optimizers come from gradcomp and work
/// on one flat float span, so the loop keeps a flat copy x of the parameters and flattens the
/// gradients each step (two copies of 5 MB per step at the default size, small next to the
/// forward and backward passes; the model's per-layer tensors stay as they are):
///
///   adam       All-Reduce Adam: steps 1-3 as above (any codec), then `gradcomp::adam` on the
///              averaged gradient;
///   cadam      compressed Adam (BytePS-Compress): `gradcomp::compressed_adam`, i.e.
///              `all_reduce_two_way` with worker and server error feedback, corrected for
///              learning-rate changes, then Adam on the decoded aggregate; with the identity
///              codec it equals `adam` bit for bit;
///   onebitadam 1-bit Adam's scheme (`gradcomp::onebit_adam`): `warmup` steps of exact Adam
///              (dense all-reduce), then the second moment frozen and the momentum sent
///              through `all_reduce_two_way` with the codec and error feedback on both sides;
///              with `factored_variance`, `gradcomp::factored_onebit_adam` instead: no
///              warm-up, the momentum compressed from step 1, Adafactor's factored second
///              moment (row and column statistics of each weight matrix, per coordinate for
///              the biases) averaged by the ranks at steps 1..sync_first and every sync_every;
///   calibadam  calibrated 1-bit Adam (`gradcomp::calibrated_onebit_adam`): no warm-up, each
///              rank's exact momentum through `all_reduce_two_way` with error feedback on both
///              sides, the factored v of `--variance factored` (averaged at steps
///              1..sync_first and every sync_every, 4 by default here) scaled by the
///              ratio of the mean gradient's energy to the ranks' (a count sketch of 64
///              floats per layer, 1024 at steps 1..sync_first, all-reduced every step), per
///              layer;
///   dadam      decentralized Adam: no gradient exchange; `decentralized_optimizer<adam,
///              comm_mixer>` gossips the parameters over `topology`, overlapped with the next
///              forward and backward pass (the gradient is taken at the rank's own un-mixed x);
///   accumadam  the same with `accum_adam` (window `accum`);
///   dpsgd      the same with `gradcomp::sgd` (momentum SGD): D-PSGD.
///
/// Decentralized ranks hold different parameters: evaluation uses their average, computed by an
/// all-reduce into a separate copy (the training state is not touched), and the result reports
/// the consensus distance at the end.
///
/// Initial weights come from one seed on every rank and are broadcast from rank 0 anyway, as a
/// real launcher would. `train_reference` trains the same model in one process on the union of
/// the ranks' batches; with dense exchange the two agree to rounding (the tests check it).

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/comm/any_communicator.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/optim/adam.hpp>
#include <gradcomp/optim/calibrated_onebit_adam.hpp>
#include <gradcomp/optim/comm_mixer.hpp>
#include <gradcomp/optim/compressed_adam.hpp>
#include <gradcomp/optim/decentralized.hpp>
#include <gradcomp/optim/factored_onebit_adam.hpp>
#include <gradcomp/optim/onebit_adam.hpp>
#include <gradcomp/optim/sgd.hpp>
#include <gradcomp/topology/topology.hpp>

#include "data.hpp"
#include "exchange.hpp"
#include "mlp.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace train {

/// The optimizer of a run (file comment).
enum class optimizer_kind { sgd, adam, cadam, onebitadam, calibadam, dadam, accumadam, dpsgd };

/// Spec name of an optimizer ("sgd", "adam", "cadam", "onebitadam", "calibadam", "dadam",
/// "accumadam", "dpsgd").
inline char const* optimizer_name(optimizer_kind k) noexcept {
  switch (k) {
    case optimizer_kind::sgd: return "sgd";
    case optimizer_kind::adam: return "adam";
    case optimizer_kind::cadam: return "cadam";
    case optimizer_kind::onebitadam: return "onebitadam";
    case optimizer_kind::calibadam: return "calibadam";
    case optimizer_kind::dadam: return "dadam";
    case optimizer_kind::accumadam: return "accumadam";
    case optimizer_kind::dpsgd: return "dpsgd";
  }
  return "?";
}

/// Parses an optimizer name; throws `config_error` for anything else.
inline optimizer_kind parse_optimizer(std::string_view s) {
  for (auto k : {optimizer_kind::sgd, optimizer_kind::adam, optimizer_kind::cadam,
                 optimizer_kind::onebitadam, optimizer_kind::calibadam, optimizer_kind::dadam,
                 optimizer_kind::accumadam, optimizer_kind::dpsgd}) {
    if (s == optimizer_name(k)) return k;
  }
  throw gradcomp::config_error(
      "train: unknown optimizer '" + std::string(s) +
      "'; expected sgd, adam, cadam, onebitadam, calibadam, dadam, accumadam or dpsgd");
}

/// Warm-up of `onebitadam` when none is given: 2 % of the steps (at least 1), so that the dense
/// warm-up costs at most what a 1/50 share of the steps costs; docs/training.md gives the
/// measurements behind it.
inline std::size_t default_onebit_warmup(std::size_t steps) {
  return std::max<std::size_t>(1, steps / 50);
}

/// Whether `e` sends scaled signs with error feedback (onebit with its default mean-|x| scale):
/// the exchange whose learning rate `scaled_sign_lr_cap` bounds.
inline bool scaled_sign_with_feedback(exchange_options const& e) {
  std::string_view const c = e.codec;
  return e.error_feedback && c.substr(0, c.find(':')) == "onebit" &&
         c.find("scaling=none") == std::string_view::npos;
}

/// The residual amplification of scaled sign with error feedback: with δ = ‖C(p)‖² / ‖p‖²
/// (C(p) = ‖p‖₁/n · sign(p) is the projection of p on sign(p)), the residual keeps
/// ‖e'‖ = √(1−δ)·‖g + e‖, so it settles at up to A(δ) = √(1−δ) / (1 − √(1−δ)) ≈ 2/δ times the
/// gradient (docs/training.md, "A safe learning rate for scaled sign with error feedback").
inline double sign_residual_amplification(double delta) {
  double const q = std::sqrt(std::max(0.0, 1.0 - delta));
  return q / (1.0 - q);
}

/// The rule: the largest learning rate for scaled sign with error feedback is the dense one
/// divided by A(δ), δ measured on the first gradient; never above the dense one.
inline double scaled_sign_lr_cap(double lr, double delta) {
  double const a = sign_residual_amplification(delta);
  return a > 1.0 ? lr / a : lr;
}

/// Whether `e` sends top-k (`topk`, `approx_topk`) with error feedback: the exchange whose
/// momentum `fold_momentum` folds into the learning rate.
inline bool topk_with_feedback(exchange_options const& e) {
  std::string_view const c = e.codec;
  std::string_view const name = c.substr(0, c.find(':'));
  return e.error_feedback && (name == "topk" || name == "approx_topk");
}

/// The momentum rule for top-k with error feedback (docs/training.md, "Momentum after a delay:
/// why top-k with error feedback failed"): heavy-ball momentum β on a gradient that error
/// feedback already delays puts a second integrator behind the residual's, so no momentum
/// buffer is kept and the learning rate takes the momentum's gain instead, with heavy ball's
/// own start: at step t (from 0), lr · (1 − β^(t+1)) / (1 − β), what momentum SGD moves for a
/// constant gradient. Step 0 is `lr` itself; the rate reaches lr / (1 − β) within a few
/// 1 / (1 − β) steps. `lr` is the step's scheduled rate (decay included).
inline double folded_learning_rate(double lr, double beta, std::size_t step) {
  if (beta <= 0.0) return lr;
  return lr * (1.0 - std::pow(beta, static_cast<double>(step) + 1.0)) / (1.0 - beta);
}

/// Whether the optimizer gossips parameters instead of exchanging gradients.
inline bool is_decentralized(optimizer_kind k) noexcept {
  return k == optimizer_kind::dadam || k == optimizer_kind::accumadam || k == optimizer_kind::dpsgd;
}

/// Learning rate of the Adam family when none is given: the best of the values tried for
/// All-Reduce Adam on the synthetic task with 4 workers (300 steps: 95.41, 95.53, 95.02 % for
/// 1e-3, 3e-3, 1e-2; 150 steps: 91.14, 94.48, 95.21, 94.34 % for 3e-4 ... 1e-2); DAdam also does
/// better at 3e-3 than at 1e-3. docs/training.md.
inline constexpr double default_adam_lr = 3e-3;

/// The gossip topology of `spec` over `n` ranks: "exp", "ring", "complete", "static-ring" or
/// "aer:ranks_per_node=P". Throws `config_error` for a malformed spec or a size the topology
/// does not support.
inline gradcomp::topology make_topology(std::string const& spec, int n) {
  std::size_t const colon = spec.find(':');
  std::string const name = spec.substr(0, colon);
  if (name == "aer") {
    std::string const arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
    std::string_view const key = "ranks_per_node=";
    char* end = nullptr;
    long const p = arg.rfind(key, 0) == 0 ? std::strtol(arg.c_str() + key.size(), &end, 10) : 0;
    if (arg.rfind(key, 0) != 0 || end == arg.c_str() + key.size() || *end != '\0' || p < 1) {
      throw gradcomp::config_error("train: topology '" + spec +
                                   "': aer wants aer:ranks_per_node=P with P >= 1");
    }
    return gradcomp::topology::alternating_exp_ring(n, static_cast<int>(p));
  }
  if (colon != std::string::npos) {
    throw gradcomp::config_error("train: topology '" + spec + "': only aer takes parameters");
  }
  return gradcomp::topology::from_name(name, n);
}

/// Everything a run needs besides the data and the communicator.
struct train_options {
  std::vector<std::size_t> hidden{1024, 512};  ///< hidden layer widths
  std::size_t steps = 600;
  std::size_t batch = 32;  ///< samples per worker per step
  double learning_rate = 0.05;
  double momentum = 0.9;
  double weight_decay = 0.0;
  double decay_at = 0.7;           ///< fraction of the steps after which the rate drops ...
  double decay = 0.1;              ///< ... by this factor (1 = never)
  std::size_t eval_every = 50;     ///< steps between points of the curve
  std::size_t eval_subset = 1024;  ///< test examples used at intermediate points (all at the end)
  std::uint64_t seed = 1;          ///< model and batch order
  /// Gradient pipeline of sgd and adam; cadam uses its `codec` ("dense" = "identity") and seed.
  exchange_options exchange;
  optimizer_kind optimizer = optimizer_kind::sgd;
  double beta1 = 0.9;            ///< Adam family
  double beta2 = 0.999;          ///< Adam family
  double eps = 1e-8;             ///< Adam family
  double adamw_decay = 0.0;      ///< Adam family: decoupled (AdamW) weight decay, all parameters
  std::string topology = "exp";  ///< decentralized: `make_topology` spec
  std::uint32_t accum = 4;       ///< accumadam: window T
  std::size_t warmup = 0;        ///< onebitadam: steps of exact Adam before v freezes (0: auto)
  bool refresh_variance = false;  ///< onebitadam: refresh v at 2T, 4T, ... (else frozen)
  bool compress_momentum = true;  ///< onebitadam: compress the momentum (else the gradient)
  /// onebitadam: compress the update m / d (d = sqrt(v)/sqrt(1-b2^T) + eps) rather than m: the
  /// better form for top-k; onebit does better with m (docs/training.md, "Compressed Adam").
  bool precondition = false;
  /// onebitadam: no warm-up; a factored second moment agreed at a schedule
  /// (`gradcomp::factored_onebit_adam`), the momentum compressed from step 1.
  bool factored_variance = false;
  std::size_t sync_first = 4;  ///< factored, calibadam: the ranks average v at steps 1..sync_first
  /// factored, calibadam: ... then every sync_every steps (0: never); unset: 8 for factored, 4
  /// for calibadam (`sync_every_of`; docs/training.md, "Fresher second moments")
  std::optional<std::size_t> sync_every;
  std::size_t sketch = 64;     ///< calibadam: count-sketch buckets per layer (0: no calibration)
  /// calibadam: count-sketch buckets per layer at steps 1..sync_first (0: `sketch` there too)
  std::size_t sketch_first = 1024;
  /// cadam: one optimizer per layer tensor (tensor id = its index), so that every tensor gets
  /// its own codec scale; false: one over the flat parameter vector (tensor id 0). onebitadam
  /// always runs per layer.
  bool per_layer = false;
  std::size_t global_average_every = 0;  ///< decentralized: exact averaging period (0: never)
  /// sgd with scaled sign and error feedback: cap the learning rate by `scaled_sign_lr_cap`
  /// (false: keep it, the cap is only printed).
  bool lr_cap = true;
  /// sgd with momentum over top-k with error feedback: fold the momentum into the learning
  /// rate (`folded_learning_rate`; false: momentum SGD as given, after the exchange).
  bool momentum_fold = true;
  bool overlap = true;  ///< decentralized: overlapped form (false: `step_blocking`)
};

/// One point of the curve, after `step` steps.
struct curve_point {
  std::size_t step = 0;
  double train_loss = 0.0;     ///< mean batch loss since the previous point, over all ranks
  double test_accuracy = 0.0;  ///< on the first `eval_subset` test examples (all at the end)
  double bytes = 0.0;          ///< cumulative bytes sent per worker (mean over ranks)
  double factor = 1.0;         ///< factor of the last step
  double gain = 1.0;  ///< mean of ‖C(g_ef)‖² / ‖g_ef‖² of what was sent since the previous point
  /// Seconds of training steps since the start (evaluation excluded), mean over ranks: the
  /// clock of a time-to-accuracy curve.
  double train_s = 0.0;
};

/// The outcome of a run (the same on every rank).
struct run_result {
  double test_accuracy = 0.0;  ///< final, on the whole test set
  double test_loss = 0.0;
  std::vector<curve_point> curve;
  double bytes_per_worker = 0.0;        ///< mean over ranks of the bytes each sent
  double dense_bytes_per_worker = 0.0;  ///< what dense float32 would have sent
  double compute_s = 0.0;               ///< forward + backward, mean over ranks
  double compress_s = 0.0;              ///< compression + decoding + statistics, mean over ranks
  double sync_s = 0.0;                  ///< time in collectives, mean over ranks
  double wall_s = 0.0;                  ///< whole training loop (evaluation included), slowest rank
  std::vector<double> factors;          ///< factor sent at each step
  std::vector<char> dense_steps;        ///< 1 where the step was sent dense
  std::size_t parameters = 0;
  std::string pipeline;  ///< `gradient_exchange::describe()`, or the optimizer's exchange
  /// Mean over ranks of the bytes each put on the wire for training (ring all-reduce 2(n-1)/n
  /// of the buffer, ring all-gather, gossip: parameters x peers; evaluation excluded).
  double wire_bytes_per_worker = 0.0;
  double step_s = 0.0;       ///< training steps only (no evaluation), slowest rank
  double comm_wait_s = 0.0;  ///< blocked in the exchange (mixer wait for gossip), mean over ranks
  /// Decentralized runs: mean over ranks of ‖x_i − x̄‖² / ‖x̄‖² after the last step (else 0).
  double consensus_distance = 0.0;
  /// What the run changed about its options, one line (empty: nothing); the learning-rate cap
  /// of scaled sign with error feedback.
  std::string note;
  /// The learning rate of step 0 the run used.
  double learning_rate = 0.0;
  /// The gradient pipeline's divergence guard at the end (sgd, adam): skipped and dense steps,
  /// and how close the untripped steps came to its limit (peak value / median per quantity).
  gradcomp::guard_counters guard{};
};

/// Learning rate of step `step`.
inline double learning_rate_at(train_options const& o, std::size_t step) {
  auto const at = static_cast<std::size_t>(o.decay_at * static_cast<double>(o.steps));
  return step >= at ? o.learning_rate * o.decay : o.learning_rate;
}

/// Whether the options fold momentum into the learning rate (`folded_learning_rate`): sgd
/// with momentum over top-k with error feedback, unless `momentum_fold` is off.
/// The statistics' sync period after step sync_first: `--sync-every` where given, else the
/// optimizer's default (`calibrated_onebit_adam_options` 4, `factored_onebit_adam_options` 8).
inline std::size_t sync_every_of(train_options const& o) {
  if (o.sync_every) return *o.sync_every;
  return o.optimizer == optimizer_kind::calibadam
             ? gradcomp::calibrated_onebit_adam_options{}.sync_every
             : gradcomp::factored_onebit_adam_options{}.sync_every;
}

inline bool folds_momentum(train_options const& o) {
  return o.optimizer == optimizer_kind::sgd && o.momentum > 0.0 && o.momentum_fold &&
         topk_with_feedback(o.exchange);
}

/// The rate the optimizer applies at `step`: `learning_rate_at`, folded where `folds_momentum`.
inline double applied_learning_rate(train_options const& o, std::size_t step) {
  double const lr = learning_rate_at(o, step);
  return folds_momentum(o) ? folded_learning_rate(lr, o.momentum, step) : lr;
}

/// The first and one-past-last training example of rank `rank` of `world`.
inline std::pair<std::size_t, std::size_t> shard(std::size_t n, int rank, int world) {
  auto const r = static_cast<std::size_t>(rank), w = static_cast<std::size_t>(world);
  return {n * r / w, n * (r + 1) / w};
}

/// Draws the batches of one rank: its shard in a fresh random order each epoch.
class batch_sampler {
 public:
  batch_sampler(std::size_t n, int rank, int world, std::uint64_t seed)
      : range_(shard(n, rank, world)),
        seed_(seed ^ (0x51ed270b9e3779b9ull * static_cast<std::uint64_t>(rank + 1))) {
    if (range_.second - range_.first == 0) {
      throw gradcomp::config_error("train: rank " + std::to_string(rank) + " of " +
                                   std::to_string(world) + " has no training examples (" +
                                   std::to_string(n) + " in all)");
    }
  }

  /// Example indices of step `step` (batches must be asked for in increasing step order to be
  /// cheap; any order gives the same answer).
  std::vector<std::size_t> batch(std::size_t step, std::size_t size) {
    std::size_t const len = range_.second - range_.first;
    std::vector<std::size_t> out(size);
    for (std::size_t i = 0; i < size; ++i) {
      std::size_t const pos = step * size + i;
      std::size_t const epoch = pos / len;
      if (epoch != epoch_ || order_.empty()) permute(epoch);
      out[i] = range_.first + order_[pos % len];
    }
    return out;
  }

 private:
  void permute(std::size_t epoch) {
    std::size_t const len = range_.second - range_.first;
    order_.resize(len);
    std::iota(order_.begin(), order_.end(), std::size_t{0});
    rng r(seed_ + 0x9e3779b97f4a7c15ull * (epoch + 1));
    for (std::size_t i = len; i > 1; --i) std::swap(order_[i - 1], order_[r.below(i)]);
    epoch_ = epoch;
  }

  std::pair<std::size_t, std::size_t> range_;
  std::uint64_t seed_;
  std::size_t epoch_ = 0;
  std::vector<std::size_t> order_;
};

/// Copies the examples `idx` of `d` into `x` / `y`.
inline void gather_batch(dataset const& d, std::span<std::size_t const> idx, std::vector<float>& x,
                         std::vector<std::uint8_t>& y) {
  x.resize(idx.size() * d.dim);
  y.resize(idx.size());
  for (std::size_t i = 0; i < idx.size(); ++i) {
    std::copy_n(d.x.data() + idx[i] * d.dim, d.dim, x.data() + i * d.dim);
    y[i] = d.y[idx[i]];
  }
}

/// Loss sum and correct count of `net` on examples [begin, end) of `d`.
inline std::pair<double, double> evaluate(mlp const& net, dataset const& d, std::size_t begin,
                                          std::size_t end) {
  workspace ws;
  double loss = 0.0, correct = 0.0;
  std::vector<std::size_t> idx;
  std::vector<float> x;
  std::vector<std::uint8_t> y;
  for (std::size_t i = begin; i < end; i += 256) {
    std::size_t const n = std::min<std::size_t>(256, end - i);
    idx.resize(n);
    std::iota(idx.begin(), idx.end(), i);
    gather_batch(d, idx, x, y);
    net.forward(x, n, ws);
    batch_result const r = net.loss(y, ws);
    loss += r.loss * static_cast<double>(n);
    correct += static_cast<double>(r.correct);
  }
  return {loss, correct};
}

/// The model of a run.
inline std::vector<std::size_t> model_sizes(train_options const& o, data_split const& data) {
  std::vector<std::size_t> sizes{data.train.dim};
  sizes.insert(sizes.end(), o.hidden.begin(), o.hidden.end());
  sizes.push_back(data.train.classes);
  return sizes;
}

/// The gradcomp Adam options of a run (learning rate of step 0).
inline gradcomp::adam_options adam_settings(train_options const& o) {
  gradcomp::adam_options a;
  a.lr = o.learning_rate;
  a.beta1 = o.beta1;
  a.beta2 = o.beta2;
  a.eps = o.eps;
  a.weight_decay = o.adamw_decay;
  a.decay = gradcomp::weight_decay_mode::decoupled;
  return a;
}

/// Copies per-layer tensors into one flat vector (resized).
inline void flatten(std::vector<std::vector<float>> const& t, std::vector<float>& flat) {
  std::size_t n = 0;
  for (auto const& v : t) n += v.size();
  flat.resize(n);
  auto at = flat.begin();
  for (auto const& v : t) at = std::copy(v.begin(), v.end(), at);
}

/// Copies a flat vector back into per-layer tensors of the same total size.
inline void unflatten(std::span<float const> flat, std::vector<std::vector<float>>& t) {
  std::size_t at = 0;
  for (auto& v : t) {
    std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(at), v.size(), v.begin());
    at += v.size();
  }
}

/// The optimizer's part of `check_options` (no data needed).
inline void check_optimizer_options(train_options const& o) {
  if (o.optimizer != optimizer_kind::sgd && o.optimizer != optimizer_kind::dpsgd) {
    adam_settings(o).validate();  // names the bad field
  }
  if (o.optimizer == optimizer_kind::accumadam && o.accum == 0) {
    throw gradcomp::config_error("train: accumadam needs an accumulation window >= 1, got 0");
  }
  if (o.factored_variance) {
    if (o.optimizer != optimizer_kind::onebitadam) {
      throw gradcomp::config_error("train: --variance factored applies to onebitadam only");
    }
    if (o.warmup != 0 || o.refresh_variance || o.precondition || !o.compress_momentum) {
      throw gradcomp::config_error(
          "train: --variance factored has no warm-up and compresses the momentum (no --warmup, "
          "--compress gradient or update)");
    }
  }
  if (o.optimizer == optimizer_kind::calibadam &&
      (o.warmup != 0 || o.refresh_variance || o.precondition || !o.compress_momentum)) {
    throw gradcomp::config_error(
        "train: calibadam has no warm-up and compresses the momentum (no --warmup, --variance "
        "refresh, --compress gradient or update)");
  }
  if ((o.factored_variance || o.optimizer == optimizer_kind::calibadam) && o.sync_first == 0) {
    throw gradcomp::config_error("train: --sync-first wants at least 1 (step 1 needs a v)");
  }
  if (o.global_average_every != 0 && !is_decentralized(o.optimizer)) {
    throw gradcomp::config_error(
        "train: --global-average-every applies to the decentralized optimizers (dadam, "
        "accumadam, dpsgd) only; " +
        std::string(optimizer_name(o.optimizer)) + " keeps every rank identical already");
  }
}

inline void check_options(train_options const& o, data_split const& data) {
  if (o.steps == 0 || o.batch == 0 || o.eval_every == 0) {
    throw gradcomp::config_error("train: steps, batch and eval_every must be positive");
  }
  if (!(o.learning_rate > 0.0) || !(o.decay > 0.0) || !(o.decay_at >= 0.0)) {
    throw gradcomp::config_error("train: the learning rate and its decay must be positive");
  }
  check_optimizer_options(o);
  if (data.train.dim != data.test.dim || data.train.classes != data.test.classes ||
      data.test.size() == 0) {
    throw gradcomp::config_error(
        "train: the training and test sets must have the same shape and a test set");
  }
}

/// The decentralized optimizers over a communicator (file comment).
template <class Local>
using gossip_optimizer =
    gradcomp::decentralized_optimizer<Local, gradcomp::comm_mixer<gradcomp::any_communicator>>;

/// Trains on rank `comm.rank()` of `comm.size()` (collective: every rank calls it with the
/// same options and data). Returns the same result on every rank; `final_params`, if given,
/// receives this rank's parameters after the last step.
inline run_result train_worker(gradcomp::any_communicator comm, data_split const& data,
                               train_options const& given,
                               std::vector<std::vector<float>>* final_params = nullptr) {
  train_options o = given;  // the learning-rate cap may change it
  using clock = std::chrono::steady_clock;
  auto since = [](clock::time_point t0) {
    return std::chrono::duration<double>(clock::now() - t0).count();
  };
  check_options(o, data);
  int const rank = comm.rank(), world = comm.size();
  mlp net(model_sizes(o, data), o.seed);
  for (auto& p : net.params()) {  // as a launcher would: rank 0's weights everywhere
    comm.broadcast(std::as_writable_bytes(std::span<float>(p)), 0);
  }
  optimizer_kind const kind = o.optimizer;
  bool const decentralized = is_decentralized(kind);
  bool const fold = folds_momentum(o);
  // the example's own SGD (kind sgd); no momentum buffer where the momentum is folded
  sgd opt(fold ? 0.0 : o.momentum, o.weight_decay);
  std::optional<gradient_exchange> ex;  // sgd and adam
  if (kind == optimizer_kind::sgd || kind == optimizer_kind::adam) ex.emplace(comm, o.exchange);
  std::optional<gradcomp::adam> adam_opt;  // adam: the same on every rank
  if (kind == optimizer_kind::adam) adam_opt.emplace(adam_settings(o));
  // cadam: two-way compression with worker and server error feedback, then Adam.
  // cadam and onebitadam hold one optimizer per parameter span: the flat vector, or each layer.
  std::vector<std::pair<std::size_t, std::size_t>> spans;  // (offset, size) in the flat vector
  if (o.per_layer || kind == optimizer_kind::onebitadam || kind == optimizer_kind::calibadam) {
    std::size_t at = 0;
    for (auto const& p : net.params()) {
      spans.emplace_back(at, p.size());
      at += p.size();
    }
  } else {
    spans.emplace_back(0, net.parameter_count());
  }
  std::vector<gradcomp::compressed_adam<gradcomp::any_codec>> cadam;
  gradcomp::codec_context cctx;
  cctx.parallel_threshold = std::numeric_limits<std::size_t>::max();  // ranks are threads already
  cctx.seed = o.exchange.seed;
  std::vector<gradcomp::onebit_adam<gradcomp::any_codec>> onebit;
  std::vector<gradcomp::factored_onebit_adam<gradcomp::any_codec>> factored;
  std::vector<gradcomp::calibrated_onebit_adam<gradcomp::any_codec>> calibrated;
  std::string const two_way_codec = o.exchange.codec == "dense" ? "identity" : o.exchange.codec;
  for (std::size_t k = 0; k < spans.size(); ++k) {
    if (kind == optimizer_kind::calibadam) {
      gradcomp::calibrated_onebit_adam_options co;
      co.adam = adam_settings(o);
      co.rows = k % 2 == 0 ? net.sizes()[k / 2] : 0;  // W_l: sizes[l] rows; b_l: a vector
      co.sync_first = o.sync_first;
      co.sync_every = sync_every_of(o);
      co.sketch = o.sketch;
      co.sketch_first = o.sketch_first;
      co.seed = o.exchange.seed;
      calibrated.emplace_back(gradcomp::make_codec(two_way_codec), co);
    } else if (kind == optimizer_kind::onebitadam && o.factored_variance) {
      gradcomp::factored_onebit_adam_options fo;
      fo.adam = adam_settings(o);
      fo.rows = k % 2 == 0 ? net.sizes()[k / 2] : 0;  // W_l: sizes[l] rows; b_l: a vector
      fo.sync_first = o.sync_first;
      fo.sync_every = sync_every_of(o);
      factored.emplace_back(gradcomp::make_codec(two_way_codec), fo);
    } else if (kind == optimizer_kind::onebitadam) {
      gradcomp::onebit_adam_options oo;
      oo.adam = adam_settings(o);
      oo.warmup = o.warmup != 0 ? o.warmup : default_onebit_warmup(o.steps);
      oo.refresh_variance = o.refresh_variance;
      oo.compress_momentum = o.compress_momentum;
      oo.precondition = o.precondition;
      onebit.emplace_back(gradcomp::make_codec(two_way_codec), oo);
    } else if (kind == optimizer_kind::cadam) {
      gradcomp::compressed_adam_options co;
      co.adam = adam_settings(o);
      cadam.emplace_back(gradcomp::make_codec(two_way_codec), co);
    }
  }
  std::variant<std::monostate, gossip_optimizer<gradcomp::adam>,
               gossip_optimizer<gradcomp::accum_adam>, gossip_optimizer<gradcomp::sgd>>
      gossip;
  std::string pipeline = ex ? ex->describe() : std::string();
  if (decentralized) {
    gradcomp::topology topo = make_topology(o.topology, world);
    pipeline = std::string("gossip of the parameters over topology ") + topo.name() +
               (o.overlap ? ", overlapped" : ", blocking");
    gradcomp::comm_mixer<gradcomp::any_communicator> mixer(comm, std::move(topo));
    if (kind == optimizer_kind::dadam) {
      gossip.emplace<1>(gradcomp::adam(adam_settings(o)), std::move(mixer));
    } else if (kind == optimizer_kind::accumadam) {
      gossip.emplace<2>(gradcomp::accum_adam(adam_settings(o), o.accum), std::move(mixer));
    } else {
      gradcomp::sgd_options so;
      so.lr = o.learning_rate;
      so.momentum = o.momentum;
      so.weight_decay = o.weight_decay;
      gossip.emplace<3>(gradcomp::sgd(so), std::move(mixer));
    }
  } else if (kind == optimizer_kind::calibadam) {
    pipeline = "no warm-up: each rank's exact momentum through two-way " + two_way_codec +
               " with worker and server error feedback, v factored and averaged at steps 1.." +
               std::to_string(o.sync_first) +
               (sync_every_of(o) != 0 ? " and every " + std::to_string(sync_every_of(o))
                                      : std::string(" only")) +
               (o.sketch != 0
                    ? ", calibrated by a " + std::to_string(o.sketch) +
                          "-bucket sketch of the mean gradient every step" +
                          (o.sketch_first != 0 ? " (" + std::to_string(o.sketch_first) +
                                                     " buckets at steps 1.." +
                                                     std::to_string(o.sync_first) + ")"
                                               : std::string())
                    : std::string(", uncalibrated")) +
               ", per layer";
  } else if (kind == optimizer_kind::onebitadam && o.factored_variance) {
    pipeline =
        "no warm-up: the momentum through two-way " + two_way_codec +
        " with worker and server error feedback from step 1, v factored (rows and "
        "columns of each matrix) and averaged at steps 1.." +
        std::to_string(o.sync_first) +
        (sync_every_of(o) != 0 ? " and every " + std::to_string(sync_every_of(o))
                               : std::string(" only")) +
        ", per layer";
  } else if (kind == optimizer_kind::onebitadam) {
    pipeline = std::to_string(onebit.front().options().warmup) +
               " steps of dense all-reduce Adam, then v " +
               (o.refresh_variance ? "refreshed at 2T, 4T, ..." : "frozen") + " and the " +
               (o.precondition        ? "update m/d"
                : o.compress_momentum ? "momentum"
                                      : "gradient") +
               " through two-way " + two_way_codec + " with worker and server error feedback" +
               ", per layer";
  } else if (kind == optimizer_kind::cadam) {
    pipeline = "two-way " + std::string(cadam.front().two_way().worker_codec().name()) +
               " all-reduce, worker and server error feedback (lr-corrected)";
  }
  auto on_gossip = [&](auto&& f) {
    std::visit(
        [&](auto& g) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(g)>, std::monostate>) f(g);
        },
        gossip);
  };

  batch_sampler sampler(data.train.size(), rank, world, o.seed);
  workspace ws;
  std::string note;
  if (kind == optimizer_kind::sgd && scaled_sign_with_feedback(o.exchange)) {
    // δ of the first gradient, over all ranks and tensors: Σ ‖g‖₁²/n / Σ ‖g‖² (energy-weighted,
    // what the pipeline reports as the gain of a scaled-sign step with a zero residual).
    std::vector<float> xs;
    std::vector<std::uint8_t> ys;
    std::vector<std::size_t> const first = sampler.batch(0, o.batch);
    gather_batch(data.train, first, xs, ys);
    net.forward(xs, o.batch, ws);
    (void)net.loss(ys, ws);
    net.backward(ws);
    double sums[2] = {0.0, 0.0};
    for (auto const& gr : net.grads()) {
      double l1 = 0.0, l2 = 0.0;
      for (float v : gr) {
        l1 += std::abs(static_cast<double>(v));
        l2 += static_cast<double>(v) * v;
      }
      sums[0] += l1 * l1 / static_cast<double>(gr.size());
      sums[1] += l2;
    }
    comm.all_reduce(std::as_writable_bytes(std::span<double>(sums)), gradcomp::comm_type::f64,
                    gradcomp::reduce_op::sum);
    double const delta = sums[1] > 0.0 ? sums[0] / sums[1] : 1.0;
    double const cap = scaled_sign_lr_cap(o.learning_rate, delta);
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "scaled sign + error feedback: delta = %.3f (||C(g)||^2/||g||^2 of the first "
                  "gradient), residual amplification A = %.2f, safe lr = lr / A = %.4g: ",
                  delta, sign_residual_amplification(delta), cap);
    note = buf;
    if (cap >= o.learning_rate) {
      std::snprintf(buf, sizeof buf, "lr %.4g kept", o.learning_rate);
    } else if (o.lr_cap) {
      std::snprintf(buf, sizeof buf, "lr capped from %.4g to %.4g (--no-lr-cap keeps it)",
                    o.learning_rate, cap);
    } else {
      std::snprintf(buf, sizeof buf, "lr %.4g kept (--no-lr-cap), above the safe value",
                    o.learning_rate);
    }
    note += buf;
    note += " (docs/training.md)";
    if (o.lr_cap) o.learning_rate = std::min(o.learning_rate, cap);
  }
  if (fold) {
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "top-k + error feedback: momentum %.3g folded into the learning rate, "
                  "lr_t = %.4g * (1 - %.3g^(t+1)) / (1 - %.3g) -> %.4g, no momentum buffer "
                  "(--no-momentum-fold keeps momentum SGD; docs/training.md)",
                  o.momentum, o.learning_rate, o.momentum, o.momentum,
                  o.learning_rate / (1.0 - o.momentum));
    if (!note.empty()) note += "; ";
    note += buf;
  }
  std::vector<float> x, g;  // flat parameters and gradient (not sgd)
  if (kind != optimizer_kind::sgd) flatten(net.params(), x);
  std::optional<mlp> avg_net;  // decentralized: the average of the ranks, for evaluation
  std::vector<float> avg;
  if (decentralized) avg_net.emplace(model_sizes(o, data), o.seed);
  std::vector<float> xb;
  std::vector<std::uint8_t> y;
  std::vector<std::span<float>> grads;
  for (auto& gr : net.grads()) grads.emplace_back(gr);

  auto gossip_sent = [&] {  // parameter bytes this rank's mixer has sent (0 if none)
    double sent = 0.0;
    on_gossip([&](auto& d) { sent = static_cast<double>(d.mixer().bytes_sent()); });
    return sent;
  };
  auto all_sum = [&](std::span<double> v) {
    comm.all_reduce(std::as_writable_bytes(v), gradcomp::comm_type::f64, gradcomp::reduce_op::sum);
  };
  auto sum_f32 = [&](std::span<float> v) {
    comm.all_reduce(std::as_writable_bytes(v), gradcomp::comm_type::f32, gradcomp::reduce_op::sum);
  };
  auto const ring_all_reduce = [world](std::size_t bytes) {
    auto const w = static_cast<std::size_t>(world);
    return w <= 1 ? 0.0 : 2.0 * static_cast<double>(bytes) * static_cast<double>(w - 1) / w;
  };

  run_result res;
  res.parameters = net.parameter_count();
  res.pipeline = pipeline;
  res.note = note;
  res.learning_rate = o.learning_rate;
  double bytes = 0.0, wire = 0.0, loss_sum = 0.0, gain_sum = 0.0, compute = 0.0, compress = 0.0,
         sync = 0.0, stepping = 0.0;
  std::size_t loss_count = 0;
  on_gossip([&](auto& d) {
    if (o.overlap) d.start(x);  // overlapped form: mixing of x^(0) runs during step 0's passes
  });
  auto const start = clock::now();
  for (std::size_t step = 0; step < o.steps; ++step) {
    auto t0 = clock::now();
    std::vector<std::size_t> const idx = sampler.batch(step, o.batch);
    gather_batch(data.train, idx, xb, y);
    net.forward(xb, o.batch, ws);
    batch_result const br = net.loss(y, ws);
    net.backward(ws);
    double const backprop = since(t0);
    compute += backprop;
    loss_sum += br.loss;
    ++loss_count;

    step_info info;
    info.step = step;
    info.backprop_s = backprop;
    info.batch = o.batch;
    info.learning_rate = applied_learning_rate(o, step);
    info.next_learning_rate = applied_learning_rate(o, step + 1);
    info.loss = br.loss;
    double factor = 1.0;
    bool skipped = false;
    if (ex) {  // sgd, adam: the gradient pipeline averages the gradients in place
      exchange_report const rep = ex->exchange(grads, info);
      skipped = rep.skipped;
      bytes += static_cast<double>(rep.bytes_sent);
      wire += static_cast<double>(rep.wire_bytes);
      compress += rep.compress_s;
      sync += rep.sync_s;
      gain_sum += rep.gain;
      factor = rep.factor;
      res.factors.push_back(rep.factor);
      res.dense_steps.push_back(std::string_view(rep.sent) == "dense" ? 1 : 0);
    } else {
      res.factors.push_back(1.0);
      res.dense_steps.push_back(1);
      gain_sum += 1.0;
    }

    if (skipped) {
      // the divergence guard skipped the step: no update (the pipeline printed why)
    } else if (kind == optimizer_kind::sgd) {
      opt.step(net.params(), net.grads(), info.learning_rate);
    } else {
      flatten(net.grads(), g);
      if (kind == optimizer_kind::adam) {
        adam_opt->set_lr(info.learning_rate);
        adam_opt->step(x, g);
      } else if (kind == optimizer_kind::onebitadam || kind == optimizer_kind::cadam ||
                 kind == optimizer_kind::calibadam) {
        auto t1 = clock::now();
        gradcomp::codec_context ctx = cctx;
        ctx.step = static_cast<std::uint32_t>(step);
        auto step_spans = [&](auto& opts) {
          for (std::size_t k = 0; k < spans.size(); ++k) {
            auto const [at, n] = spans[k];
            opts[k].set_lr(info.learning_rate);  // cadam: residuals are corrected by lr_prev / lr
            gradcomp::collective_result const r = opts[k].step(
                comm, std::span<float>(x).subspan(at, n),
                gradcomp::tensor_view<float const>(std::span<float const>(g).subspan(at, n),
                                                   static_cast<gradcomp::tensor_id>(k)),
                ctx);
            bytes += static_cast<double>(r.packet_bytes);
            wire += static_cast<double>(r.wire_bytes);
          }
        };
        if (kind == optimizer_kind::calibadam) {
          step_spans(calibrated);
        } else if (kind == optimizer_kind::onebitadam && o.factored_variance) {
          step_spans(factored);
        } else if (kind == optimizer_kind::onebitadam) {
          step_spans(onebit);
        } else {
          step_spans(cadam);
        }
        sync += since(t1);
      } else {
        on_gossip([&](auto& d) {
          d.set_lr(info.learning_rate);
          if (o.overlap)
            d.step(x, g);  // waits for the mixing of x^(k), steps, launches x^(k+1)'s
          else
            d.step_blocking(x, g);
          if (o.global_average_every != 0 && (step + 1) % o.global_average_every == 0) {
            auto t1 = clock::now();
            d.global_average(x, world, sum_f32);
            sync += since(t1);
            wire += ring_all_reduce(x.size() * sizeof(float));
          }
        });
      }
      unflatten(x, net.params());  // the next forward pass uses this rank's own x
    }
    stepping += since(t0);

    bool const last = step + 1 == o.steps;
    if ((step + 1) % o.eval_every == 0 || last) {
      std::size_t const m = last ? data.test.size() : std::min(o.eval_subset, data.test.size());
      auto const [b, e] = shard(m, rank, world);
      mlp const* model = &net;
      if (decentralized) {  // the average of the ranks' x, into a copy: x itself is untouched
        avg.assign(x.begin(), x.end());
        sum_f32(avg);
        float const n = static_cast<float>(world);
        for (float& v : avg) v = v / n;
        unflatten(avg, avg_net->params());
        model = &*avg_net;
      }
      auto const [l, c] = evaluate(*model, data.test, b, e);
      double const gsent = gossip_sent();
      double v[6] = {loss_sum, static_cast<double>(loss_count), c, bytes + gsent, wire + gsent,
                     stepping};
      all_sum(v);
      curve_point p;
      p.step = step + 1;
      p.train_loss = v[0] / v[1];
      p.test_accuracy = v[2] / static_cast<double>(m);
      p.bytes = v[3] / world;
      p.factor = factor;
      p.gain = gain_sum / static_cast<double>(loss_count);
      p.train_s = v[5] / world;
      res.curve.push_back(p);
      loss_sum = 0.0;
      gain_sum = 0.0;
      loss_count = 0;
      if (last) {
        double lv[1] = {l};
        all_sum(lv);
        res.test_accuracy = p.test_accuracy;
        res.test_loss = lv[0] / static_cast<double>(m);
        if (decentralized) {  // consensus distance of the iterates just evaluated
          double dist = 0.0, norm = 0.0;
          for (std::size_t i = 0; i < x.size(); ++i) {
            double const d = static_cast<double>(x[i]) - avg[i];
            dist += d * d;
            norm += static_cast<double>(avg[i]) * avg[i];
          }
          double dv[1] = {dist};
          all_sum(dv);
          res.consensus_distance = norm > 0.0 ? dv[0] / world / norm : 0.0;
        }
      }
    }
  }
  double const wall = std::chrono::duration<double>(clock::now() - start).count();
  if (ex) res.guard = ex->pipeline().guard().counters();
  if (final_params != nullptr) *final_params = net.params();  // x^(K), before any drain
  double mixer_wait = 0.0;
  on_gossip([&](auto& d) {
    d.drain(x);  // completes the last mixing (every rank): nothing left outstanding
    mixer_wait = d.mixer().wait_seconds();
  });
  bytes += gossip_sent();
  wire += gossip_sent();
  sync += mixer_wait;
  double sums[5] = {bytes, compute, compress, sync, wire};
  all_sum(sums);
  double wmax[2] = {wall, stepping};
  comm.all_reduce(std::as_writable_bytes(std::span<double>(wmax)), gradcomp::comm_type::f64,
                  gradcomp::reduce_op::max);
  res.bytes_per_worker = sums[0] / world;
  res.compute_s = sums[1] / world;
  res.compress_s = sums[2] / world;
  res.sync_s = sums[3] / world;
  res.comm_wait_s = sums[3] / world;
  res.wire_bytes_per_worker = sums[4] / world;
  res.wall_s = wmax[0];
  res.step_s = wmax[1];
  res.dense_bytes_per_worker =
      static_cast<double>(o.steps) * static_cast<double>(res.parameters) * sizeof(float);
  return res;
}

/// Single-process reference: trains the same model on the union of the `world` ranks' batches
/// (rank 0's examples first) with plain SGD on the exact mean gradient. Returns the parameters.
inline std::vector<std::vector<float>> train_reference(data_split const& data,
                                                       train_options const& o, int world) {
  check_options(o, data);
  mlp net(model_sizes(o, data), o.seed);
  sgd opt(o.momentum, o.weight_decay);
  std::vector<batch_sampler> samplers;
  for (int r = 0; r < world; ++r) samplers.emplace_back(data.train.size(), r, world, o.seed);
  workspace ws;
  std::vector<float> x;
  std::vector<std::uint8_t> y;
  for (std::size_t step = 0; step < o.steps; ++step) {
    std::vector<std::size_t> idx;
    for (auto& s : samplers) {
      std::vector<std::size_t> const b = s.batch(step, o.batch);
      idx.insert(idx.end(), b.begin(), b.end());
    }
    gather_batch(data.train, idx, x, y);
    net.forward(x, idx.size(), ws);
    net.loss(y, ws);
    net.backward(ws);
    opt.step(net.params(), net.grads(), learning_rate_at(o, step));
  }
  return net.params();
}

}  // namespace train
