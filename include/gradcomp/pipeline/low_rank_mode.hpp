// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `low_rank_mode`: the PowerSGD exchange mode of `gradient_pipeline` (a "powersgd" codec spec,
/// pipeline/options.hpp), host tensors. It owns the mode's state: one `powersgd_session` per
/// compressed tensor (its error feedback and warm-start Q), made at the tensor's first step for
/// its matrix shape, and the sessions as they were before the step, put back if it fails. Each
/// tensor goes through `all_reduce_low_rank`'s exchange (collective/low_rank.hpp); the outcome
/// round is the pipeline's. The interface is pipeline/exchange.hpp's.
///
/// Checkpoint section (part of "GCPL", unchanged from before the mode had a file of its own):
/// the session count (u64), then per session in ascending tensor id: the id (u64), rows (u64),
/// cols (u64) and `powersgd_state::save_exact`.

#include <gradcomp/codec/powersgd.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/low_rank.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/collective/powersgd_session.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/pipeline/exchange.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// PowerSGD, one session per tensor (file comment).
class low_rank_mode {
 public:
  /// A mode without sessions; every session it makes takes `opt`.
  explicit low_rank_mode(powersgd_options const& opt) : opt_(opt) {}

  /// The options of every session.
  [[nodiscard]] powersgd_options const& options() const noexcept { return opt_; }
  /// The sessions, by tensor id.
  [[nodiscard]] std::map<tensor_id, powersgd_session> const& sessions() const noexcept { return sessions_; }

  /// `all_reduce_low_rank`'s exchange of `t` with its session (made now at its first step,
  /// for a `t.rows` × `t.cols` matrix); the session before the step is kept until `commit`.
  template <communicator Comm>
  collective_result exchange(Comm& comm, exchange_tensor const& t, codec_context const& ctx,
                             collective_options const& copt, detail::step_check& check) {
    tensor_id const id = t.grad.id();
    auto it = sessions_.find(id);
    if (it == sessions_.end()) {
      it = sessions_.emplace(id, powersgd_session(t.rows, t.cols, opt_, id)).first;
      undo_.emplace_back(id, std::nullopt);
    } else {
      undo_.emplace_back(id, it->second.snapshot());
    }
    return detail::low_rank_exchange(comm, it->second, t.grad, t.out, ctx, copt, check);
  }

  /// The step completed on every rank: its sessions stay.
  void commit() noexcept { undo_.clear(); }
  /// The step failed: every session it touched goes back (one it made goes away).
  void rollback() noexcept {
    try {
      for (auto& [id, before] : undo_) {
        if (before) sessions_.at(id).restore(std::move(*before));
        else sessions_.erase(id);
      }
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory while restoring
    }
    undo_.clear();
  }

  /// The checkpoint section (file comment).
  void save(detail::byte_writer& w) const {
    w.put_u64(sessions_.size());
    for (auto const& [id, s] : sessions_) {
      w.put_u64(static_cast<std::uint64_t>(id));
      w.put_u64(s.state().rows());
      w.put_u64(s.state().cols());
      s.state().save_exact(w);
    }
  }

  /// A mode with these options holding the sessions of a section read from `r`; `r.fail` for
  /// an invalid shape, a state that does not load, or an id that appears twice.
  [[nodiscard]] low_rank_mode loaded(detail::byte_reader& r) const {
    low_rank_mode fresh(opt_);
    std::uint64_t const count = r.get_u64();
    for (std::uint64_t i = 0; i < count; ++i) {
      auto const id = static_cast<tensor_id>(r.get_u32_of_u64("session id"));
      std::uint64_t const rows = r.get_u64(), cols = r.get_u64();
      if (rows == 0 || cols == 0 || rows > (std::uint64_t{1} << 40) / cols) {
        r.fail("a PowerSGD session has an invalid shape");
      }
      powersgd_session s(static_cast<std::size_t>(rows), static_cast<std::size_t>(cols), opt_, id);
      s.state().load_exact(r);
      if (!fresh.sessions_.emplace(id, std::move(s)).second) r.fail("a PowerSGD session id appears twice");
    }
    return fresh;
  }

  /// The section of a pipeline in another mode (no sessions).
  static void save_none(detail::byte_writer& w) { w.put_u64(0); }
  /// Reads past a section that must be empty (a pipeline in another mode): `r.fail` when it
  /// holds sessions.
  static void expect_none(detail::byte_reader& r) {
    if (r.get_u64() != 0) r.fail("holds PowerSGD sessions, this pipeline is not PowerSGD");
  }

 private:
  powersgd_options opt_;
  std::map<tensor_id, powersgd_session> sessions_;
  std::vector<std::pair<tensor_id, std::optional<powersgd_state>>> undo_;  // the step's sessions before it
};

GRADCOMP_NAMESPACE_END
