// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// gradcomp_bench_comm_mpi: dense all-reduce through mpi_communicator, timed against the
// theoretical time of a bandwidth-bound ring all-reduce. It validates the network lab
// (bench/netlab.sh): at a shaped rate the measured time should sit near the model's.
//
//   bench/netlab.sh --rate 1gbit -- bash -c '$GRADCOMP_NETLAB_MPIRUN -n 4
//   build/release/bench/gradcomp_bench_comm_mpi' bench/run_comm_mpi.sh # both rates, markdown table
//
// Options: --mib N (gradient size as float32, default 64: a 16-bit run moves half the bytes of
// the same gradient), --iters N (timed repetitions, default 5, after
// one warm-up), --type f32|f16|bf16 (default f32), --rate-bps BITS (link rate for the model;
// default $GRADCOMP_NETLAB_BPS, set by netlab.sh).
//
// Per repetition: barrier, all_reduce, and the slowest rank's time. Reported (rank 0): median
// and best time, bytes each rank sends in a ring all-reduce (2(n-1)/n * bytes), the bus
// bandwidth (that volume over the median time), and two models at the given rate R:
//   per-link ring   2(n-1)/n * bytes / R   every rank has a link of rate R of its own
//   shared medium   2(n-1)   * bytes / R   all ranks share one link of rate R (netlab's lo)

#include <gradcomp/comm/mpi.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct options {
  double mib = 64;
  int iters = 5;
  gradcomp::comm_type type = gradcomp::comm_type::f32;
  double rate_bps = 0;
};

options parse(int argc, char** argv) {
  options o;
  if (char const* env = std::getenv("GRADCOMP_NETLAB_BPS")) o.rate_bps = std::atof(env);
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto next = [&]() -> char const* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gradcomp_bench_comm_mpi: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--mib") {
      o.mib = std::atof(next());
    } else if (a == "--iters") {
      o.iters = std::max(1, std::atoi(next()));
    } else if (a == "--rate-bps") {
      o.rate_bps = std::atof(next());
    } else if (a == "--type") {
      std::string const t = next();
      if (t == "f32")
        o.type = gradcomp::comm_type::f32;
      else if (t == "f16")
        o.type = gradcomp::comm_type::f16;
      else if (t == "bf16")
        o.type = gradcomp::comm_type::bf16;
      else {
        std::fprintf(stderr, "gradcomp_bench_comm_mpi: --type is f32, f16 or bf16\n");
        std::exit(2);
      }
    } else {
      std::fprintf(stderr,
                   "usage: gradcomp_bench_comm_mpi [--mib N] [--iters N] [--type f32|f16|bf16] "
                   "[--rate-bps B]\n");
      std::exit(2);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  gradcomp::mpi_environment env(&argc, &argv);
  options const o = parse(argc, argv);
  gradcomp::mpi_options mo;
  mo.timeout = std::chrono::minutes(10);
  gradcomp::mpi_communicator comm(MPI_COMM_WORLD, mo);
  int const n = comm.size();
  std::size_t const es = gradcomp::comm_type_size(o.type);
  std::size_t const elements = static_cast<std::size_t>(o.mib * 1024 * 1024) / 4;
  std::size_t const bytes = elements * es;
  std::vector<std::byte> buf(bytes);
  // Small values that stay finite however often they are summed.
  std::vector<float> f(bytes / es, 1.0f / 1024);
  if (o.type == gradcomp::comm_type::f32) {
    std::memcpy(buf.data(), f.data(), bytes);
  } else {
    for (std::size_t i = 0; i < f.size(); ++i) {
      std::uint16_t h = o.type == gradcomp::comm_type::f16
                            ? gradcomp::from_float<gradcomp::half>(f[i]).bits
                            : gradcomp::from_float<gradcomp::bfloat16>(f[i]).bits;
      std::memcpy(buf.data() + 2 * i, &h, 2);
    }
  }

  std::vector<double> times;
  for (int it = 0; it <= o.iters; ++it) {
    comm.barrier();
    auto const t0 = std::chrono::steady_clock::now();
    comm.all_reduce(buf, o.type, gradcomp::reduce_op::sum);
    double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (it > 0) times.push_back(slowest);  // the first one is a warm-up
  }
  std::sort(times.begin(), times.end());
  double const median = times[times.size() / 2];
  double const best = times.front();
  double const ring_bytes = 2.0 * (n - 1) / n * static_cast<double>(bytes);

  if (comm.rank() == 0) {
    char const* rate = std::getenv("GRADCOMP_NETLAB_RATE");
    std::printf("all_reduce %s, %zu elements, %zu bytes (%.1f MiB), %d ranks, rate %s\n",
                gradcomp::comm_type_name(o.type), elements, bytes,
                static_cast<double>(bytes) / (1024.0 * 1024.0), n,
                rate != nullptr ? rate : "not shaped");
    std::printf("  time per all-reduce  median %.3f s, best %.3f s (%d runs)\n", median, best,
                o.iters);
    std::printf("  bytes sent per rank  %.0f (ring: 2(n-1)/n * bytes)\n", ring_bytes);
    std::printf("  bus bandwidth        %.3f Gbit/s\n", ring_bytes * 8 / median / 1e9);
    if (o.rate_bps > 0) {
      double const per_link = ring_bytes * 8 / o.rate_bps;
      double const shared = per_link * n;
      std::printf("  model per-link ring  %.3f s   measured / model = %.2f\n", per_link,
                  median / per_link);
      std::printf("  model shared medium  %.3f s   measured / model = %.2f\n", shared,
                  median / shared);
    }
    std::printf(
        "RESULT type=%s ranks=%d bytes=%zu rate=%s median_s=%.4f best_s=%.4f bus_gbps=%.4f\n",
        gradcomp::comm_type_name(o.type), n, bytes, rate != nullptr ? rate : "none", median, best,
        ring_bytes * 8 / median / 1e9);
  }
  return 0;
}
