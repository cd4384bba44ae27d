// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `powersgd_session`: PowerSGD (`codec/powersgd.hpp`) as a `low_rank_session`, so
/// `all_reduce_low_rank` runs its factor all-reduces over any communicator:
///
/// ```cpp
/// gradcomp::powersgd_session s(rows, cols, {.rank = 4}, gradcomp::tensor_id{3});  // one per tensor
/// gradcomp::all_reduce_low_rank(comm, s, grad, out, ctx, {.op = gradcomp::reduction::average});
/// ```
///
/// A low-rank matrix exchanges two factors (P, then Q computed from the summed and
/// orthonormalized P); a matrix too small to gain exchanges itself, dense, as one factor. The
/// session keeps PowerSGD's warm-start Q and error-feedback residual between steps. A rank with
/// no gradient this step (`grad` empty) contributes a zero gradient: its residual still flows.
/// If a step fails (a communication error, or a failure on another rank reported by the outcome
/// round), `all_reduce_low_rank` restores the session's `snapshot` taken before it, so the
/// session is exactly as before the step; a step abandoned outside that collective is
/// abandoned by the next `begin` (`powersgd_state::abort`: the warm-start Q is restored, the
/// gradient stays in the residual).

#include <gradcomp/codec/powersgd.hpp>
#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/concepts/low_rank_session.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// PowerSGD of one rows × cols tensor as a `low_rank_session` (see file comment).
class powersgd_session {
 public:
  using low_rank_session_concept = low_rank_session_tag;

  /// A session for a rows × cols matrix (row-major) with the given options, for tensor `id`
  /// (which keys the random replacement of rank-deficient columns).
  powersgd_session(std::size_t rows, std::size_t cols, powersgd_options const& opt = {},
                   tensor_id id = tensor_id{0})
      : state_(rows, cols, opt, id) {}

  /// The PowerSGD state (factors, residual, save/restore).
  [[nodiscard]] powersgd_state& state() noexcept { return state_; }
  [[nodiscard]] powersgd_state const& state() const noexcept { return state_; }

  /// Shape, rank and mode; throws `config_error` unless n = rows · cols.
  [[nodiscard]] std::uint64_t shape_fingerprint(std::size_t n) const {
    check_size(n);
    return detail::psgd::session_fingerprint(state_.rows(), state_.cols(), state_.rank(), state_.mode());
  }

  /// Phase 1 (local): error feedback and P = M Q; `g` empty contributes zeros.
  void begin(tensor_view<float const> g, std::size_t n, codec_context const& ctx) {
    check_size(n);
    state_.abort();  // a step left half-way by a failed collective
    if (g.empty() && n != 0) {
      zeros_.assign(n, 0.0f);
      first_ = state_.begin(tensor_view<float const>(zeros_, state_.id()), ctx);
    } else {
      first_ = state_.begin(g, ctx);
    }
  }

  /// 2 (P, Q) for a low-rank matrix, 1 (the matrix) for a dense one.
  [[nodiscard]] std::size_t factor_count() const noexcept {
    return detail::psgd::session_factor_count(state_.mode());
  }

  /// Floats of factor `i` (known before it is computed): P (rank × rows) or the dense matrix,
  /// then Q (rank × cols). `all_reduce_low_rank` uses it to keep taking part in the step with
  /// zeros when computing a factor failed on this rank (the outcome round then fails the step).
  [[nodiscard]] std::size_t factor_size(std::size_t i) const noexcept {
    return detail::psgd::session_factor_size(state_.mode(), state_.rows(), state_.cols(), state_.rank(), i);
  }

  /// Factor 0 is what `begin` computed; factor 1 (Q) is computed from the summed P.
  std::span<float> factor(std::size_t i, codec_context const& ctx) {
    if (i == 0) return first_;
    if (i == 1 && state_.mode() == powersgd_mode::low_rank) return state_.after_p_reduced(ctx);
    throw config_error("gradcomp: powersgd_session has no factor " + std::to_string(i) + " (it has " +
                       std::to_string(factor_count()) + ")");
  }

  /// A copy of the whole state (factors, residual, warm start), taken by `all_reduce_low_rank`
  /// before a step and given back to `restore` if the step fails on any rank, so that a failed
  /// step leaves the session exactly as it was (the cost: one copy of the residual per step).
  [[nodiscard]] powersgd_state snapshot() const { return state_; }
  /// Puts back a `snapshot` (the step in progress, if any, is forgotten).
  void restore(powersgd_state s) {
    state_ = std::move(s);
    first_ = {};
  }

  /// out = alpha · P Qᵀ (or alpha · the summed dense matrix); Q becomes the next warm start.
  void finish(std::span<float> out, float alpha, codec_context const& ctx) {
    if (state_.mode() == powersgd_mode::dense) (void)state_.after_p_reduced(ctx);
    state_.finish(alpha, ctx);
    state_.reconstruct(out, ctx);
  }

 private:
  void check_size(std::size_t n) const {
    if (n != state_.size()) {
      throw config_error("gradcomp: powersgd_session is for a " + std::to_string(state_.rows()) + " × " +
                         std::to_string(state_.cols()) + " matrix (" + std::to_string(state_.size()) +
                         " elements), the tensor has " + std::to_string(n));
    }
  }

  powersgd_state state_;
  std::span<float> first_;
  std::vector<float> zeros_;
};

static_assert(low_rank_session<powersgd_session>);

GRADCOMP_NAMESPACE_END
