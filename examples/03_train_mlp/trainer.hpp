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
/// Initial weights come from one seed on every rank and are broadcast from rank 0 anyway, as a
/// real launcher would. `train_reference` trains the same model in one process on the union of
/// the ranks' batches; with dense exchange the two agree to rounding (the tests check it).

#include <gradcomp/comm/any_communicator.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/core/error.hpp>

#include "data.hpp"
#include "exchange.hpp"
#include "mlp.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace train {

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
  exchange_options exchange;
};

/// One point of the curve, after `step` steps.
struct curve_point {
  std::size_t step = 0;
  double train_loss = 0.0;     ///< mean batch loss since the previous point, over all ranks
  double test_accuracy = 0.0;  ///< on the first `eval_subset` test examples (all at the end)
  double bytes = 0.0;          ///< cumulative bytes sent per worker (mean over ranks)
  double factor = 1.0;         ///< factor of the last step
  double gain = 1.0;  ///< mean of ‖C(g_ef)‖² / ‖g_ef‖² of what was sent since the previous point
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
  std::string pipeline;  ///< `gradient_exchange::describe()`
};

/// Learning rate of step `step`.
inline double learning_rate_at(train_options const& o, std::size_t step) {
  auto const at = static_cast<std::size_t>(o.decay_at * static_cast<double>(o.steps));
  return step >= at ? o.learning_rate * o.decay : o.learning_rate;
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

inline void check_options(train_options const& o, data_split const& data) {
  if (o.steps == 0 || o.batch == 0 || o.eval_every == 0) {
    throw gradcomp::config_error("train: steps, batch and eval_every must be positive");
  }
  if (!(o.learning_rate > 0.0) || !(o.decay > 0.0) || !(o.decay_at >= 0.0)) {
    throw gradcomp::config_error("train: the learning rate and its decay must be positive");
  }
  if (data.train.dim != data.test.dim || data.train.classes != data.test.classes ||
      data.test.size() == 0) {
    throw gradcomp::config_error(
        "train: the training and test sets must have the same shape and a test set");
  }
}

/// Trains on rank `comm.rank()` of `comm.size()` (collective: every rank calls it with the
/// same options and data). Returns the same result on every rank; `final_params`, if given,
/// receives this rank's parameters after the last step.
inline run_result train_worker(gradcomp::any_communicator comm, data_split const& data,
                               train_options const& o,
                               std::vector<std::vector<float>>* final_params = nullptr) {
  using clock = std::chrono::steady_clock;
  check_options(o, data);
  int const rank = comm.rank(), world = comm.size();
  mlp net(model_sizes(o, data), o.seed);
  for (auto& p : net.params()) {  // as a launcher would: rank 0's weights everywhere
    comm.broadcast(std::as_writable_bytes(std::span<float>(p)), 0);
  }
  sgd opt(o.momentum, o.weight_decay);
  gradient_exchange ex(comm, o.exchange);
  batch_sampler sampler(data.train.size(), rank, world, o.seed);
  workspace ws;
  std::vector<float> x;
  std::vector<std::uint8_t> y;
  std::vector<std::span<float>> grads;
  for (auto& g : net.grads()) grads.emplace_back(g);

  auto all_sum = [&](std::span<double> v) {
    comm.all_reduce(std::as_writable_bytes(v), gradcomp::comm_type::f64, gradcomp::reduce_op::sum);
  };

  run_result res;
  res.parameters = net.parameter_count();
  res.pipeline = ex.describe();
  double bytes = 0.0, loss_sum = 0.0, gain_sum = 0.0, compute = 0.0, compress = 0.0, sync = 0.0;
  std::size_t loss_count = 0;
  auto const start = clock::now();
  for (std::size_t step = 0; step < o.steps; ++step) {
    auto t0 = clock::now();
    std::vector<std::size_t> const idx = sampler.batch(step, o.batch);
    gather_batch(data.train, idx, x, y);
    net.forward(x, o.batch, ws);
    batch_result const br = net.loss(y, ws);
    net.backward(ws);
    double const backprop = std::chrono::duration<double>(clock::now() - t0).count();
    compute += backprop;
    loss_sum += br.loss;
    ++loss_count;

    step_info info;
    info.step = step;
    info.backprop_s = backprop;
    info.batch = o.batch;
    info.learning_rate = learning_rate_at(o, step);
    info.next_learning_rate = learning_rate_at(o, step + 1);
    exchange_report const rep = ex.exchange(grads, info);
    bytes += static_cast<double>(rep.bytes_sent);
    compress += rep.compress_s;
    sync += rep.sync_s;
    gain_sum += rep.gain;
    res.factors.push_back(rep.factor);
    res.dense_steps.push_back(std::string_view(rep.sent) == "dense" ? 1 : 0);

    opt.step(net.params(), net.grads(), info.learning_rate);

    bool const last = step + 1 == o.steps;
    if ((step + 1) % o.eval_every == 0 || last) {
      std::size_t const m = last ? data.test.size() : std::min(o.eval_subset, data.test.size());
      auto const [b, e] = shard(m, rank, world);
      auto const [l, c] = evaluate(net, data.test, b, e);
      double v[4] = {loss_sum, static_cast<double>(loss_count), c, bytes};
      all_sum(v);
      curve_point p;
      p.step = step + 1;
      p.train_loss = v[0] / v[1];
      p.test_accuracy = v[2] / static_cast<double>(m);
      p.bytes = v[3] / world;
      p.factor = rep.factor;
      p.gain = gain_sum / static_cast<double>(loss_count);
      res.curve.push_back(p);
      loss_sum = 0.0;
      gain_sum = 0.0;
      loss_count = 0;
      if (last) {
        double lv[1] = {l};
        all_sum(lv);
        res.test_accuracy = p.test_accuracy;
        res.test_loss = lv[0] / static_cast<double>(m);
      }
    }
  }
  double const wall = std::chrono::duration<double>(clock::now() - start).count();
  double sums[4] = {bytes, compute, compress, sync};
  all_sum(sums);
  double wmax[1] = {wall};
  comm.all_reduce(std::as_writable_bytes(std::span<double>(wmax)), gradcomp::comm_type::f64,
                  gradcomp::reduce_op::max);
  res.bytes_per_worker = sums[0] / world;
  res.compute_s = sums[1] / world;
  res.compress_s = sums[2] / world;
  res.sync_s = sums[3] / world;
  res.wall_s = wmax[0];
  res.dense_bytes_per_worker =
      static_cast<double>(o.steps) * static_cast<double>(res.parameters) * sizeof(float);
  if (final_params != nullptr) *final_params = net.params();
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
