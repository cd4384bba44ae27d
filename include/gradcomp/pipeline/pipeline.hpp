// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `gradient_pipeline`: the training step of compressed data-parallel training, the one front
/// door. A training loop calls it once per step with its gradient tensors (or bucket by bucket
/// as the backward pass produces them, `submit` / `finish`); it writes the average over all
/// ranks of what was sent back into the tensors. One step:
///
/// 1. **Plan.** The controller (static, schedule, GraVAC, Accordion; none: the codec as given)
///    names the factors to compress at.
/// 2. **Stage.** Each large tensor's g + residual (per the error-feedback policy) is compressed
///    at the first factor; each further factor is re-compressed from the packet before it
///    (`recompress_sparse`, O(m)). The residual is not touched yet. The controller's
///    statistics (‖g_ef‖², ‖C(g_ef)‖² per factor, per-layer norms) are computed where it needs
///    them.
/// 3. **Agree.** One round checks that every rank has the same layout and configuration and
///    that every rank's local step succeeded; with a controller the statistics are summed over
///    ranks (`agree`) and every rank takes the same `decision`.
/// 4. **Send.** The decided packets go through the bucketed collective chosen by the codec's
///    aggregation kind (summable: all-reduce in the compressed domain; shared support:
///    all-reduce of the values; gather: all-gather-v and decode in rank order), small tensors
///    in dense buckets, buckets pipelined (collective/bucket.hpp). A dense decision sends every
///    tensor dense (g + residual, or g with the residual kept, as the decision says). Low-rank
///    codecs (PowerSGD) run one `powersgd_session` per tensor (`all_reduce_low_rank`); with
///    `two_way` the packets go through `all_reduce_two_way` with worker and server feedback.
/// 5. **Commit.** Each residual is updated for exactly what was sent: computed before the
///    exchange (`compressor::prepare_commit` with the packet to send), made current only after
///    the exchange succeeded (`apply_commit`); `commit_lossless` for g + residual sent dense,
///    nothing when g was sent and the residual kept. With EF21 the receiver side turns the
///    averaged increments into the gradient estimate.
///
/// A failure anywhere (a NaN gradient on one rank, mismatched layouts, a lost peer, a packet
/// one rank cannot decode) throws on every rank and leaves the pipeline's state — residuals,
/// controller, PowerSGD sessions, two-way residuals, layer accumulators, step counter — exactly
/// as it was before the step (`save` gives the same bytes), so a retry computes what the step
/// would have; the gradient tensors may hold partial output then. The exchange ends with the
/// step-outcome round of collective/outcome.hpp (one all-reduce of 12 bytes per step) before
/// anything is committed; `buckets.checksum` turns on its checksums.
///
/// Between the agreement and the decision, the divergence guard (pipeline/guard.hpp, on by
/// default) sums the ranks' gradient and residual norms and losses in one small all-reduce and
/// acts on a non-finite value or an explosion against the recent history: raise (the
/// default), skip the step, or send it dense (`pipeline_options::guard`).
///
/// Gradients are float32, float16 or bfloat16 (`tensor_view<T>`); residuals, sums and decoding
/// are float32, and a 16-bit tensor receives its average rounded once. The whole state (every
/// residual, controller state with its history, PowerSGD factors, the step counter) is saved by
/// `save` and restored by `load` (pipeline/checkpoint.hpp has the format); a resumed run is
/// bit-identical to one that never stopped.
///
/// **Device sources** (docs/cuda.md): constructed with a device packet source — a
/// `cuda::device_compressor<C, Rule>` (feedback "residual", "ef21" or "dgc:...", the rule's,
/// with DGC's parameters) or a `cuda::stream_codec<C>` (feedback "none") of a CUDA codec,
/// element-wise or sparsifier — the pipeline takes float32, float16 and
/// bfloat16 gradients in device memory through the same `step` (or `begin` / `submit` /
/// `finish`). The step runs the same agreement round and divergence guard (its norms computed on
/// the device, in the same canonical order), then the bucketed collective of that source
/// (`bucketed_all_reduce`, payloads in device memory, control messages on the host), or with
/// `two_way` the two-way collective of the source's codec and feedback per compressed tensor
/// (worker and server residuals in device memory); outputs, residuals, statistics and `save`
/// are byte for byte those of the CPU pipeline with the CPU codec of `pipeline_options::codec`.
/// The divergence guard's raise, skip and dense actions work as on the CPU. PowerSGD
/// ("powersgd:..." codec specs) takes `cuda::stream_codec<cuda::identity_codec>` as the source
/// (the small tensors go dense through it) and keeps one `cuda::powersgd_session` per tensor,
/// made by the memory space (`make_low_rank_session`, cuda/powersgd.cuh); outputs and `save`
/// are the CPU pipeline's with `backend=builtin`. The hierarchical all-reduce
/// (`pipeline_options::hierarchical`) runs per compressed tensor over the node and lane
/// communicators given to `set_hierarchical_groups` (e.g. from `nccl_communicator::split`),
/// payloads on the device, outputs and the owners' residuals the CPU pipeline's. `measure_gain`
/// gives the CPU pipeline's gain to the bit (each compressed tensor compressed and decoded once
/// more on the device for it). A controller over a device sparsifier stages each tensor's
/// packets at every level of its plan on the device (`device_source_base::stage_levels`; the
/// further levels re-compressed from a host copy of the first packet), keeps Accordion's layer
/// accumulators in device memory and sends the decided level's packets (or a dense step) with
/// the CPU pipeline's outputs, states, statistics and `save`. Not taken by a device source
/// (`config_error` at construction): `buckets.checksum`, a 16-bit `buckets.small_format` and a
/// controller over a codec without a selection size.

#include <gradcomp/adapt/any_controller.hpp>
#include <gradcomp/adapt/protocol.hpp>
#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/codec/budget.hpp>
#include <gradcomp/codec/powersgd.hpp>
#include <gradcomp/codec/recompress.hpp>
#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/hierarchical.hpp>
#include <gradcomp/collective/low_rank.hpp>
#include <gradcomp/collective/memory.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/collective/powersgd_session.hpp>
#include <gradcomp/collective/sections.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/comm/any_communicator.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/core/spec.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/feedback/dgc.hpp>
#include <gradcomp/feedback/policies.hpp>
#include <gradcomp/pipeline/guard.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// How a `gradient_pipeline` compresses, corrects and sends.
struct pipeline_options {
  /// Codec spec (`make_codec`, e.g. "topk:ratio=0.01", "qsgd:levels=7", "fp16"), or a PowerSGD
  /// spec ("powersgd:rank=4", `make_powersgd`). With a controller it must be a sparsifier
  /// (topk, approx_topk, randomk), whose selection size the controller sets each step.
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

namespace detail {

/// The error-feedback policy of a pipeline spec ("none", "residual", "ef21", "dgc:...").
using pipeline_compressor =
    std::variant<compressor<any_codec, no_feedback>, compressor<any_codec, residual_feedback>,
                 compressor<any_codec, ef21_feedback>, compressor<any_codec, dgc_feedback>>;

inline pipeline_compressor make_pipeline_compressor(std::string_view spec, any_codec codec) {
  std::string_view const name = spec.substr(0, spec.find(':'));
  bool const has_options = spec.find(':') != std::string_view::npos;
  if (name == "dgc") {
    float momentum = 0.9f;
    double clip = 0.0;
    if (has_options) {
      spec_options o(spec, "feedback");
      momentum = static_cast<float>(o.number("momentum", 0.9));
      clip = o.number("clip_norm", 0.0);
      o.finish();
    }
    return compressor<any_codec, dgc_feedback>(std::move(codec), dgc_feedback(momentum, clip));
  }
  if (has_options) {
    throw config_error("gradcomp: feedback '" + std::string(name) + "' takes no options, got '" + std::string(spec) + "'");
  }
  if (name == "none") return compressor<any_codec, no_feedback>(std::move(codec));
  if (name == "residual") return compressor<any_codec, residual_feedback>(std::move(codec));
  if (name == "ef21") return compressor<any_codec, ef21_feedback>(std::move(codec));
  throw config_error("gradcomp: unknown error feedback '" + std::string(spec) +
                     "' (expected none, residual, ef21 or dgc[:momentum=M,clip_norm=C])");
}

/// Sum of squares of a host float span, in double, in the canonical order of
/// core/quant/dither.hpp (`host_memory::sum_of_squares`): the guard's norms of a device source
/// (`device_memory::sum_of_squares`) have the same bits.
inline double norm_sq(std::span<float const> v) noexcept { return host_memory{}.sum_of_squares(v); }

/// The pipeline's view of a device source (type-erased; `device_source_model` is the one
/// implementation). The communicator comes in erased as well (`any_communicator::borrow`).
class device_source_base {
 public:
  device_source_base() = default;
  device_source_base(device_source_base const&) = delete;
  device_source_base& operator=(device_source_base const&) = delete;
  virtual ~device_source_base() = default;
  /// The source's error feedback: none (`stream_codec`), or its rule's (`device_compressor<C,
  /// Rule>`: residual, EF21 or DGC).
  [[nodiscard]] virtual feedback_id feedback() const noexcept = 0;
  /// A DGC source's momentum, clipping norm and workers (`config_error` for another source).
  [[nodiscard]] virtual std::tuple<float, double, std::uint32_t> dgc_parameters() const = 0;
  /// Floats of the feedback state of an n-element tensor (2n for DGC's [u | v]; 0 for none).
  [[nodiscard]] virtual std::size_t state_floats(std::size_t n) const noexcept = 0;
  /// The collectives' fingerprint of the source's codec for `n` elements.
  [[nodiscard]] virtual std::uint64_t fingerprint(std::size_t n, reduction op) const = 0;
  /// One step of the bucketed collective over `items` (device spans); commits the residuals
  /// after the outcome round only, so a failure leaves them as they were.
  virtual bucket_result exchange(any_communicator& comm, std::span<bucket_item const> items,
                                 codec_context const& ctx) = 0;
  /// The guard's dense action: one step of `items` sent as they are, every tensor in float32
  /// buckets (the bucketed collective of the source's codec without feedback, options of the
  /// pipeline with no tensor compressed); the residuals are not touched.
  virtual bucket_result exchange_dense(any_communicator& comm, std::span<bucket_item const> items,
                                       codec_context const& ctx) = 0;
  /// Forgets every feedback state and EF21 receiver (the guard's reset after a non-finite
  /// residual).
  virtual void reset_states() = 0;
  /// The committed feedback state of `id` in device memory — the residual, EF21's h or DGC's
  /// [u | v] (empty: none yet, or feedback "none").
  [[nodiscard]] virtual std::span<float const> state(tensor_id id) const = 0;
  /// A host copy of `state(id)`.
  [[nodiscard]] virtual std::vector<float> state_on_host(tensor_id id) const = 0;
  /// A host copy of EF21's receiver estimate of `id` (empty: none, or another rule).
  [[nodiscard]] virtual std::vector<float> receiver_on_host(tensor_id id) const = 0;
  /// Replaces every state and EF21 receiver by host values (empty: zero); on an error nothing
  /// changes.
  virtual void assign_states(std::map<tensor_id, std::vector<float>> const& states,
                             std::map<tensor_id, std::vector<float>> const& receivers) = 0;
  /// Σ x² of device floats, the bits of `norm_sq` (the memory space's `sum_of_squares`).
  [[nodiscard]] virtual double sum_of_squares(std::span<float const> x) const = 0;
  /// The compression gain's terms of one tensor (`pipeline_options::measure_gain`): ‖p‖² and
  /// ‖D(C(p))‖² of the input p the source compresses (g + residual, EF21's g − h, DGC's v; g
  /// without feedback), with the bits of `norm_sq`. The packet is the one the exchange then
  /// sends (same codec, context and tensor id), compressed once more into a scratch buffer; the
  /// feedback state is not touched (the stage is discarded). A non-finite p throws what the
  /// exchange would throw.
  virtual std::pair<double, double> gain_terms(tensor_view<float const> g, codec_context const& ctx) = 0;
  /// Controllers (`pipeline_options::controller`). Whether the source's codec takes a selection
  /// size (`with_budget`: top-k, approximate top-k, random-k).
  [[nodiscard]] virtual bool has_budget() const noexcept = 0;
  /// A controller's stage of one tensor, as the CPU pipeline's `stage`: the source's input p is
  /// staged (g + residual, EF21's g − h, DGC's v; g without feedback) and, for each factor of
  /// `factors`, a packet written in device memory and kept for the exchange — the codec at the
  /// first factor compresses p, each further level is `recompress_sparse` of the level before
  /// (on a host copy of the first packet, m elements, then copied back: its bytes are the CPU's
  /// by construction). With `norms`, ‖p‖² is added to `input_sq` and ‖D(packet l)‖² to
  /// `level_sq[l]` (the bits of `norm_sq`). A failure discards the stage and throws.
  virtual void stage_levels(tensor_view<float const> g, codec_context const& ctx, std::span<double const> factors,
                            bool norms, double& input_sq, std::span<double> level_sq) = 0;
  /// One step of the bucketed collective sending the level-`level` packets of the staged
  /// tensors (written by `stage_levels`, the codec at `factor`), the small tensors of `items`
  /// dense; the feedback steps are prepared from the packets sent and committed after the
  /// outcome round (EF21's receivers take the outputs then).
  virtual bucket_result exchange_level(any_communicator& comm, std::span<bucket_item const> items, std::size_t level,
                                       double factor, codec_context const& ctx) = 0;
  /// The staged input p of `id` (device memory; g itself for a source without feedback: empty).
  [[nodiscard]] virtual std::span<float const> staged_input(tensor_id id) const = 0;
  /// The staged input of `id` was delivered exactly (a dense send of p): the residual becomes
  /// zero, EF21's h takes p, DGC's u and v become zero.
  virtual void commit_lossless(tensor_id id) = 0;
  /// Drops the staged step of `id` (the state stays).
  virtual void discard(tensor_id id) noexcept = 0;
  /// EF21's receiver side for a dense output of `id` (nothing for another rule).
  virtual void receive(tensor_id id, std::span<float> io) = 0;
  /// Accordion's per-layer gradients (the CPU pipeline's `accumulate_layer`), in device memory:
  /// with `accumulate` x is added to the accumulator of `id` (zeros when its size differs);
  /// with `report` its ‖·‖² is returned (0 when empty) and it is emptied. Staged until
  /// `layers_commit`; `layers_rollback` puts every accumulator back.
  virtual double accumulate_layer(tensor_id id, std::span<float const> x, bool accumulate, bool report) = 0;
  virtual void layers_commit() noexcept = 0;
  virtual void layers_rollback() noexcept = 0;
  /// Host copies of the accumulators (as the CPU pipeline saves them: an emptied one is empty).
  [[nodiscard]] virtual std::map<tensor_id, std::vector<float>> layers_on_host() const = 0;
  /// Replaces every accumulator by host values; nothing changes on an error.
  virtual void layers_assign(std::map<tensor_id, std::vector<float>> const& acc) = 0;
  /// Sets device floats to zero (the outputs of a step the guard skips).
  virtual void zero(std::span<float> x) const = 0;
  /// A device float32 buffer of `n` floats kept for tensor `id` across steps (a 16-bit
  /// gradient is widened into it and its result rounded back from it).
  virtual std::span<float> wide(tensor_id id, std::size_t n) = 0;
  /// Device casts with the bits of `widen_to_f32` and `round_from_f32` (the memory space's
  /// `widen` and `narrow`); `config_error` for a source whose memory space has none.
  virtual void widen(std::span<half const> src, std::span<float> dst) const = 0;
  virtual void widen(std::span<bfloat16 const> src, std::span<float> dst) const = 0;
  virtual void narrow(std::span<float const> src, std::span<half> dst) const = 0;
  virtual void narrow(std::span<float const> src, std::span<bfloat16> dst) const = 0;

  /// Two-way compression (`pipeline_options::two_way`): the source's codec on the worker and
  /// the server side, with its feedback on both (device residuals for a source that keeps
  /// residuals, none else), a `two_way_compressor` kept in device memory. `two_way_begin`
  /// opens a step, `two_way_exchange` runs `all_reduce_two_way`'s exchange of one tensor
  /// (the outcome round is the caller's), `two_way_commit` keeps the step's changes and
  /// `two_way_rollback` puts every state back.
  virtual void two_way_begin() = 0;
  virtual collective_result two_way_exchange(any_communicator& comm, tensor_view<float const> g, std::span<float> out,
                                             codec_context const& ctx, collective_options const& copt,
                                             step_check& check) = 0;
  virtual void two_way_commit() noexcept = 0;
  virtual void two_way_rollback() noexcept = 0;
  /// The two-way state in `two_way_compressor::save`'s format (host copies of the residuals).
  [[nodiscard]] virtual std::vector<std::byte> two_way_save() const = 0;
  /// Restores a state written by `two_way_save` (or by the CPU pipeline's two-way compressor
  /// with the same feedback); `format_error` and nothing changed on a malformed one.
  virtual void two_way_load(std::span<std::byte const> bytes) = 0;

  /// The hierarchical all-reduce (`pipeline_options::hierarchical`) of one compressed tensor
  /// over the node and lane communicators of `gradient_pipeline::set_hierarchical_groups`
  /// (`hierarchical_exchange_over`; the outcome round is the caller's). The shard owners'
  /// feedback steps stay staged until `hierarchical_commit`; `hierarchical_rollback` discards
  /// them.
  virtual hierarchical_result hierarchical_exchange(any_communicator& comm, any_communicator& node,
                                                    any_communicator* lane, hierarchical_plan const& plan,
                                                    tensor_view<float const> g, std::span<float> out,
                                                    codec_context const& ctx, hierarchical_options const& opt,
                                                    step_check& check) = 0;
  virtual void hierarchical_commit() = 0;
  virtual void hierarchical_rollback() noexcept = 0;

  /// PowerSGD (a "powersgd" codec spec): whether the source's memory space makes device
  /// sessions (`make_low_rank_session`, found by argument-dependent lookup on the memory space:
  /// cuda/powersgd.cuh for `cuda::device_memory`).
  [[nodiscard]] virtual bool makes_low_rank_sessions() const noexcept = 0;
  /// `all_reduce_low_rank`'s exchange of tensor `id` (the outcome round is the caller's) with
  /// its session, made at its first step for a rows × cols matrix with `opt`; the session's
  /// state before the step is kept until `low_rank_commit` (`low_rank_rollback` puts it back).
  virtual collective_result low_rank_exchange(any_communicator& comm, tensor_id id, std::size_t rows,
                                              std::size_t cols, powersgd_options const& opt,
                                              tensor_view<float const> g, std::span<float> out,
                                              codec_context const& ctx, collective_options const& copt,
                                              step_check& check) = 0;
  virtual void low_rank_commit() noexcept = 0;
  virtual void low_rank_rollback() noexcept = 0;
  /// The sessions in the CPU pipeline's checkpoint format (count, then per session its id,
  /// rows, cols and `save_exact`), in ascending id order.
  virtual void low_rank_save(byte_writer& w) const = 0;
  /// Replaces every session by `saved` (id → rows, cols and a "GCPS" v1 record of
  /// `save_exact`, already validated by a host session); nothing changes on an error.
  virtual void low_rank_load(
      std::map<tensor_id, std::tuple<std::size_t, std::size_t, std::vector<std::byte>>> const& saved,
      powersgd_options const& opt) = 0;
};

/// The record format `low_rank_load` takes (one session's `save_exact`).
inline constexpr char const* low_rank_record_magic = "GCPS";

/// The PowerSGD sessions of a device source whose memory space `M` makes them
/// (`make_low_rank_session(m, rows, cols, options, id)`, found by argument-dependent lookup:
/// cuda/powersgd.cuh), with the states to put back if the step fails; empty for another space.
template <class M>
struct low_rank_store {};
template <class M>
  requires requires(M const& m, powersgd_options const& o) {
    make_low_rank_session(m, std::size_t{}, std::size_t{}, o, tensor_id{});
  }
struct low_rank_store<M> {
  using session_type = decltype(make_low_rank_session(std::declval<M const&>(), std::size_t{}, std::size_t{},
                                                      std::declval<powersgd_options const&>(), tensor_id{}));
  std::map<tensor_id, session_type> sessions;
  std::vector<std::pair<tensor_id, std::optional<decltype(std::declval<session_type const&>().snapshot())>>> undo;
};

/// The packet source of a controller's exchange (`device_source_base::exchange_level`): its
/// codec is the source's codec at the decided level, its packets are the ones written before
/// the decision (copied into the collective's buffers), and the feedback steps go to the source
/// that staged them (`Source`'s `prepare_commit`, `apply_commit`, `discard`, EF21's `receive`).
template <class Source, class Codec>
class prepared_source {
 public:
  prepared_source(Source& src, Codec const& codec) noexcept : src_(&src), codec_(&codec) {}
  /// The level's codec and packets of the step (the packets stay owned by the caller).
  void bind(Codec const& codec, std::map<tensor_id, std::span<std::byte const>> packets) {
    codec_ = &codec;
    packets_ = std::move(packets);
  }
  [[nodiscard]] Codec const& codec() const noexcept { return *codec_; }
  std::size_t compress(tensor_view<float const> g, std::span<std::byte> out, codec_context const& = {}) {
    return copy(g.id(), out);
  }
  std::size_t stage(tensor_view<float const> g, std::span<std::byte> out, codec_context const& = {})
    requires two_phase_source<Source>
  {
    return copy(g.id(), out);
  }
  template <class D>
  void prepare_commit(tensor_id id, D const& codec, std::span<std::byte const> sent, codec_context const& ctx = {})
    requires two_phase_source<Source>
  {
    src_->prepare_commit(id, codec, sent, ctx);
  }
  void apply_commit(tensor_id id)
    requires two_phase_source<Source>
  {
    src_->apply_commit(id);
  }
  void discard(tensor_id id)
    requires two_phase_source<Source>
  {
    src_->discard(id);
  }
  void receive(tensor_id id, std::span<float> io)
    requires requires(Source& x, tensor_id i, std::span<float> o) { x.receive(i, o); }
  {
    src_->receive(id, io);
  }

 private:
  std::size_t copy(tensor_id id, std::span<std::byte> out) const {
    auto const it = packets_.find(id);
    if (it == packets_.end()) {
      throw config_error("gradcomp: gradient_pipeline: tensor " + std::to_string(static_cast<unsigned>(id)) +
                         " has no staged packet for the controller's exchange");
    }
    std::span<std::byte const> const p = it->second;
    if (out.size() < p.size()) {
      throw config_error("gradcomp: gradient_pipeline: a staged packet of " + std::to_string(p.size()) +
                         " bytes does not fit the collective's buffer of " + std::to_string(out.size()));
    }
    memory_of(*codec_).copy(out.first(p.size()), p);
    return p.size();
  }
  Source* src_;
  Codec const* codec_;
  std::map<tensor_id, std::span<std::byte const>> packets_;
};

/// `device_source_base` over a `Source` (its payloads in device memory, a `bucketed_all_reduce`
/// of it doing the exchange).
template <class Source>
class device_source_model final : public device_source_base {
 public:
  device_source_model(Source src, bucket_options const& opt) : opt_(opt), buckets_(std::move(src), opt) {}

  [[nodiscard]] feedback_id feedback() const noexcept override { return feedback_kind; }
  [[nodiscard]] std::tuple<float, double, std::uint32_t> dgc_parameters() const override {
    if constexpr (feedback_kind == feedback_id::dgc) {
      auto const& r = buckets_source().rule();
      return {r.momentum(), r.clip_norm(), r.workers()};
    } else {
      throw config_error("gradcomp: gradient_pipeline: the device source keeps no DGC state");
    }
  }
  [[nodiscard]] std::size_t state_floats(std::size_t n) const noexcept override {
    if constexpr (feedback_kind == feedback_id::none) {
      (void)n;
      return 0;
    } else {
      return Source::rule_type::state_floats(n);
    }
  }
  [[nodiscard]] std::uint64_t fingerprint(std::size_t n, reduction op) const override {
    return codec_fingerprint(buckets_source(), n, op, codec_context{}, "gradient_pipeline source");
  }
  bucket_result exchange(any_communicator& comm, std::span<bucket_item const> items,
                         codec_context const& ctx) override {
    return buckets_.run(comm, items, ctx);
  }
  bucket_result exchange_dense(any_communicator& comm, std::span<bucket_item const> items,
                               codec_context const& ctx) override {
    if (!dense_) {
      bucket_options o = opt_;
      o.min_compress_elements = std::numeric_limits<std::size_t>::max();
      o.small_format = dense_format::f32;
      dense_.emplace(codec_of(buckets_source()), o);
    }
    return dense_->run(comm, items, ctx);
  }
  void reset_states() override {
    if constexpr (feedback_kind != feedback_id::none) buckets_.source().reset();
  }
  [[nodiscard]] std::span<float const> state(tensor_id id) const override {
    if constexpr (feedback_kind != feedback_id::none) {
      return buckets_source().state(id);
    } else {
      (void)id;
      return {};
    }
  }
  [[nodiscard]] std::vector<float> state_on_host(tensor_id id) const override { return on_host(state(id)); }
  [[nodiscard]] std::vector<float> receiver_on_host(tensor_id id) const override {
    if constexpr (receiving) {
      return on_host(buckets_source().receiver(id));
    } else {
      (void)id;
      return {};
    }
  }
  void assign_states(std::map<tensor_id, std::vector<float>> const& states,
                     std::map<tensor_id, std::vector<float>> const& receivers) override {
    if constexpr (receiving) {
      buckets_.source().assign_states(states, receivers);
    } else if constexpr (feedback_kind != feedback_id::none) {
      if (!receivers.empty()) throw config_error("gradcomp: gradient_pipeline: receiver states for a source without a receiver side");
      buckets_.source().assign_states(states);
    } else {
      (void)states, (void)receivers;  // no feedback: nothing to load
    }
  }
  [[nodiscard]] double sum_of_squares(std::span<float const> x) const override {
    return memory_of(buckets_source()).sum_of_squares(x);
  }
  void zero(std::span<float> x) const override { memory_of(buckets_source()).zero(std::as_writable_bytes(x)); }
  std::pair<double, double> gain_terms(tensor_view<float const> g, codec_context const& ctx) override {
    auto const mem = memory_of(buckets_source());
    auto const& c = codec_of(buckets_source());
    std::span<float const> const p = stage_input(g, ctx);
    try {
      if (!gain_packet_) gain_packet_.emplace(mem.make_buffer());
      gain_packet_->resize(c.max_compressed_bytes(g.size()));
      std::size_t const bytes = c.compress(tensor_view<float const>(p, g.id()), gain_packet_->span(), ctx);
      std::pair<double, double> const terms{
          mem.sum_of_squares(p),
          decoded_norm(c, std::span<std::byte const>(gain_packet_->span().first(bytes)), g.size(), ctx)};
      discard(g.id());
      return terms;
    } catch (...) {
      discard(g.id());
      throw;
    }
  }

  [[nodiscard]] bool has_budget() const noexcept override { return budgeted; }
  void stage_levels(tensor_view<float const> g, codec_context const& ctx, std::span<double const> factors,
                    bool norms, double& input_sq, std::span<double> level_sq) override {
    if constexpr (!budgeted) {
      (void)g, (void)ctx, (void)factors, (void)norms, (void)input_sq, (void)level_sq;
      throw config_error("gradcomp: gradient_pipeline: the device source's codec has no selection size");
    } else {
      auto const mem = memory_of(buckets_source());
      std::span<float const> const p = stage_input(g, ctx);
      try {
        if (norms) input_sq += mem.sum_of_squares(p);
        if (factors.empty()) return;  // a dense step: the input only
        std::vector<level_packet>& lv = levels_[g.id()];
        while (lv.size() < factors.size()) lv.push_back({mem.make_buffer(), 0});
        codec_type const& c0 = level_codec(factors[0]);
        lv[0].buf.resize(c0.max_compressed_bytes(g.size()));
        lv[0].bytes = c0.compress(tensor_view<float const>(p, g.id()), lv[0].buf.span(), ctx);
        if (factors.size() > 1 && direct_levels()) {
          // Re-compression equals compressing p at the level's size: on the device.
          for (std::size_t l = 1; l < factors.size(); ++l) {
            codec_type const& c = level_codec(factors[l]);
            lv[l].buf.resize(c.max_compressed_bytes(g.size()));
            lv[l].bytes = c.compress(tensor_view<float const>(p, g.id()), lv[l].buf.span(), ctx);
          }
        } else if (factors.size() > 1) {
          // The further levels from the packet before, on the host (m elements, not n).
          std::vector<std::byte> prev(lv[0].bytes);
          mem.read(std::span<std::byte const>(lv[0].packet()),
                   [&](std::span<std::byte const> h) { std::memcpy(prev.data(), h.data(), h.size()); });
          for (std::size_t l = 1; l < factors.size(); ++l) {
            std::uint64_t const k = sparse_budget::factor(factors[l]).kept(g.size());
            std::vector<std::byte> next(max_recompressed_bytes(std::span<std::byte const>(prev), k));
            next.resize(recompress_sparse(std::span<std::byte const>(prev), k, std::span<std::byte>(next), ctx));
            lv[l].buf.resize(next.size());
            mem.write(lv[l].buf.span(), std::span<std::byte const>(next));
            lv[l].bytes = next.size();
            prev = std::move(next);
          }
        }
        if (norms) {
          for (std::size_t l = 0; l < factors.size(); ++l)
            level_sq[l] += decoded_norm(level_codec(factors[l]), lv[l].packet(), g.size(), ctx);
        }
      } catch (...) {
        discard(g.id());
        throw;
      }
    }
  }
  bucket_result exchange_level(any_communicator& comm, std::span<bucket_item const> items, std::size_t level,
                               double factor, codec_context const& ctx) override {
    if constexpr (!budgeted) {
      (void)comm, (void)items, (void)level, (void)factor, (void)ctx;
      throw config_error("gradcomp: gradient_pipeline: the device source's codec has no selection size");
    } else {
      codec_type const& c = level_codec(factor);
      std::map<tensor_id, std::span<std::byte const>> packets;
      for (auto const& it : items) {
        auto const found = levels_.find(it.grad.id());
        if (found != levels_.end() && found->second.size() > level)
          packets.emplace(it.grad.id(), found->second[level].packet());
      }
      if (!prepared_) prepared_.emplace(prepared_type(buckets_.source(), c), opt_);
      prepared_->source().bind(c, std::move(packets));
      return prepared_->run(comm, items, ctx);
    }
  }
  [[nodiscard]] std::span<float const> staged_input(tensor_id id) const override {
    if constexpr (feedback_kind != feedback_id::none) {
      return buckets_source().staged_input(id);
    } else {
      (void)id;
      return {};
    }
  }
  void commit_lossless(tensor_id id) override {
    if constexpr (feedback_kind != feedback_id::none) buckets_.source().commit_lossless(id);
  }
  void discard(tensor_id id) noexcept override {
    if constexpr (feedback_kind != feedback_id::none) buckets_.source().discard(id);
  }
  void receive(tensor_id id, std::span<float> io) override {
    if constexpr (receiving) {
      buckets_.source().receive(id, io);
    } else {
      (void)id, (void)io;
    }
  }
  double accumulate_layer(tensor_id id, std::span<float const> x, bool accumulate, bool report) override {
    auto const mem = memory_of(buckets_source());
    auto const [it, fresh] = layers_.try_emplace(id, layer_slot{mem.make_buffer(), mem.make_buffer()});
    if (fresh) layers_fresh_.push_back(id);
    layers_touched_.push_back(id);
    layer_slot& a = it->second;
    // The step's value goes to `a.next` (accumulated) or stays `a.cur`; made current at
    // `layers_commit`.
    a.use_next = accumulate;
    a.next_n = a.n;
    if (accumulate) {
      a.next.resize(x.size_bytes());
      std::span<float> const nx = float_span(a.next, x.size());
      if (a.n == x.size()) {
        mem.copy(std::as_writable_bytes(nx), a.cur.span().first(x.size_bytes()));
      } else {
        mem.zero(std::as_writable_bytes(nx));
      }
      mem.add(x, nx);
      a.next_n = x.size();
    }
    if (!report) return 0.0;
    auto const& v = a.use_next ? a.next : a.cur;
    double const sq =
        a.next_n == 0 ? 0.0 : mem.sum_of_squares(std::span<float const>(reinterpret_cast<float const*>(v.data()), a.next_n));
    a.next_n = 0;  // emptied once reported
    return sq;
  }
  void layers_commit() noexcept override {
    for (tensor_id id : layers_touched_) {
      layer_slot& a = layers_.at(id);
      if (a.use_next) std::swap(a.cur, a.next);
      a.n = a.next_n;
      a.use_next = false;
    }
    layers_touched_.clear();
    layers_fresh_.clear();
  }
  void layers_rollback() noexcept override {
    for (tensor_id id : layers_touched_) {
      auto const it = layers_.find(id);
      if (it != layers_.end()) it->second.use_next = false;
    }
    for (tensor_id id : layers_fresh_) layers_.erase(id);
    layers_touched_.clear();
    layers_fresh_.clear();
  }
  [[nodiscard]] std::map<tensor_id, std::vector<float>> layers_on_host() const override {
    std::map<tensor_id, std::vector<float>> out;
    for (auto const& [id, a] : layers_) {  // (between steps: nothing is staged)
      out.emplace(id, on_host(std::span<float const>(reinterpret_cast<float const*>(a.cur.data()), a.n)));
    }
    return out;
  }
  void layers_assign(std::map<tensor_id, std::vector<float>> const& acc) override {
    auto const mem = memory_of(buckets_source());
    std::map<tensor_id, layer_slot> fresh;
    for (auto const& [id, v] : acc) {
      layer_slot& a = fresh.try_emplace(id, layer_slot{mem.make_buffer(), mem.make_buffer()}).first->second;
      a.cur.resize(v.size() * sizeof(float));
      mem.write(a.cur.span(), std::as_bytes(std::span<float const>(v)));
      a.n = v.size();
    }
    layers_ = std::move(fresh);
    layers_touched_.clear();
    layers_fresh_.clear();
  }
  std::span<float> wide(tensor_id id, std::size_t n) override {
    auto it = wides_.find(id);
    if (it == wides_.end()) it = wides_.emplace(id, memory_of(buckets_source()).make_buffer()).first;
    it->second.resize(n * sizeof(float));
    return {reinterpret_cast<float*>(it->second.data()), n};
  }
  void widen(std::span<half const> src, std::span<float> dst) const override { cast(src, dst); }
  void widen(std::span<bfloat16 const> src, std::span<float> dst) const override { cast(src, dst); }
  void narrow(std::span<float const> src, std::span<half> dst) const override { cast(src, dst); }
  void narrow(std::span<float const> src, std::span<bfloat16> dst) const override { cast(src, dst); }

  void two_way_begin() override { two_way().begin_step(); }
  collective_result two_way_exchange(any_communicator& comm, tensor_view<float const> g, std::span<float> out,
                                     codec_context const& ctx, collective_options const& copt,
                                     step_check& check) override {
    return detail::two_way_exchange(comm, two_way(), g, out, ctx, copt, check);
  }
  void two_way_commit() noexcept override {
    if (two_way_) two_way_->commit_step();
  }
  void two_way_rollback() noexcept override {
    try {
      if (two_way_) two_way_->rollback_step();
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory while restoring
    }
  }
  [[nodiscard]] std::vector<std::byte> two_way_save() const override {
    return two_way_ ? two_way_->save() : two_way_type(codec_of(buckets_source())).save();
  }
  void two_way_load(std::span<std::byte const> bytes) override { two_way().load(bytes); }

  hierarchical_result hierarchical_exchange(any_communicator& comm, any_communicator& node, any_communicator* lane,
                                            hierarchical_plan const& plan, tensor_view<float const> g,
                                            std::span<float> out, codec_context const& ctx,
                                            hierarchical_options const& opt, step_check& check) override {
    Source& src = buckets_.source();
    pending_commit<Source> staged(src);
    hierarchical_result res;
    hierarchical_exchange_over(comm, node, lane, plan, src, g, out, ctx, opt, check, staged, res);
    for (tensor_id id : staged.release()) hier_staged_.push_back(id);
    return res;
  }
  void hierarchical_commit() override {
    if constexpr (two_phase_source<Source>) {
      for (tensor_id id : hier_staged_) buckets_.source().apply_commit(id);
    }
    hier_staged_.clear();
  }
  void hierarchical_rollback() noexcept override {
    try {
      if constexpr (two_phase_source<Source>) {
        for (tensor_id id : hier_staged_) buckets_.source().discard(id);
      }
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory while restoring
    }
    hier_staged_.clear();
  }

  [[nodiscard]] bool makes_low_rank_sessions() const noexcept override { return sessions_made; }
  collective_result low_rank_exchange(any_communicator& comm, tensor_id id, std::size_t rows, std::size_t cols,
                                      powersgd_options const& opt, tensor_view<float const> g,
                                      std::span<float> out, codec_context const& ctx,
                                      collective_options const& copt, step_check& check) override {
    if constexpr (sessions_made) {
      auto it = low_rank_.sessions.find(id);
      if (it == low_rank_.sessions.end()) {
        it = low_rank_.sessions.emplace(id, make_low_rank_session(memory_of(buckets_source()), rows, cols, opt, id)).first;
        low_rank_.undo.emplace_back(id, std::nullopt);
      } else {
        low_rank_.undo.emplace_back(id, it->second.snapshot());
      }
      return detail::low_rank_exchange(comm, it->second, g, out, ctx, copt, check);
    } else {
      (void)comm, (void)id, (void)rows, (void)cols, (void)opt, (void)g, (void)out, (void)ctx, (void)copt, (void)check;
      throw config_error("gradcomp: gradient_pipeline: this device source's memory space makes no PowerSGD sessions");
    }
  }
  void low_rank_commit() noexcept override {
    if constexpr (sessions_made) low_rank_.undo.clear();
  }
  void low_rank_rollback() noexcept override {
    if constexpr (sessions_made) {
      try {
        for (auto& [id, before] : low_rank_.undo) {
          if (before) low_rank_.sessions.at(id).restore(std::move(*before));
          else low_rank_.sessions.erase(id);
        }
      } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory while restoring
      }
      low_rank_.undo.clear();
    }
  }
  void low_rank_save(byte_writer& w) const override {
    if constexpr (sessions_made) {
      w.put_u64(low_rank_.sessions.size());
      for (auto const& [id, s] : low_rank_.sessions) {
        w.put_u64(static_cast<std::uint64_t>(id));
        w.put_u64(s.state().rows());
        w.put_u64(s.state().cols());
        s.save_exact(w);
      }
    } else {
      w.put_u64(0);
    }
  }
  void low_rank_load(std::map<tensor_id, std::tuple<std::size_t, std::size_t, std::vector<std::byte>>> const& saved,
                     powersgd_options const& opt) override {
    if constexpr (sessions_made) {
      decltype(low_rank_.sessions) fresh;
      for (auto const& [id, rec] : saved) {
        auto const& [rows, cols, bytes] = rec;
        auto it = fresh.emplace(id, make_low_rank_session(memory_of(buckets_source()), rows, cols, opt, id)).first;
        byte_reader r(std::span<std::byte const>(bytes), low_rank_record_magic, 1, "PowerSGD session");
        it->second.load_exact(r);
        r.expect_end();
      }
      low_rank_.sessions = std::move(fresh);
      low_rank_.undo.clear();
    } else if (!saved.empty()) {
      (void)opt;
      throw config_error("gradcomp: gradient_pipeline: this device source's memory space makes no PowerSGD sessions");
    }
  }

 private:
  // The source's feedback: its rule's, or none (`stream_codec`).
  static constexpr feedback_id feedback_kind = [] {
    if constexpr (requires { Source::rule_type::id; }) {
      return Source::rule_type::id;
    } else {
      return feedback_id::none;
    }
  }();
  static constexpr bool residuals = feedback_kind == feedback_id::residual;
  static constexpr bool receiving = feedback_kind == feedback_id::ef21;
  // A host copy of device floats.
  [[nodiscard]] std::vector<float> on_host(std::span<float const> d) const {
    std::vector<float> out(d.size());
    if (!d.empty()) {
      memory_of(buckets_source()).read(std::as_bytes(d), [&](std::span<std::byte const> h) {
        std::memcpy(out.data(), h.data(), h.size());
      });
    }
    return out;
  }
  // Two-way compression with the source's codec and feedback (made at its first use).
  using codec_type = std::remove_cvref_t<decltype(codec_of(std::declval<Source const&>()))>;
  using two_way_feedback = std::conditional_t<residuals, residual_feedback_for<codec_type>, no_feedback>;
  using two_way_type = two_way_compressor<codec_type, two_way_feedback, two_way_feedback>;
  two_way_type& two_way() {
    if (!two_way_) two_way_.emplace(codec_of(buckets_source()));
    return *two_way_;
  }
  std::optional<two_way_type> two_way_;
  // PowerSGD sessions (a "powersgd" codec spec), of the type the memory space makes.
  using memory_type = memory_of_t<Source>;
  static constexpr bool sessions_made = requires { typename low_rank_store<memory_type>::session_type; };
  low_rank_store<memory_type> low_rank_;
  std::vector<tensor_id> hier_staged_;  // the hierarchical step's staged feedback
  bucket_options opt_;
  std::optional<bucketed_all_reduce<codec_type>> dense_;  // the guard's dense steps
  [[nodiscard]] Source const& buckets_source() const noexcept { return buckets_.source(); }
  // A widening (16-bit source) or a rounding (16-bit destination) in the source's memory space.
  template <class A, class B>
  void cast(std::span<A const> src, std::span<B> dst) const {
    auto const mem = memory_of(buckets_source());
    if constexpr (std::same_as<B, float> && requires { mem.widen(src, dst); }) {
      mem.widen(src, dst);
    } else if constexpr (!std::same_as<B, float> && requires { mem.narrow(src, dst); }) {
      mem.narrow(src, dst);
    } else {
      throw config_error("gradcomp: gradient_pipeline: this device source's memory space has no 16-bit casts; "
                         "pass float32 gradients");
    }
  }
  mutable bucketed_all_reduce<Source> buckets_;  // `source()` is a non-const member
  std::map<tensor_id, typename memory_of_t<Source>::buffer> wides_;  // 16-bit gradients, widened
  std::optional<typename memory_of_t<Source>::buffer> gain_packet_, gain_decoded_;  // `gain_terms`

  // The source's input p of g, staged (g itself without feedback).
  std::span<float const> stage_input(tensor_view<float const> g, codec_context const& ctx) {
    if constexpr (feedback_kind != feedback_id::none) {
      return buckets_.source().stage_input(g, ctx);
    } else {
      (void)ctx;
      return g.span();
    }
  }
  // ‖D(packet)‖², decoded into zeros (the CPU pipeline's `packet_norm_sq`).
  template <class Codec>
  double decoded_norm(Codec const& c, std::span<std::byte const> packet, std::size_t n, codec_context const& ctx) {
    auto const mem = memory_of(buckets_source());
    if (!gain_decoded_) gain_decoded_.emplace(mem.make_buffer());
    gain_decoded_->resize(n * sizeof(float));
    std::span<float> const d = float_span(*gain_decoded_, n);
    mem.zero(std::as_writable_bytes(d));
    c.decompress_add(packet, d, 1.0f, ctx);
    return mem.sum_of_squares(std::span<float const>(d));
  }

  // Controllers: the source's codec at each factor (made once per factor, as the CPU
  // pipeline's `codec_cache_`), the packets of each level per tensor, the exchange of a level.
  static constexpr bool budgeted = requires(codec_type const& c) { c.with_budget(sparse_budget::factor(1.0)); };
  codec_type const& level_codec(double f)
    requires budgeted
  {
    auto it = level_codecs_.find(f);
    if (it == level_codecs_.end())
      it = level_codecs_.emplace(f, codec_of(buckets_source()).with_budget(sparse_budget::factor(f))).first;
    return it->second;
  }
  // Whether `recompress_sparse` of a packet gives the packet of p compressed directly at the
  // smaller size (codec/recompress.hpp): exact top-k with float32 values, unscaled random-k.
  // Approximate top-k, 16-bit top-k values and scaled random-k are re-compressed from the
  // packet.
  [[nodiscard]] bool direct_levels() const noexcept {
    if constexpr (codec_type::id == codec_id::topk) {
      return codec_of(buckets_source()).device_codec().value_type() == sparse_values::f32;
    } else if constexpr (codec_type::id == codec_id::random_k) {
      return !codec_type::device_codec_type::scaled;
    } else {
      return false;
    }
  }
  struct level_packet {
    typename memory_of_t<Source>::buffer buf;
    std::size_t bytes = 0;
    [[nodiscard]] std::span<std::byte const> packet() const noexcept { return buf.span().first(bytes); }
  };
  std::map<double, codec_type> level_codecs_;
  std::map<tensor_id, std::vector<level_packet>> levels_;
  using prepared_type = prepared_source<Source, codec_type>;
  std::optional<bucketed_all_reduce<prepared_type>> prepared_;
  // Accordion's accumulators: the current value (`n` floats, 0: empty) and the step's next one.
  struct layer_slot {
    typename memory_of_t<Source>::buffer cur, next;
    std::size_t n = 0, next_n = 0;
    bool use_next = false;
  };
  std::map<tensor_id, layer_slot> layers_;
  std::vector<tensor_id> layers_touched_, layers_fresh_;
};

}  // namespace detail

/// A packet source `gradient_pipeline` takes for device gradients: its payloads live in device
/// memory (its codec's `memory()` is not host memory; `cuda::stream_codec<C>` for feedback
/// "none", `cuda::device_compressor<C>` for "residual", cuda/collective.cuh), it compresses
/// float32 tensors and is a source of `bucketed_all_reduce`.
template <class S>
concept pipeline_device_source =
    std::move_constructible<S> && detail::packet_source<S, float> && !detail::host_payloads<S>;

/// The training step of compressed data-parallel training (see file comment). One object per
/// model (or per group of tensors that share a configuration); every rank makes one with the
/// same options and calls it in the same order. Not thread-safe.
class gradient_pipeline {
 public:
  /// Builds the pipeline; `config_error` for an invalid or inconsistent configuration.
  explicit gradient_pipeline(pipeline_options opt) : opt_(std::move(opt)) {
    if (opt_.buckets.mode != bucket_compression::per_tensor) {
      throw config_error("gradcomp: gradient_pipeline compresses per tensor (bucket_compression::per_tensor); "
                         "per_bucket would key error feedback by bucket");
    }
    std::string_view const family = std::string_view(opt_.codec).substr(0, opt_.codec.find(':'));
    if (family == "powersgd") {
      low_rank_ = make_powersgd(opt_.codec).options();
      if (opt_.feedback != "residual" && opt_.feedback != "none") {
        throw config_error("gradcomp: PowerSGD keeps its own error feedback: feedback must be 'residual' or 'none', got '" +
                           opt_.feedback + "'");
      }
      if (!opt_.controller.empty() || opt_.two_way) {
        throw config_error("gradcomp: gradient_pipeline: PowerSGD takes no controller and no two-way compression");
      }
      low_rank_->error_feedback = opt_.feedback == "residual";
      base_ = make_codec("identity");  // unused; keeps the compressor well-formed
    } else {
      base_ = make_codec(opt_.codec);
      if (base_.aggregation() == aggregation_kind::low_rank) {
        throw config_error("gradcomp: gradient_pipeline: low-rank codecs are configured by a powersgd spec");
      }
    }
    comp_ = detail::make_pipeline_compressor(opt_.feedback, base_);
    if (!opt_.controller.empty()) {
      if (!base_.has_budget()) {
        throw config_error(std::string("gradcomp: gradient_pipeline: a controller sets a sparsifier's selection size; codec '") +
                           base_.name() + "' has none (use topk, approx_topk or randomk)");
      }
      if (opt_.two_way) throw config_error("gradcomp: gradient_pipeline: two-way compression takes no controller");
      ctrl_.emplace(make_controller(opt_.controller));
    }
    if (opt_.two_way) {
      two_way_.emplace(make_two_way(opt_.feedback, base_));
    }
    if (!opt_.hierarchical.nodes.empty()) {
      if (!opt_.controller.empty() || opt_.two_way || low_rank_) {
        throw config_error(
            "gradcomp: gradient_pipeline: the hierarchical all-reduce takes no controller, no "
            "two-way compression and no PowerSGD");
      }
      if (opt_.feedback != "residual" && opt_.feedback != "none") {
        throw config_error(
            "gradcomp: gradient_pipeline: the hierarchical all-reduce keeps error feedback on the "
            "shard owners: feedback must be 'residual' or 'none', got '" + opt_.feedback + "'");
      }
      hier_ = true;
      opt_.hierarchical.op = opt_.buckets.op;
      opt_.hierarchical.checksum = opt_.buckets.checksum;
    }
    guard_.emplace(opt_.guard);
  }

  /// Builds a pipeline whose gradients are tensors in device memory, compressed by `src` (file
  /// comment): `cuda::device_compressor<C>` with feedback "residual", `cuda::stream_codec<C>`
  /// with feedback "none", C a CUDA codec. `opt.codec` is
  /// the spec of the CPU codec with the same wire format (e.g. "int8:bucket=100,rounding=
  /// stochastic" for `cuda::int8_codec{100, int8_rounding::stochastic}`): the pipeline's
  /// agreement round, statistics and checkpoints use it. `config_error` for what a device source
  /// does not take (file comment), for a feedback spec that does not match `src`, and for a codec
  /// spec whose codec differs from `src`'s in the collectives' fingerprint (codec, aggregation,
  /// packet sizes, bits per element).
  template <pipeline_device_source Source>
  gradient_pipeline(pipeline_options opt, Source src) : gradient_pipeline(std::move(opt)) {
    auto refuse = [](std::string const& what) {
      throw config_error("gradcomp: gradient_pipeline with a device source: " + what);
    };
    if (opt_.buckets.checksum)
      refuse("buckets.checksum is not taken (it reads every payload on the host)");
    if (opt_.buckets.small_format != dense_format::f32) {
      refuse("a 16-bit buckets.small_format is not taken (dense buckets are float32)");
    }
    auto model =
        std::make_unique<detail::device_source_model<Source>>(std::move(src), opt_.buckets);
    if (ctrl_ && !model->has_budget()) {
      refuse("a controller sets the selection size of the device codec, which has none (controller '" +
             opt_.controller + "')");
    }
    if (low_rank_) {
      // PowerSGD keeps its residuals in its sessions; the source sends the small tensors dense
      if (model->feedback() != feedback_id::none) {
        refuse("with PowerSGD the source keeps no feedback state (pass cuda::stream_codec<cuda::identity_codec>)");
      }
      if (!model->makes_low_rank_sessions()) {
        refuse("its memory space makes no PowerSGD sessions (include gradcomp/cuda/powersgd.cuh)");
      }
    }
    if (!low_rank_) {
      // The source's feedback is the spec's: its rule (and DGC's parameters) or none.
      feedback_id const mine = std::visit(
          [](auto const& c) { return std::remove_cvref_t<decltype(c)>::feedback_type::id; }, comp_);
      if (model->feedback() != mine) {
        constexpr char const* names[] = {"none", "residual", "ef21", "dgc"};
        refuse("its source's error feedback (" + std::string(names[static_cast<unsigned>(model->feedback()) & 3u]) +
               ") is not feedback '" + opt_.feedback + "'");
      }
      if (mine == feedback_id::dgc) {
        auto const& dgc = std::get<compressor<any_codec, dgc_feedback>>(comp_).feedback();
        auto const [m, clip, workers] = model->dgc_parameters();
        if (m != dgc.momentum() || clip != dgc.clip_norm() || workers != dgc.workers()) {
          refuse("its source's DGC parameters (momentum, clip_norm, workers) differ from feedback '" +
                 opt_.feedback + "'");
        }
      }
    }
    for (std::size_t const n : {std::size_t{1}, std::size_t{4099}, (std::size_t{1} << 20) + 3}) {
      if (model->fingerprint(n, opt_.buckets.op) !=
          detail::codec_fingerprint(base_, n, opt_.buckets.op, codec_context{},
                                    "gradient_pipeline source")) {
        refuse("codec spec '" + opt_.codec +
               "' does not describe the device codec (another codec, packet size or "
               "bits per element at " +
               std::to_string(n) + " elements)");
      }
    }
    device_ = std::move(model);
    two_way_.reset();  // two-way compression, if asked for, runs in the device source
  }

  [[nodiscard]] pipeline_options const& options() const noexcept { return opt_; }
  /// The next step's number (steps completed so far).
  [[nodiscard]] std::uint64_t step_count() const noexcept { return step_; }
  /// The controller, if any.
  [[nodiscard]] any_controller const* controller() const noexcept { return ctrl_ ? &*ctrl_ : nullptr; }
  /// Statistics of the last completed step.
  [[nodiscard]] pipeline_stats const& last_stats() const noexcept { return last_; }
  /// Called with the statistics of every completed step (e.g. for logging); empty: none.
  void on_step(std::function<void(pipeline_stats const&)> hook) { hook_ = std::move(hook); }
  /// The divergence guard (history and counters).
  [[nodiscard]] divergence_guard const& guard() const noexcept { return *guard_; }
  /// Called on every rank with each guard trip that did not raise (a skipped or dense step),
  /// before the step returns. Without one, rank 0 prints the verdict's message to stderr.
  void on_guard(std::function<void(guard_verdict const&)> hook) { guard_hook_ = std::move(hook); }

  /// The matrix shape (rows × cols, row-major) PowerSGD gives tensor `id`. Without one a
  /// tensor of n elements is taken as n / c × c with c the largest divisor of n up to √n.
  /// `config_error` unless rows · cols > 0; a size mismatch is found at the step.
  void set_shape(tensor_id id, std::size_t rows, std::size_t cols) {
    if (rows == 0 || cols == 0) throw config_error("gradcomp: gradient_pipeline::set_shape needs rows and cols > 0");
    shapes_[id] = {rows, cols};
  }

  /// The node and lane communicators of this rank for the hierarchical all-reduce
  /// (`pipeline_options::hierarchical`), as `hierarchical_groups` describes them
  /// (collective/hierarchical.hpp): `node` holds the ranks of this rank's node, numbered as the
  /// grouping numbers them; `lane`, on a rank that owns a shard, the j-th ranks of every node,
  /// numbered by node. Kept for every later step (pass `any_communicator::borrow(c)` to keep a
  /// reference to a communicator that lives elsewhere, e.g. one from
  /// `nccl_communicator::split`). Required with a device source, whose payloads stay on these
  /// communicators; with host tensors the steps use them instead of point-to-point groups over
  /// the step's communicator (the same bits). Every rank sets them or none does (the step's
  /// agreement round checks, and checks them against the grouping). `config_error` without
  /// the hierarchical option.
  void set_hierarchical_groups(any_communicator node, std::optional<any_communicator> lane = std::nullopt) {
    if (!hier_) {
      throw config_error("gradcomp: gradient_pipeline::set_hierarchical_groups without pipeline_options::hierarchical");
    }
    if (open_) throw config_error("gradcomp: gradient_pipeline::set_hierarchical_groups during a step");
    hier_node_.emplace(std::move(node));
    hier_lane_ = std::move(lane);
  }

  /// The committed error-feedback state of tensor `id` (the residual for "residual", h for
  /// "ef21", [u | v] for "dgc"); empty before its first step or without feedback.
  /// With a device source: the residual in device memory.
  [[nodiscard]] std::span<float const> feedback_state(tensor_id id) {
    if (device_) return device_->state(id);
    return std::visit([&](auto& c) -> std::span<float const> { return c.state(id).values(); }, comp_);
  }

  /// One step over all of the model's gradients (see file comment): averages them over the
  /// ranks of `comm` in place. Collective: every rank calls it with the same tensors (ids,
  /// sizes, order). Returns this rank's statistics.
  template <communicator Comm, element T>
  pipeline_stats step(Comm& comm, std::span<tensor_view<T> const> grads, pipeline_step_info const& info = {}) {
    begin(comm, info);
    try {
      for (auto const& g : grads) add_tensor(g);
    } catch (...) {
      abandon();
      throw;
    }
    return finish_step(comm);
  }
  /// `step` for a vector of tensors.
  template <communicator Comm, element T>
  pipeline_stats step(Comm& comm, std::vector<tensor_view<T>> const& grads, pipeline_step_info const& info = {}) {
    return step(comm, std::span<tensor_view<T> const>(grads), info);
  }

  /// Overlapped use, first call of a step: the backward pass is about to produce gradients.
  template <communicator Comm>
  void begin(Comm& comm, pipeline_step_info const& info = {}) {
    if (open_) {
      rollback();
      abandon();
    }
    open_ = true;
    info_ = info;
    step_check_ = detail::step_check(opt_.buckets.checksum);
    t_begin_ = clock::now();
    rank_ = comm.rank();
    size_ = comm.size();
    pending_.clear();
    guard_tensors_.clear();
    guard_nonfinite_ = false;
    local_ = nullptr;
    plan_ = ctrl_ ? ctrl_->plan() : step_plan{};
    levels_ = low_rank_ ? 0 : (ctrl_ ? plan_.measure.size() : 1);
    level_codecs_.clear();
    for (std::size_t l = 0; l < levels_; ++l) level_codecs_.push_back(codec_at_level(l));
    ef_norm_ = 0.0;
    comp_norms_.assign(levels_, 0.0);
    layer_norms_.clear();
    compress_s_ = 0.0;
    ctx_ = opt_.context;
    ctx_.step = static_cast<std::uint32_t>(step_);
    // Shared-support codecs draw the same coordinates on every rank, and PowerSGD starts every
    // rank from the same Q: their seed is shared; the others add the rank (independent noise).
    bool const shared = low_rank_ || base_.aggregation() == aggregation_kind::shared_support;
    ctx_.seed = opt_.seed + (shared ? 0u : static_cast<std::uint64_t>(rank_));
  }

  /// Overlapped use: a bucket of gradients is ready (e.g. from a DDP bucket hook). Its tensors
  /// are compressed now, while the backward pass goes on; they are sent and written back by
  /// `finish`. The tensors must stay alive and unchanged by the caller until then.
  template <element T>
  void submit(std::span<tensor_view<T> const> grads) {
    if (!open_) throw config_error("gradcomp: gradient_pipeline::submit before begin");
    for (auto const& g : grads) add_tensor(g);
  }
  /// `submit` for a vector of tensors.
  template <element T>
  void submit(std::vector<tensor_view<T>> const& grads) {
    submit(std::span<tensor_view<T> const>(grads));
  }

  /// Overlapped use, last call of a step: agrees, decides, sends, commits and writes every
  /// submitted tensor's average back. Collective.
  template <communicator Comm>
  pipeline_stats finish(Comm& comm) {
    if (!open_) throw config_error("gradcomp: gradient_pipeline::finish before begin");
    return finish_step(comm);
  }

  /// Saves the whole state (pipeline/checkpoint.hpp). Not during an open step.
  [[nodiscard]] std::vector<std::byte> save() const {
    if (open_) throw config_error("gradcomp: gradient_pipeline::save during a step (call finish first)");
    detail::byte_writer w;
    w.begin(checkpoint_magic, checkpoint_version);
    w.put_string(opt_.codec);
    w.put_string(opt_.feedback);
    w.put_string(opt_.controller);
    w.put_u64(opt_.two_way ? 1 : 0);
    w.put_u64(step_);
    w.put_f64(last_timing_.backprop);
    w.put_f64(last_timing_.compress);
    w.put_f64(last_timing_.sync);
    w.put_bytes(device_ ? device_state()
                        : std::visit([](auto const& c) { return c.save(); }, comp_));
    w.put_bytes(ctrl_ ? ctrl_->save() : std::vector<std::byte>{});
    std::map<tensor_id, std::vector<float>> const device_layers =
        device_ ? device_->layers_on_host() : std::map<tensor_id, std::vector<float>>{};
    auto const& accumulators = device_ ? device_layers : accumulators_;
    w.put_u64(accumulators.size());
    for (auto const& [id, acc] : accumulators) {
      w.put_u64(static_cast<std::uint64_t>(id));
      w.put_floats(acc);
    }
    if (device_) {
      device_->low_rank_save(w);
    } else {
      w.put_u64(sessions_.size());
      for (auto const& [id, s] : sessions_) {
        w.put_u64(static_cast<std::uint64_t>(id));
        w.put_u64(s.state().rows());
        w.put_u64(s.state().cols());
        s.state().save_exact(w);
      }
    }
    if (device_ && opt_.two_way) {
      w.put_bytes(device_->two_way_save());
    } else {
      w.put_bytes(two_way_ ? std::visit([](auto const& t) { return t.save(); }, *two_way_) : std::vector<std::byte>{});
    }
    w.put_bytes(guard_->save());
    return w.finish();
  }

  /// Restores a state written by `save` of a pipeline with the same codec, feedback,
  /// controller, two-way and guard options. A malformed, corrupted (the checkpoint ends in a
  /// CRC32C of all its bytes, core/serialize.hpp) or mismatched checkpoint is a `format_error`
  /// and leaves the state unchanged; so is one saved before checkpoints carried a checksum. With a
  /// device source the residuals are copied to the device (on the source's stream).
  void load(std::span<std::byte const> bytes) {
    if (open_) throw config_error("gradcomp: gradient_pipeline::load during a step");
    detail::byte_reader r(bytes, checkpoint_magic, checkpoint_version,
                          "gradient_pipeline checkpoint");
    auto expect = [&](std::string const& got, std::string const& mine, char const* what) {
      if (got != mine) {
        r.fail(std::string("saved with ") + what + " '" + got + "', this pipeline has '" + mine + "'");
      }
    };
    expect(r.get_string(), opt_.codec, "codec");
    expect(r.get_string(), opt_.feedback, "feedback");
    expect(r.get_string(), opt_.controller, "controller");
    if (r.get_u64() != (opt_.two_way ? 1u : 0u)) r.fail("saved with another two_way setting");
    std::uint64_t const step = r.get_u64();
    step_timing timing;
    timing.backprop = r.get_f64();
    timing.compress = r.get_f64();
    timing.sync = r.get_f64();
    // Everything is restored into copies first, then swapped in: a failure changes nothing.
    detail::pipeline_compressor comp = comp_;
    std::vector<std::byte> const cstate = r.get_bytes();
    std::visit([&](auto& c) { c.load(cstate, state_check::container); }, comp);  // GCPL checked it
    // A device source: the states (and EF21's receivers) validated by the host compressor
    // above, then copied.
    std::map<tensor_id, std::vector<float>> device_states, device_receivers;
    std::set<tensor_id> device_tensors;
    if (device_) {
      std::visit(
          [&](auto const& c) {
            c.for_each_committed([&](tensor_id id, std::span<float const> v) {
              device_states.emplace(id, std::vector<float>(v.begin(), v.end()));
              device_tensors.insert(id);
            });
            c.for_each_receiver([&](tensor_id id, std::span<float const> v) {
              device_receivers.emplace(id, std::vector<float>(v.begin(), v.end()));
            });
          },
          comp);
    }
    std::optional<any_controller> ctrl = ctrl_;
    std::vector<std::byte> const kstate = r.get_bytes();
    if (ctrl) {
      ctrl->load(kstate);
    } else if (!kstate.empty()) {
      r.fail("holds controller state, this pipeline has no controller");
    }
    std::map<tensor_id, std::vector<float>> acc;
    std::uint64_t const nacc = r.get_u64();
    for (std::uint64_t i = 0; i < nacc; ++i) {
      auto const id = static_cast<tensor_id>(r.get_u32_of_u64("accumulator id"));
      if (!acc.emplace(id, r.get_floats()).second) r.fail("an accumulator id appears twice");
    }
    std::map<tensor_id, powersgd_session> sessions;
    std::map<tensor_id, std::tuple<std::size_t, std::size_t, std::vector<std::byte>>> device_sessions;
    std::uint64_t const nses = r.get_u64();
    if (nses != 0 && !low_rank_) r.fail("holds PowerSGD sessions, this pipeline is not PowerSGD");
    for (std::uint64_t i = 0; i < nses; ++i) {
      auto const id = static_cast<tensor_id>(r.get_u32_of_u64("session id"));
      std::uint64_t const rows = r.get_u64(), cols = r.get_u64();
      if (rows == 0 || cols == 0 || rows > (std::uint64_t{1} << 40) / cols) r.fail("a PowerSGD session has an invalid shape");
      powersgd_session s(static_cast<std::size_t>(rows), static_cast<std::size_t>(cols), *low_rank_, id);
      s.state().load_exact(r);
      if (device_) {  // validated by the host session, re-recorded for the device's
        detail::byte_writer rec;
        rec.begin(detail::low_rank_record_magic, 1);
        s.state().save_exact(rec);
        device_sessions[id] = {static_cast<std::size_t>(rows), static_cast<std::size_t>(cols), rec.finish()};
      }
      if (!sessions.emplace(id, std::move(s)).second) r.fail("a PowerSGD session id appears twice");
    }
    std::optional<two_way_variant> tw = two_way_;
    std::vector<std::byte> const tstate = r.get_bytes();
    if (device_ && opt_.two_way) {
      // validated by a host two-way compressor of the same feedback, loaded at the end
      two_way_variant check = make_two_way(opt_.feedback, base_);
      std::visit([&](auto& t) { t.load(tstate); }, check);
    } else if (tw) {
      std::visit([&](auto& t) { t.load(tstate); }, *tw);
    } else if (!tstate.empty()) {
      r.fail("holds two-way state, this pipeline is not two-way");
    }
    std::optional<divergence_guard> guard(std::in_place, opt_.guard);
    {
      std::vector<std::byte> const gstate = r.get_bytes();
      try {
        guard->load(gstate);
      } catch (format_error const& e) {
        r.fail(e.what());
      }
    }
    r.expect_end();
    if (device_) {
      // the steps that may fail come first; each changes nothing when it fails, and at most one
      // of them has anything to load (two-way and PowerSGD exclude each other, and the
      // residuals of either are empty, so their assignment allocates nothing)
      if (opt_.two_way) device_->two_way_load(tstate);
      if (low_rank_) device_->low_rank_load(device_sessions, *low_rank_);
      device_->layers_assign(acc);  // (empty but for a controller, which excludes both above)
      device_->assign_states(device_states, device_receivers);
      device_tensors_ = std::move(device_tensors);
    } else {
      comp_ = std::move(comp);
    }
    ctrl_ = std::move(ctrl);
    if (!device_) accumulators_ = std::move(acc);
    if (!device_) sessions_ = std::move(sessions);
    two_way_ = std::move(tw);
    guard_ = std::move(guard);
    step_ = step;
    last_timing_ = timing;
  }

  /// Magic and version of the checkpoint format.
  static constexpr char const* checkpoint_magic = "GCPL";
  static constexpr std::uint8_t checkpoint_version = 2;

 private:
  using clock = std::chrono::steady_clock;
  static double seconds(clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

  using two_way_variant = std::variant<two_way_compressor<any_codec, no_feedback, no_feedback>,
                                       two_way_compressor<any_codec, residual_feedback, residual_feedback>>;
  static two_way_variant make_two_way(std::string const& feedback, any_codec const& c) {
    if (feedback == "none") return two_way_compressor<any_codec, no_feedback, no_feedback>(c);
    if (feedback == "residual") return two_way_compressor<any_codec, residual_feedback, residual_feedback>(c);
    throw config_error("gradcomp: two-way compression takes feedback none or residual (worker and server side), got '" +
                       feedback + "'");
  }

  // One tensor of the step in progress.
  struct entry {
    tensor_id id{};
    std::size_t n = 0;
    bool large = false;                      // at least min_compress_elements (else sent dense)
    bool staged = false;                     // g + residual staged by the compressor
    std::span<float> out32;                  // float32 output (the caller's tensor or `wide`)
    std::span<float const> raw32;            // float32 view of the raw gradient
    std::function<void()> write_back;        // rounds `wide` into a 16-bit tensor
    std::vector<detail::local_packet>* packets = nullptr;  // per level
  };

  // Buffers that persist across steps, per tensor id.
  struct buffers {
    std::vector<detail::local_packet> packets;
    std::vector<float> wide;  // float32 copy of a 16-bit gradient, then its output
  };

  any_codec codec_at_level(std::size_t l) {
    if (!ctrl_) return base_;
    double const f = plan_.measure[l];
    auto it = codec_cache_.find(f);
    if (it == codec_cache_.end()) it = codec_cache_.emplace(f, base_.with_budget(sparse_budget::factor(f))).first;
    return it->second;
  }

  // Adds one tensor to the step: checks it, converts a 16-bit one, stages and compresses it.
  // A local failure is recorded (every rank learns of it in the agreement round).
  template <element T>
  void add_tensor(tensor_view<T> const& g) {
    auto const t0 = clock::now();
    for (auto const& e : pending_) {
      if (e.id == g.id()) {
        // recorded, not thrown: every rank must reach the step's agreement round, which then
        // fails on all of them (this rank with this error)
        if (!local_) {
          local_ = std::make_exception_ptr(config_error("gradcomp: gradient_pipeline: tensor id " +
                                                        std::to_string(static_cast<unsigned>(g.id())) +
                                                        " appears twice in one step"));
        }
        return;
      }
    }
    entry e;
    e.id = g.id();
    e.n = g.size();
    e.large = g.size() >= opt_.buckets.min_compress_elements;
    if (device_) {  // device memory: nothing is read here, the exchange compresses
      if constexpr (std::same_as<T, float>) {
        e.out32 = g.span();
        e.raw32 = g.span();
      } else {
        // As `buffers::wide` on the host: widened (exact) into a float32 device buffer kept for
        // the tensor, the step's result rounded back once after the exchange.
        try {
          std::span<float> const w = device_->wide(g.id(), g.size());
          device_->widen(std::span<T const>(g.span()), w);
          e.out32 = w;
          e.raw32 = w;
          std::span<T> const dst = g.span();
          detail::device_source_base const* dev = device_.get();
          e.write_back = [dev, w, dst] { dev->narrow(std::span<float const>(w), dst); };
        } catch (...) {
          if (!local_) local_ = std::current_exception();
        }
      }
      // The check the CPU pipeline's stage makes (the feedback policy's), so that the step
      // fails with the same error on the same ranks: here, before the agreement round.
      std::size_t const held = e.large ? device_->state(e.id).size() : 0;
      if (held != 0 && held != device_->state_floats(e.n) && !local_) {
        local_ = std::make_exception_ptr(
            config_error("gradcomp: " + opt_.feedback + " feedback state of tensor " +
                         std::to_string(static_cast<unsigned>(e.id)) + " holds " + std::to_string(held) +
                         " floats but the gradient has " + std::to_string(e.n) +
                         " elements (one state per tensor id)"));
      }
      // The guard's local norms, as `stage` below computes them for host tensors (the residual
      // of a compressed tensor only), in the same canonical order on the device.
      if (guard_->enabled()) {
        guard_tensor gt{e.id, device_->sum_of_squares(e.raw32), 0.0};
        if (e.large && !opt_.two_way && !low_rank_) gt.residual_sq = device_->sum_of_squares(device_->state(e.id));
        guard_tensors_.push_back(gt);
        if (!std::isfinite(gt.gradient_sq) || !std::isfinite(gt.residual_sq)) guard_nonfinite_ = true;
      }
      // The compression gain's terms, where `stage` adds them for host tensors (a tensor the
      // CPU pipeline stages; a failure is this rank's, told in the agreement round).
      // A controller: the tensor staged and its packets written at every level of the plan, as
      // `stage` does for host tensors, with the statistics the controller needs.
      if (ctrl_ && e.large && !guard_nonfinite_ && !local_) {
        try {
          device_->stage_levels(tensor_view<float const>(e.raw32, e.id), ctx_,
                                std::span<double const>(plan_.measure).first(levels_),
                                opt_.measure_gain || ctrl_needs_gains(), ef_norm_, std::span<double>(comp_norms_));
          e.staged = true;
        } catch (...) {
          local_ = std::current_exception();
        }
      }
      if (!ctrl_ && opt_.measure_gain && e.large && !opt_.two_way && !low_rank_ && !hier_ && !guard_nonfinite_ &&
          !local_) {
        try {
          auto const [input_sq, compressed_sq] = device_->gain_terms(tensor_view<float const>(e.raw32, e.id), ctx_);
          ef_norm_ += input_sq;
          comp_norms_[0] += compressed_sq;
        } catch (...) {
          local_ = std::current_exception();
        }
      }
      pending_.push_back(std::move(e));
      compress_s_ += seconds(t0, clock::now());
      return;
    }
    buffers& b = buffers_[g.id()];
    if constexpr (std::same_as<T, float>) {
      e.out32 = g.span();
      e.raw32 = g.span();
    } else {
      b.wide.resize(g.size());
      detail::widen_to_f32(std::span<T const>(g.span()), std::span<float>(b.wide), ctx_);
      e.out32 = std::span<float>(b.wide);
      e.raw32 = std::span<float const>(b.wide);
      std::span<T> const dst = g.span();
      std::vector<float>* wide = &b.wide;
      codec_context const* ctx = &ctx_;
      e.write_back = [dst, wide, ctx] { detail::round_from_f32(std::span<float const>(*wide), dst, *ctx); };
    }
    e.packets = &b.packets;
    e.staged = e.large && !low_rank_ && !two_way_ && !hier_;
    if (guard_->enabled()) {
      // The guard's local norms; a non-finite one is not staged (the codec would throw): the
      // guard's round tells every rank, and no packet of this step is sent then.
      guard_tensor gt{e.id, detail::norm_sq(e.raw32), 0.0};
      if (e.staged) {
        gt.residual_sq =
            detail::norm_sq(std::visit([&](auto& c) { return c.state(e.id).values(); }, comp_));
      }
      guard_tensors_.push_back(gt);
      if (!std::isfinite(gt.gradient_sq) || !std::isfinite(gt.residual_sq)) guard_nonfinite_ = true;
      if (guard_nonfinite_) e.staged = false;
    }
    if (e.staged && !local_) {
      try {
        stage(e, tensor_view<T const>(std::span<T const>(g.span()), g.id()));
      } catch (...) {
        local_ = std::current_exception();
      }
    }
    pending_.push_back(std::move(e));
    compress_s_ += seconds(t0, clock::now());
  }

  void accumulate_layer(entry const& e) {
    auto const found = accumulators_.find(e.id);
    accumulator_undo_.emplace_back(e.id, found == accumulators_.end() ? std::nullopt : std::optional(found->second));
    std::vector<float>& acc = accumulators_[e.id];  // (put back if the step fails)
    if (plan_.accumulate_layers) {
      if (acc.size() != e.n) acc.assign(e.n, 0.0f);
      for (std::size_t i = 0; i < e.n; ++i) acc[i] += e.raw32[i];
    }
    if (plan_.report_layers) {
      layer_norms_.push_back(acc.empty() ? 0.0 : detail::norm_sq(acc));
      acc.clear();
    }
  }

  // Stage g + residual, compress at level 0, re-compress the further levels from the packet.
  template <element T>
  void stage(entry& e, tensor_view<T const> g) {
    bool const need_gain = opt_.measure_gain || ctrl_needs_gains();
    if (levels_ == 0) {  // a dense step: g + residual only
      std::span<float const> const staged = std::visit([&](auto& comp) { return comp.stage_input(g, ctx_); }, comp_);
      if (need_gain) ef_norm_ += detail::norm_sq(staged);
      return;
    }
    auto& packets = *e.packets;
    if (packets.size() < levels_) packets.resize(levels_);
    detail::local_packet& p0 = packets[0];
    any_codec const& c0 = level_codecs_[0];
    p0.buf.resize(c0.max_compressed_bytes(e.n));
    std::visit(
        [&](auto& comp) {
          comp.codec() = c0;
          p0.bytes = comp.stage(g, p0.buf.span(), ctx_);
        },
        comp_);
    if (need_gain) {
      std::span<float const> const staged = std::visit([&](auto& c) { return c.staged_input(e.id); }, comp_);
      ef_norm_ += detail::norm_sq(staged);
    }
    for (std::size_t l = 1; l < levels_; ++l) {
      detail::local_packet const& prev = packets[l - 1];
      detail::local_packet& p = packets[l];
      std::uint64_t const k = sparse_budget::factor(plan_.measure[l]).kept(e.n);
      p.buf.resize(max_recompressed_bytes(prev.packet(), k));
      p.bytes = recompress_sparse(prev.packet(), k, p.buf.span(), ctx_);
    }
    for (std::size_t l = 0; l < levels_; ++l) {
      detail::local_packet& p = packets[l];
      aggregation_kind const kind = level_codecs_[l].aggregation();
      p.section = {};
      if (kind == aggregation_kind::summable || kind == aggregation_kind::shared_support) {
        p.section = detail::section_of(level_codecs_[l], p.packet());
      }
      if (need_gain) comp_norms_[l] += packet_norm_sq(level_codecs_[l], p.packet(), e.n);
    }
  }

  [[nodiscard]] bool ctrl_needs_gains() const noexcept { return ctrl_ && plan_.measure.size() > 1; }

  // ‖D(packet)‖² (decoded into a scratch buffer).
  double packet_norm_sq(any_codec const& c, std::span<std::byte const> packet, std::size_t n) {
    scratch_.assign(n, 0.0f);
    c.decompress_add(packet, std::span<float>(scratch_), 1.0f, ctx_);
    return detail::norm_sq(scratch_);
  }

  // Leaves the step without sending: every stage is discarded, nothing is committed.
  void abandon() noexcept {
    for (auto const& e : pending_) {
      if (!e.staged) continue;
      if (device_) {
        device_->discard(e.id);
      } else {
        std::visit([&](auto& c) { c.discard(e.id); }, comp_);
      }
    }
    pending_.clear();
    open_ = false;
  }

  template <communicator Comm>
  pipeline_stats finish_step(Comm& comm) {
    std::optional<any_controller> snapshot;
    try {
      pipeline_stats st = device_ ? run_device_step(comm, snapshot) : run_step(comm, snapshot);
      open_ = false;
      pending_.clear();
      return st;
    } catch (...) {
      if (snapshot) ctrl_ = std::move(snapshot);
      rollback();
      abandon();
      throw;
    }
  }

  // A failed step: PowerSGD sessions, two-way residuals and layer accumulators go back to what
  // they were before it (residuals were only prepared, `abandon` discards them).
  void rollback() noexcept {
    try {
      for (auto& [id, before] : session_undo_) {
        if (before) sessions_.at(id).restore(std::move(*before));
        else sessions_.erase(id);
      }
      if (two_way_) std::visit([](auto& tw) { tw.rollback_step(); }, *two_way_);
      if (device_ && opt_.two_way) device_->two_way_rollback();
      if (device_ && low_rank_) device_->low_rank_rollback();
      if (device_ && hier_) device_->hierarchical_rollback();
      if (device_ && ctrl_) device_->layers_rollback();
      std::visit([&](auto& c) {
        for (tensor_id id : hier_staged_) c.discard(id);
      }, comp_);
      for (auto& [id, acc] : accumulator_undo_) {
        if (acc) accumulators_[id] = std::move(*acc);
        else accumulators_.erase(id);
      }
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory while restoring
    }
    session_undo_.clear();
    accumulator_undo_.clear();
    hier_staged_.clear();
  }

  // The opening of every step: the statistics' counts, the pending tensors as bucket items, the
  // agreement round (layout, configuration and every rank's local success, in one round), which
  // gives the bucket `plan`, and the divergence guard's round (every rank gets the same verdict
  // `gv`); their time is added to `communicate`. Returns true for a step the guard skips, which
  // is then complete (`st` its statistics).
  template <communicator Comm>
  bool open_step(Comm& comm, pipeline_stats& st, std::vector<bucket_item>& items, bucket_result& br,
                 double& communicate, guard_verdict& gv, std::vector<detail::bucket_plan>& plan) {
    st.step = step_;
    st.tensors = pending_.size();
    auto const t_agree = clock::now();
    items.reserve(pending_.size());
    for (auto const& e : pending_) items.push_back({tensor_view<float const>(e.raw32, e.id), e.out32});
    plan = agree_step(comm, items, br);
    communicate += seconds(t_agree, clock::now());
    if (!guard_->enabled()) return false;
    gv = check_guard(comm, br, st, communicate);
    if (gv.action != guard_action::skipped) return false;
    st = skip_step(st, gv, communicate);
    return true;
  }

  // Runs `f` with `comm` as an `any_communicator` (the device source's exchanges take one).
  template <communicator Comm, class F>
  static void with_erased(Comm& comm, F&& f) {
    if constexpr (std::same_as<Comm, any_communicator>) {
      f(comm);
    } else {
      any_communicator erased = any_communicator::borrow(comm);
      f(erased);
    }
  }

  template <communicator Comm>
  pipeline_stats run_step(Comm& comm, std::optional<any_controller>& snapshot) {
    pipeline_stats st;
    double communicate = 0.0;
    std::vector<bucket_item> items;
    bucket_result br;
    guard_verdict gv;
    std::vector<detail::bucket_plan> plan;
    if (open_step(comm, st, items, br, communicate, gv, plan)) return st;

    bool const guard_dense = gv.action == guard_action::dense;
    // Accordion's per-layer gradients, once the step is known to go through.
    if (plan_.accumulate_layers || plan_.report_layers) {
      for (auto const& e : pending_) accumulate_layer(e);
    }

    // The decision.
    std::size_t k = 0;
    residual_rule rule = residual_rule::subtract_sent;
    st.factor = low_rank_ ? 1.0 : 32.0 / base_.bits_per_element();
    if (guard_dense) {  // every tensor's own g, dense; the controller is not asked
      k = decision::npos;
      rule = residual_rule::keep;
      st.sent = send_kind::dense;
      st.factor = 1.0;
      st.gain = 1.0;
    } else if (ctrl_) {
      std::tie(k, rule) = decide_step(comm, st, snapshot, communicate);
    } else if (opt_.measure_gain && !low_rank_ && !hier_) {
      double sums[2] = {ef_norm_, levels_ > 0 ? comp_norms_[0] : 0.0};
      auto const t0 = clock::now();
      sum_stats(comm, std::span<double>(sums));
      communicate += seconds(t0, clock::now());
      st.gain = sums[0] > 0.0 ? sums[1] / sums[0] : 1.0;
    }

    bool const compressing = low_rank_ || two_way_ || hier_ || k != decision::npos;
    for (auto const& e : pending_) st.compressed_tensors += e.large && !guard_dense && compressing ? 1 : 0;

    // The next residuals for the packets to be sent are computed now (the packets may be summed
    // in place on the wire); they become current only once the exchange has succeeded.
    auto const t_prepare = clock::now();
    if (k != decision::npos && !low_rank_ && !two_way_ && !hier_) {
      for (auto const& e : pending_) {
        if (e.staged) {
          std::visit([&](auto& c) { c.prepare_commit(e.id, level_codecs_[k], (*e.packets)[k].packet(), ctx_); }, comp_);
        }
      }
    }
    double const prepare_s = seconds(t_prepare, clock::now());

    // The exchange.
    double decode = 0.0;
    auto const t_send = clock::now();
    if (guard_dense) {
      send_dense(comm, items, residual_rule::keep, br, decode);
    } else if (low_rank_ || two_way_ || hier_) {
      send_per_tensor(comm, br, decode);
    } else if (k == decision::npos) {
      send_dense(comm, items, rule, br, decode);
    } else {
      send_packets(comm, plan, k, br, decode);
    }
    // Every rank decoded everything (and, with the checksum option, got intact data) before
    // anyone commits: the step-outcome round (collective/outcome.hpp).
    detail::agree_outcome(comm, step_check_, "gradient_pipeline", step_);
    br.wire_bytes += detail::outcome_wire_bytes(opt_.buckets.checksum, size_);
    if (two_way_) std::visit([](auto& tw) { tw.commit_step(); }, *two_way_);
    std::visit([&](auto& c) {
      for (tensor_id id : hier_staged_) c.apply_commit(id);
    }, comp_);
    hier_staged_.clear();
    session_undo_.clear();
    accumulator_undo_.clear();
    communicate += seconds(t_send, clock::now()) - decode;

    // Commit exactly what was sent, then the receiver side and the 16-bit outputs.
    auto const t_commit = clock::now();
    if (!low_rank_ && !two_way_ && !hier_) {
      for (auto const& e : pending_) {
        if (!e.staged) continue;
        std::visit(
            [&](auto& c) {
              if (k != decision::npos) {
                c.apply_commit(e.id);
              } else if (rule == residual_rule::keep) {
                c.discard(e.id);
              } else {
                c.commit_lossless(e.id);
              }
            },
            comp_);
      }
      if (gv.reset_residual) std::visit([](auto& c) { c.reset(); }, comp_);
    }
    double const commit_s = seconds(t_commit, clock::now());
    auto const t_out = clock::now();
    if (!low_rank_ && !two_way_ && !hier_ && !guard_dense) {
      for (auto const& e : pending_) {
        if (e.staged) std::visit([&](auto& c) { c.receive(e.id, e.out32); }, comp_);
      }
    }
    for (auto const& e : pending_) {
      if (e.write_back) e.write_back();
    }
    decode += seconds(t_out, clock::now());

    st.bytes_sent = br.packet_bytes;
    st.wire_bytes = br.wire_bytes;
    st.buckets = br.buckets;
    st.compress_s = compress_s_ + prepare_s + commit_s;
    st.communicate_s = communicate;
    st.decode_s = decode;
    return close_step(st, gv);
  }

  // The controller's decision (host and device steps): the step's statistics summed over the
  // ranks (`agree`), the level k to send (`decision::npos`: dense) and the residual rule, the
  // sent kind, factor and gain in `st`; the controller before the decision kept in `snapshot`
  // (put back if the step fails). Its time is added to `communicate`.
  template <communicator Comm>
  std::pair<std::size_t, residual_rule> decide_step(Comm& comm, pipeline_stats& st,
                                                    std::optional<any_controller>& snapshot, double& communicate) {
    auto const t0 = clock::now();
    step_stats s;
    s.step = plan_.step;
    s.ef_norm_sq = ef_norm_;
    s.compressed_norm_sq = comp_norms_;
    s.layer_norms_sq = layer_norms_;
    s.last_step = last_timing_;
    s.batch_size = info_.batch_size;
    s.workers = static_cast<std::uint32_t>(size_);
    s.learning_rate = info_.learning_rate;
    s.next_learning_rate = info_.next_learning_rate;
    if (info_.loss) s.loss = *info_.loss;
    agree(s, [&](std::span<double> v) { sum_stats(comm, v); }, [&](std::span<double> v) { max_stats(comm, v); });
    communicate += seconds(t0, clock::now());
    snapshot.emplace(*ctrl_);
    decision const d = ctrl_->decide(s);
    std::size_t const k = d.packet(levels_);
    residual_rule rule = d.residual;
    st.sent = d.send;
    st.factor = d.factor;
    if (k != decision::npos && s.ef_norm_sq > 0.0 && (opt_.measure_gain || ctrl_needs_gains())) {
      st.gain = s.compressed_norm_sq[k] / s.ef_norm_sq;
    } else if (k == decision::npos) {
      st.gain = 1.0;
    }
    // A receiving policy (EF21) sends increments: g with the residual kept is no increment.
    bool const receives = std::visit([](auto const& c) { return std::remove_cvref_t<decltype(c)>::receives; }, comp_);
    if (k == decision::npos && rule == residual_rule::keep && receives) rule = residual_rule::zero;
    return {k, rule};
  }

  // The rest of a device source's step with a controller (after `run_device_step`'s agreement
  // and guard rounds), as `run_step` does it for host tensors: the layer accumulators, the
  // decision, then the packets of the decided level (staged by `add_tensor`) in the source's
  // bucketed collective, or every tensor dense (p = g + residual, or g with the residual kept,
  // as the decision says).
  template <communicator Comm>
  pipeline_stats run_device_controlled_step(Comm& comm, std::optional<any_controller>& snapshot, pipeline_stats& st,
                                            std::vector<bucket_item> const& items, bucket_result const& br,
                                            guard_verdict const& gv, double communicate) {
    bool const guard_dense = gv.action == guard_action::dense;
    if (plan_.accumulate_layers || plan_.report_layers) {
      for (auto const& e : pending_) {
        double const sq = device_->accumulate_layer(e.id, e.raw32, plan_.accumulate_layers, plan_.report_layers);
        if (plan_.report_layers) layer_norms_.push_back(sq);
      }
    }
    std::size_t k = decision::npos;
    residual_rule rule = residual_rule::keep;
    if (guard_dense) {  // every tensor's own g, dense; the controller is not asked
      st.sent = send_kind::dense;
      st.factor = 1.0;
      st.gain = 1.0;
    } else {
      std::tie(k, rule) = decide_step(comm, st, snapshot, communicate);
    }
    for (auto const& e : pending_) st.compressed_tensors += e.large && !guard_dense && k != decision::npos ? 1 : 0;

    // The exchange: the decided level's packets, or dense.
    bool const lossless = !guard_dense && k == decision::npos && rule != residual_rule::keep;
    auto const t_send = clock::now();
    bucket_result r;
    with_erased(comm, [&](any_communicator& c) {
      if (k != decision::npos && !guard_dense) {
        r = device_->exchange_level(c, std::span<bucket_item const>(items), k, plan_.measure[k], ctx_);
      } else if (lossless) {  // p sent dense, delivered exactly
        std::vector<bucket_item> sent = items;
        for (std::size_t i = 0; i < sent.size(); ++i) {
          std::span<float const> const p =
              pending_[i].staged ? device_->staged_input(pending_[i].id) : std::span<float const>{};
          if (!p.empty()) sent[i].grad = tensor_view<float const>(p, pending_[i].id);
        }
        r = device_->exchange_dense(c, std::span<bucket_item const>(sent), ctx_);
      } else {  // g dense, the residual kept
        r = device_->exchange_dense(c, std::span<bucket_item const>(items), ctx_);
      }
    });
    device_->layers_commit();
    // Commit: a level's packets were committed by the exchange after its outcome round.
    for (auto const& e : pending_) {
      if (!e.staged) continue;
      if (lossless) device_->commit_lossless(e.id);
      if (guard_dense || (k == decision::npos && !lossless)) {
        device_->discard(e.id);
      } else {
        device_tensors_.insert(e.id);
      }
    }
    if (gv.reset_residual) {
      device_->reset_states();
      device_tensors_.clear();
    }
    if (lossless) {  // EF21's receiver side (the exchange did it for a level's packets)
      for (auto const& e : pending_) {
        if (e.staged) device_->receive(e.id, e.out32);
      }
    }
    for (auto const& e : pending_) {
      if (e.write_back) e.write_back();
    }
    st.bytes_sent = r.packet_bytes;
    st.wire_bytes = br.wire_bytes + r.wire_bytes;
    st.buckets = r.buckets;
    st.compress_s = compress_s_;
    st.communicate_s = communicate + seconds(t_send, clock::now());
    return close_step(st, gv);
  }

  // The end of a completed step (every kind): timing for the controller, the step counter, the
  // guard's history and report, the statistics and the hook.
  pipeline_stats close_step(pipeline_stats& st, guard_verdict const& gv) {
    st.total_s = seconds(t_begin_, clock::now());
    // PowerSGD has no bits per element: its factor is what the step saved, the bytes of its
    // gradients sent dense (float32, the baseline of every codec's factor) over the bytes sent.
    if (low_rank_ && st.sent != send_kind::dense && st.bytes_sent > 0) {
      std::size_t dense = 0;
      for (auto const& e : pending_) dense += 4 * e.n;
      st.factor = static_cast<double>(dense) / static_cast<double>(st.bytes_sent);
    }
    last_timing_ = opt_.measured_timing ? step_timing{info_.backprop_s, st.compress_s, st.communicate_s}
                                        : step_timing{info_.backprop_s, 0.0, 0.0};
    ++step_;
    if (guard_->enabled()) {
      guard_->commit(gv);
      st.guard = gv.action;
      if (gv.tripped) report_guard(gv);
    }
    last_ = st;
    if (hook_) hook_(st);
    return st;
  }

  // A step of a device source: the agreement round of `run_step` (layout, configuration, local
  // status), then the source's bucketed collective, which compresses, exchanges, decodes and,
  // after its outcome round, commits the residuals.
  template <communicator Comm>
  pipeline_stats run_device_step(Comm& comm, std::optional<any_controller>& snapshot) {
    pipeline_stats st;
    double agree_s = 0.0;
    std::vector<bucket_item> items;
    bucket_result br;
    guard_verdict gv;
    std::vector<detail::bucket_plan> plan;  // (the source's collective plans its own buckets)
    if (open_step(comm, st, items, br, agree_s, gv, plan)) return st;
    if (ctrl_) return run_device_controlled_step(comm, snapshot, st, items, br, gv, agree_s);
    bool const guard_dense = gv.action == guard_action::dense;
    // `measure_gain`: the gain over all ranks, in the CPU pipeline's round (`run_step`).
    if (!guard_dense && opt_.measure_gain && !low_rank_ && !hier_) {
      double sums[2] = {ef_norm_, comp_norms_[0]};
      auto const t0 = clock::now();
      sum_stats(comm, std::span<double>(sums));
      agree_s += seconds(t0, clock::now());
      st.gain = sums[0] > 0.0 ? sums[1] / sums[0] : 1.0;
    }
    auto const t_send = clock::now();
    bucket_result r;
    with_erased(comm, [&](any_communicator& c) {
      if (guard_dense) {  // every tensor's own g, dense; the residuals kept (or reset below)
        r = device_->exchange_dense(c, std::span<bucket_item const>(items), ctx_);
      } else if (opt_.two_way || low_rank_ || hier_) {
        r = exchange_per_tensor_on_device(c);
      } else {
        r = device_->exchange(c, std::span<bucket_item const>(items), ctx_);
      }
    });
    for (auto const& e : pending_) {
      if (e.write_back) e.write_back();  // 16-bit gradients: the result rounded once
    }
    double const send_s = seconds(t_send, clock::now());
    if (guard_dense) {
      st.sent = send_kind::dense;
      st.factor = 1.0;
      st.gain = 1.0;
      if (gv.reset_residual && !opt_.two_way) {  // as the CPU's compressor reset
        device_->reset_states();
        device_tensors_.clear();
      }
    } else {
      for (auto const& e : pending_) {
        if (!e.large) continue;
        ++st.compressed_tensors;
        // two-way and PowerSGD keep their own state; the hierarchical all-reduce's is the shard
        // owners' (a tensor's shard, compressed between nodes)
        if (hier_) {
          int const local = hier_plan_.layout.local_rank(comm.rank());
          if (local < hier_plan_.lanes && hier_plan_.layout.nodes() > 1)
            device_tensors_.insert(hierarchical_shard_id(e.id, local, hier_plan_.lanes));
        } else if (!opt_.two_way && !low_rank_) {
          device_tensors_.insert(e.id);
        }
      }
      st.factor = low_rank_ ? 1.0 : 32.0 / base_.bits_per_element();
    }
    st.bytes_sent = r.packet_bytes;
    st.wire_bytes = br.wire_bytes + r.wire_bytes;
    st.buckets = r.buckets;
    st.compress_s = compress_s_;
    st.communicate_s = agree_s + send_s;  // compression and decoding run inside the exchange
    return close_step(st, gv);
  }

  // Two-way compression or PowerSGD with a device source, as `send_per_tensor` does them for
  // host tensors: `all_reduce_two_way`'s or `all_reduce_low_rank`'s exchange per compressed
  // tensor, the small tensors dense in the source's bucketed collective, then the step-outcome
  // round; the two-way state or the sessions' become current only after it (a failure puts
  // them back, `rollback`).
  bucket_result exchange_per_tensor_on_device(any_communicator& comm) {
    bucket_result br;
    collective_options const copt{opt_.buckets.op, opt_.buckets.checksum};
    if (opt_.two_way) device_->two_way_begin();
    std::vector<bucket_item> const dense = for_each_compressed(br, [&](entry const& e, tensor_view<float const> g) {
      if (low_rank_) {
        auto const [rows, cols] = shape_of(e.id, e.n);
        return device_->low_rank_exchange(comm, e.id, rows, cols, *low_rank_, g, e.out32, ctx_, copt, step_check_);
      }
      if (hier_) {
        hierarchical_result const hr =
            device_->hierarchical_exchange(comm, *hier_node_, hier_lane_ ? &*hier_lane_ : nullptr, hier_plan_, g,
                                           e.out32, ctx_, opt_.hierarchical, step_check_);
        collective_result r;
        r.packet_bytes = hr.packet_bytes;
        r.wire_bytes = hr.wire_bytes;
        return r;
      }
      return device_->two_way_exchange(comm, g, e.out32, ctx_, copt, step_check_);
    });
    if (!dense.empty()) {
      bucket_result const d = device_->exchange(comm, std::span<bucket_item const>(dense), ctx_);
      br.packet_bytes += d.packet_bytes;
      br.wire_bytes += d.wire_bytes;
      br.buckets += d.buckets;
    }
    detail::agree_outcome(comm, step_check_, "gradient_pipeline", step_);
    br.wire_bytes += detail::outcome_wire_bytes(opt_.buckets.checksum, size_);
    if (opt_.two_way) device_->two_way_commit();
    if (low_rank_) device_->low_rank_commit();
    if (hier_) device_->hierarchical_commit();
    return br;
  }

  // The error-feedback state of a device source in `compressor::save`'s format, as the CPU
  // pipeline's compressor writes it: one record per tensor that completed a step, ascending
  // ids, its state copied to the host (feedback "none": no values); with EF21 then one
  // receiver record per such tensor (the CPU's receivers are the tensors it received, the
  // same set).
  [[nodiscard]] std::vector<std::byte> device_state() const {
    feedback_id const id_of = std::visit(
        [](auto const& c) { return std::remove_cvref_t<decltype(c)>::feedback_type::id; }, comp_);
    bool const receivers = id_of == feedback_id::ef21;
    std::vector<std::byte> out =
        detail::feedback_state_head(id_of, device_tensors_.size(), receivers ? device_tensors_.size() : 0);
    for (tensor_id const id : device_tensors_) detail::put_feedback_record(out, id, device_->state_on_host(id));
    if (receivers) {
      for (tensor_id const id : device_tensors_) detail::put_feedback_record(out, id, device_->receiver_on_host(id));
    }
    detail::seal_feedback_state(out);  // version 3, with its checksum, as `compressor::save`
    return out;
  }

  // The divergence guard's round (guard.hpp): every rank gets the same verdict, recorded in
  // `st`; a verdict that raises throws here. Its time is added to `communicate`.
  template <communicator Comm>
  guard_verdict check_guard(Comm& comm, bucket_result& br, pipeline_stats& st, double& communicate) {
    auto const t0 = clock::now();
    // In tensor id order, so that the sums over the tensors do not depend on the order in which
    // they were submitted (whole step, bucket by bucket).
    std::sort(guard_tensors_.begin(), guard_tensors_.end(), [](guard_tensor const& a, guard_tensor const& b) {
      return static_cast<std::uint32_t>(a.id) < static_cast<std::uint32_t>(b.id);
    });
    bool const watch = !low_rank_ && !opt_.two_way && !hier_ && opt_.feedback != "none";
    guard_verdict gv = guard_->check_with([&](std::span<double> v) { sum_stats(comm, v); }, comm.size(), step_,
                                          std::span<guard_tensor const>(guard_tensors_), watch, info_.loss,
                                          br.wire_bytes);
    communicate += seconds(t0, clock::now());
    st.gradient_norm = gv.gradient;
    st.residual_norm = gv.residual;
    st.loss = gv.loss;
    if (gv.raise_it) throw numeric_error(gv.message);
    return gv;
  }

  // A step the guard skips: nothing is sent and no state changes (stages discarded, the step
  // counter kept); the gradient tensors are set to zero on every rank.
  pipeline_stats skip_step(pipeline_stats st, guard_verdict const& gv, double communicate) {
    for (auto const& e : pending_) {
      if (e.staged && device_) device_->discard(e.id);
      if (e.staged && !device_) std::visit([&](auto& c) { c.discard(e.id); }, comp_);
      if (device_) {
        device_->zero(e.out32);
      } else {
        std::fill(e.out32.begin(), e.out32.end(), 0.0f);
      }
      if (e.write_back) e.write_back();
    }
    for (auto& e : pending_) e.staged = false;
    guard_->commit(gv);
    st.guard = guard_action::skipped;
    st.sent = send_kind::dense;
    st.factor = 1.0;
    st.communicate_s = communicate;
    st.compress_s = compress_s_;
    st.total_s = seconds(t_begin_, clock::now());
    report_guard(gv);
    last_ = st;
    if (hook_) hook_(st);
    return st;
  }

  void report_guard(guard_verdict const& gv) {
    if (guard_hook_) {
      guard_hook_(gv);
    } else if (rank_ == 0) {
      std::fprintf(stderr, "%s\n", gv.message.c_str());
    }
  }

  // The statistics all-reduces (sums and maxima over ranks), covered by the step check: with
  // the checksum option a corrupted statistic fails the step rather than steer a decision.
  template <communicator Comm>
  void sum_stats(Comm& comm, std::span<double> v) {
    step_check_.before_sum(std::as_bytes(v), comm_type::f64);
    comm.all_reduce(std::as_writable_bytes(v), comm_type::f64, reduce_op::sum);
    step_check_.after_sum(std::as_bytes(v), comm_type::f64);
    step_check_.result(std::as_bytes(v));
  }
  template <communicator Comm>
  void max_stats(Comm& comm, std::span<double> v) {
    comm.all_reduce(std::as_writable_bytes(v), comm_type::f64, reduce_op::max);
    step_check_.result(std::as_bytes(v));
  }

  // The step's agreement round: layout (ids, sizes, order, bucketing), configuration
  // (codec, feedback, controller, step) and each rank's local status.
  template <communicator Comm>
  std::vector<detail::bucket_plan> agree_step(Comm& comm, std::vector<bucket_item> const& items, bucket_result& br) {
    std::exception_ptr local = local_;
    rank_report mine;
    mine.count = items.size();
    mine.codec = static_cast<std::uint32_t>(base_.id());
    std::vector<detail::bucket_plan> plan;
    try {
      plan = detail::plan_buckets(std::span<bucket_item const>(items), opt_.buckets);
      fingerprint fp;
      fp.add("gradient_pipeline").add(opt_.codec).add(opt_.feedback).add(opt_.controller);
      if (hier_) {
        hier_plan_ = detail::plan_hierarchy(opt_.hierarchical, comm.size());
        if (hier_node_) {
          detail::check_groups(hier_plan_, comm.rank(), &*hier_node_, hier_lane_ ? &*hier_lane_ : nullptr);
        } else if (device_) {
          throw config_error(
              "gradcomp: gradient_pipeline: the hierarchical all-reduce of a device source needs the "
              "node and lane communicators (set_hierarchical_groups)");
        }
        fp.add("hierarchical").add(hier_plan_.grouping).add(hier_node_ ? "own groups" : "point-to-point groups");
        fp.add(static_cast<std::uint64_t>(hier_plan_.lanes));
        fp.add(static_cast<std::uint64_t>(opt_.hierarchical.intra));
        fp.add(static_cast<std::uint64_t>(opt_.hierarchical.groups.tag_base));
        fp.add(static_cast<std::uint64_t>(opt_.hierarchical.groups.tag_count));
      }
      fp.add(opt_.two_way ? 1 : 0).add(step_).add(opt_.buckets.bucket_bytes).add(opt_.buckets.min_compress_elements);
      fp.add(static_cast<std::uint64_t>(opt_.buckets.small_format)).add(static_cast<std::uint64_t>(opt_.buckets.op));
      fp.add(opt_.measure_gain ? 1 : 0).add(opt_.guard);
      if (opt_.buckets.checksum) fp.add("checksum");
      for (auto const& it : items) fp.add(it.out.size()).add(static_cast<std::uint64_t>(it.grad.id()));
      mine.fingerprint = fp.value();
    } catch (...) {
      if (!local) local = std::current_exception();
    }
    if (local) mine.status = 1;
    detail::report_round round;
    round.post(comm, mine, {}, opt_.buckets.checksum, "gradient_pipeline");
    round.finish("gradient_pipeline", local);
    br.wire_bytes += round.wire_bytes();
    return plan;
  }

  // Compressed send: the packets of level k in the bucketed collective; small tensors dense.
  template <communicator Comm>
  void send_packets(Comm& comm, std::vector<detail::bucket_plan> const& plan, std::size_t k, bucket_result& br,
                    double& decode) {
    any_codec const& codec = level_codecs_[k];
    aggregation_kind const kind = codec.aggregation();
    detail::bucket_engine<any_codec> engine(codec, kind, opt_.buckets, detail::reduction_scale(opt_.buckets.op, size_),
                                            step_check_);
    engine.ctx_ = ctx_;
    auto prepare = [&](std::size_t bi, detail::bucket_slot& s) {
      detail::bucket_plan const& b = plan[bi];
      s.reset();
      if (b.dense) {
        engine.prepare_dense(b, s, [&](std::size_t i) { return pending_[i].raw32; }, ctx_);
        return;
      }
      fingerprint fp;
      fp.add(detail::codec_fingerprint(codec, b.elements, opt_.buckets.op, ctx_, "bucket"));
      for (std::size_t i : b.items) {
        entry const& e = pending_[i];
        s.units.push_back({tensor_view<float const>(e.raw32, e.id), e.out32});
        s.packets.push_back(&(*e.packets)[k]);
      }
      engine.assemble(s, fp, b.elements);
    };
    auto done = [&](std::size_t bi, detail::bucket_slot& s) {
      if (plan[bi].dense) detail::scatter_fused(plan[bi], s, pending_out());
    };
    engine.run(comm, std::span<detail::bucket_plan const>(plan), slots_, prepare, done, br);
    br.buckets += plan.size();
    decode += engine.decode_s;
  }

  // Dense send of every tensor: g + residual (rule zero) or g (rule keep) for the compressed
  // ones, g for the small ones.
  template <communicator Comm>
  void send_dense(Comm& comm, std::vector<bucket_item> const& items, residual_rule rule, bucket_result& br,
                  double& decode) {
    bucket_options dense_opt = opt_.buckets;
    dense_opt.min_compress_elements = std::numeric_limits<std::size_t>::max();
    dense_opt.small_format = dense_format::f32;
    std::vector<detail::bucket_plan> const plan = detail::plan_buckets(std::span<bucket_item const>(items), dense_opt);
    detail::bucket_engine<any_codec> engine(base_, base_.aggregation(), dense_opt,
                                            detail::reduction_scale(dense_opt.op, size_), step_check_);
    engine.ctx_ = ctx_;
    auto input = [&](std::size_t i) -> std::span<float const> {
      entry const& e = pending_[i];
      if (e.staged && rule != residual_rule::keep) {
        return std::visit([&](auto& c) { return c.staged_input(e.id); }, comp_);
      }
      return e.raw32;
    };
    auto prepare = [&](std::size_t bi, detail::bucket_slot& s) {
      s.reset();
      engine.prepare_dense(plan[bi], s, input, ctx_);
    };
    auto done = [&](std::size_t bi, detail::bucket_slot& s) { detail::scatter_fused(plan[bi], s, pending_out()); };
    engine.run(comm, std::span<detail::bucket_plan const>(plan), slots_, prepare, done, br);
    br.buckets += plan.size();
    decode += engine.decode_s;
  }

  // Per-tensor collectives for the large tensors — PowerSGD: one `powersgd_session` each (its
  // own error feedback and warm start), `all_reduce_low_rank`; two-way: `all_reduce_two_way`
  // with the two-way compressor's worker and server feedback — and the small ones dense in
  // bucketed calls.
  template <communicator Comm>
  void send_per_tensor(Comm& comm, bucket_result& br, double& decode) {
    collective_options const copt{opt_.buckets.op, opt_.buckets.checksum};
    if (two_way_) std::visit([](auto& tw) { tw.begin_step(); }, *two_way_);
    std::vector<bucket_item> const dense = for_each_compressed(br, [&](entry const& e, tensor_view<float const> g) {
      collective_result r;
      if (low_rank_) {
        auto it = sessions_.find(e.id);
        if (it == sessions_.end()) {
          auto const [rows, cols] = shape_of(e.id, e.n);
          it = sessions_.emplace(e.id, powersgd_session(rows, cols, *low_rank_, e.id)).first;
          session_undo_.emplace_back(e.id, std::nullopt);
        } else {
          session_undo_.emplace_back(e.id, it->second.snapshot());
        }
        r = detail::low_rank_exchange(comm, it->second, g, e.out32, ctx_, copt, step_check_);
      } else if (hier_) {
        hierarchical_result hr;
        std::visit(
            [&](auto& c) {
              detail::pending_commit<std::remove_reference_t<decltype(c)>> staged(c);
              if (hier_node_) {
                detail::hierarchical_exchange_over(comm, *hier_node_, hier_lane_ ? &*hier_lane_ : nullptr,
                                                   hier_plan_, c, g, e.out32, ctx_, opt_.hierarchical,
                                                   step_check_, staged, hr);
              } else {
                detail::hierarchical_exchange(comm, hier_plan_, c, g, e.out32, ctx_,
                                              opt_.hierarchical, step_check_, staged, hr);
              }
              // made current after the step's outcome round, or discarded by `rollback`
              for (tensor_id id : staged.release()) hier_staged_.push_back(id);
            },
            comp_);
        r.packet_bytes = hr.packet_bytes;
        r.wire_bytes = hr.wire_bytes;
      } else {
        r = std::visit([&](auto& tw) { return detail::two_way_exchange(comm, tw, g, e.out32, ctx_, copt, step_check_); },
                       *two_way_);
      }
      return r;
    });
    if (!dense.empty()) send_plain_dense(comm, dense, br, decode);
  }

  // The per-tensor modes' split of the step (host and device sources): `one(entry, g)` runs
  // the collective of each compressed tensor (its result counted in `br`, one bucket each); the
  // small tensors are returned, to go dense in buckets.
  template <class One>
  std::vector<bucket_item> for_each_compressed(bucket_result& br, One&& one) {
    std::vector<bucket_item> dense;
    for (auto const& e : pending_) {
      if (!e.large) {
        dense.push_back({tensor_view<float const>(e.raw32, e.id), e.out32});
        continue;
      }
      collective_result const r = one(e, tensor_view<float const>(e.raw32, e.id));
      br.packet_bytes += r.packet_bytes;
      br.wire_bytes += r.wire_bytes;
      ++br.buckets;
    }
    return dense;
  }

  template <communicator Comm>
  void send_plain_dense(Comm& comm, std::vector<bucket_item> const& dense, bucket_result& br, double& decode) {
    bucket_options o = opt_.buckets;
    o.min_compress_elements = std::numeric_limits<std::size_t>::max();
    std::vector<detail::bucket_plan> const plan = detail::plan_buckets(std::span<bucket_item const>(dense), o);
    detail::bucket_engine<any_codec> engine(base_, base_.aggregation(), o, detail::reduction_scale(o.op, size_),
                                            step_check_);
    engine.ctx_ = ctx_;
    auto prepare = [&](std::size_t bi, detail::bucket_slot& s) {
      s.reset();
      engine.prepare_dense(plan[bi], s, [&](std::size_t i) { return dense[i].grad.span(); }, ctx_);
    };
    auto done = [&](std::size_t bi, detail::bucket_slot& s) { detail::scatter_fused(plan[bi], s, dense); };
    engine.run(comm, std::span<detail::bucket_plan const>(plan), slots_, prepare, done, br);
    br.buckets += plan.size();
    decode += engine.decode_s;
  }

  [[nodiscard]] std::pair<std::size_t, std::size_t> shape_of(tensor_id id, std::size_t n) const {
    if (auto it = shapes_.find(id); it != shapes_.end()) return it->second;
    std::size_t c = 1;
    for (std::size_t d = 1; d * d <= n; ++d) {
      if (n % d == 0) c = d;
    }
    return {n / c, c};
  }

  // The pending entries as items with an `out` member (for scatter_fused).
  struct out_view {
    std::vector<entry> const* v;
    struct item {
      std::span<float> out;
    };
    item operator[](std::size_t i) const { return {(*v)[i].out32}; }
  };
  [[nodiscard]] out_view pending_out() const noexcept { return {&pending_}; }

  pipeline_options opt_;
  any_codec base_ = make_codec("identity");
  detail::pipeline_compressor comp_ = compressor<any_codec, no_feedback>(make_codec("identity"));
  std::optional<any_controller> ctrl_;
  std::optional<powersgd_options> low_rank_;
  std::map<tensor_id, std::pair<std::size_t, std::size_t>> shapes_;
  std::optional<two_way_variant> two_way_;
  bool hier_ = false;                      // hierarchical all-reduce (opt_.hierarchical)
  detail::hierarchical_plan hier_plan_;    // its layout, settled by the step's agreement round
  std::optional<any_communicator> hier_node_, hier_lane_;  // set_hierarchical_groups
  std::vector<tensor_id> hier_staged_;     // the owners' staged feedback of the step
  std::map<tensor_id, powersgd_session> sessions_;
  std::map<double, any_codec> codec_cache_;
  std::map<tensor_id, buffers> buffers_;
  std::map<tensor_id, std::vector<float>> accumulators_;
  detail::bucket_slot slots_[2];
  std::unique_ptr<detail::device_source_base> device_;  // a device source (else null)
  std::set<tensor_id> device_tensors_;  // its tensors with a completed step (saved state)

  // The step in progress.
  bool open_ = false;
  pipeline_step_info info_;
  clock::time_point t_begin_;
  int rank_ = 0, size_ = 1;
  std::vector<entry> pending_;
  std::exception_ptr local_;
  step_plan plan_;
  std::size_t levels_ = 0;
  std::vector<any_codec> level_codecs_;
  double ef_norm_ = 0.0;
  std::vector<double> comp_norms_, layer_norms_;
  double compress_s_ = 0.0;
  codec_context ctx_;
  std::vector<float> scratch_;
  detail::step_check step_check_;  // failures after the data moved, checksums (outcome round)
  std::vector<std::pair<tensor_id, std::optional<powersgd_state>>> session_undo_;  // sessions before the step
  std::vector<std::pair<tensor_id, std::optional<std::vector<float>>>> accumulator_undo_;  // the same, accumulators

  // Across steps.
  std::uint64_t step_ = 0;
  step_timing last_timing_;
  pipeline_stats last_;
  std::function<void(pipeline_stats const&)> hook_;
  std::optional<divergence_guard> guard_;
  std::function<void(guard_verdict const&)> guard_hook_;
  std::vector<guard_tensor> guard_tensors_;  // the step in progress
  bool guard_nonfinite_ = false;
};

GRADCOMP_NAMESPACE_END
