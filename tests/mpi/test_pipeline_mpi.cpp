// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// The training pipeline over MPI ranks: every rank's output, bit for bit, against the plain
// reference (every rank's contribution computed locally, packets decoded and summed in rank
// order) for each aggregation kind, feedback policy and controller; the same decisions on every
// rank; a run resumed from a checkpoint equal to one that never stopped.

#include <gradcomp/comm/mpi.hpp>
#include <gradcomp/pipeline/pipeline.hpp>

#include "../unit/pipeline/pipeline_support.hpp"
#include "check.hpp"

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

using namespace gradcomp;
using namespace std::chrono_literals;
using namespace pipeline_test;

namespace {

mpi_options pipeline_mpi_options() {
  mpi_options o;
  o.timeout = 60s;
  return o;
}

// Equal within the rounding of W float32 (or float16, for fp16 values) additions in another order.
bool close(std::vector<float> const& a, std::vector<float> const& b, int world) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    double const tol = 2e-3 * world * (std::fabs(static_cast<double>(b[i])) + 1e-3);
    if (!(std::fabs(static_cast<double>(a[i]) - b[i]) <= tol)) return false;
  }
  return true;
}

std::uint64_t fnv(std::vector<float> const& v) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (float f : v) {
    std::uint32_t const b = std::bit_cast<std::uint32_t>(f);
    for (int i = 0; i < 4; ++i) h = (h ^ ((b >> (8 * i)) & 0xffu)) * 0x100000001b3ull;
  }
  return h;
}

pipeline_options make_options(std::string codec, std::string feedback, std::string controller) {
  pipeline_options o;
  o.codec = std::move(codec);
  o.feedback = std::move(feedback);
  o.controller = std::move(controller);
  o.seed = 5;
  o.measured_timing = false;
  o.buckets.min_compress_elements = 1000;
  o.buckets.bucket_bytes = 64 << 10;
  return o;
}

}  // namespace

MPI_TEST(pipeline_matches_reference_over_mpi) {
  mpi_communicator c(MPI_COMM_WORLD, pipeline_mpi_options());
  struct cfg {
    char const* codec;
    char const* feedback;
    char const* controller;
  };
  cfg const configs[] = {
      {"topk:ratio=0.02", "residual", ""},
      {"qsgd:levels=7,bucket=256", "ef21", ""},
      {"fp16", "residual", ""},
      {"randomk:ratio=0.05", "residual", ""},
      {"topk:ratio=0.01", "residual", "gravac:theta_min=4,theta_max=256,epsilon=0.3,window=2"},
      {"topk:ratio=0.01", "dgc:momentum=0.9", "accordion:low=2,high=40,interval=3,accumulation=2"},
      {"topk:ratio=0.01", "residual", "gravac:theta_min=4,theta_max=64,epsilon=1,window=2,dense=keep"},
  };
  std::vector<std::size_t> const sizes = model_sizes();
  for (cfg const& k : configs) {
    pipeline_options const opt = make_options(k.codec, k.feedback, k.controller);
    gradient_pipeline pipe(opt);
    reference ref(opt, c.size());
    for (std::uint64_t s = 0; s < 5; ++s) {
      auto grads = make_grads<float>(c.rank(), s, sizes);
      pipeline_stats const st = pipe.step(c, views(grads), {.backprop_s = 0.01, .batch_size = 16});
      auto const expect = ref.step<float>(s, st, sizes);
      // Gathered packets are decoded in rank order on every transport: bit for bit. Sums in
      // the compressed domain and dense sums are MPI's (its order of combination, not rank
      // order): within rounding of the rank-order reference, and identical on every rank.
      bool const gathered = make_codec(k.codec).aggregation() == aggregation_kind::gather && st.sent != send_kind::dense;
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        if (gathered && sizes[t] >= opt.buckets.min_compress_elements) {
          MPI_CHECK(same_bits(grads[t], expect[t]));
        } else {
          MPI_CHECK(close(grads[t], expect[t], c.size()));
        }
        std::uint64_t h[2] = {fnv(grads[t]), 0};
        h[1] = ~h[0];
        c.all_reduce(std::as_writable_bytes(std::span<std::uint64_t>(h)), comm_type::u64, reduce_op::max);
        MPI_CHECK(h[0] == fnv(grads[t]) && ~h[1] == fnv(grads[t]));
      }
      // every rank took the same decision
      double mine[2] = {st.factor, static_cast<double>(st.sent)};
      double hi[2] = {mine[0], mine[1]};
      c.all_reduce(std::as_writable_bytes(std::span<double>(hi)), comm_type::f64, reduce_op::max);
      MPI_CHECK(hi[0] == mine[0] && hi[1] == mine[1]);
    }
  }
}

MPI_TEST(pipeline_resumes_bit_identically_over_mpi) {
  mpi_communicator c(MPI_COMM_WORLD, pipeline_mpi_options());
  pipeline_options const opt =
      make_options("topk:ratio=0.01", "residual", "gravac:theta_min=4,theta_max=256,epsilon=0.3,window=2");
  std::vector<std::size_t> const sizes = model_sizes();
  gradient_pipeline straight(opt), first(opt);
  std::vector<std::vector<std::vector<float>>> a, b;
  for (std::uint64_t s = 0; s < 6; ++s) {
    auto g = make_grads<float>(c.rank(), s, sizes);
    straight.step(c, views(g), {.backprop_s = 0.01, .batch_size = 16});
    a.push_back(g);
  }
  for (std::uint64_t s = 0; s < 3; ++s) {
    auto g = make_grads<float>(c.rank(), s, sizes);
    first.step(c, views(g), {.backprop_s = 0.01, .batch_size = 16});
    b.push_back(g);
  }
  gradient_pipeline resumed(opt);
  resumed.load(first.save());
  for (std::uint64_t s = 3; s < 6; ++s) {
    auto g = make_grads<float>(c.rank(), s, sizes);
    resumed.step(c, views(g), {.backprop_s = 0.01, .batch_size = 16});
    b.push_back(g);
  }
  for (std::size_t s = 0; s < a.size(); ++s) {
    for (std::size_t t = 0; t < sizes.size(); ++t) MPI_CHECK(same_bits(a[s][t], b[s][t]));
  }
  MPI_CHECK(straight.save() == resumed.save());
}
