// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Decentralized training with a local optimizer: DAdam (local optimizer `adam`), its AccumAdam
/// variant (`accum_adam`), or D-PSGD (`sgd`). Per rank i and iteration k:
/// ```
///   x_i^(k+1) = sum_j w_ij^(k) x_j^(k)  -  lr * d_i( g_i(x_i^(k)) )
/// ```
/// The gradient is taken at the rank's own, un-mixed parameters; only parameters are mixed
/// (moments, step counts and accumulators stay local); the local step (AdamW decay included)
/// acts on the mixed parameters.
///
/// Overlapped form (`start` once, then `step` per iteration), as in the authors' Decent-DP:
/// the mixing of x^(k) is launched right after the update that produced it and waited for only
/// once g_i(x^(k)) has been computed, so the exchange runs during the forward and backward
/// passes. Blocking form (`step_blocking`): mix, then update, with nothing outstanding in
/// between. Both use W^(k) at iteration k and give bit-identical parameters.
///
/// Failures: an iteration whose mixing fails throws and leaves x, the optimizer's moments and
/// the iteration count as they were (the mixer writes x only once its exchange succeeded, and
/// the update runs after it). In the overlapped form the exchange launched at the end of
/// iteration k belongs to iteration k+1: a failure to launch it is thrown by the next `step`
/// (or `drain`). Either way no mixing is outstanding afterwards; on a new communicator,
/// `start(x)` and `step` redo the failed iteration exactly.
///
/// Element types: the parameters are float32 (the master copy that is mixed); gradients may be
/// float, half or bfloat16 when the local optimizer accepts them (`sgd`, `adam`, `accum_adam`
/// do: moments in float32, the 16-bit gradient widened exactly), bit-identical to the float32
/// gradient widened.

#include <gradcomp/concepts/mixer.hpp>
#include <gradcomp/concepts/optimizer.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/optim/mixing.hpp>

#include <concepts>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <utility>

GRADCOMP_NAMESPACE_BEGIN

/// A local optimizer run on gossip-mixed parameters (file comment).
template <local_optimizer Optimizer, parameter_mixer Mixer>
class decentralized_optimizer {
 public:
  decentralized_optimizer(Optimizer opt, Mixer mixer)
      : opt_(std::move(opt)), mixer_(std::move(mixer)) {}

  /// Overlapped form: launches the mixing of the initial parameters x^(0) (identical on every
  /// rank after the initial broadcast). Call once before the first `step`, and again after
  /// `drain` to resume.
  void start(std::span<float const> x) {
    if (pending_)
      throw config_error(
          "gradcomp: decentralized_optimizer::start called while a mixing is outstanding");
    mixer_.start_mixing(x, k_);
    pending_ = true;
  }

  /// Overlapped iteration: `g` is the gradient at the current (un-mixed) `x`. Waits for the
  /// outstanding mixing (x <- W^(k) x), applies the local step, then launches the mixing of
  /// the new parameters for iteration k + 1. Leave `x` unchanged between calls.
  void step(std::span<float> x, std::span<float const> g) { step_overlapped(x, g); }

  /// `step` with a 16-bit gradient (`half`, `bfloat16`; see file comment).
  template <element G>
    requires(!std::same_as<G, float>) && requires(Optimizer& o, std::span<float> x, std::span<G const> g) { o.step(x, g); }
  void step(std::span<float> x, std::span<G const> g) {
    step_overlapped(x, g);
  }

  /// `step_blocking` with a 16-bit gradient (`half`, `bfloat16`; see file comment).
  template <element G>
    requires(!std::same_as<G, float>) && requires(Optimizer& o, std::span<float> x, std::span<G const> g) { o.step(x, g); }
  void step_blocking(std::span<float> x, std::span<G const> g) {
    step_mixed_first(x, g);
  }

  /// Blocking iteration: mixes `x` with W^(k) now, then applies the local step. Nothing may be
  /// outstanding (do not mix with the overlapped form without `drain`).
  void step_blocking(std::span<float> x, std::span<float const> g) { step_mixed_first(x, g); }

 private:
  template <class G>
  void step_overlapped(std::span<float> x, std::span<G const> g) {
    if (!pending_) {
      throw config_error(
          "gradcomp: decentralized_optimizer::step needs an outstanding mixing; call "
          "start(x) before the first step (or use step_blocking)");
    }
    pending_ = false;
    if (start_failure_) {
      // The exchange of x^(k) could not even be launched: this step fails, nothing changes.
      std::exception_ptr e = std::move(start_failure_);
      start_failure_ = nullptr;
      std::rethrow_exception(e);
    }
    mixer_.wait_mixing(x);
    opt_.step(x, g);
    ++k_;
    // The exchange of x^(k+1) belongs to the next iteration: a failure to launch it is that
    // iteration's failure (this one has completed), reported by the next `step`.
    try {
      mixer_.start_mixing(std::span<float const>(x), k_);
    } catch (...) {
      start_failure_ = std::current_exception();
    }
    pending_ = true;
  }

  template <class G>
  void step_mixed_first(std::span<float> x, std::span<G const> g) {
    if (pending_) {
      throw config_error(
          "gradcomp: decentralized_optimizer::step_blocking called while a mixing "
          "is outstanding; call drain(x) first");
    }
    mixer_.start_mixing(std::span<float const>(x), k_);
    mixer_.wait_mixing(x);
    opt_.step(x, g);
    ++k_;
  }

 public:
  /// Completes the outstanding mixing, if any: x <- W^(k) x. Since W^(k) is doubly stochastic
  /// this keeps the average over ranks. Use before evaluation, checkpoints or global averaging;
  /// `start(x)` resumes (with W^(k) again).
  void drain(std::span<float> x) {
    if (!pending_) return;
    pending_ = false;
    if (start_failure_) {
      std::exception_ptr e = std::move(start_failure_);
      start_failure_ = nullptr;
      std::rethrow_exception(e);
    }
    mixer_.wait_mixing(x);
  }

  /// Exact global averaging (periodic consensus, or evaluation): drain, replace x by the mean
  /// over the `world` ranks using `sum` (an in-place all-reduce sum over all ranks), and resume
  /// the overlapped form if it was running. Collective: every rank calls it at the same step.
  template <class AllReduceSum>
  void global_average(std::span<float> x, int world, AllReduceSum&& sum) {
    bool const resume = pending_;
    drain(x);
    average_parameters(x, world, std::forward<AllReduceSum>(sum));
    if (resume) start(x);
  }

  /// Iterations done so far (k).
  [[nodiscard]] std::uint64_t steps() const noexcept { return k_; }
  /// Whether a mixing is outstanding.
  [[nodiscard]] bool pending() const noexcept { return pending_; }
  [[nodiscard]] Optimizer& optimizer() noexcept { return opt_; }
  [[nodiscard]] Optimizer const& optimizer() const noexcept { return opt_; }
  [[nodiscard]] Mixer& mixer() noexcept { return mixer_; }
  [[nodiscard]] double lr() const noexcept { return opt_.lr(); }
  void set_lr(double lr) { opt_.set_lr(lr); }

 private:
  Optimizer opt_;
  Mixer mixer_;
  std::uint64_t k_ = 0;
  bool pending_ = false;
  std::exception_ptr start_failure_;  // launching the outstanding mixing failed (see step)
};

GRADCOMP_NAMESPACE_END
