// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// gradcomp_model_check_mpi: checks the runtime model (gradcomp/model/runtime.hpp) against the
// time the same exchanges take on a real network. Run it under mpirun inside the network lab
// (bench/run_model_check.sh does both):
//
//   bench/netlab.sh --rate 1gbit -- bash -c
//       '$GRADCOMP_NETLAB_MPIRUN -n 4 build/release/bench/gradcomp_model_check_mpi'
//
// What it does, every rank taking part:
//   1. Calibrates the network: one-way time of a ping-pong between ranks 0 and 1 (the others
//      idle) at 8 bytes (latency alpha) and at two large sizes (bandwidth beta, from the
//      difference, so a token bucket's initial burst cancels out).
//   2. Describes the lab to the model: `ranks` single-rank nodes whose traffic all crosses one
//      shared link, i.e. inter = {alpha, beta} and fabric_bandwidth = beta (every byte any rank
//      sends goes through the lab's one shaped loopback; bench/netlab.sh).
//   3. Measures each codec where it will run (all ranks compressing at once, so the CPU
//      sharing of the run is in the figure): compression ratio, compression speed (error
//      feedback included where the case uses it) and decoding speed, slowest rank. Decoding is
//      timed the way the collectives decode a mean (output cleared, then each packet added:
//      n packets on the gather path), so a sparse codec's pass over the output is in it.
//   4. For each case, predicts the time per step with the model from (1)-(3) alone, measures
//      it (median of --reps steps, slowest rank; compute cases: mean step of --steps steps run
//      back to back), and prints both and the relative error.
//
// The compute cases emulate a GPU's forward and backward pass by sleeping (the CPU is free,
// as it is while a GPU computes) for mean + stddev * z seconds, z standard normal from a fixed
// seed per rank and step; while "computing" a rank polls its outstanding exchange every
// millisecond, as a framework's communication thread would (Open MPI over TCP moves a long
// message only inside MPI calls; --no-poll shows what happens without it).
//
//   gradcomp_model_check_mpi [--mib 16] [--reps 5] [--steps 8] [--compute-ms 300]
//                            [--stddev-ms 30] [--only name,...] [--csv FILE] [--tolerance 0.25]
//                            [--no-poll]
//
// The last line is "model check: N cases, M within TOL" and the exit status is 1 when a case
// is outside --tolerance (so scripts can use it), 0 otherwise.

#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/dense.hpp>
#include <gradcomp/collective/hierarchical.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/comm/mpi.hpp>
#include <gradcomp/gradcomp.hpp>
#include <gradcomp/model/runtime.hpp>
#include <gradcomp/optim/comm_mixer.hpp>
#include <gradcomp/topology/topology.hpp>

#include "support.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace gc = gradcomp;

namespace {

using clock_type = std::chrono::steady_clock;

double now() { return std::chrono::duration<double>(clock_type::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct config {
  double mib = 16;
  int reps = 5;
  int steps = 8;
  double compute_ms = 300;
  double stddev_ms = 30;
  double tolerance = 0.25;
  std::vector<std::string> only;
  std::string csv;
  bool poll = true;  // poll outstanding exchanges while computing
};

// The largest value of `v` over the ranks.
double slowest(gc::mpi_communicator& comm, double v) {
  double x[1] = {v};
  comm.all_reduce(std::as_writable_bytes(std::span<double>(x)), gc::comm_type::f64, gc::reduce_op::max);
  return x[0];
}

// One-way seconds of a `bytes` message between ranks 0 and 1 (half the round trip, median of
// `reps`); every rank returns rank 0's figure.
double one_way(gc::mpi_communicator& comm, std::size_t bytes, int reps) {
  std::vector<std::byte> buf(std::max<std::size_t>(bytes, 1));
  std::vector<double> t;
  comm.barrier();
  for (int r = 0; r <= reps; ++r) {
    double const t0 = now();
    if (comm.rank() == 0) {
      comm.send(buf, 1, 7);
      comm.recv(buf, 1, 7);
    } else if (comm.rank() == 1) {
      comm.recv(buf, 0, 7);
      comm.send(buf, 0, 7);
    }
    if (r > 0) t.push_back((now() - t0) / 2.0);
  }
  double x[1] = {comm.rank() == 0 ? median(t) : 0.0};
  comm.broadcast(std::as_writable_bytes(std::span<double>(x)), 0);
  return x[0];
}

// Sleeps until `seconds` from `start` have passed, calling `poll` about every millisecond.
void emulate_compute(double start, double seconds, std::function<void()> const& poll) {
  auto const deadline = clock_type::time_point(std::chrono::duration_cast<clock_type::duration>(
      std::chrono::duration<double>(start + seconds)));
  while (clock_type::now() < deadline) {
    std::this_thread::sleep_until(std::min(deadline, clock_type::now() + std::chrono::milliseconds(1)));
    if (poll) poll();
  }
}

// The compute time of rank `rank` at step `step`: mean + stddev * z, z ~ N(0, 1) from a fixed
// seed, never negative.
double compute_time(config const& cfg, int rank, int step) {
  std::mt19937_64 rng(0x5eedull * 1000003ull + static_cast<std::uint64_t>(rank) * 7919ull +
                      static_cast<std::uint64_t>(step));
  std::normal_distribution<double> z(0.0, 1.0);
  return std::max(0.0, cfg.compute_ms / 1e3 + cfg.stddev_ms / 1e3 * z(rng));
}

// A codec as measured here, in the model's terms.
gc::codec_params measure_codec(gc::mpi_communicator& comm, gc::any_codec const& codec, bool ef,
                               std::vector<float> const& g, int reps) {
  gc::compressor<gc::any_codec> comp(codec);
  std::vector<std::byte> packet(codec.max_compressed_bytes(g.size()));
  std::vector<float> out(g.size(), 0.0f);
  gc::tensor_view<float const> const v(std::span<float const>(g), gc::tensor_id{1});
  std::vector<double> tc, td;
  std::size_t bytes = 0;
  int const decodes = codec.aggregation() == gc::aggregation_kind::gather ? comm.size() : 1;
  reps = std::max(reps, 5);
  for (int r = 0; r <= reps; ++r) {
    comm.barrier();
    double t0 = now();
    bytes = ef ? comp.compress(v, std::span<std::byte>(packet)) : codec.compress(v, std::span<std::byte>(packet));
    double const c = now() - t0;
    comm.barrier();
    t0 = now();
    // Decoded as the collectives decode a mean: the output cleared, then every packet added
    // (n of them on the gather path, one summed packet otherwise).
    std::fill(out.begin(), out.end(), 0.0f);
    for (int p = 0; p < decodes; ++p) {
      codec.decompress_add(std::span<std::byte const>(packet.data(), bytes), std::span<float>(out), 0.25f);
    }
    double const d = (now() - t0) / decodes;
    if (r > 0) {
      tc.push_back(c);
      td.push_back(d);
    }
  }
  double const m = static_cast<double>(g.size() * sizeof(float));
  gc::codec_params k;
  k.aggregation = codec.aggregation();
  k.ratio = m / static_cast<double>(bytes);
  k.compress_bandwidth = m / slowest(comm, median(tc));
  k.decompress_bandwidth = m / slowest(comm, median(td));
  return k;
}

struct result {
  std::string name;
  std::string what;  // the model function and its inputs, in words
  double predicted = 0;
  double measured = 0;
  gc::iteration_time parts;
};

struct lab {
  gc::cluster_params cluster;
  double alpha = 0, beta = 0;
};

lab calibrate(gc::mpi_communicator& comm) {
  lab l;
  double const t0 = one_way(comm, 8, 40);
  std::size_t const s1 = 1u << 20, s2 = 8u << 20;
  double const t1 = one_way(comm, s1, 5);
  double const t2 = one_way(comm, s2, 5);
  l.alpha = t0;
  l.beta = static_cast<double>(s2 - s1) / std::max(1e-9, t2 - t1);
  l.cluster.ranks = comm.size();
  l.cluster.ranks_per_node = 1;
  l.cluster.inter = {l.alpha, l.beta};
  l.cluster.intra = {l.alpha, l.beta};
  l.cluster.fabric_bandwidth = l.beta;
  return l;
}

config parse(int argc, char** argv) {
  config cfg;
  gradcomp_bench::arg_reader in(argc, argv, "gradcomp_model_check");
  while (in.next()) {
    std::string const& a = in.option();
    auto value = [&] { return in.value(); };
    auto number = [&]() {
      std::string const v = value();
      char* end = nullptr;
      double const x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !std::isfinite(x) || x < 0) {
        std::fprintf(stderr, "gradcomp_model_check: %s wants a non-negative number, got '%s'\n", a.c_str(),
                     v.c_str());
        std::exit(2);
      }
      return x;
    };
    if (a == "--no-poll") {
      cfg.poll = false;
      continue;
    }
    if (a == "--mib") cfg.mib = number();
    else if (a == "--reps") cfg.reps = std::max(1, static_cast<int>(number()));
    else if (a == "--steps") cfg.steps = std::max(1, static_cast<int>(number()));
    else if (a == "--compute-ms") cfg.compute_ms = number();
    else if (a == "--stddev-ms") cfg.stddev_ms = number();
    else if (a == "--tolerance") cfg.tolerance = number();
    else if (a == "--only") cfg.only = gradcomp_bench::split_list(value());
    else if (a == "--csv") cfg.csv = value();
    else {
      std::fprintf(stderr,
                   "usage: gradcomp_model_check_mpi [--mib 16] [--reps 5] [--steps 8] [--compute-ms 300] "
                   "[--stddev-ms 30] [--only a,b] [--csv FILE] [--tolerance 0.25] [--no-poll]\n");
      std::exit(a == "--help" || a == "-h" ? 0 : 2);
    }
  }
  if (cfg.mib <= 0) {
    std::fprintf(stderr, "gradcomp_model_check: --mib must be positive\n");
    std::exit(2);
  }
  return cfg;
}

class checker {
 public:
  checker(gc::mpi_communicator& comm, config cfg)
      : comm_(comm), cfg_(std::move(cfg)),
        n_(static_cast<std::size_t>(cfg_.mib * 1024 * 1024 / 4)),
        bytes_(static_cast<double>(n_ * sizeof(float))),
        grad_(gradcomp_bench::test_gradient(n_, comm.rank())),
        out_(n_) {}

  void run() {
    lab_ = calibrate(comm_);
    if (comm_.rank() == 0) {
      std::printf("\ngradcomp model check: %d ranks, %.0f MiB float32 (%zu elements)\n", comm_.size(), cfg_.mib, n_);
      std::printf("calibration (ping-pong, ranks 0 and 1): alpha %.1f us, beta %.2f MB/s (%.3f Gbit/s)\n",
                  lab_.alpha * 1e6, lab_.beta / 1e6, lab_.beta * 8 / 1e9);
      std::printf("model of the lab: %d single-rank nodes, inter = {alpha, beta}, one shared fabric of beta\n\n",
                  comm_.size());
      std::fflush(stdout);
    }
    communication_cases();
    gossip_cases();
    compute_cases();
    report();
  }

  [[nodiscard]] bool all_within() const {
    for (auto const& r : results_)
      if (std::abs(r.predicted - r.measured) > cfg_.tolerance * r.measured) return false;
    return true;
  }

 private:
  bool wanted(std::string const& name) const {
    return cfg_.only.empty() || std::find(cfg_.only.begin(), cfg_.only.end(), name) != cfg_.only.end();
  }

  // Median over reps of the slowest rank's time of `step`, each step started together.
  double time_steps(std::function<void()> const& step) {
    std::vector<double> t;
    for (int r = 0; r <= cfg_.reps; ++r) {
      comm_.barrier();
      double const t0 = now();
      step();
      double const dt = slowest(comm_, now() - t0);
      if (r > 0) t.push_back(dt);
    }
    return median(t);
  }

  gc::tensor_view<float const> grad() const {
    return gc::tensor_view<float const>(std::span<float const>(grad_), gc::tensor_id{1});
  }

  void add(std::string name, std::string what, gc::iteration_time const& p, double measured) {
    results_.push_back({std::move(name), std::move(what), p.total(), measured, p});
    if (comm_.rank() == 0) {
      auto const& r = results_.back();
      std::printf("  %-34s predicted %8.1f ms  measured %8.1f ms  %+6.1f%%\n", r.name.c_str(), r.predicted * 1e3,
                  r.measured * 1e3, 100.0 * (r.predicted - r.measured) / r.measured);
      std::fflush(stdout);
    }
  }

  void communication_cases() {
    gc::compute_params const idle;  // communication and codecs only
    if (wanted("dense f32")) {
      double const t = time_steps([&] { gc::all_reduce_dense(comm_, std::span<float const>(grad_), out_); });
      add("dense f32", "predict_allreduce", gc::predict_allreduce(bytes_, lab_.cluster, idle), t);
    }
    struct spec {
      char const* name;
      char const* codec;
      bool ef;
      bool two_way;
    };
    for (spec const s : {spec{"fp16 (summable)", "fp16", false, false}, spec{"top-k 1% + EF", "topk:ratio=0.01", true, false},
                         spec{"onebit + EF", "onebit", true, false}, spec{"QSGD s=7", "qsgd:levels=7,bucket=512", false, false},
                         spec{"random-k 1% + EF", "randomk:ratio=0.01", true, false},
                         spec{"two-way top-k 1% + EF", "topk:ratio=0.01", true, true},
                         spec{"two-way onebit + EF", "onebit", true, true}}) {
      if (!wanted(s.name)) continue;
      gc::any_codec const codec = gc::make_codec(s.codec);
      gc::codec_params const k = measure_codec(comm_, codec, s.ef, grad_, cfg_.reps);
      double t = 0;
      gc::iteration_time p;
      if (s.two_way) {
        gc::two_way_compressor<gc::any_codec> tw(codec);
        t = time_steps([&] { gc::all_reduce_two_way(comm_, tw, grad(), out_); });
        p = gc::predict_two_way(bytes_, lab_.cluster, idle, k);
      } else {
        gc::compressor<gc::any_codec> comp(codec);
        t = time_steps([&] {
          gc::codec_context ctx;
          if (s.ef) gc::all_reduce_compressed(comm_, comp, grad(), out_, ctx);
          else gc::all_reduce_compressed(comm_, codec, grad(), out_, ctx);
        });
        p = gc::predict_compressed_allreduce(bytes_, lab_.cluster, idle, k);
      }
      char what[160];
      std::snprintf(what, sizeof what, "%s, ratio %.1f, compress %.2f GB/s, decode %.2f GB/s",
                    s.two_way ? "predict_two_way" : "predict_compressed_allreduce", k.ratio,
                    k.compress_bandwidth / 1e9, k.decompress_bandwidth / 1e9);
      add(s.name, what, p, t);
    }
    hierarchical_cases(idle);
  }

  // The hierarchical all-reduce on the ranks grouped as nodes of 2 (ranks 2k and 2k+1). In the
  // lab every byte crosses the one shaped loopback, the intra-node ones too: in the intra-node
  // phases all n ranks send at once, so each gets beta / n (intra = {alpha, beta / n}); in the
  // inter-node phase the 2 lanes' n flows share the fabric (network_link: min(beta / 2,
  // beta / n)). So the lab is a cluster of n / 2 nodes with intra = {alpha, beta / n}.
  void hierarchical_cases(gc::compute_params const& idle) {
    int const n = comm_.size();
    if (n < 4 || n % 2 != 0) return;
    gc::cluster_params cl = lab_.cluster;
    cl.ranks_per_node = 2;
    cl.intra = {lab_.alpha, lab_.beta / n};
    gc::hierarchical_options opt;
    opt.nodes = gc::node_grouping::uniform(2);
    struct spec {
      char const* name;
      char const* codec;
    };
    for (spec const s : {spec{"hierarchical top-k 1% + EF", "topk:ratio=0.01"},
                         spec{"hierarchical onebit + EF", "onebit"}}) {
      if (!wanted(s.name)) continue;
      gc::any_codec const codec = gc::make_codec(s.codec);
      gc::codec_params const k = measure_codec(comm_, codec, true, grad_, cfg_.reps);
      gc::compressor<gc::any_codec> comp(codec);
      double const t = time_steps([&] { gc::all_reduce_hierarchical(comm_, comp, grad(), out_, {}, opt); });
      char what[160];
      std::snprintf(what, sizeof what,
                    "predict_hierarchical_allreduce, nodes of 2, ratio %.1f, compress %.2f GB/s, decode %.2f GB/s",
                    k.ratio, k.compress_bandwidth / 1e9, k.decompress_bandwidth / 1e9);
      add(s.name, what, gc::predict_hierarchical_allreduce(bytes_, cl, idle, k), t);
    }
  }

  void gossip_cases() {
    gc::compute_params const idle;
    int const n = comm_.size();
    std::vector<std::pair<std::string, gc::topology>> topos;
    if ((n & (n - 1)) == 0 && n > 1) topos.emplace_back("gossip exp", gc::topology::one_peer_exponential(n));
    if (n % 2 == 0) topos.emplace_back("gossip ring", gc::topology::ring(n));
    if (n >= 3) topos.emplace_back("gossip static ring", gc::topology::static_ring(n));
    for (auto const& [name, topo] : topos) {
      if (!wanted(name)) continue;
      gc::comm_mixer<gc::mpi_communicator> mixer(comm_, topo);
      std::vector<float> x(grad_);
      std::uint64_t k = 0;
      // Every phase of the period counts: time whole periods and divide.
      std::uint64_t const period = topo.period();
      double const t = time_steps([&] {
                         for (std::uint64_t s = 0; s < period; ++s) {
                           mixer.start_mixing(x, k++);
                           mixer.wait_mixing(x);
                         }
                       }) /
                       static_cast<double>(period);
      add(name, "predict_gossip", gc::predict_gossip(bytes_, lab_.cluster, idle, topo), t);
    }
  }

  // Steps run back to back (as in training), the slowest rank's mean step.
  double time_training(std::function<void(int)> const& step) {
    step(-1);  // warm-up
    comm_.barrier();
    double const t0 = now();
    for (int s = 0; s < cfg_.steps; ++s) step(s);
    double const mine = (now() - t0) / cfg_.steps;
    comm_.barrier();
    return slowest(comm_, mine);
  }

  void compute_cases() {
    gc::compute_params c;
    c.mean = cfg_.compute_ms / 1e3;
    c.stddev = cfg_.stddev_ms / 1e3;
    int const rank = comm_.rank();
    if (wanted("compute + dense f32 no overlap")) {
      gc::compute_params blocking = c;
      blocking.overlap = false;
      double const t = time_training([&](int s) {
        emulate_compute(now(), compute_time(cfg_, rank, s), {});
        gc::all_reduce_dense(comm_, std::span<float const>(grad_), out_);
      });
      add("compute + dense f32 no overlap", "predict_allreduce, overlap off",
          gc::predict_allreduce(bytes_, lab_.cluster, blocking), t);
    }
    if (wanted("compute + dense f32 overlapped")) {
      // The gradient's all-reduce starts when the backward pass starts and runs during it.
      double const t = time_training([&](int s) {
        double const total = compute_time(cfg_, rank, s);
        double const start = now();
        emulate_compute(start, (1.0 - c.backward_fraction) * total, {});
        std::copy(grad_.begin(), grad_.end(), out_.begin());
        gc::request r = comm_.iall_reduce(std::as_writable_bytes(std::span<float>(out_)), gc::comm_type::f32,
                                          gc::reduce_op::sum);
        emulate_compute(start, total, [&] {
          if (cfg_.poll) (void)r.test();
        });
        r.wait();
      });
      add("compute + dense f32 overlapped", "predict_allreduce, backward window",
          gc::predict_allreduce(bytes_, lab_.cluster, c), t);
    }
    int const n = comm_.size();
    if ((n & (n - 1)) == 0 && n > 1 && wanted("compute + gossip exp overlapped")) {
      // DAdam's schedule: the mixing of x^k runs during the computation of the next gradient.
      gc::topology const topo = gc::topology::one_peer_exponential(n);
      gc::comm_mixer<gc::mpi_communicator> mixer(comm_, topo);
      std::vector<float> x(grad_);
      std::uint64_t k = 0;
      mixer.start_mixing(x, k++);
      double const t = time_training([&](int s) {
        emulate_compute(now(), compute_time(cfg_, rank, s), [&] {
          if (cfg_.poll) (void)mixer.test_mixing();
        });
        mixer.wait_mixing(x);
        mixer.start_mixing(x, k++);
      });
      mixer.wait_mixing(x);
      add("compute + gossip exp overlapped", "predict_gossip, whole-compute window",
          gc::predict_gossip(bytes_, lab_.cluster, c, topo), t);
    }
  }

  void report() {
    if (comm_.rank() != 0) return;
    std::printf("\n| case | model | predicted ms | measured ms | error |\n|---|---|---:|---:|---:|\n");
    std::size_t ok = 0;
    for (auto const& r : results_) {
      double const err = (r.predicted - r.measured) / r.measured;
      ok += std::abs(err) <= cfg_.tolerance ? 1 : 0;
      std::printf("| %s | %s | %.1f | %.1f | %+.1f%% |\n", r.name.c_str(), r.what.c_str(), r.predicted * 1e3,
                  r.measured * 1e3, 100.0 * err);
    }
    if (!cfg_.csv.empty()) {
      if (std::FILE* f = std::fopen(cfg_.csv.c_str(), "w")) {
        std::fprintf(f, "case,model,predicted_s,measured_s,compute_s,codec_s,communication_s,exposed_s,alpha_s,beta_Bps\n");
        for (auto const& r : results_) {
          std::fprintf(f, "\"%s\",\"%s\",%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g\n", r.name.c_str(), r.what.c_str(),
                       r.predicted, r.measured, r.parts.compute, r.parts.codec, r.parts.communication,
                       r.parts.exposed, lab_.alpha, lab_.beta);
        }
        std::fclose(f);
      } else {
        std::fprintf(stderr, "gradcomp_model_check: cannot write %s\n", cfg_.csv.c_str());
      }
    }
    std::printf("\nmodel check: %zu cases, %zu within %.0f%%\n", results_.size(), ok, 100.0 * cfg_.tolerance);
    std::fflush(stdout);
  }

  gc::mpi_communicator& comm_;
  config cfg_;
  std::size_t n_;
  double bytes_;
  std::vector<float> grad_;
  std::vector<float> out_;
  lab lab_;
  std::vector<result> results_;
};

}  // namespace

int main(int argc, char** argv) {
  gc::mpi_environment env(&argc, &argv);
  config const cfg = parse(argc, argv);
  gc::mpi_communicator comm(MPI_COMM_WORLD);
  if (comm.size() < 2) {
    std::fprintf(stderr, "gradcomp_model_check: needs at least 2 ranks (mpirun -n 4 ...)\n");
    return 2;
  }
  try {
    checker c(comm, cfg);
    c.run();
    return c.all_within() ? 0 : 1;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "gradcomp_model_check (rank %d): %s\n", comm.rank(), e.what());
    return 2;
  }
}
