// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// gradcomp_bench_powersgd: one PowerSGD step of rank r on an R x C float32 matrix, next to the
// two GEMMs of that step done by BLAS (OpenBLAS when the program was built with it), all on
// one thread and measured in the same run, plus the built-in GEMM against BLAS on those shapes.
//
// Benchmarks (n = R x C, default 4096 x 4096, r = 4):
//   step/builtin          one step of error-feedback PowerSGD with the built-in GEMM: M <- g + e
//                         (finite check, residual correction), P = M Q, orthonormalize P,
//                         Q = Mᵀ P (`begin`, `after_p_reduced`, `finish`); warm state
//   step+decode/builtin   the same plus writing M̂ = P Qᵀ to a dense output (`reconstruct`)
//   step/blas             the step with gemm_backend::blas
//   gemm/<backend>/<form> one GEMM: P = M Q or Q = Mᵀ P, in the codec's layout (factors stored
//                         column by column: P' = Q' Mᵀ "NT", Q' = P' M "NN") and in the
//                         textbook layout (P = M Q "NN, n = r", Q = Mᵀ P "TN, n = r")
// Counters:
//   ms           median time of one call
//   GFLOP/s      2 R C r / time (GEMMs only)
//   blas2_ms     the two BLAS GEMMs of one step, each in the faster of the two layouts, timed
//                after every step call (untimed for the step itself), median
//   x_blas2      ms / blas2_ms: the target is PowerSGD within 2x of its two GEMMs
//   x_blas2_cpu, cpu_GFLOP/s   the same from the thread's CPU time (for a shared machine)
//
// Options (before Google Benchmark's own): --rows=4096 --cols=4096 --rank=4

#include "harness.hpp"

#include <gradcomp/codec/powersgd.hpp>
#include <gradcomp/cpu/kernels/gemm.hpp>

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>
#include <vector>

#if defined(GRADCOMP_BENCH_OPENBLAS)
extern "C" void openblas_set_num_threads(int);
#endif

namespace {

namespace gb = gradcomp_bench;
namespace gc = gradcomp;
using gc::cpu::transpose;

std::size_t g_rows = 4096, g_cols = 4096;
std::uint32_t g_rank = 4;

struct buffers {
  gb::buffer<float> q, p, q2, out;
};

buffers& bufs() {
  static buffers b{gb::buffer<float>(g_rank * g_cols), gb::buffer<float>(g_rank * g_rows),
                   gb::buffer<float>(g_rank * g_cols), gb::buffer<float>(g_rows * g_cols)};
  static bool init = [] {
    auto const& r = gb::gaussian(g_rank * g_cols);
    std::memcpy(b.q.data(), r.data(), g_rank * g_cols * sizeof(float));
    return true;
  }();
  (void)init;
  return b;
}

enum class form { nt_codec, nn_codec, nn_textbook, tn_textbook };

constexpr char const* form_name(form f) {
  switch (f) {
    case form::nt_codec: return "P=QtMt(NT,codec)";
    case form::nn_codec: return "Q=PtM(NN,codec)";
    case form::nn_textbook: return "P=MQ(NN,n=r)";
    case form::tn_textbook: return "Q=MtP(TN,n=r)";
  }
  return "?";
}

// One GEMM of a step on the Gaussian matrix M.
void run_gemm(form f, gc::cpu::gemm_backend be, gc::codec_context const& ctx) {
  std::size_t const R = g_rows, C = g_cols, r = g_rank;
  float const* m = gb::gaussian(R * C).data();
  buffers& b = bufs();
  switch (f) {
    case form::nt_codec:  // P' (r x R) = Q' (r x C) Mᵀ
      gc::cpu::gemm(transpose::no, transpose::yes, r, R, C, 1.0f, b.q.data(), C, m, C, 0.0f,
                    b.p.data(), R, ctx, be);
      break;
    case form::nn_codec:  // Q' (r x C) = P' (r x R) M
      gc::cpu::gemm(transpose::no, transpose::no, r, C, R, 1.0f, b.p.data(), R, m, C, 0.0f,
                    b.q2.data(), C, ctx, be);
      break;
    case form::nn_textbook:  // P (R x r) = M Q (C x r)
      gc::cpu::gemm(transpose::no, transpose::no, R, r, C, 1.0f, m, C, b.q.data(), r, 0.0f,
                    b.p.data(), r, ctx, be);
      break;
    case form::tn_textbook:  // Q (C x r) = Mᵀ P (R x r)
      gc::cpu::gemm(transpose::yes, transpose::no, C, r, R, 1.0f, m, C, b.p.data(), r, 0.0f,
                    b.q2.data(), r, ctx, be);
      break;
  }
}

// CPU time of the calling thread: everything here runs on one thread (a one-thread pool and
// OpenBLAS set to one thread), so on a machine shared with other work it shows what the code
// costs without the time the thread spent descheduled.
double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double flops() { return 2.0 * static_cast<double>(g_rows) * static_cast<double>(g_cols) * g_rank; }

// The two BLAS GEMMs of a step, each in the faster layout for BLAS; 0 without BLAS.
struct seconds {
  double wall = 0.0, cpu = 0.0;
};

seconds blas_pair_seconds(gc::codec_context const& ctx) {
  if (!gc::cpu::gemm_has_blas) return {};
  seconds best[2] = {{1e30, 1e30}, {1e30, 1e30}};
  form const forms[2][2] = {{form::nt_codec, form::nn_textbook},
                            {form::nn_codec, form::tn_textbook}};
  for (int g = 0; g < 2; ++g) {
    for (form f : forms[g]) {
      double const t0 = gb::now_seconds(), c0 = thread_seconds();
      run_gemm(f, gc::cpu::gemm_backend::blas, ctx);
      best[g].wall = std::min(best[g].wall, gb::now_seconds() - t0);
      best[g].cpu = std::min(best[g].cpu, thread_seconds() - c0);
    }
  }
  return {best[0].wall + best[1].wall, best[0].cpu + best[1].cpu};
}

void bm_gemm(benchmark::State& state, form f, gc::cpu::gemm_backend be) {
  gc::codec_context const ctx = gb::context(1);
  run_gemm(f, be, ctx);
  std::vector<double> times, cpu;
  for (auto _ : state) {
    double const t0 = gb::now_seconds(), c0 = thread_seconds();
    run_gemm(f, be, ctx);
    times.push_back(gb::now_seconds() - t0);
    cpu.push_back(thread_seconds() - c0);
    benchmark::ClobberMemory();
  }
  double const t = gb::median(times), tc = gb::median(cpu);
  state.counters["ms"] = t * 1e3;
  state.counters["GFLOP/s"] = flops() / t / 1e9;
  state.counters["cpu_GFLOP/s"] = flops() / tc / 1e9;
}

void bm_step(benchmark::State& state, gc::cpu::gemm_backend be, bool decode) {
  gc::codec_context ctx = gb::context(1);
  gc::powersgd_options opt;
  opt.rank = g_rank;
  opt.backend = be;
  gc::powersgd_state s(g_rows, g_cols, opt, gc::tensor_id{1});
  // Two gradients alternate, so the residual and warm start evolve as in training.
  gc::tensor_view<float const> const g0(gb::gaussian(g_rows * g_cols).span(), gc::tensor_id{1});
  auto const& other = gb::gaussian(g_rows * g_cols + 1);
  gc::tensor_view<float const> const g1(other.span().first(g_rows * g_cols), gc::tensor_id{1});
  std::span<float> const out = bufs().out.span();
  std::uint32_t stepno = 0;
  auto one = [&] {
    ctx.step = stepno;
    s.begin((stepno++ & 1) ? g1 : g0, ctx);
    s.after_p_reduced(ctx);
    s.finish(1.0f, ctx);
    if (decode) s.reconstruct(out, ctx);
  };
  try {
    one();
    one();  // warm: residual and Q exist
  } catch (std::exception const& e) {
    state.SkipWithError(e.what());
    return;
  }
  std::vector<double> times, cpu, base, base_cpu;
  for (auto _ : state) {
    double const t0 = gb::now_seconds(), c0 = thread_seconds();
    one();
    times.push_back(gb::now_seconds() - t0);
    cpu.push_back(thread_seconds() - c0);
    benchmark::ClobberMemory();
    state.PauseTiming();
    seconds const b = blas_pair_seconds(ctx);
    base.push_back(b.wall);
    base_cpu.push_back(b.cpu);
    state.ResumeTiming();
  }
  double const t = gb::median(times), tb = gb::median(base);
  double const tc = gb::median(cpu), tbc = gb::median(base_cpu);
  state.counters["ms"] = t * 1e3;
  if (tb > 0) {
    state.counters["blas2_ms"] = tb * 1e3;
    state.counters["x_blas2"] = t / tb;
    state.counters["x_blas2_cpu"] = tc / tbc;
  }
}

std::size_t take_option(int& argc, char** argv, std::string_view name, std::size_t fallback) {
  std::string const prefix = "--" + std::string(name) + "=";
  for (int i = 1; i < argc; ++i) {
    std::string_view const a = argv[i];
    if (a.substr(0, prefix.size()) != prefix) continue;
    std::size_t const v = std::strtoull(argv[i] + prefix.size(), nullptr, 10);
    for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
    --argc;
    return v;
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  g_rows = take_option(argc, argv, "rows", 4096);
  g_cols = take_option(argc, argv, "cols", 4096);
  g_rank = static_cast<std::uint32_t>(take_option(argc, argv, "rank", 4));
  if (g_rows == 0 || g_cols == 0 || g_rank == 0) {
    std::fprintf(stderr, "gradcomp_bench_powersgd: --rows, --cols and --rank must be positive\n");
    return 2;
  }
#if defined(GRADCOMP_BENCH_OPENBLAS)
  openblas_set_num_threads(1);
#endif
  std::string const shape = "/" + std::to_string(g_rows) + "x" + std::to_string(g_cols) +
                            "/r:" + std::to_string(g_rank) + "/threads:1";
  gb::add("step/builtin" + shape,
      [](benchmark::State& s) { bm_step(s, gc::cpu::gemm_backend::builtin, false); });
  gb::add("step+decode/builtin" + shape,
      [](benchmark::State& s) { bm_step(s, gc::cpu::gemm_backend::builtin, true); });
  if (gc::cpu::gemm_has_blas) {
    gb::add("step/blas" + shape,
        [](benchmark::State& s) { bm_step(s, gc::cpu::gemm_backend::blas, false); });
  }
  for (form f : {form::nt_codec, form::nn_codec, form::nn_textbook, form::tn_textbook}) {
    gb::add(std::string("gemm/builtin/") + form_name(f) + shape,
        [f](benchmark::State& s) { bm_gemm(s, f, gc::cpu::gemm_backend::builtin); });
    if (gc::cpu::gemm_has_blas) {
      gb::add(std::string("gemm/blas/") + form_name(f) + shape,
          [f](benchmark::State& s) { bm_gemm(s, f, gc::cpu::gemm_backend::blas); });
    }
  }
  return gb::run_benchmarks(argc, argv, {{"gemm_blas", gc::cpu::gemm_has_blas ? "yes" : "no"}});
}
