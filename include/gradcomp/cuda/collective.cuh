// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Device codecs as sources of the library's collectives: `stream_codec<C>` makes a CUDA codec
/// (cuda/cast.cuh, int8.cuh, ...) a `codec` over device memory, bound to a CUDA stream, and
/// `device_compressor<C, Rule>` adds error feedback kept on the device (residual by default;
/// EF21 and DGC with the rules of cuda/feedback.cuh). Both go unchanged
/// through `all_reduce_compressed` (collective/all_reduce.hpp): the collective's algorithm is
/// the one of the CPU codecs, and only where its payloads live differs. Two-way compression
/// (`two_way_compressor<stream_codec<C>>` through `all_reduce_two_way`, collective/two_way.hpp)
/// takes a `stream_codec` too: its worker and server residuals are `device_residual_feedback`
/// states, the feedback a `stream_codec` names as its `residual_feedback_type`.
///
/// How it fits: every span handed to a `stream_codec` (the gradient's `tensor_view`, the packet
/// buffer, the decoded output) holds **device pointers**. The codec's `memory()` returns the
/// memory space `device_memory` (cuda/memory.cuh); the collectives read it through
/// `detail::memory_of` (collective/memory.hpp) and then keep their payload buffers (packets,
/// summed values, gathered packets) in device memory and zero them with `cudaMemsetAsync`. The
/// agreement and outcome rounds stay host messages: a communicator for device memory (the NCCL
/// adapter, comm/nccl.cuh) must carry both, telling them apart by their pointers. The host
/// reads a payload in two places only, both small: the header of a packet (its value section,
/// the codec's packet checks) and the frame around summable values (fingerprinted by the
/// agreement round).
///
/// Streams: the codec enqueues its work on its stream; use the same stream for the
/// communicator (or order the two yourself), so that a packet is complete before the
/// communicator reads it. The collectives wait for every communicator operation on the host,
/// so decoding is ordered after the data arrived.
///
/// What a device source does not take: 16-bit gradients through the collectives (they would be
/// widened on the host; pass float32), the `checksum` option (it reads every payload on the
/// host): both are errors, at compile time and as a `config_error`. A two-way compressor over a
/// `stream_codec` is not saved or loaded (`save` and `load` are for host codecs).

#include <gradcomp/cuda/config.cuh>

#include <gradcomp/codec/value_section.hpp>
#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/concepts/feedback.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cuda/detail/packet.cuh>
#include <gradcomp/cuda/feedback.cuh>
#include <gradcomp/cuda/memory.cuh>

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

GRADCOMP_CUDA_NAMESPACE_BEGIN
namespace detail {

/// The static traits of a device codec: its own members where it declares them (`C::aggregation`,
/// `C::unbiased`, `c.bits_per_element()`: the sparsifiers), else those of the element-wise CPU
/// codec of the same id (codec/cast.hpp, int8.hpp, ...; tests/cuda/collective_host.cu compares
/// them).
constexpr aggregation_kind elementwise_aggregation(codec_id id) noexcept {
  return id == codec_id::identity || id == codec_id::fp16 || id == codec_id::bf16 ? aggregation_kind::summable
                                                                                : aggregation_kind::gather;
}
constexpr bool elementwise_unbiased(codec_id id) noexcept {
  return id == codec_id::identity || id == codec_id::natural || id == codec_id::qsgd ||
         id == codec_id::terngrad || id == codec_id::dithering;
}
constexpr bool is_elementwise(codec_id id) noexcept {
  return id == codec_id::identity || id == codec_id::fp16 || id == codec_id::bf16 || id == codec_id::int8 ||
         id == codec_id::onebit || id == codec_id::qsgd || id == codec_id::terngrad || id == codec_id::natural ||
         id == codec_id::dithering;
}

template <class C>
consteval aggregation_kind aggregation_of_device_codec() {
  if constexpr (requires { { C::aggregation } -> std::convertible_to<aggregation_kind>; }) {
    return C::aggregation;
  } else {
    static_assert(is_elementwise(C::id), "a device codec that is not element-wise declares C::aggregation");
    return elementwise_aggregation(C::id);
  }
}
template <class C>
consteval bool unbiased_device_codec() {
  if constexpr (requires { { C::unbiased } -> std::convertible_to<bool>; }) {
    return C::unbiased;
  } else {
    static_assert(is_elementwise(C::id), "a device codec that is not element-wise declares C::unbiased");
    return elementwise_unbiased(C::id);
  }
}

}  // namespace detail

struct device_residual_feedback;

/// A CUDA codec bound to a stream: a `codec` (concepts/codec.hpp) whose spans are device
/// memory, with the packets, errors and random streams of the CPU codec of the same format. It
/// owns a device workspace that grows to the largest tensor it has seen (allocated on its
/// stream), so one object serves one thread at a time, like the stream. The codec context's
/// `seed` and `step` and the tensor's id key the random stream, as on the CPU; its pool and ISA
/// do not apply.
template <class C>
class stream_codec {
 public:
  using codec_concept = codec_tag;
  /// The CUDA codec inside.
  using device_codec_type = C;
  static constexpr codec_id id = C::id;
  static constexpr aggregation_kind aggregation = detail::aggregation_of_device_codec<C>();
  static constexpr bool unbiased = detail::unbiased_device_codec<C>();
  /// The residual feedback of this codec's sources (feedback/policies.hpp's
  /// `residual_feedback_for`): residuals in device memory.
  using residual_feedback_type = device_residual_feedback;

  /// `codec` (a CUDA codec) on `stream`.
  explicit stream_codec(C codec = C{}, cudaStream_t stream = nullptr)
      : codec_(std::move(codec)), stream_(stream), workspace_(stream) {}
  /// A copy has the same codec and stream and a workspace of its own (empty until used).
  stream_codec(stream_codec const& o) : codec_(o.codec_), stream_(o.stream_), workspace_(o.stream_) {}
  stream_codec& operator=(stream_codec const& o) {
    if (this != &o) {
      codec_ = o.codec_;
      stream_ = o.stream_;
      workspace_ = device_buffer(o.stream_);
    }
    return *this;
  }
  stream_codec(stream_codec&&) noexcept = default;
  stream_codec& operator=(stream_codec&&) noexcept = default;
  ~stream_codec() = default;

  /// The CUDA codec.
  [[nodiscard]] C const& device_codec() const noexcept { return codec_; }
  /// This codec with another selection size (a sparsifier's `with_budget`, given a
  /// `gradcomp::sparse_budget`), on the same stream, with a workspace of its own.
  template <class Budget>
  [[nodiscard]] stream_codec with_budget(Budget const& b) const
    requires requires(C const& c, Budget const& x) { c.with_budget(x); }
  {
    return stream_codec(codec_.with_budget(b), stream_);
  }
  /// The stream every operation is enqueued on.
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  /// The memory space of this codec's payloads (collective/memory.hpp).
  [[nodiscard]] device_memory memory() const noexcept { return device_memory{stream_}; }

  /// The packet size bound for `n` elements, as the CPU codec's.
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const { return codec_.max_compressed_bytes(n); }
  /// Nominal wire bits per element of float32 input, as the CPU codec's.
  [[nodiscard]] double bits_per_element() const {
    if constexpr (requires { codec_.bits_per_element(); }) {
      return codec_.bits_per_element();
    } else if constexpr (C::id == codec_id::identity) {
      return 32.0;
    } else if constexpr (C::id == codec_id::fp16 || C::id == codec_id::bf16) {
      return 16.0;
    } else if constexpr (C::id == codec_id::onebit) {
      return 1.0;
    } else {
      return codec_.wire_format().bits_per_element();
    }
  }

  /// Writes the packet of `x` (device memory) into `out` (device memory, at least
  /// `max_compressed_bytes(x.size())` bytes, else `config_error`); returns its size.
  template <element T>
  std::size_t compress(tensor_view<T const> x, std::span<std::byte> out, codec_context const& ctx = {}) const {
    check_room(x.size(), out.size());
    std::size_t temp = grow(x.size());
    return codec_.compress(workspace_.data(), temp, x.data(), x.size(), out.data(), stream_, stream_for(ctx, x.id()));
  }
  /// Residual error feedback fused with compression (the CUDA codec's `compress_with_feedback`):
  /// the packet of p = g + e (`residual` empty: e = 0) and `next` = p − D(packet), byte for
  /// byte what `residual_feedback` writes and keeps. Device spans; `next` may alias `residual`.
  template <element T>
  std::size_t compress_with_feedback(tensor_view<T const> g, std::span<float const> residual, std::span<float> next,
                                     std::span<std::byte> out, codec_context const& ctx = {}) const {
    check_room(g.size(), out.size());
    if ((!residual.empty() && residual.size() != g.size()) || next.size() != g.size()) {
      throw config_error("gradcomp: cuda " + std::string(codec_name(id)) + " error feedback of " +
                         std::to_string(g.size()) + " elements got residuals of " + std::to_string(residual.size()) +
                         " and " + std::to_string(next.size()) + " elements");
    }
    std::size_t temp = grow(g.size());
    return codec_.compress_with_feedback(workspace_.data(), temp, g.data(), residual.empty() ? nullptr : residual.data(),
                                         next.data(), g.size(), out.data(), stream_, stream_for(ctx, g.id()));
  }
  /// `out = x̂` (device memory); a malformed packet throws what the CPU codec throws. Random-k
  /// regenerates its coordinates from `ctx`'s seed and step (the sender's, as on the CPU).
  template <element T>
  void decompress(std::span<std::byte const> packet, std::span<T> out, codec_context const& ctx = {}) const {
    std::size_t temp = grow(out.size());
    if constexpr (takes_random_stream) {
      codec_.decompress(workspace_.data(), temp, packet.data(), packet.size(), out.data(), out.size(), stream_,
                        stream_for(ctx, tensor_id{0}));
    } else {
      codec_.decompress(workspace_.data(), temp, packet.data(), packet.size(), out.data(), out.size(), stream_);
    }
  }
  /// `out = fma(alpha, x̂, out)` (device memory), as the CPU codec's `decompress_add`.
  template <element T>
  void decompress_add(std::span<std::byte const> packet, std::span<T> out, float alpha,
                      codec_context const& ctx = {}) const {
    std::size_t temp = grow(out.size());
    if constexpr (takes_random_stream) {
      codec_.decompress_add(workspace_.data(), temp, packet.data(), packet.size(), out.data(), out.size(), alpha,
                            stream_, stream_for(ctx, tensor_id{0}));
    } else {
      codec_.decompress_add(workspace_.data(), temp, packet.data(), packet.size(), out.data(), out.size(), alpha,
                            stream_);
    }
  }

  /// The summed values of a packet in device memory: for identity, fp16 and bf16 (summable)
  /// the whole payload, in the packet's element type (identity) or the codec's 16-bit type; for
  /// random-k (shared support) the values after the check word (the codec's `values_of`).
  /// Copies the header to the host and validates it as the CPU codec does.
  [[nodiscard]] gradcomp::value_section value_section(std::span<std::byte const> packet) const
    requires(aggregation == aggregation_kind::summable || aggregation == aggregation_kind::shared_support)
  {
    detail::packet_probe const probe = detail::probe_packet(packet.data(), packet.size(), stream_);
    packet_header const head = detail::read_probed_header(probe, packet.size());
    packet_header const h = C::inspect(packet.data(), packet.size(), static_cast<std::size_t>(head.count), stream_);
    if constexpr (aggregation == aggregation_kind::shared_support) {
      return C::values_of(h);
    } else {
      dtype const values = id == codec_id::fp16 ? dtype::f16 : id == codec_id::bf16 ? dtype::bf16 : h.type;
      return {header_bytes, static_cast<std::size_t>(h.payload_bytes), values};
    }
  }

 private:
  // The sparsifiers' decoders take the random stream (random-k's coordinates); the element
  // codecs' do not.
  static constexpr bool takes_random_stream =
      requires(C const& c, void* w, std::size_t& t, std::byte const* p, float* o, cudaStream_t s, random_stream r) {
        c.decompress(w, t, p, std::size_t{}, o, std::size_t{}, s, r);
      };

  static random_stream stream_for(codec_context const& ctx, tensor_id t) noexcept {
    return random_stream{ctx.seed, ctx.step, static_cast<std::uint32_t>(t)};
  }
  void check_room(std::size_t n, std::size_t room) const {
    std::size_t const need = codec_.max_compressed_bytes(n);
    if (room < need) {
      throw config_error("gradcomp: cuda " + std::string(codec_name(id)) + " compress of " + std::to_string(n) +
                         " elements needs an output of " + std::to_string(need) + " bytes, got " +
                         std::to_string(room));
    }
  }
  // The workspace for n elements, grown when needed; returns its size.
  std::size_t grow(std::size_t n) const {
    std::size_t const need = codec_.workspace_bytes(n);
    if (need > workspace_.size()) workspace_.resize(need);
    return workspace_.size();
  }

  C codec_;
  cudaStream_t stream_;
  mutable device_buffer workspace_;
};

/// Residual error feedback as a policy over a `stream_codec` (`residual_feedback`'s rule, fused
/// with compression): the one-phase step of concepts/feedback.hpp's `one_phase_feedback`, whose
/// state, one float32 residual, lives in device memory. Packets and residuals are byte for byte
/// those of `residual_feedback` with the CPU codec of the same format. What `two_way_compressor`
/// keeps per shard and side for a device codec (collective/two_way.hpp). It has no host
/// `stage`: the policy's input p = g + e is never materialized, the codec's fused pass reads it.
struct device_residual_feedback {
  using feedback_concept = feedback_tag;
  static constexpr feedback_id id = feedback_id::residual;

  /// The residual e, in device memory (empty, meaning zero, until a step has succeeded). A
  /// copy is a device copy on the residual's stream (what a two-way step keeps to roll back).
  class state {
   public:
    state() = default;
    state(state const& o) : data_(o.data_.stream()), next_(o.data_.stream()), n_(o.n_) {
      data_.resize(n_ * sizeof(float));
      detail::copy_on_device(data_.data(), o.data_.data(), n_ * sizeof(float), data_.stream());
    }
    state& operator=(state const& o) {
      if (this != &o) *this = state(o);
      return *this;
    }
    state(state&&) noexcept = default;
    state& operator=(state&&) noexcept = default;
    ~state() = default;

    /// The residual (device memory).
    [[nodiscard]] std::span<float const> values() const noexcept {
      return {reinterpret_cast<float const*>(data_.data()), n_};
    }
    /// Replaces the residual by host `values` (empty: zero), copied into device memory on
    /// `mem`'s stream (a checkpoint loaded, `two_way_compressor::load`). On an error the
    /// residual is as before.
    void assign(std::span<float const> values, device_memory const& mem) {
      device_buffer fresh(mem.stream);
      fresh.resize(values.size() * sizeof(float));
      mem.write(fresh.span(), std::as_bytes(values));
      data_ = std::move(fresh);
      next_ = device_buffer(mem.stream);
      n_ = values.size();
    }

   private:
    friend struct device_residual_feedback;
    device_buffer data_, next_;
    std::size_t n_ = 0;
  };

  /// One step: the packet of p = g + e (device memory) into `out`, and e ← p − D(packet), as
  /// `residual_feedback::compress`. A state of another size than `g` is `residual_feedback`'s
  /// `config_error`; on any error the state is as before.
  template <class C, element T>
  std::size_t compress(stream_codec<C> const& c, state& s, tensor_view<T const> g,
                       std::span<std::byte> out, codec_context const& ctx) const {
    if (s.n_ != 0 && s.n_ != g.size()) {
      throw config_error("gradcomp: residual_feedback state holds " + std::to_string(s.n_) +
                         " elements but the gradient has " + std::to_string(g.size()) +
                         " (one state per tensor id)");
    }
    if (s.next_.stream() != c.stream()) s.next_ = device_buffer(c.stream());
    s.next_.resize(g.size() * sizeof(float));
    std::span<float> const next(reinterpret_cast<float*>(s.next_.data()), g.size());
    std::size_t const bytes = c.compress_with_feedback(g, s.values(), next, out, ctx);
    std::swap(s.data_, s.next_);
    s.n_ = g.size();
    return bytes;
  }
};

/// Error feedback on the device: a packet source of the collectives that keeps its state per
/// tensor id in device memory and follows `Rule` (cuda/feedback.cuh): `device_residual_rule`
/// (the default; `residual_feedback`), `device_ef21_rule` (`ef21_feedback`, with its receiver
/// side) or `device_dgc_rule` (`dgc_feedback`). It commits in two phases as `compressor` does
/// (feedback/compressor.hpp): `stage` writes the packet and stages the step, `prepare_commit`
/// computes the next state aside, `apply_commit` makes it current once every rank has
/// succeeded, `discard` drops it, so a failed step leaves every state as it was;
/// `commit_lossless` commits a dense send of the staged input. Packets, states and (EF21) the
/// collectives' outputs are byte for byte those of `compressor<C_cpu, F>` with the CPU codec of
/// the same format and the CPU policy of the same rule.
template <class C, class Rule = device_residual_rule>
class device_compressor {
 public:
  /// The feedback rule.
  using rule_type = Rule;
  /// Whether the collectives hand their outputs to `receive` (EF21: the outputs become the
  /// receiver's estimate, as `compressor::receives`).
  static constexpr bool receives = Rule::receives;

  /// Error feedback around `codec`, following `rule`.
  explicit device_compressor(stream_codec<C> codec, Rule rule = Rule{})
      : codec_(std::move(codec)), rule_(std::move(rule)) {}

  /// The codec.
  [[nodiscard]] stream_codec<C> const& codec() const noexcept { return codec_; }
  /// The rule.
  [[nodiscard]] Rule const& rule() const noexcept { return rule_; }

  /// One step in one go: stages, commits the packet written and makes the next state of tensor
  /// `g.id()` current. On an error the state is as before.
  std::size_t compress(tensor_view<float const> g, std::span<std::byte> out, codec_context const& ctx = {}) {
    std::size_t const bytes = stage(g, out, ctx);
    try {
      prepare_commit(g.id(), codec_, std::span<std::byte const>(out.first(bytes)), ctx);
    } catch (...) {
      discard(g.id());
      throw;
    }
    apply_commit(g.id());
    return bytes;
  }

  /// Phase one: writes the packet of the rule's input (g + e, g − h, or DGC's v) into `out` and
  /// stages the step; the current state is untouched until `apply_commit`. A state of another
  /// size than `g`'s is a `config_error` (tensor ids must keep their sizes); a non-finite input
  /// the CPU policy's `numeric_error`.
  std::size_t stage(tensor_view<float const> g, std::span<std::byte> out, codec_context const& ctx = {}) {
    detail::device_feedback_slot& s = begin_stage(g);
    std::size_t bytes = 0;
    if constexpr (requires { rule_.stage(codec_, s, g, out, ctx); }) {
      bytes = rule_.stage(codec_, s, g, out, ctx);
    } else {
      s.staged_in = rule_.stage_input(codec_, s, g, ctx);
      bytes = codec_.compress(tensor_view<float const>(s.staged_in, g.id()), out, ctx);
    }
    s.staged = true;
    return bytes;
  }
  /// Phase one without compression (for a step that may go dense): stages the rule's input and
  /// returns it (device memory, as `staged_input`).
  std::span<float const> stage_input(tensor_view<float const> g, codec_context const& ctx = {}) {
    detail::device_feedback_slot& s = begin_stage(g);
    s.staged_in = rule_.stage_input(codec_, s, g, ctx);
    s.staged = true;
    return s.staged_in;
  }
  /// The staged input of tensor `id` (device memory; empty if none is staged, or after a fused
  /// stage of the residual rule, which does not materialize it).
  [[nodiscard]] std::span<float const> staged_input(tensor_id id) const {
    auto it = states_.find(id);
    if (it == states_.end() || !it->second.staged) return {};
    return it->second.staged_in;
  }

  /// Phase two, first half: the next state of `id` for `sent`, the packet actually sent (device
  /// memory, decoded with `codec`), is computed aside (the residual rule after a fused `stage`
  /// has it already: the packet sent is the one staged). `config_error` if nothing is staged.
  template <class D>
  void prepare_commit(tensor_id id, stream_codec<D> const& codec, std::span<std::byte const> sent,
                      codec_context const& ctx = {}) {
    detail::device_feedback_slot& s = staged_slot(id);
    rule_.prepare(codec, s, sent, ctx);
    s.staged = false;
    s.prepared = true;
  }
  /// Phase two, second half: makes the prepared state of `id` current.
  void apply_commit(tensor_id id) {
    auto it = states_.find(id);
    if (it == states_.end() || !it->second.prepared) {
      throw config_error("gradcomp: device error feedback: apply_commit of tensor " +
                         std::to_string(static_cast<std::uint32_t>(id)) + " without a prepared commit");
    }
    detail::device_feedback_slot& s = it->second;
    std::swap(s.state, s.next);
    s.floats = s.next_floats;
    s.prepared = false;
    s.fused = false;
  }
  /// Phase two when the staged input itself was delivered exactly (a dense send): the residual
  /// becomes zero, EF21's h takes the increment in full, DGC's u and v become zero.
  void commit_lossless(tensor_id id) {
    detail::device_feedback_slot& s = staged_slot(id);
    rule_.lossless(s);
    s.staged = false;
    s.fused = false;
  }
  /// Drops the staged or prepared step of `id` (the current state stays).
  void discard(tensor_id id) {
    auto it = states_.find(id);
    if (it == states_.end()) return;
    it->second.staged = false;
    it->second.prepared = false;
    it->second.fused = false;
  }

  /// Receiver side (EF21): `io`, a collective's output for tensor `id` (device memory), becomes
  /// the receiver's estimate H ← H + io, io ← H (`ef21_feedback::receive`). `config_error` if
  /// the size changed.
  void receive(tensor_id id, std::span<float> io)
    requires(Rule::receives)
  {
    auto [it, fresh] = receivers_.try_emplace(id, codec_.stream());
    try {
      rule_.receive(it->second.h, it->second.floats, io);
    } catch (...) {
      if (fresh) receivers_.erase(it);
      throw;
    }
  }
  /// The receiver's estimate H of `id` (device memory; empty before its first output).
  [[nodiscard]] std::span<float const> receiver(tensor_id id) const
    requires(Rule::receives)
  {
    auto it = receivers_.find(id);
    if (it == receivers_.end()) return {};
    return {reinterpret_cast<float const*>(it->second.h.data()), it->second.floats};
  }

  /// The committed state of `id` (device memory; empty before its first step, and for the
  /// residual after a lossless commit): the residual, EF21's h, or DGC's [u | v] (the values of
  /// the CPU policy's state).
  [[nodiscard]] std::span<float const> state(tensor_id id) const {
    auto it = states_.find(id);
    if (it == states_.end()) return {};
    return it->second.current();
  }
  /// The residual of `id` (`state`; residual feedback only: what `gradient_pipeline` reads of a
  /// device source with feedback "residual").
  [[nodiscard]] std::span<float const> residual(tensor_id id) const
    requires(Rule::id == feedback_id::residual)
  {
    return state(id);
  }
  /// Replaces every state by `states` (host values per tensor id, as `state` gives them; an
  /// empty vector is a zero state, as before a tensor's first step), copied to the device on the
  /// codec's stream. Everything is allocated and copied before anything is replaced: on an
  /// error the states are as before. The EF21 receivers are kept.
  void assign_states(std::map<tensor_id, std::vector<float>> const& states) {
    std::map<tensor_id, detail::device_feedback_slot> fresh;
    for (auto const& [id, v] : states) {
      if (v.empty()) continue;
      detail::device_feedback_slot& e = fresh.try_emplace(id, codec_.stream()).first->second;
      std::span<float> const d = detail::device_feedback_slot::floats_of(e.state, v.size());
      detail::copy_from_host(d.data(), v.data(), v.size() * sizeof(float), codec_.stream());
      e.floats = v.size();
    }
    states_ = std::move(fresh);
  }
  /// `assign_states`, and every EF21 receiver estimate replaced by `receivers` (host values per
  /// tensor id, as `receiver` gives them). Everything is allocated and copied before anything
  /// is replaced: on an error the states and receivers are as before.
  void assign_states(std::map<tensor_id, std::vector<float>> const& states,
                     std::map<tensor_id, std::vector<float>> const& receivers)
    requires(Rule::receives)
  {
    std::map<tensor_id, receiver_slot> fresh;
    for (auto const& [id, v] : receivers) {
      if (v.empty()) continue;
      receiver_slot& r = fresh.try_emplace(id, codec_.stream()).first->second;
      r.h.resize(v.size() * sizeof(float));
      detail::copy_from_host(r.h.data(), v.data(), v.size() * sizeof(float), codec_.stream());
      r.floats = v.size();
    }
    assign_states(states);
    receivers_ = std::move(fresh);
  }
  /// `assign_states` of residuals (residual feedback only).
  void assign_residuals(std::map<tensor_id, std::vector<float>> const& residuals)
    requires(Rule::id == feedback_id::residual)
  {
    assign_states(residuals);
  }
  /// Forgets every state (and every EF21 receiver).
  void reset() {
    states_.clear();
    receivers_.clear();
  }

 private:
  struct receiver_slot {
    explicit receiver_slot(cudaStream_t s) : h(s) {}
    device_buffer h;
    std::size_t floats = 0;
  };

  // The slot of g.id(), checked against g's size, with any earlier stage dropped.
  detail::device_feedback_slot& begin_stage(tensor_view<float const> g) {
    detail::device_feedback_slot& s = states_.try_emplace(g.id(), codec_.stream()).first->second;
    if (s.floats != 0 && s.floats != Rule::state_floats(g.size())) {
      throw config_error("gradcomp: device error feedback (" + std::string(Rule::name) + ") of tensor " +
                         std::to_string(static_cast<std::uint32_t>(g.id())) + ": a gradient of " +
                         std::to_string(g.size()) + " elements for a state of " + std::to_string(s.floats) +
                         " floats (one state per tensor id)");
    }
    s.staged = false;
    s.prepared = false;
    s.fused = false;
    s.n = g.size();
    s.staged_in = {};
    return s;
  }
  detail::device_feedback_slot& staged_slot(tensor_id id) {
    auto it = states_.find(id);
    if (it == states_.end() || !it->second.staged) {
      throw config_error("gradcomp: device error feedback: tensor " + std::to_string(static_cast<std::uint32_t>(id)) +
                         " has no staged step to commit");
    }
    return it->second;
  }

  stream_codec<C> codec_;
  Rule rule_;
  std::map<tensor_id, detail::device_feedback_slot> states_;
  std::map<tensor_id, receiver_slot> receivers_;
};

GRADCOMP_CUDA_NAMESPACE_END
