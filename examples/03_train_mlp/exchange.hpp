// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `gradient_exchange`: the one place where the training example's gradients leave a worker,
/// a thin adaptor from the example's options to gradcomp's `gradient_pipeline`
/// (gradcomp/pipeline/pipeline.hpp), which does the work: compress g + residual, run the
/// controller protocol (plan, multi-level candidates, agree, decide), send through the
/// collective the codec's aggregation kind picks, commit the residual for what was sent, and
/// average over the ranks. Each step replaces the worker's per-layer gradient tensors, on every
/// rank, with the average over all ranks of what was sent:
///
///   dense      every tensor in one float32 dense bucket (an all-reduce), averaged: the
///              baseline (pipeline codec "identity", feedback "none", nothing compressed);
///   codec      a fixed codec (fp16, onebit, identity, int8, randomk:ratio=..., ...), with or
///              without residual error feedback;
///   topk       top-k ("topk", "topk:values=f16") at the factor a controller picks per step
///              (control.hpp): static, a schedule, or an adaptive one.
///
/// Unlike the pipeline's default, every tensor is compressed, also the small ones (the biases):
/// `min_compress_elements` is 1, as the example has always done, so that the figures of
/// docs/training.md compare with the earlier ones.

#include <gradcomp/concepts/context.hpp>
#include <gradcomp/comm/any_communicator.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/pipeline/pipeline.hpp>

#include "control.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace train {

/// How gradients are exchanged.
struct exchange_options {
  /// "dense" (float32 all-reduce), a fixed codec spec for `gradcomp::make_codec` ("fp16",
  /// "onebit", "identity", ...), or "topk" / "topk:values=f16" (the factor comes from
  /// `controller`).
  std::string codec = "dense";
  /// Residual error feedback (ignored for "dense").
  bool error_feedback = true;
  /// Controller spec for "topk" (control.hpp), e.g. "static:factor=100".
  std::string controller = "static:factor=100";
  /// Seed of the codecs' random streams (stochastic codecs); ranks add their rank to it, except
  /// for codecs whose ranks must draw the same numbers.
  std::uint64_t seed = 7;
  /// The pipeline's divergence guard (gradcomp/pipeline/guard.hpp): "raise" (the library's
  /// default), "skip", "dense", "off", with optional ":factor=F,window=W,...".
  std::string guard = "raise";
};

/// What the caller knows about the step being exchanged.
struct step_info {
  std::uint64_t step = 0;  ///< informational: the pipeline counts its own steps from 0
  double backprop_s = 0.0;  ///< this step's forward + backward time
  std::uint64_t batch = 0;  ///< samples per worker
  double learning_rate = 0.0;
  double next_learning_rate = 0.0;
  double loss = std::numeric_limits<double>::quiet_NaN();  ///< this rank's batch loss (NaN: none)
};

/// What one exchange did (this rank); from the pipeline's `pipeline_stats`.
struct exchange_report {
  std::size_t bytes_sent = 0;  ///< payload bytes this rank contributed to the collective(s)
  /// Bytes this rank puts on the wire under the bandwidth-optimal algorithms (ring all-reduce:
  /// 2(n-1)/n of the buffer; ring all-gather: every block but the next rank's), as gradcomp's
  /// `collective_result::wire_bytes` models them, the pipeline's agreement rounds included.
  std::size_t wire_bytes = 0;
  double factor = 1.0;         ///< compression factor of what was sent (1 = dense)
  char const* sent = "dense";  ///< "dense", "minimum" or "candidate"
  double compress_s = 0.0;     ///< compression, decoding, norms and residual updates
  double sync_s = 0.0;         ///< collectives (agreement, statistics and gradients)
  double gain = 1.0;           ///< ‖C(g_ef)‖² / ‖g_ef‖² of what was sent, over all ranks
  /// The divergence guard skipped the step: nothing was sent, the gradients are zero; the
  /// optimizer must not step.
  bool skipped = false;
};

/// The example's options as `gradient_pipeline` options.
inline gradcomp::pipeline_options pipeline_options_for(exchange_options const& o) {
  gradcomp::pipeline_options p;
  std::string_view const family = std::string_view(o.codec).substr(0, o.codec.find(':'));
  bool const dense = o.codec == "dense";
  p.codec = dense ? "identity" : o.codec;
  p.feedback = dense || !o.error_feedback ? "none" : "residual";
  if (family == "topk") {
    p.controller = o.controller;
    // The controller sets the selection size each step; the spec only needs a valid one.
    if (o.codec.find("ratio=") == std::string::npos && o.codec.find("k=") == std::string::npos) {
      p.codec += o.codec.find(':') == std::string::npos ? ":ratio=0.01" : ",ratio=0.01";
    }
  }
  p.seed = o.seed;
  p.guard = o.guard;
  // "dense": nothing is compressed, every tensor goes into a float32 dense bucket (one
  // all-reduce for this model); otherwise every tensor is compressed, the biases included.
  p.buckets.min_compress_elements = dense ? std::numeric_limits<std::size_t>::max() : 1;
  p.measure_gain = !dense;  // the example reports the gain of every step
  p.context.parallel_threshold = std::numeric_limits<std::size_t>::max();  // ranks are threads already
  return p;
}

/// The per-step gradient exchange (see file comment).
class gradient_exchange {
 public:
  gradient_exchange(gradcomp::any_communicator comm, exchange_options opts)
      : comm_(std::move(comm)), opts_(std::move(opts)), pipe_(pipeline_options_for(opts_)) {}

  [[nodiscard]] gradcomp::any_communicator& communicator() noexcept { return comm_; }
  [[nodiscard]] exchange_options const& options() const noexcept { return opts_; }
  [[nodiscard]] gradcomp::gradient_pipeline& pipeline() noexcept { return pipe_; }

  /// The error-feedback residual of tensor `t` (empty: zero, or no error feedback).
  [[nodiscard]] std::span<float const> residual(std::size_t t) {
    return pipe_.feedback_state(static_cast<gradcomp::tensor_id>(t));
  }

  /// One line describing the pipeline.
  [[nodiscard]] std::string describe() const {
    if (opts_.codec == "dense") return "dense float32 all-reduce (gradient_pipeline)";
    gradcomp::pipeline_options const& p = pipe_.options();
    std::string s = "gradient_pipeline: " + p.codec;
    if (!p.controller.empty()) s += " at the factor of controller " + p.controller;
    if (p.feedback != "none") s += " + error feedback";
    return s;
  }

  /// Replaces each tensor of `grads` (tensor i has id i; same shapes on every rank) with the
  /// average over ranks of what the pipeline sent. Collective: every rank calls it each step.
  exchange_report exchange(std::span<std::span<float> const> grads, step_info const& info) {
    views_.clear();
    for (std::size_t t = 0; t < grads.size(); ++t) {
      views_.emplace_back(grads[t], static_cast<gradcomp::tensor_id>(t));
    }
    gradcomp::pipeline_step_info pi;
    pi.backprop_s = info.backprop_s;
    pi.batch_size = info.batch;
    pi.learning_rate = info.learning_rate;
    pi.next_learning_rate = info.next_learning_rate;
    if (!std::isnan(info.loss)) pi.loss = info.loss;
    gradcomp::pipeline_stats const st =
        pipe_.step(comm_, std::span<gradcomp::tensor_view<float> const>(views_), pi);
    exchange_report rep;
    rep.bytes_sent = st.bytes_sent;
    rep.wire_bytes = st.wire_bytes;
    rep.factor = st.factor;
    bool const dense = opts_.codec == "dense" || st.sent == send_kind::dense;
    rep.sent = dense ? "dense" : st.sent == send_kind::candidate ? "candidate" : "minimum";
    rep.compress_s = st.compress_s + st.decode_s;
    rep.sync_s = st.communicate_s;
    rep.gain = dense || std::isnan(st.gain) ? 1.0 : st.gain;
    rep.skipped = st.guard == gradcomp::guard_action::skipped;
    return rep;
  }

 private:
  gradcomp::any_communicator comm_;
  exchange_options opts_;
  gradcomp::gradient_pipeline pipe_;
  std::vector<gradcomp::tensor_view<float>> views_;
};

}  // namespace train
