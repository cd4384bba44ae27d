// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// The collectives of the MPI fault tests (test_faults_mpi.cpp in the MPI runner, and the
// faults/faults.cpp program that mpirun starts once per drop and stall case): one step of
// all_reduce_compressed (gather and summable kinds, with error feedback), of two-way
// compression, or of the gradient pipeline, on any communicator, with the state the step
// touches serialized, so that a failed step can be compared with the state before it.

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/comm/fault.hpp>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/feedback/policies.hpp>
#include <gradcomp/pipeline/pipeline.hpp>

#include "../unit/comm/fault_steps.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace mpi_faults {

namespace gc = gradcomp;
using bytes = std::vector<std::byte>;

/// The collectives under test.
enum class which { arc_gather, arc_summable, two_way, pipeline };
inline constexpr which all_subjects[] = {which::arc_gather, which::arc_summable, which::two_way,
                                         which::pipeline};

inline char const* which_name(which w) {
  switch (w) {
    case which::arc_gather: return "all_reduce_compressed(gather)";
    case which::arc_summable: return "all_reduce_compressed(summable)";
    case which::two_way: return "all_reduce_two_way";
    case which::pipeline: return "gradient_pipeline";
  }
  return "?";
}

/// The payload operation of each collective (the one the corruption cases hit): counted among
/// the operations of that kind.
inline gc::comm_operation payload_op(which w) {
  switch (w) {
    case which::arc_gather: return gc::comm_operation::all_gather_v;
    case which::arc_summable: return gc::comm_operation::all_reduce;
    case which::two_way: return gc::comm_operation::all_to_all_v;
    case which::pipeline: return gc::comm_operation::all_gather_v;
  }
  return gc::comm_operation::any;
}

using fault_steps::append;
using fault_steps::gradient;

/// One rank's side of one collective.
class rank_model {
 public:
  rank_model(which w, bool checksum)
      : w_(w),
        checksum_(checksum),
        comp_(gc::make_codec(w == which::arc_summable ? "fp16" : "topk:ratio=0.05")),
        tw_(gc::make_codec("topk:ratio=0.1")) {
    if (w == which::pipeline) {
      gc::pipeline_options o;
      o.codec = "topk:ratio=0.05";
      o.feedback = "residual";
      o.seed = 11;
      o.measured_timing = false;
      o.buckets.min_compress_elements = 1000;
      o.buckets.bucket_bytes = 8000;
      o.buckets.checksum = checksum;
      o.context.parallel_threshold = std::numeric_limits<std::size_t>::max();
      pipe_.emplace(o);
    }
  }

  /// The state a step touches.
  [[nodiscard]] bytes state() const {
    switch (w_) {
      case which::arc_gather:
      case which::arc_summable: return comp_.save();
      case which::two_way: return tw_.save();
      case which::pipeline: return pipe_->save();
    }
    return {};
  }

  /// One step; returns this rank's output.
  template <class Comm>
  bytes step(Comm& c, int s) {
    gc::codec_context ctx;
    ctx.seed = 5u + static_cast<std::uint64_t>(c.rank());
    ctx.step = static_cast<std::uint32_t>(s);
    ctx.parallel_threshold = std::numeric_limits<std::size_t>::max();
    gc::collective_options const opt{.op = gc::reduction::average, .checksum = checksum_};
    bytes out;
    if (w_ == which::pipeline) return fault_steps::pipeline_step(*pipe_, c, s);
    std::vector<float> const g = gradient(c.rank(), s, 900);
    std::vector<float> o(g.size());
    gc::tensor_view<float const> const gv(g, gc::tensor_id{3});
    if (w_ == which::two_way) {
      gc::all_reduce_two_way(c, tw_, gv, std::span<float>(o), ctx, opt);
    } else {
      gc::all_reduce_compressed(c, comp_, gv, std::span<float>(o), ctx, opt);
    }
    append(out, std::span<float const>(o));
    return out;
  }

 private:
  which w_;
  bool checksum_;
  gc::compressor<gc::any_codec, gc::residual_feedback> comp_;
  gc::two_way_compressor<gc::any_codec> tw_;
  std::optional<gc::gradient_pipeline> pipe_;
};

/// A model and its clean twin after a clean step 0 on `clean`, with what the clean step 1 gives.
struct prepared {
  rank_model model;
  bytes expect, expect_state, before;
};

template <class Comm>
prepared prepare(which w, bool checksum, Comm& clean) {
  rank_model ref(w, checksum), model(w, checksum);
  (void)ref.step(clean, 0);
  (void)model.step(clean, 0);
  bytes expect = ref.step(clean, 1);
  bytes before = model.state();
  return {std::move(model), std::move(expect), ref.state(), std::move(before)};
}

}  // namespace mpi_faults
