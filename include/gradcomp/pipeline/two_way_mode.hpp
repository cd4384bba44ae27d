// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `two_way_mode`: the two-way compression mode of `gradient_pipeline`
/// (`pipeline_options::two_way`, pipeline/options.hpp), host tensors. It owns the mode's
/// state: a `two_way_compressor` over the pipeline's codec with worker and server feedback of
/// the same policy ("residual" on both sides, or "none"), keyed per shard of each tensor.
/// Each compressed tensor goes through `all_reduce_two_way`'s exchange
/// (collective/two_way.hpp: workers compress their shards, each shard's owner sums and
/// re-compresses with its server feedback, the packets are gathered); the outcome round is the
/// pipeline's. The first exchange of a step opens a step of the compressor, which keeps a copy
/// of every shard state the step changes: `commit` forgets the copies, `rollback` puts them
/// back. The interface is pipeline/exchange.hpp's.
///
/// Checkpoint section (part of "GCPL", unchanged from before the mode had a file of its own):
/// one byte string (`byte_writer::put_bytes`) holding `two_way_compressor::save` ("GCTW"
/// version 1); empty in a pipeline of another mode.

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/feedback/policies.hpp>
#include <gradcomp/pipeline/exchange.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Two-way compression with worker and server feedback (file comment).
class two_way_mode {
 public:
  /// The two-way compressor of either feedback.
  using compressor_type = std::variant<two_way_compressor<any_codec, no_feedback, no_feedback>,
                                       two_way_compressor<any_codec, residual_feedback, residual_feedback>>;

  /// A mode without state that compresses with `codec` on both sides and keeps the error
  /// feedback `feedback` names on both: "residual" or "none" (`config_error` for another).
  two_way_mode(std::string const& feedback, any_codec const& codec) : tw_(make(feedback, codec)) {}

  /// The compressor (its worker and server states).
  [[nodiscard]] compressor_type const& compressor() const noexcept { return tw_; }

  /// `all_reduce_two_way`'s exchange of `t` (its shape is not used); the shard states before
  /// the step are kept until `commit` or `rollback`.
  template <communicator Comm>
  collective_result exchange(Comm& comm, exchange_tensor const& t, codec_context const& ctx,
                             collective_options const& copt, detail::step_check& check) {
    return std::visit(
        [&](auto& tw) {
          if (!open_) {
            tw.begin_step();
            open_ = true;
          }
          return detail::two_way_exchange(comm, tw, t.grad, t.out, ctx, copt, check);
        },
        tw_);
  }

  /// The step completed on every rank: its shard states stay.
  void commit() noexcept {
    if (open_) std::visit([](auto& tw) { tw.commit_step(); }, tw_);
    open_ = false;
  }
  /// The step failed: every shard state it changed goes back (one it made goes away).
  void rollback() noexcept {
    try {
      std::visit([](auto& tw) { tw.rollback_step(); }, tw_);
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory while restoring
    }
    open_ = false;
  }

  /// The checkpoint section (file comment).
  void save(detail::byte_writer& w) const {
    w.put_bytes(std::visit([](auto const& tw) { return tw.save(); }, tw_));
  }
  /// The section of a pipeline in another mode (empty).
  static void save_none(detail::byte_writer& w) { w.put_bytes(std::vector<std::byte>{}); }

  /// A mode of this configuration holding the state of `section` (the byte string of the
  /// file comment); `format_error` for a malformed one.
  [[nodiscard]] two_way_mode loaded_from(std::span<std::byte const> section) const {
    two_way_mode fresh(*this);  // `load` replaces every state and closes the steps
    std::visit([&](auto& tw) { tw.load(section); }, fresh.tw_);
    fresh.open_ = false;
    return fresh;
  }
  /// `loaded_from` the section read from `r`.
  [[nodiscard]] two_way_mode loaded(detail::byte_reader& r) const {
    std::vector<std::byte> const section = r.get_bytes();
    return loaded_from(std::span<std::byte const>(section));
  }
  /// Reads past a section that must be empty (a pipeline in another mode): `r.fail` when it
  /// holds state.
  static void expect_none(detail::byte_reader& r) {
    if (!r.get_bytes().empty()) r.fail("holds two-way state, this pipeline is not two-way");
  }

 private:
  static compressor_type make(std::string const& feedback, any_codec const& c) {
    if (feedback == "none") return two_way_compressor<any_codec, no_feedback, no_feedback>(c);
    if (feedback == "residual") return two_way_compressor<any_codec, residual_feedback, residual_feedback>(c);
    throw config_error("gradcomp: two-way compression takes feedback none or residual (worker and server side), got '" +
                       feedback + "'");
  }

  compressor_type tw_;
  bool open_ = false;  // a step of the compressor is open (its first exchange happened)
};

GRADCOMP_NAMESPACE_END
