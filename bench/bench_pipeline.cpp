// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// gradcomp_bench_pipeline: the cost of the training pipeline over the bare collective it
// drives. For each codec and tensor count, W in-process ranks exchange the same gradient
// (2^size elements split into `tensors` equal tensors) once with `gradient_pipeline::step`
// and once with one `all_reduce_compressed` per tensor through a `compressor` with the same
// error feedback, alternating A and B step by step so both see the same machine state. It
// prints the median time per step of each, their ratio, and one line per target:
//
//   target pipeline/<codec>/<tensors>: measured R x, needed <= 1.05 x, met|missed
//
// Usage: gradcomp_bench_pipeline [--sizes=24] [--tensors=1,100] [--ranks=2] [--steps=15]
//        [--codecs=topk:ratio=0.01/residual,fp16/none,...]   (codec spec / feedback)
//        [--bucket-mb=M]   (the pipeline's bucket size; default that of bucket_options, 25 MiB)

#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/gradcomp.hpp>

#include "harness.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace gc = gradcomp;
using gradcomp_bench::take_list;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct outcome {
  double pipeline_s = 0.0, bare_s = 0.0;
};

outcome run(std::string const& codec, std::string const& feedback, std::size_t total, std::size_t tensors, int ranks,
            int steps, std::size_t bucket_bytes) {
  std::vector<std::vector<double>> a(static_cast<std::size_t>(ranks)), b(static_cast<std::size_t>(ranks));
  gc::run_in_process(ranks, [&](gc::in_process_communicator& comm) {
    gc::codec_context ctx;
    ctx.parallel_threshold = std::numeric_limits<std::size_t>::max();  // ranks are threads
    ctx.seed = 3 + static_cast<std::uint64_t>(comm.rank());
    gc::pipeline_options opt;
    opt.codec = codec;
    opt.feedback = feedback;
    opt.seed = 3;
    opt.context = ctx;
    if (bucket_bytes != 0) opt.buckets.bucket_bytes = bucket_bytes;
    gc::gradient_pipeline pipe(opt);
    auto bare = gc::make_feedback(feedback, gc::make_codec(codec));
    std::size_t const each = total / tensors;
    std::vector<std::vector<float>> g(tensors, std::vector<float>(each)), h = g, out = g;
    auto fill = [&](int step) {
      for (std::size_t t = 0; t < tensors; ++t) {
        for (std::size_t i = 0; i < each; ++i) {
          auto const x = static_cast<float>(std::sin(0.001 * static_cast<double>(i + t * 7 + static_cast<std::size_t>(step)) +
                                                     comm.rank()));
          g[t][i] = x * x * x;
        }
      }
    };
    std::vector<gc::tensor_view<float>> views;
    for (std::size_t t = 0; t < tensors; ++t) views.emplace_back(std::span<float>(h[t]), static_cast<gc::tensor_id>(t));
    using clock = std::chrono::steady_clock;
    for (int s = 0; s < steps + 2; ++s) {  // two warm-up steps
      fill(s);
      h = g;
      comm.barrier();
      auto const t0 = clock::now();
      pipe.step(comm, views);
      comm.barrier();
      auto const t1 = clock::now();
      ctx.step = static_cast<std::uint32_t>(s);
      std::visit(
          [&](auto& c) {
            for (std::size_t t = 0; t < tensors; ++t) {
              gc::all_reduce_compressed(comm, c,
                                        gc::tensor_view<float const>(std::span<float const>(g[t]), static_cast<gc::tensor_id>(t)),
                                        std::span<float>(out[t]), ctx, {.op = gc::reduction::average});
            }
          },
          bare);
      comm.barrier();
      auto const t2 = clock::now();
      if (s >= 2) {
        a[static_cast<std::size_t>(comm.rank())].push_back(std::chrono::duration<double>(t1 - t0).count());
        b[static_cast<std::size_t>(comm.rank())].push_back(std::chrono::duration<double>(t2 - t1).count());
      }
    }
  });
  return {median(a[0]), median(b[0])};
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> const sizes = take_list(argc, argv, "sizes", {"24"});
  std::vector<std::string> const tensor_counts = take_list(argc, argv, "tensors", {"1", "100"});
  int const ranks = std::atoi(take_list(argc, argv, "ranks", {"2"})[0].c_str());
  int const steps = std::atoi(take_list(argc, argv, "steps", {"15"})[0].c_str());
  // the pipeline's bucket size in MiB of float32 gradient (0: bucket_options' default, 25)
  double const bucket_mb = std::atof(take_list(argc, argv, "bucket-mb", {"0"})[0].c_str());
  std::vector<std::string> const codecs =
      take_list(argc, argv, "codecs", {"topk:ratio=0.01/residual", "onebit/residual", "fp16/none"});
  if (ranks < 1 || steps < 1) {
    std::fprintf(stderr, "gradcomp_bench_pipeline: --ranks and --steps must be >= 1\n");
    return 2;
  }
  std::printf("gradcomp_bench_pipeline: %d in-process ranks, median of %d steps (A/B alternated), time per step\n",
              ranks, steps);
  int missed = 0;
  for (std::string const& sz : sizes) {
    int const log2n = std::atoi(sz.c_str());
    if (log2n < 10 || log2n > 28) {
      std::fprintf(stderr, "gradcomp_bench_pipeline: --sizes takes log2 element counts in 10..28\n");
      return 2;
    }
    std::size_t const total = std::size_t{1} << log2n;
    for (std::string const& spec : codecs) {
      std::size_t const slash = spec.find('/');
      std::string const codec = spec.substr(0, slash);
      std::string const feedback = slash == std::string::npos ? "residual" : spec.substr(slash + 1);
      for (std::string const& tc : tensor_counts) {
        std::size_t const tensors = static_cast<std::size_t>(std::atol(tc.c_str()));
        if (tensors == 0 || tensors > total) continue;
        outcome const o = run(codec, feedback, total, tensors, ranks, steps,
                              static_cast<std::size_t>(bucket_mb * 1024.0 * 1024.0));
        double const ratio = o.pipeline_s / o.bare_s;
        bool const met = ratio <= 1.05;
        missed += met ? 0 : 1;
        std::printf("  2^%d elements, %zu tensors, %s + %s: pipeline %.2f ms, bare all_reduce_compressed %.2f ms\n", log2n,
                    tensors, codec.c_str(), feedback.c_str(), 1e3 * o.pipeline_s, 1e3 * o.bare_s);
        std::printf("target pipeline/2^%d/%s+%s/%zu tensors: measured %.3f x, needed <= 1.05 x, %s\n", log2n,
                    codec.c_str(), feedback.c_str(), tensors, ratio, met ? "met" : "missed");
      }
    }
  }
  std::printf("%d target(s) missed\n", missed);
  return 0;
}
