// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `compressor<Codec, Feedback>`: a codec composed with an error-feedback policy, holding one
/// feedback state per tensor id. The codec may be replaced between steps (a controller changing
/// the compression factor); the residual carries over, so no gradient mass is lost.
///
/// A step runs in one call (`compress`) or in two phases: `stage` (compress g + residual; the
/// residual is not touched yet; `staged_input` gives the float32 input, e.g. for multi-level
/// re-compression or norms), then, once the caller knows what it sent, `commit` with that
/// packet, `commit_lossless` (the staged input was sent dense) or `discard` (nothing of it was
/// sent; the state stays as it was). A decision taken after compression so needs no undo.
///
/// With a policy whose packets are increments (`ef21_feedback`), `receive` keeps the receiver
/// side, one estimate per tensor id, and turns a collective's output into the estimate; the
/// collectives call it.
///
/// Saved state format (little-endian): "GCEF", u8 version 3, u8 feedback_id, u16 0,
/// u32 tensor count (tensors with a completed step; a stage alone is not state), u32 receiver
/// count, then per tensor (ascending id): u32 id, u64 n, n x f32, where the n floats are the
/// policy state's `values()` (the residual, n = the tensor's elements; for `dgc_feedback`
/// momentum and accumulation, n = twice the elements); then the receiver records in the same
/// layout; then u32 CRC32C (core/crc32c.hpp) of every byte before it. `load` checks the
/// checksum before anything else: a corrupted state is a `format_error` that changes nothing.
/// Versions 1 (no receivers) and 2 are the same without the checksum: `load` refuses them on
/// their own, and takes them only inside a container whose own checksum covers them
/// (`state_check::container`: the pipeline's checkpoint, which holds version 2 records for a
/// device source's residuals and in checkpoints written before version 3).

#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/concepts/feedback.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/crc32c.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/feedback/policies.hpp>

#include <concepts>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// How `compressor::load` treats a state without a checksum (versions 1 and 2, file comment).
enum class state_check {
  required,   ///< refused: a state on its own must carry its CRC32C (version 3)
  container,  ///< accepted: the bytes sit inside a container whose own checksum was checked
};

namespace detail {

/// The 16-byte head of the saved error-feedback state format (file comment): magic, version 2,
/// the policy's id, the counts of tensor and receiver records that follow. What
/// `compressor::save` writes, and a pipeline with a device source for its device residuals.
inline std::vector<std::byte> feedback_state_head(feedback_id policy, std::size_t tensors,
                                                  std::size_t receivers) {
  std::vector<std::byte> out(16);
  std::memcpy(out.data(), "GCEF", 4);
  out[4] = std::byte{2};
  out[5] = static_cast<std::byte>(policy);
  store_le<std::uint16_t>(out.data() + 6, 0);
  store_le<std::uint32_t>(out.data() + 8, static_cast<std::uint32_t>(tensors));
  store_le<std::uint32_t>(out.data() + 12, static_cast<std::uint32_t>(receivers));
  return out;
}

/// Makes a version 2 state (head and records) a version 3 one: sets the version byte and
/// appends the CRC32C of every byte. What `compressor::save` does last.
inline void seal_feedback_state(std::vector<std::byte>& state) {
  state[4] = std::byte{3};
  std::uint32_t const crc = crc32c_table(state);
  std::size_t const at = state.size();
  state.resize(at + 4);
  store_le<std::uint32_t>(state.data() + at, crc);
}

/// Appends one record of that format to `out`: u32 id, u64 n, then the n floats of `v`.
inline void put_feedback_record(std::vector<std::byte>& out, tensor_id id,
                                std::span<float const> v) {
  std::size_t const at = out.size();
  out.resize(at + 12 + 4 * v.size());
  store_le<std::uint32_t>(out.data() + at, static_cast<std::uint32_t>(id));
  store_le<std::uint64_t>(out.data() + at + 4, v.size());
  for (std::size_t i = 0; i < v.size(); ++i) store_f32(out.data() + at + 12 + 4 * i, v[i]);
}

}  // namespace detail

/// A codec with error feedback and per-tensor state (see file comment).
template <codec_operations Codec, class Feedback = residual_feedback>
  requires feedback_policy<Feedback, Codec>
class compressor {
 public:
  using codec_type = Codec;
  using feedback_type = Feedback;
  using state_type = typename Feedback::state;

  /// A default codec and policy (for codecs that have a default).
  compressor()
    requires std::default_initializable<Codec>
      : compressor(Codec{}) {}
  explicit compressor(Codec c, Feedback f = Feedback{}) : codec_(std::move(c)), feedback_(std::move(f)) {}

  /// The codec; assign a new one to change parameters between steps.
  [[nodiscard]] Codec& codec() noexcept { return codec_; }
  [[nodiscard]] Codec const& codec() const noexcept { return codec_; }
  [[nodiscard]] Feedback const& feedback() const noexcept { return feedback_; }

  /// Upper bound of a packet for `n` elements.
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    return codec_.max_compressed_bytes(n);
  }

  /// Compresses gradient `g` with error feedback into `out`; returns the packet size. State is
  /// keyed by `g.id()`; on an exception it is left unchanged.
  template <element T>
  std::size_t compress(tensor_view<T const> g, std::span<std::byte> out, codec_context const& ctx = {}) {
    if (auto it = states_.find(g.id()); it != states_.end()) {
      it->second.staged = false;
      std::size_t const bytes = feedback_.compress(codec_, it->second.state, g, out, ctx);
      it->second.committed = true;
      return bytes;
    }
    entry fresh;  // enters the map only once a step has succeeded
    std::size_t const bytes = feedback_.compress(codec_, fresh.state, g, out, ctx);
    fresh.committed = true;
    states_.emplace(g.id(), std::move(fresh));
    return bytes;
  }

  /// Phase one of a step: stages g + residual (per the policy) for tensor `g.id()` and
  /// compresses it with the codec into `out`; returns the packet size. The committed state is
  /// unchanged until `commit` / `commit_lossless`; a new `stage` of the same tensor replaces
  /// the staged input.
  template <element T>
  std::size_t stage(tensor_view<T const> g, std::span<std::byte> out, codec_context const& ctx = {}) {
    return stage_impl(g, ctx, [&](std::span<float const> in) {
      return codec_.compress(tensor_view<float const>(in, g.id()), out, ctx);
    });
  }
  /// Phase one without compression (for a step that may go dense): stages g + residual and
  /// returns it (as `staged_input`).
  template <element T>
  std::span<float const> stage_input(tensor_view<T const> g, codec_context const& ctx = {}) {
    stage_impl(g, ctx, [](std::span<float const>) { return std::size_t{0}; });
    return staged_input(g.id());
  }

  /// The staged float32 input of tensor `id` (after `stage`, until the commit): what the codec
  /// compressed. Empty if none is staged.
  [[nodiscard]] std::span<float const> staged_input(tensor_id id) const {
    auto it = states_.find(id);
    if (it == states_.end() || !it->second.staged) return {};
    return it->second.input;
  }

  /// Phase two: the state of tensor `id` is updated for `sent`, the packet actually sent
  /// (decoded with `codec`, e.g. the codec of another factor or of a re-compression of the
  /// staged packet). `config_error` if nothing is staged.
  template <codec_operations C>
  void commit(tensor_id id, C const& codec, std::span<std::byte const> sent, codec_context const& ctx = {}) {
    feedback_.commit(codec, take_staged(id), sent, ctx);
  }
  /// `commit` in two steps: the next state of tensor `id` is computed from `sent` now (so the
  /// packet may change afterwards, e.g. summed in place by an all-reduce) but becomes current
  /// only with `apply_commit`; a `discard` in between keeps the state as it was.
  template <codec_operations C>
  void prepare_commit(tensor_id id, C const& codec, std::span<std::byte const> sent, codec_context const& ctx = {}) {
    entry& e = staged_entry(id);
    feedback_.prepare_commit(codec, e.state, sent, ctx);
    e.staged = false;
    e.prepared = true;
  }
  /// Makes the prepared commit of tensor `id` current.
  void apply_commit(tensor_id id) {
    auto it = states_.find(id);
    if (it == states_.end() || !it->second.prepared) {
      throw config_error("gradcomp: compressor: apply_commit of tensor " + std::to_string(static_cast<unsigned>(id)) +
                         " without a prepared commit");
    }
    feedback_.apply_commit(it->second.state);
    it->second.prepared = false;
    it->second.committed = true;
  }

  /// `commit` decoding with this compressor's codec.
  void commit(tensor_id id, std::span<std::byte const> sent, codec_context const& ctx = {}) {
    feedback_.commit(codec_, take_staged(id), sent, ctx);
  }
  /// Phase two when the staged input itself was delivered exactly (a dense send of
  /// g + residual): the residual becomes zero (EF21: h takes the increment in full).
  void commit_lossless(tensor_id id) { feedback_.commit_lossless(take_staged(id)); }
  /// Phase two when nothing of the staged input was sent: the state stays as before the stage.
  void discard(tensor_id id) {
    auto it = states_.find(id);
    if (it != states_.end()) {
      it->second.staged = false;
      it->second.prepared = false;
    }
  }

  /// Receiver side of an increment policy (EF21): `io`, a collective's output for tensor `id`,
  /// becomes the receiver's estimate (see `ef21_feedback::receive`). Without such a policy it
  /// leaves `io` as it is.
  void receive(tensor_id id, std::span<float> io) {
    if constexpr (receiving_feedback<Feedback>) feedback_.receive(receivers_[id], io);
  }
  /// Whether `receive` changes outputs (the policy's packets are increments).
  static constexpr bool receives = receiving_feedback<Feedback>;

  /// Decodes a packet (any sender) into `out`.
  template <element T>
  void decompress(std::span<std::byte const> packet, std::span<T> out, codec_context const& ctx = {}) const {
    codec_.decompress(packet, out, ctx);
  }

  /// Adds `alpha` times a decoded packet to `out`.
  template <element T>
  void decompress_add(std::span<std::byte const> packet, std::span<T> out, float alpha = 1.0f,
                      codec_context const& ctx = {}) const {
    codec_.decompress_add(packet, out, alpha, ctx);
  }

  /// Feedback state of tensor `id` (created empty if absent).
  [[nodiscard]] state_type& state(tensor_id id) { return states_[id].state; }
  /// Calls `f(id, values)` for every tensor with a completed step, in ascending id order, with
  /// its policy state's `values()` (what `save` writes).
  template <class F>
  void for_each_committed(F&& f) const {
    for (auto const& [id, e] : states_) {
      if (e.committed) f(id, e.state.values());
    }
  }
  /// Calls `f(id, values)` for every receiver state (EF21's estimates), in ascending id order
  /// (what `save` writes after the states); never without a receiving policy.
  template <class F>
  void for_each_receiver(F&& f) const {
    if constexpr (receiving_feedback<Feedback>) {
      for (auto const& [id, r] : receivers_) f(id, r.values());
    } else {
      (void)f;
    }
  }
  /// Forgets all state (e.g. after the model was re-initialised).
  void reset() {
    states_.clear();
    receivers_.clear();
  }

  /// Serializes every tensor's state.
  [[nodiscard]] std::vector<std::byte> save() const {
    std::size_t committed = 0;
    for (auto const& [id, e] : states_) committed += e.committed ? 1 : 0;
    std::vector<std::byte> out =
        detail::feedback_state_head(Feedback::id, committed, receiver_count());
    auto put = [&out](tensor_id id, std::span<float const> v) {
      detail::put_feedback_record(out, id, v);
    };
    for (auto const& [id, e] : states_) {
      if (e.committed) put(id, e.state.values());
    }
    if constexpr (receiving_feedback<Feedback>) {
      for (auto const& [id, r] : receivers_) put(id, r.values());
    }
    detail::seal_feedback_state(out);
    return out;
  }

  /// Restores state written by `save` (replacing all current state). Throws `format_error` on a
  /// malformed or corrupted buffer (checksum), or one of a different feedback policy; the
  /// current state is kept then. `check`: whether a state without a checksum (versions 1 and 2)
  /// is refused (the default) or taken (inside a checked container; file comment).
  void load(std::span<std::byte const> in, state_check check = state_check::required) {
    auto fail = [](std::string const& what) -> void {
      throw format_error("gradcomp: error-feedback state: " + what);
    };
    if (in.size() < 16 || std::memcmp(in.data(), "GCEF", 4) != 0) fail("missing \"GCEF\" magic");
    unsigned const version = static_cast<unsigned>(in[4]);
    if (version != 1 && version != 2 && version != 3) fail("unsupported version " + std::to_string(version));
    if (version == 3) {
      if (in.size() < 20) fail("truncated (no room for the checksum)");
      if (detail::crc32c_table(in.first(in.size() - 4)) != detail::load_le<std::uint32_t>(in.data() + in.size() - 4)) {
        fail("checksum (CRC32C) mismatch: the state is corrupted");
      }
      in = in.first(in.size() - 4);
    } else if (check == state_check::required) {
      fail("version " + std::to_string(version) +
           " carries no checksum (saved by a gradcomp from before state checksums, or corrupted); it is refused");
    }
    if (static_cast<feedback_id>(in[5]) != Feedback::id) {
      fail("saved by feedback policy " + std::to_string(static_cast<unsigned>(in[5])) + ", this is " +
           std::to_string(static_cast<unsigned>(Feedback::id)));
    }
    std::uint32_t const count = detail::load_le<std::uint32_t>(in.data() + 8);
    std::uint32_t const rcount = detail::load_le<std::uint32_t>(in.data() + 12);
    if (version == 1 && rcount != 0) fail("version 1 with a non-zero reserved field");
    if (rcount != 0 && !receiving_feedback<Feedback>) fail("receiver records for a policy without a receiver side");
    std::size_t at = 16;
    auto read_records = [&](std::uint32_t records, char const* what, auto& into) {
      for (std::uint32_t t = 0; t < records; ++t) {
        if (in.size() - at < 12) fail(std::string("truncated ") + what + " record " + std::to_string(t));
        auto const id = static_cast<tensor_id>(detail::load_le<std::uint32_t>(in.data() + at));
        std::uint64_t const n = detail::load_le<std::uint64_t>(in.data() + at + 4);
        if (n > (in.size() - at - 12) / 4) {
          fail(std::string(what) + " record " + std::to_string(t) + " claims " + std::to_string(n) +
               " values beyond the buffer");
        }
        if (into.count(id) != 0) fail(std::string(what) + " id " + std::to_string(static_cast<unsigned>(id)) + " appears twice");
        std::vector<float> v(n);
        for (std::size_t i = 0; i < n; ++i) v[i] = detail::load_f32(in.data() + at + 12 + 4 * i);
        assign_record(into[id], v);
        at += 12 + 4 * n;
      }
    };
    std::map<tensor_id, entry> restored;
    read_records(count, "tensor", restored);
    receiver_map restored_receivers;
    if constexpr (receiving_feedback<Feedback>) read_records(rcount, "receiver", restored_receivers);
    if (at != in.size()) fail(std::to_string(in.size() - at) + " trailing bytes");
    states_ = std::move(restored);
    receivers_ = std::move(restored_receivers);
  }

 private:
  template <class F>
  struct receiver_of {
    struct type {};  // a policy without a receiver side keeps none
  };
  template <receiving_feedback F>
  struct receiver_of<F> {
    using type = typename F::receiver_state;
  };
  using receiver_map = std::map<tensor_id, typename receiver_of<Feedback>::type>;

  [[nodiscard]] std::size_t receiver_count() const noexcept {
    if constexpr (receiving_feedback<Feedback>) return receivers_.size();
    return 0;
  }

  static void assign_record(auto& target, std::vector<float> const& v) {
    if constexpr (requires { target.state; }) {
      target.state.assign(v);
      target.committed = true;
    } else {
      target.assign(v);
    }
  }

  template <element T, class Compress>
  std::size_t stage_impl(tensor_view<T const> g, codec_context const& ctx, Compress&& compress) {
    auto [it, fresh] = states_.try_emplace(g.id());
    entry& e = it->second;
    e.staged = false;
    try {
      e.input = feedback_.stage(e.state, g, ctx);
      std::size_t const bytes = compress(e.input);
      e.staged = true;
      return bytes;
    } catch (...) {
      if (fresh) states_.erase(it);
      throw;
    }
  }

  // One tensor's feedback state and its stage in progress.
  struct entry {
    state_type state;
    std::span<float const> input;  // the staged input (valid while `staged`)
    bool staged = false;
    bool prepared = false;         // a commit is prepared, awaiting apply_commit
    bool committed = false;        // a step has completed (else: staged only, not saved)
  };

  entry& staged_entry(tensor_id id) {
    auto it = states_.find(id);
    if (it == states_.end() || !it->second.staged) {
      throw config_error("gradcomp: compressor: commit of tensor " + std::to_string(static_cast<unsigned>(id)) +
                         " without a staged input (call stage first, once per commit)");
    }
    return it->second;
  }

  // The state of a staged tensor, its stage ended; config_error if none is staged.
  state_type& take_staged(tensor_id id) {
    auto it = states_.find(id);
    if (it == states_.end() || !it->second.staged) {
      throw config_error("gradcomp: compressor: commit of tensor " + std::to_string(static_cast<unsigned>(id)) +
                         " without a staged input (call stage first, once per commit)");
    }
    it->second.staged = false;
    it->second.committed = true;
    return it->second.state;
  }

  Codec codec_;
  Feedback feedback_;
  std::map<tensor_id, entry> states_;
  receiver_map receivers_;
};

GRADCOMP_NAMESPACE_END
