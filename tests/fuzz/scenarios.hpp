// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// What the peer, checkpoint and controller targets and the corpus generator run: pipeline
/// options from a `pipeline_setup`, the steps that give a controller or a pipeline some state,
/// and the collective scenarios a scripted peer is played against (`run_peer`).

#include "configs.hpp"
#include "controller_steps.hpp"
#include "fuzz.hpp"
#include "scripted_peer.hpp"

#include <gradcomp/adapt/any_controller.hpp>
#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/collective/dense.hpp>
#include <gradcomp/collective/low_rank.hpp>
#include <gradcomp/collective/parameter_server.hpp>
#include <gradcomp/collective/powersgd_session.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/feedback/policies.hpp>
#include <gradcomp/pipeline/pipeline.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace gradcomp_fuzz {

namespace gc = gradcomp;

/// The options of `s`, with buckets small enough that a few dozen elements are compressed.
inline gc::pipeline_options pipeline_options_of(pipeline_setup const& s) {
  gc::pipeline_options o;
  o.codec = std::string(s.codec);
  o.feedback = std::string(s.feedback);
  o.controller = std::string(s.controller);
  o.two_way = s.two_way;
  o.seed = 11;
  o.buckets.min_compress_elements = 8;
  o.buckets.bucket_bytes = 256;
  o.measured_timing = false;
  return o;
}

/// The pipeline's model: three tensors (48, 5 and 20 elements; the 5 go dense).
struct pipeline_model {
  std::vector<std::vector<float>> data{sample_tensor(48, 1), sample_tensor(5, 2),
                                       sample_tensor(20, 3)};
  /// What a training loop reports with each step.
  static constexpr gc::pipeline_step_info info{
      .backprop_s = 0.01, .batch_size = 32, .learning_rate = 0.1, .next_learning_rate = 0.1};
  std::vector<gc::tensor_view<float>> views() {
    std::vector<gc::tensor_view<float>> v;
    for (std::size_t i = 0; i < data.size(); ++i) {
      v.emplace_back(std::span<float>(data[i]), gc::tensor_id{static_cast<std::uint32_t>(i)});
    }
    return v;
  }
};

/// Number of scenarios `run_peer` knows.
inline constexpr unsigned peer_scenarios = 10;

/// Runs collective scenario `scenario` (modulo `peer_scenarios`) on its rank of `comm`, with
/// configuration `variant` and size parameter `size`:
/// 0 agreement and agree_on_value; 1 all_reduce_compressed of a codec; 2, 3 the same through
/// error feedback (residual, EF21), two steps; 4 PowerSGD (all_reduce_low_rank), two steps;
/// 5 two-way; 6 parameter server (rank 0 a worker, rank 1 the server); 7 bucketed all-reduce of
/// three tensors; 8 the gradient pipeline, two steps; 9 dense all-reduce and a 16-bit
/// all_reduce_compressed.
inline void run_peer(scripted_peer& comm, unsigned scenario, unsigned variant, unsigned size) {
  gc::codec_context const ctx = context();
  std::size_t const n = 1 + size % 64;
  auto const me = static_cast<std::uint32_t>(comm.rank());  // 0, or 1 when the generator records
  std::vector<float> const x = sample_tensor(n, scenario + 100 * me);
  std::vector<float> out(n);
  gc::tensor_view<float const> const grad(std::span<float const>(x), gc::tensor_id{1});
  gc::collective_options const avg{.op = gc::reduction::average};
  auto codec = [&] { return gc::make_codec(pick(codec_specs, variant)); };
  switch (scenario % peer_scenarios) {
    case 0:
      gc::agree(comm, 0x1234u + variant, "fuzz agreement");
      (void)gc::agree_on_value(comm, std::uint64_t{variant}, 1);
      break;
    case 1: gc::all_reduce_compressed(comm, codec(), grad, std::span<float>(out), ctx, avg); break;
    case 2: {
      gc::compressor<gc::any_codec, gc::residual_feedback> c(codec());
      for (int s = 0; s < 2; ++s)
        gc::all_reduce_compressed(comm, c, grad, std::span<float>(out), ctx, avg);
      break;
    }
    case 3: {
      gc::compressor<gc::any_codec, gc::ef21_feedback> c(codec());
      for (int s = 0; s < 2; ++s)
        gc::all_reduce_compressed(comm, c, grad, std::span<float>(out), ctx, avg);
      break;
    }
    case 4: {
      std::size_t const rows = 1 + size % 8, cols = 1 + (size / 8) % 8;
      std::vector<float> const m = sample_tensor(rows * cols, 4);
      std::vector<float> mo(m.size());
      gc::powersgd_options o;
      o.rank = 1 + variant % 3;
      o.min_elements = variant % 2 == 0 ? 4 : 64;
      gc::powersgd_session s(rows, cols, o, gc::tensor_id{2});
      for (int st = 0; st < 2; ++st) {
        gc::all_reduce_low_rank(
            comm, s, gc::tensor_view<float const>(std::span<float const>(m), gc::tensor_id{2}),
            std::span<float>(mo), ctx, avg);
      }
      break;
    }
    case 5: {
      gc::two_way_compressor<gc::any_codec, gc::residual_feedback, gc::residual_feedback> tw(
          codec());
      gc::all_reduce_two_way(comm, tw, grad, std::span<float>(out), ctx, avg);
      break;
    }
    case 6: {
      gc::two_way_compressor<gc::any_codec, gc::residual_feedback, gc::residual_feedback> tw(
          codec());
      if (me == 0) {
        gc::ps_push_pull(comm, tw, grad, std::span<float>(out), ctx);
      } else {
        gc::ps_serve(comm, tw, grad.id(), n, ctx);
      }
      break;
    }
    case 7: {
      gc::bucket_options o;
      o.bucket_bytes = 64;
      o.min_compress_elements = 8;
      o.mode = variant % 2 == 0 ? gc::bucket_compression::per_tensor
                                : gc::bucket_compression::per_bucket;
      o.small_format = static_cast<gc::dense_format>(variant % 3);
      gc::bucketed_all_reduce<gc::any_codec> b(codec(), o);
      std::vector<float> const y = sample_tensor(5, 7), z = sample_tensor(n + 8, 8);
      std::vector<float> yo(y.size()), zo(z.size());
      std::vector<gc::bucket_item> const items{
          {grad, std::span<float>(out)},
          {gc::tensor_view<float const>(std::span<float const>(y), gc::tensor_id{3}),
           std::span<float>(yo)},
          {gc::tensor_view<float const>(std::span<float const>(z), gc::tensor_id{4}),
           std::span<float>(zo)}};
      (void)b.run(comm, std::span<gc::bucket_item const>(items), ctx);
      break;
    }
    case 8: {
      gc::gradient_pipeline p(pipeline_options_of(pick(pipeline_setups, variant)));
      pipeline_model model;
      for (int s = 0; s < 2; ++s) (void)p.step(comm, model.views(), pipeline_model::info);
      break;
    }
    default: {
      gc::all_reduce_dense(comm, std::span<float const>(x), std::span<float>(out),
                           static_cast<gc::dense_format>(variant % 3), avg, ctx);
      std::vector<gc::half> h(n), ho(n);
      for (std::size_t i = 0; i < n; ++i) h[i] = gc::half(x[i]);
      gc::all_reduce_compressed(
          comm, codec(),
          gc::tensor_view<gc::half const>(std::span<gc::half const>(h), gc::tensor_id{5}),
          std::span<gc::half>(ho), ctx, avg);
      break;
    }
  }
}

}  // namespace gradcomp_fuzz
