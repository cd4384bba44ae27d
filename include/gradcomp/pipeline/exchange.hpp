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
///
/// The per-tensor modes' exchange step is here too (`exchange_step`, the step protocol's
/// dispatch target for them, pipeline/rounds.hpp's services): each compressed tensor through
/// the mode's `exchange`, the small ones dense in buckets (`detail::send_raw_dense`), the
/// outcome round, then `commit`.

#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/pipeline/flat_mode.hpp>
#include <gradcomp/pipeline/options.hpp>
#include <gradcomp/pipeline/rounds.hpp>
#include <gradcomp/pipeline/step_state.hpp>

#include <concepts>
#include <cstddef>
#include <span>
#include <vector>

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

namespace detail {

/// `items` sent dense as they are (the guard's dense step, the per-tensor modes' small
/// tensors), in dense buckets of format `small` through the pipeline's codec; messages in
/// `br`, decoding time in `decode`.
template <communicator Comm>
void send_raw_dense(step_services& sv, Comm& comm, std::span<bucket_item const> items,
                    dense_format small, bucket_result& br, double& decode) {
  bucket_options o = sv.opt.buckets;
  o.small_format = small;
  exchange_dense_buckets(
      comm, items, o, sv.base, sv.cur.size, sv.cur.ctx, sv.cur.check, sv.slots,
      [&](std::size_t i) { return items[i].grad.span(); }, br, decode);
}

}  // namespace detail

/// A per-tensor mode's exchange step of opened step `s` (two-way, hierarchical, PowerSGD;
/// pipeline/rounds.hpp's services `sv`): each compressed tensor through the mode's collective,
/// the small ones dense in buckets (every tensor dense on the guard's dense step), the outcome
/// round, then the mode's commit and the 16-bit outputs. Returns the completed step's
/// statistics.
template <communicator Comm, class Mode>
  requires per_tensor_exchange_mode<Mode, Comm>
pipeline_stats exchange_step(Comm& comm, Mode& m, opened_step& s, step_services& sv) {
  using clock = detail::step_clock;
  step_state& cur = sv.cur;
  pipeline_stats& st = s.st;
  bool const guard_dense = s.guard_dense();
  st.factor = sv.traits.factor_from_bytes ? 1.0 : 32.0 / sv.base.bits_per_element();
  if (guard_dense) {
    detail::dense_step_stats(st);
  } else if (sv.traits.gain_round && sv.opt.measure_gain) {
    gain_round(sv, comm, st, s.communicate);
  }
  for (auto const& e : cur.entries) st.compressed_tensors += e.large && !guard_dense ? 1 : 0;
  double decode = 0.0;
  auto const t_send = clock::now();
  if (guard_dense) {
    detail::send_raw_dense(sv, comm, std::span<bucket_item const>(s.items), dense_format::f32,
                           s.br, decode);
  } else {
    collective_options const copt{sv.opt.buckets.op, sv.opt.buckets.checksum};
    std::vector<bucket_item> const dense = detail::for_each_compressed(
        std::span<step_entry const>(cur.entries), s.br,
        [&](step_entry const& e, tensor_view<float const> g) {
          auto const [rows, cols] = sv.shape_of(e.id, e.n);  // (PowerSGD's; the others take none)
          return m.exchange(comm, exchange_tensor{g, e.out32, rows, cols}, cur.ctx, copt,
                            cur.check);
        });
    if (!dense.empty()) {
      detail::send_raw_dense(sv, comm, std::span<bucket_item const>(dense),
                             sv.opt.buckets.small_format, s.br, decode);
    }
  }
  outcome_round(sv, comm, s.br);
  m.commit();
  s.communicate += detail::seconds_between(t_send, clock::now()) - decode;
  auto const t_out = clock::now();
  write_back(sv);
  decode += detail::seconds_between(t_out, clock::now());
  return complete(sv, s, 0.0, decode);
}

GRADCOMP_NAMESPACE_END
