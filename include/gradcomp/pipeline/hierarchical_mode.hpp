// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `hierarchical_mode`: the hierarchical all-reduce mode of `gradient_pipeline`
/// (`pipeline_options::hierarchical`, pipeline/options.hpp). It owns the mode's state:
///
/// - the shard owners' error feedback, a `feedback_compressor` of the pipeline's codec with
///   feedback "residual" or "none", keyed by `hierarchical_shard_id` (collective/hierarchical.hpp);
/// - the node and lane communicators the caller gave (`set_groups`; without them the node and
///   lane groups run over the step communicator's point-to-point messages);
/// - the step's plan (layout and lanes), settled in the pipeline's agreement round (`plan_step`);
/// - the feedback the step staged, made current by `commit` or discarded by `rollback`.
///
/// Each compressed tensor goes through the hierarchical all-reduce's exchange
/// (`hierarchical_exchange_over` / `hierarchical_exchange`: reduce-scatter inside the nodes,
/// the node sums compressed between nodes by the shard owners, all-gather inside the nodes)
/// with the options given at construction (their `op` and `checksum` are the pipeline's
/// buckets'); the outcome round is the pipeline's. The interface is pipeline/exchange.hpp's.
///
/// Checkpoint section (part of "GCPL", unchanged from before the mode had a file of its own: it
/// is the container's error-feedback section): one byte string (`byte_writer::put_bytes`)
/// holding `compressor::save` of the owners' feedback. With a device source the owners'
/// feedback lives in the source and this mode keeps only the groups and the plan.

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/hierarchical.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/comm/any_communicator.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/core/spec.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/feedback/make_feedback.hpp>
#include <gradcomp/pipeline/exchange.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// The hierarchical all-reduce with the shard owners' error feedback (file comment).
class hierarchical_mode {
 public:
  /// A mode without state over the grouping of `opt` (its `op` and `checksum` are those of
  /// every exchange), compressing between nodes with `codec` and keeping the error feedback
  /// `feedback` names on the shard owners: "residual" or "none" (`config_error` for another).
  hierarchical_mode(hierarchical_options opt, std::string const& feedback, any_codec const& codec)
      : opt_(std::move(opt)), comp_(make(feedback, codec)) {}

  /// The options of every exchange.
  [[nodiscard]] hierarchical_options const& options() const noexcept { return opt_; }
  /// The shard owners' error feedback (committed state by shard id).
  [[nodiscard]] feedback_compressor& feedback() noexcept { return comp_; }
  [[nodiscard]] feedback_compressor const& feedback() const noexcept { return comp_; }

  /// The node and lane communicators of this rank (`gradient_pipeline::set_hierarchical_groups`),
  /// kept for every later step.
  void set_groups(any_communicator node, std::optional<any_communicator> lane) {
    node_.emplace(std::move(node));
    lane_ = std::move(lane);
  }
  /// This rank's node communicator, if given.
  [[nodiscard]] any_communicator* node() noexcept { return node_ ? &*node_ : nullptr; }
  /// This rank's lane communicator, if given (only shard owners have one).
  [[nodiscard]] any_communicator* lane() noexcept { return lane_ ? &*lane_ : nullptr; }
  /// The plan of the step, as `plan_step` settled it.
  [[nodiscard]] detail::hierarchical_plan const& plan() const noexcept { return plan_; }

  /// Settles the step's plan for rank `rank` of `size` and adds what every rank must share to
  /// the agreement round's fingerprint `fp`. `config_error` for an invalid grouping or lane
  /// count, groups that do not match it, or none where `needs_groups` (a device source, whose
  /// payloads stay on them).
  void plan_step(int size, int rank, bool needs_groups, fingerprint& fp) {
    plan_ = detail::plan_hierarchy(opt_, size);
    if (node_) {
      detail::check_groups(plan_, rank, &*node_, lane_ ? &*lane_ : nullptr);
    } else if (needs_groups) {
      throw config_error(
          "gradcomp: gradient_pipeline: the hierarchical all-reduce of a device source needs the "
          "node and lane communicators (set_hierarchical_groups)");
    }
    fp.add("hierarchical").add(plan_.grouping).add(node_ ? "own groups" : "point-to-point groups");
    fp.add(static_cast<std::uint64_t>(plan_.lanes));
    fp.add(static_cast<std::uint64_t>(opt_.intra));
    fp.add(static_cast<std::uint64_t>(opt_.groups.tag_base));
    fp.add(static_cast<std::uint64_t>(opt_.groups.tag_count));
  }

  /// The hierarchical all-reduce's exchange of `t` with the plan of the step (its shape and
  /// `copt` are not used: the options are the mode's); the owners' feedback it stages becomes
  /// current at `commit`.
  template <communicator Comm>
  collective_result exchange(Comm& comm, exchange_tensor const& t, codec_context const& ctx,
                             collective_options const& /*copt*/, detail::step_check& check) {
    hierarchical_result hr;
    std::visit(
        [&](auto& c) {
          detail::pending_commit<std::remove_reference_t<decltype(c)>> staged(c);
          if (node_) {
            detail::hierarchical_exchange_over(comm, *node_, lane_ ? &*lane_ : nullptr, plan_, c, t.grad, t.out,
                                               ctx, opt_, check, staged, hr);
          } else {
            detail::hierarchical_exchange(comm, plan_, c, t.grad, t.out, ctx, opt_, check, staged, hr);
          }
          for (tensor_id id : staged.release()) staged_.push_back(id);
        },
        comp_);
    collective_result r;
    r.packet_bytes = hr.packet_bytes;
    r.wire_bytes = hr.wire_bytes;
    return r;
  }

  /// The step completed on every rank: the owners' staged feedback becomes current (each id
  /// was prepared by `exchange`, so nothing here throws).
  void commit() noexcept {
    std::visit(
        [&](auto& c) {
          for (tensor_id id : staged_) c.apply_commit(id);
        },
        comp_);
    staged_.clear();
  }
  /// The step failed: the owners' staged feedback is discarded.
  void rollback() noexcept {
    std::visit(
        [&](auto& c) {
          for (tensor_id id : staged_) c.discard(id);
        },
        comp_);
    staged_.clear();
  }

  /// The checkpoint section (file comment).
  void save(detail::byte_writer& w) const {
    w.put_bytes(std::visit([](auto const& c) { return c.save(); }, comp_));
  }
  /// A mode of this configuration and groups holding the owners' feedback of `section` (the
  /// byte string of the file comment, inside a container that checked its integrity);
  /// `format_error` for a malformed one.
  [[nodiscard]] hierarchical_mode loaded_from(std::span<std::byte const> section) const {
    hierarchical_mode fresh(*this);  // `load` replaces every state
    std::visit([&](auto& c) { c.load(section, state_check::container); }, fresh.comp_);
    fresh.staged_.clear();
    return fresh;
  }
  /// `loaded_from` the section read from `r`.
  [[nodiscard]] hierarchical_mode loaded(detail::byte_reader& r) const {
    std::vector<std::byte> const section = r.get_bytes();
    return loaded_from(std::span<std::byte const>(section));
  }

 private:
  static feedback_compressor make(std::string const& feedback, any_codec const& codec) {
    if (feedback != "residual" && feedback != "none") {
      throw config_error(
          "gradcomp: the hierarchical all-reduce keeps error feedback on the shard owners: feedback "
          "'residual' or 'none', got '" +
          feedback + "'");
    }
    return make_feedback(feedback, codec);
  }

  hierarchical_options opt_;
  feedback_compressor comp_;
  std::optional<any_communicator> node_, lane_;  // set_groups
  detail::hierarchical_plan plan_;               // settled by plan_step
  std::vector<tensor_id> staged_;                // the owners' feedback the step staged
};

GRADCOMP_NAMESPACE_END
