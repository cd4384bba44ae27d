// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// What a `gradient_pipeline` (pipeline/pipeline.hpp) is configured with and what it reports:
/// `pipeline_options`, `pipeline_step_info` (what the caller knows about a step),
/// `pipeline_stats` (what a step did), and the one table of which exchange modes combine.
///
/// A pipeline runs one exchange mode, selected by its options:
///
/// | mode           | selected by                          | error feedback                  |
/// |----------------|--------------------------------------|---------------------------------|
/// | `flat`         | none of the below                    | none, residual, ef21, dgc:...   |
/// | `controlled`   | `controller` (a sparsifier codec)    | none, residual, ef21, dgc:...   |
/// | `two_way`      | `two_way`                            | none or residual                |
/// | `hierarchical` | `hierarchical.nodes`                 | none or residual                |
/// | `low_rank`     | a "powersgd" `codec`                 | none or residual (its own)      |
///
/// The modes exclude each other: at most one of the options in the middle column is set.
/// `check_pipeline_options` applies this table (`pipeline_mode_rules`) and is the only place
/// that does; every refusal is a `config_error` that names the option. What a device source
/// does not take is refused by `check_device_options` and, in each mode, `check_device_source`,
/// here too.
///
/// What the step protocol (pipeline/pipeline.hpp) reads of a mode besides its exchange is
/// `pipeline_mode_traits_of`, one row per mode:
///
/// | mode           | exchange (header)                  | stages | levels | seed    | gain  |
/// |----------------|------------------------------------|--------|--------|---------|-------|
/// | `flat`         | bucketed (flat_mode.hpp)           | yes    | 1      | codec's | round |
/// | `controlled`   | bucketed, multi-level (same)       | yes    | plan's | codec's | plan  |
/// | `two_way`      | per tensor (two_way_mode.hpp)      | no     | 1      | codec's | round |
/// | `hierarchical` | per tensor (hierarchical_mode.hpp) | no     | 1      | codec's | no    |
/// | `low_rank`     | per tensor (low_rank_mode.hpp)     | no     | 0      | shared  | no    |
///
/// (seed: shared by every rank, or as the codec's aggregation says; gain: `measure_gain`'s
/// round after the guard, or the controller's statistics.)

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/codec/codec_spec.hpp>
#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/hierarchical.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/concepts/step_protocol.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/feedback/dgc.hpp>
#include <gradcomp/feedback/make_feedback.hpp>
#include <gradcomp/feedback/policies.hpp>
#include <gradcomp/pipeline/guard.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <variant>

GRADCOMP_NAMESPACE_BEGIN

/// How a `gradient_pipeline` compresses, corrects and sends.
struct pipeline_options {
  /// Codec spec (`make_codec_spec`: a `make_codec` spec, e.g. "topk:ratio=0.01",
  /// "qsgd:levels=7", "fp16", or a PowerSGD spec, "powersgd:rank=4", `make_powersgd`). With a
  /// controller it must be a sparsifier (topk, approx_topk, randomk), whose selection size the
  /// controller sets each step.
  std::string codec = "topk:ratio=0.01";
  /// Error feedback: "none", "residual" (EF-SGD), "ef21", or "dgc" with optional
  /// ":momentum=0.9,clip_norm=0" (DGC's momentum correction; momentum factor masking).
  /// PowerSGD keeps its own error feedback: "residual" (on) or "none" (off).
  std::string feedback = "residual";
  /// Controller spec (`make_controller`: "static:factor=100", "gravac:...", "accordion:...",
  /// "schedule:..."); empty: the codec as given, every step.
  std::string controller;
  /// Send through two-way compression (BytePS-Compress: workers compress shards with their
  /// feedback, the shard's owner sums, re-compresses with server-side feedback and gathers).
  /// Not with a controller or PowerSGD.
  bool two_way = false;
  /// Send the compressed tensors through the hierarchical all-reduce
  /// (collective/hierarchical.hpp): with `hierarchical.nodes` set (e.g.
  /// `node_grouping::uniform(8)`), each large tensor is reduced inside the nodes (in
  /// `hierarchical.intra`), the node sums are compressed between nodes by the shard owners
  /// (`hierarchical.lanes`), whose error feedback they keep, and the result is gathered inside
  /// the nodes. Its `op` and `checksum` are those of `buckets`. Empty (the default): flat. Not
  /// with a controller, two-way compression or PowerSGD; feedback "residual" or "none".
  hierarchical_options hierarchical{};
  /// Seed of the codecs' random streams. Each rank adds its rank, except for shared-support
  /// codecs (random-k), whose ranks must draw the same coordinates, and PowerSGD, whose ranks
  /// start from the same Q.
  std::uint64_t seed = 0;
  /// Bucketing: bucket size, the size below which tensors go dense (no error feedback for
  /// them), their dense format, pipelined compression. The pipeline compresses per tensor
  /// (`bucket_compression::per_tensor`) and averages (`op`, default `reduction::average`).
  bucket_options buckets{.op = reduction::average};
  /// Compute the compression gain every step, also when the controller does not use it
  /// (one more pass over g + residual, and the decoded packet, per tensor).
  bool measure_gain = false;
  /// Report the pipeline's measured compress and communication times to the controller
  /// (GraVAC's throughput). Wall-clock times make the decisions of two runs differ; off, the
  /// controller sees only the caller's `backprop_s` (and zeros), so runs — resumed or not —
  /// are reproducible bit for bit.
  bool measured_timing = true;
  /// Execution context of the codecs (thread pool, parallel threshold, SIMD level). Its seed
  /// and step are set by the pipeline.
  codec_context context{};
  /// Divergence guard spec (pipeline/guard.hpp, docs/pipeline.md): "off", or "raise", "skip"
  /// or "dense" with optional ":factor=F,residual_factor=R,loss_span=L,window=W,warmup=N,max_skips=S".
  std::string guard = "raise";
};

/// What the caller knows about the step (for the controller's statistics).
struct pipeline_step_info {
  double backprop_s = 0.0;        ///< this step's forward + backward time
  std::uint64_t batch_size = 0;   ///< samples per worker (GraVAC's throughput)
  double learning_rate = 0.0;     ///< this step's learning rate (0: not reported)
  double next_learning_rate = 0.0;  ///< the next step's (0: not reported)
  /// This rank's loss of the step, for the divergence guard and the controller (the mean over
  /// the ranks that report one is `step_stats::loss`; ef_window's loss check reads it); empty:
  /// not reported.
  std::optional<double> loss{};
};

/// What one step did on this rank.
struct pipeline_stats {
  std::uint64_t step = 0;                ///< the step (0, 1, ...)
  send_kind sent = send_kind::minimum;   ///< what was sent (minimum / candidate / dense)
  /// Compression factor of what was sent: 32 / the codec's bits per element (the controller's
  /// factor with one), 1 when dense; for PowerSGD, the float32 bytes of the step's gradients
  /// over the bytes sent.
  double factor = 1.0;
  /// ‖C(g_ef)‖² / ‖g_ef‖² of what was sent, over all ranks (1 for dense); NaN when not
  /// measured (no controller needing it and `measure_gain` off).
  double gain = std::numeric_limits<double>::quiet_NaN();
  std::size_t bytes_sent = 0;            ///< this rank's payload bytes (packets and dense)
  std::size_t wire_bytes = 0;            ///< modeled ring traffic, agreement rounds included
  std::size_t tensors = 0;               ///< tensors in the step
  std::size_t compressed_tensors = 0;    ///< of which compressed (the rest went dense)
  std::size_t buckets = 0;               ///< messages (buckets) issued
  double compress_s = 0.0;  ///< staging, multi-level, norms and the residual commits
  double communicate_s = 0.0;  ///< agreement rounds and payloads (waiting included)
  double decode_s = 0.0;    ///< decoding received packets and writing the outputs
  double total_s = 0.0;     ///< the whole call
  /// What the divergence guard did (guard.hpp): none, skipped (nothing sent, no state changed,
  /// the gradient tensors hold zeros: do not step the optimizer), or dense.
  guard_action guard = guard_action::none;
  /// The guard's global values of the step: gradient and residual norms over all ranks, the
  /// mean reported loss (NaN when the guard is off, or not watched / not reported).
  double gradient_norm = std::numeric_limits<double>::quiet_NaN();
  double residual_norm = std::numeric_limits<double>::quiet_NaN();
  double loss = std::numeric_limits<double>::quiet_NaN();
};

/// The exchange mode a pipeline's options select (file comment's table).
enum class pipeline_mode : std::uint8_t {
  flat,          ///< the codec as given, every step, in the bucketed collective
  controlled,    ///< a controller picks the compression level of each step
  two_way,       ///< two-way compression (worker and server feedback)
  hierarchical,  ///< the hierarchical all-reduce (node sums compressed between nodes)
  low_rank,      ///< PowerSGD, one session per tensor
};

/// One row of the mode table: the option that selects a mode, its name in errors, and the
/// error feedback it takes.
struct pipeline_mode_rule {
  pipeline_mode mode;
  std::string_view option;  ///< the `pipeline_options` member that selects it
  std::string_view name;    ///< what errors call it
  /// Whether the mode takes feedback "residual" or "none" only, and why.
  bool residual_or_none;
  std::string_view feedback_reason;
};

/// The modes other than `flat` (which none of these options selects), in the order in which
/// a conflict is reported: the first selected row names the conflict.
inline constexpr pipeline_mode_rule pipeline_mode_rules[] = {
    {pipeline_mode::low_rank, "codec", "PowerSGD", true, "PowerSGD keeps its own error feedback"},
    {pipeline_mode::hierarchical, "hierarchical", "hierarchical all-reduce", true,
     "the hierarchical all-reduce keeps error feedback on the shard owners"},
    {pipeline_mode::two_way, "two_way", "two-way compression", true,
     "two-way compression keeps feedback on the worker and the server side"},
    {pipeline_mode::controlled, "controller", "controller", false, ""},
};

/// The mode's name ("flat", "controlled", "two_way", "hierarchical", "low_rank").
[[nodiscard]] constexpr std::string_view pipeline_mode_name(pipeline_mode m) noexcept {
  switch (m) {
    case pipeline_mode::flat: return "flat";
    case pipeline_mode::controlled: return "controlled";
    case pipeline_mode::two_way: return "two_way";
    case pipeline_mode::hierarchical: return "hierarchical";
    case pipeline_mode::low_rank: return "low_rank";
  }
  return "?";
}

/// What the step protocol reads of a mode besides its exchange (file comment's second table).
struct pipeline_mode_traits {
  /// The pipeline's error-feedback compressor stages each large tensor (g + residual
  /// compressed while the backward pass goes on): the divergence guard watches its residuals, a
  /// dense step sends g + residual, a device source keeps per-tensor states.
  bool stages;
  /// The tensors are compressed at levels of a codec: at the controller's plan's
  /// (`plan_levels`), else at one, the codec as given. Not `leveled`: PowerSGD, no codec's
  /// level (a plan of none).
  bool leveled;
  bool plan_levels;
  /// Every rank draws from the same seed, whatever the codec (PowerSGD starts every rank from
  /// the same Q); otherwise only a shared-support codec's ranks do.
  bool shared_seed;
  /// `measure_gain`'s all-reduce of the gain's terms runs after the guard (two-way's terms are
  /// zero, its gain then reads 1); a controller's decision sums them itself.
  bool gain_round;
  /// The step's factor is the float32 bytes of its gradients over the bytes sent (PowerSGD has
  /// no bits per element); otherwise 32 / the codec's bits per element.
  bool factor_from_bytes;
};

/// The row of mode `m` (file comment).
[[nodiscard]] constexpr pipeline_mode_traits pipeline_mode_traits_of(pipeline_mode m) noexcept {
  switch (m) {
    case pipeline_mode::flat: return {true, true, false, false, true, false};
    case pipeline_mode::controlled: return {true, true, true, false, false, false};
    case pipeline_mode::two_way: return {false, true, false, false, true, false};
    case pipeline_mode::hierarchical: return {false, true, false, false, false, false};
    case pipeline_mode::low_rank: return {false, false, false, true, false, true};
  }
  return {};
}

/// The mode `opt` selects, its codec spec parsed (`make_codec_spec`) as `codec`; checks the
/// table of the file comment. `config_error`, naming the option, for
/// - `buckets.mode` other than `bucket_compression::per_tensor` (error feedback is kept per
///   tensor),
/// - two of `codec` (PowerSGD), `hierarchical`, `two_way` and `controller` at once,
/// - a `feedback` other than "residual" or "none" for a mode that takes only those,
/// - a `controller` over a codec without a selection size (top-k, approximate top-k and
///   random-k have one).
/// The feedback, controller and guard specs themselves are parsed by their own parsers
/// (`make_feedback`, `make_controller`, `parse_guard`).
[[nodiscard]] inline pipeline_mode check_pipeline_options(pipeline_options const& opt, codec_spec const& codec) {
  if (opt.buckets.mode != bucket_compression::per_tensor) {
    throw config_error("gradcomp: gradient_pipeline compresses per tensor (bucket_compression::per_tensor); "
                       "per_bucket would key error feedback by bucket");
  }
  auto selected = [&](pipeline_mode m) {
    switch (m) {
      case pipeline_mode::low_rank: return names_low_rank(codec);
      case pipeline_mode::hierarchical: return !opt.hierarchical.nodes.empty();
      case pipeline_mode::two_way: return opt.two_way;
      case pipeline_mode::controlled: return !opt.controller.empty();
      case pipeline_mode::flat: return false;
    }
    return false;
  };
  pipeline_mode_rule const* mode = nullptr;
  std::string others;
  for (pipeline_mode_rule const& r : pipeline_mode_rules) {
    if (!selected(r.mode)) continue;
    if (!mode) {
      mode = &r;
    } else {
      others += std::string(others.empty() ? "" : ", no ") + std::string(r.name) + " (pipeline_options::" +
                std::string(r.option) + ")";
    }
  }
  if (!mode) return pipeline_mode::flat;
  if (!others.empty()) {
    throw config_error("gradcomp: gradient_pipeline: " + std::string(mode->name) + " (pipeline_options::" +
                       std::string(mode->option) + ") takes no " + others +
                       "; the exchange modes exclude each other");
  }
  if (mode->residual_or_none && opt.feedback != "residual" && opt.feedback != "none") {
    throw config_error("gradcomp: gradient_pipeline: " + std::string(mode->feedback_reason) +
                       ": pipeline_options::feedback must be 'residual' or 'none', got '" + opt.feedback + "'");
  }
  if (mode->mode == pipeline_mode::controlled) {
    any_codec const& c = std::get<any_codec>(codec);
    if (!c.has_budget()) {
      throw config_error(std::string("gradcomp: gradient_pipeline: a controller (pipeline_options::controller '") +
                         opt.controller + "') sets a sparsifier's selection size; codec '" + c.name() +
                         "' has none (use topk, approx_topk or randomk)");
    }
  }
  return mode->mode;
}

/// What `gradient_pipeline`'s device constructor learns of its source
/// (`detail::device_source_base`, pipeline/device_source.hpp) for `check_device_source`.
struct device_source_facts {
  bool has_budget = false;                   ///< its codec has a selection size
  bool makes_low_rank_sessions = false;      ///< its memory space makes PowerSGD sessions
  feedback_id feedback = feedback_id::none;  ///< its error feedback
  /// A DGC source's momentum, clipping norm and workers (empty for another source).
  std::optional<std::tuple<float, double, std::uint32_t>> dgc{};
};

/// The options a device source does not take, whatever its mode and codec: `config_error` for
/// `buckets.checksum` (it reads every payload on the host) and for a 16-bit
/// `buckets.small_format` (dense buckets are float32). Checked before the source is taken.
inline void check_device_options(pipeline_options const& opt) {
  auto refuse = [](std::string const& what) {
    throw config_error("gradcomp: gradient_pipeline with a device source: " + what);
  };
  if (opt.buckets.checksum)
    refuse("buckets.checksum is not taken (it reads every payload on the host)");
  if (opt.buckets.small_format != dense_format::f32) {
    refuse("a 16-bit buckets.small_format is not taken (dense buckets are float32)");
  }
}

/// The refusals of device source `src` in mode `mode` of options `opt` (already checked by
/// `check_pipeline_options` and `check_device_options`), `feedback` the pipeline's
/// error-feedback compressor of `opt.feedback`. `config_error`, in this order, for
/// - `controlled` over a source whose codec has no selection size,
/// - `low_rank` with a source that keeps feedback state, or whose memory space makes no
///   PowerSGD sessions,
/// - another mode whose source's error feedback is not `opt.feedback`'s, or whose DGC
///   parameters (momentum, clip_norm, workers) differ.
/// Whether the source's codec is the one `opt.codec` names is checked against the codec
/// itself, by the constructor (the collectives' fingerprints).
inline void check_device_source(pipeline_options const& opt, pipeline_mode mode,
                                feedback_compressor const& feedback,
                                device_source_facts const& src) {
  auto refuse = [](std::string const& what) {
    throw config_error("gradcomp: gradient_pipeline with a device source: " + what);
  };
  if (mode == pipeline_mode::controlled && !src.has_budget) {
    refuse(
        "a controller sets the selection size of the device codec, which has none (controller '" +
        opt.controller + "')");
  }
  if (mode == pipeline_mode::low_rank) {
    // PowerSGD keeps its residuals in its sessions; the source sends the small tensors dense
    if (src.feedback != feedback_id::none) {
      refuse(
          "with PowerSGD the source keeps no feedback state (pass "
          "cuda::stream_codec<cuda::identity_codec>)");
    }
    if (!src.makes_low_rank_sessions) {
      refuse("its memory space makes no PowerSGD sessions (include gradcomp/cuda/powersgd.cuh)");
    }
    return;
  }
  // The source's feedback is the spec's: its rule (and DGC's parameters) or none.
  feedback_id const mine = feedback_of(feedback);
  if (src.feedback != mine) {
    constexpr char const* names[] = {"none", "residual", "ef21", "dgc"};
    refuse("its source's error feedback (" +
           std::string(names[static_cast<unsigned>(src.feedback) & 3u]) + ") is not feedback '" +
           opt.feedback + "'");
  }
  if (mine == feedback_id::dgc) {
    auto const& dgc = std::get<compressor<any_codec, dgc_feedback>>(feedback).feedback();
    auto const [m, clip, workers] = src.dgc.value();
    if (m != dgc.momentum() || clip != dgc.clip_norm() || workers != dgc.workers()) {
      refuse("its source's DGC parameters (momentum, clip_norm, workers) differ from feedback '" +
             opt.feedback + "'");
    }
  }
}

GRADCOMP_NAMESPACE_END
