// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The narrow interface of an exchange mode of `gradient_pipeline` (pipeline/options.hpp's
/// table of modes). The pipeline's step protocol (plan → stage → agree → guard → exchange →
/// outcome → commit or roll back; save / load) is the same for every mode; what differs is
/// how the compressed tensors travel and what state that keeps between steps. A mode owns that
/// state and offers the protocol five things:
///
/// - `exchange`: the collective of one compressed tensor, its average written to the output.
///   The state it changes is staged: a later rank's failure must not leave it changed.
/// - `commit()`: called after the step's outcome round (collective/outcome.hpp), when every
///   rank finished the step: the staged changes become the state. `noexcept`.
/// - `rollback()`: called when the step failed anywhere: the state is put back to what it was
///   before the step, so that `save` gives the same bytes. `noexcept`.
/// - `save(w)`: the mode's section of the pipeline's "GCPL" checkpoint.
/// - `loaded(r)`: a fresh mode of the same configuration holding the state of a section read
///   from `r` (`r.fail`, a `format_error`, on a malformed one); the mode it is called on does
///   not change, so that the pipeline swaps every restored part in only once all parsed.
///
/// `per_tensor_exchange_mode` states this as a concept; each mode lives in its own header
/// (pipeline/low_rank_mode.hpp: PowerSGD, one session per tensor; pipeline/two_way_mode.hpp:
/// two-way compression, worker and server feedback; pipeline/hierarchical_mode.hpp: the
/// hierarchical all-reduce, the shard owners' feedback). A mode's shape and `collective_options`
/// arguments may go unused (two-way needs no shape; the hierarchical mode has its own options).
/// The flat mode (pipeline/flat_mode.hpp: the bucketed collective, one level or a controller's
/// several) sends all tensors of a step at once, so it has an interface of its own: stage each
/// tensor, prepare, exchange a level or dense, commit, discard.

#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/core/tensor.hpp>

#include <concepts>
#include <cstddef>
#include <span>

GRADCOMP_NAMESPACE_BEGIN

/// One compressed tensor of a step, as a mode's `exchange` receives it: its gradient (float32,
/// host or device memory as the mode expects), the output its average goes to, and its matrix
/// shape (rows × cols, row-major; `gradient_pipeline::set_shape`, for modes that need one).
struct exchange_tensor {
  tensor_view<float const> grad;
  std::span<float> out;
  std::size_t rows = 0;
  std::size_t cols = 0;
};

/// A mode that exchanges the compressed tensors one by one over `Comm` (file comment). `check`
/// is the step's outcome check: a failure after the data moved is recorded there, and the
/// pipeline's outcome round decides whether `commit` or `rollback` follows.
template <class M, class Comm>
concept per_tensor_exchange_mode =
    std::move_constructible<M> &&
    requires(M& m, M const& cm, Comm& comm, exchange_tensor const& t, codec_context const& ctx,
             collective_options const& copt, detail::step_check& check, detail::byte_writer& w,
             detail::byte_reader& r) {
      { m.exchange(comm, t, ctx, copt, check) } -> std::same_as<collective_result>;
      { m.commit() } noexcept;
      { m.rollback() } noexcept;
      cm.save(w);
      { cm.loaded(r) } -> std::same_as<M>;
    };

GRADCOMP_NAMESPACE_END
