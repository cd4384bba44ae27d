// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// gradcomp_bench_collectives: time per all-reduce of one large gradient (64 MiB of float32 by
// default) per codec and collective, against the dense float32 and 16-bit baselines measured in
// the same run. Columns:
//
//   time      measured wall time per step (slowest rank, median of --reps steps); in process
//             the ranks compute one at a time (see cpu_token), so this is not a step time
//   compute   time a rank computes (compression, decoding, error feedback), slowest rank;
//             in process measured with the CPU to itself
//   wire/rank bytes this rank sends under ring algorithms (collective_result::wire_bytes)
//   model@R   compute + wire bytes / R: what the step would take on a network of rate R (one
//             link per rank, latency ignored); --rates sets R (Gbit/s); with --shared-link all
//             ranks share one link of rate R (as in bench/netlab.sh, where every rank's traffic
//             crosses the one shaped loopback): compute + ranks x wire / R
//   x f32, x 16  speed-up of model@R against dense f32 and the best 16-bit dense, at each rate
//
// In-process (default): --ranks threads of one process share the in-process communicator; the
// measured time includes the in-process copies, which a network replaces, hence the model.
// Under MPI (built with GRADCOMP_HAVE_MPI and run by mpirun, e.g. inside bench/netlab.sh), the
// measured time is the real one on that network, and the model columns are only a check.
//
//   gradcomp_bench_collectives [--ranks 4] [--mib 64] [--reps 3] [--rates 1,10]
//                              [--only name,name...] [--threads T] [--shared-link]
//
// --threads sets GRADCOMP_NUM_THREADS (the size of the process-wide pool all ranks share in
// process; under MPI each process has its own).

#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/dense.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/gradcomp.hpp>

#include "support.hpp"

#if GRADCOMP_HAVE_MPI
#  include <gradcomp/comm/mpi.hpp>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace gc = gradcomp;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The CPU token of in-process runs: a rank holds it while it computes and lets go of it inside
// every communication call, so at most one rank computes at a time and each rank's compute time
// is what it would be on a machine of its own (the ranks of a real job do not share cores).
// Under MPI there is no token: every process has its own CPU.
struct cpu_token {
  std::mutex m;
};

// A communicator that measures the time a rank computes: the time between communication calls
// (with the CPU token held, in process). `compute` accumulates it; `begin()` / `end()` bracket a
// step.
template <gc::communicator Comm>
class timed_communicator {
 public:
  using communicator_concept = gc::communicator_tag;
  timed_communicator(Comm& c, cpu_token* token) : c_(&c), token_(token) {}
  [[nodiscard]] int rank() const { return c_->rank(); }
  [[nodiscard]] int size() const { return c_->size(); }
  double compute = 0.0;

  void begin() {
    compute = 0.0;
    acquire();
  }
  void end() { release(); }
  void acquire() {
    if (token_ != nullptr) token_->m.lock();
    since_ = now();
  }
  void release() {
    compute += now() - since_;
    if (token_ != nullptr) token_->m.unlock();
  }

  void barrier() { time([&] { c_->barrier(); }); }
  void broadcast(std::span<std::byte> b, int r) { time([&] { c_->broadcast(b, r); }); }
  void all_reduce(std::span<std::byte> b, gc::comm_type t, gc::reduce_op o) { time([&] { c_->all_reduce(b, t, o); }); }
  void reduce_scatter(std::span<std::byte const> i, std::span<std::byte> o, gc::comm_type t, gc::reduce_op op) {
    time([&] { c_->reduce_scatter(i, o, t, op); });
  }
  void all_gather(std::span<std::byte const> i, std::span<std::byte> o) { time([&] { c_->all_gather(i, o); }); }
  void all_gather_v(std::span<std::byte const> i, std::span<std::byte> o, std::span<std::size_t const> c) {
    time([&] { c_->all_gather_v(i, o, c); });
  }
  void all_to_all_v(std::span<std::byte const> i, std::span<std::size_t const> sc, std::span<std::byte> o,
                    std::span<std::size_t const> rc) {
    time([&] { c_->all_to_all_v(i, sc, o, rc); });
  }
  void send(std::span<std::byte const> i, int p, int t) { time([&] { c_->send(i, p, t); }); }
  void recv(std::span<std::byte> o, int p, int t) { time([&] { c_->recv(o, p, t); }); }
  gc::request ibroadcast(std::span<std::byte> b, int r) { return wrap([&] { return c_->ibroadcast(b, r); }); }
  gc::request iall_reduce(std::span<std::byte> b, gc::comm_type t, gc::reduce_op o) {
    return wrap([&] { return c_->iall_reduce(b, t, o); });
  }
  gc::request ireduce_scatter(std::span<std::byte const> i, std::span<std::byte> o, gc::comm_type t, gc::reduce_op op) {
    return wrap([&] { return c_->ireduce_scatter(i, o, t, op); });
  }
  gc::request iall_gather(std::span<std::byte const> i, std::span<std::byte> o) {
    return wrap([&] { return c_->iall_gather(i, o); });
  }
  gc::request iall_gather_v(std::span<std::byte const> i, std::span<std::byte> o, std::span<std::size_t const> c) {
    return wrap([&] { return c_->iall_gather_v(i, o, c); });
  }
  gc::request iall_to_all_v(std::span<std::byte const> i, std::span<std::size_t const> sc, std::span<std::byte> o,
                            std::span<std::size_t const> rc) {
    return wrap([&] { return c_->iall_to_all_v(i, sc, o, rc); });
  }
  gc::request isend(std::span<std::byte const> i, int p, int t) { return wrap([&] { return c_->isend(i, p, t); }); }
  gc::request irecv(std::span<std::byte> o, int p, int t) { return wrap([&] { return c_->irecv(o, p, t); }); }

 private:
  class timed_state final : public gc::request::state {
   public:
    timed_state(gc::request r, timed_communicator* owner) : r_(std::move(r)), owner_(owner) {}
    bool test() override { return r_.test(); }
    void wait() override {
      owner_->release();
      try {
        r_.wait();
      } catch (...) {
        owner_->acquire();
        throw;
      }
      owner_->acquire();
    }

   private:
    gc::request r_;
    timed_communicator* owner_;
  };
  template <class Fn>
  void time(Fn&& fn) {
    release();
    try {
      fn();
    } catch (...) {
      acquire();
      throw;
    }
    acquire();
  }
  template <class Fn>
  gc::request wrap(Fn&& fn) {
    gc::request r;
    time([&] { r = fn(); });
    return gc::request(std::make_unique<timed_state>(std::move(r), this));
  }
  Comm* c_;
  cpu_token* token_;
  double since_ = 0.0;
};

struct config {
  int ranks = 4;
  double mib = 64;
  int reps = 3;
  std::vector<double> rates{1.0, 10.0};
  std::vector<std::string> only;
  bool shared_link = false;
};

struct row {
  std::string name;
  std::string path;
  double time = 0, compute = 0, compress = 0;
  std::size_t wire = 0, packet = 0;
};

// One benchmark case: a step function run by every rank, plus a compression-only timing.
struct bench_case {
  std::string name;
  // step(comm, grad, out) -> result; each rank owns its own state (constructed per rank).
  std::function<std::function<gc::collective_result(timed_communicator<gc::any_communicator>&, gc::tensor_view<float const>,
                                                     std::span<float>)>()>
      make;
  // compression of the full gradient with the case's codec (with error feedback where used)
  std::function<std::function<void(gc::tensor_view<float const>)>()> make_compress;
};

std::vector<bench_case> cases() {
  std::vector<bench_case> v;
  auto dense = [&](std::string name, gc::dense_format f) {
    v.push_back({name,
                 [f] {
                   return [f](auto& comm, gc::tensor_view<float const> g, std::span<float> out) {
                     return gc::all_reduce_dense(comm, g.span(), out, f);
                   };
                 },
                 [f] {
                   auto buf = std::make_shared<std::vector<std::byte>>();
                   return [f, buf](gc::tensor_view<float const> g) {
                     if (f == gc::dense_format::f32) return;
                     buf->resize(gc::header_bytes + 2 * g.size());
                     if (f == gc::dense_format::f16) gc::fp16_codec{}.compress(g, std::span<std::byte>(*buf));
                     else gc::bf16_codec{}.compress(g, std::span<std::byte>(*buf));
                   };
                 }});
  };
  dense("dense f32", gc::dense_format::f32);
  dense("dense f16", gc::dense_format::f16);
  dense("dense bf16", gc::dense_format::bf16);
  auto compressed = [&](std::string name, std::string spec, bool ef) {
    std::optional<gc::any_codec> maybe;
    try {
      maybe = gc::make_codec(spec);
    } catch (gc::config_error const&) {
      static std::atomic<bool> said{false};  // cases() runs on every rank; say it once
      if (!said.exchange(true)) {
        std::fprintf(stderr, "skipping %s: codec spec '%s' is not available in this build\n", name.c_str(), spec.c_str());
      }
      return;
    }
    gc::any_codec const codec = *maybe;
    v.push_back({name,
                 [codec, ef] {
                   auto comp = std::make_shared<gc::compressor<gc::any_codec>>(codec);
                   return [codec, ef, comp](auto& comm, gc::tensor_view<float const> g, std::span<float> out) {
                     gc::codec_context ctx;
                     return ef ? gc::all_reduce_compressed(comm, *comp, g, out, ctx)
                               : gc::all_reduce_compressed(comm, codec, g, out, ctx);
                   };
                 },
                 [codec, ef] {
                   auto comp = std::make_shared<gc::compressor<gc::any_codec>>(codec);
                   auto buf = std::make_shared<std::vector<std::byte>>();
                   return [codec, ef, comp, buf](gc::tensor_view<float const> g) {
                     buf->resize(codec.max_compressed_bytes(g.size()));
                     if (ef) comp->compress(g, std::span<std::byte>(*buf));
                     else codec.compress(g, std::span<std::byte>(*buf));
                   };
                 }});
  };
  auto two_way = [&](std::string name, std::string spec) {
    gc::any_codec const codec = gc::make_codec(spec);
    v.push_back({name,
                 [codec] {
                   auto tw = std::make_shared<gc::two_way_compressor<gc::any_codec>>(codec);
                   return [tw](auto& comm, gc::tensor_view<float const> g, std::span<float> out) {
                     return gc::all_reduce_two_way(comm, *tw, g, out);
                   };
                 },
                 [codec] {
                   auto comp = std::make_shared<gc::compressor<gc::any_codec>>(codec);
                   auto buf = std::make_shared<std::vector<std::byte>>();
                   return [comp, buf](gc::tensor_view<float const> g) {
                     buf->resize(comp->max_compressed_bytes(g.size()));
                     comp->compress(g, std::span<std::byte>(*buf));
                   };
                 }});
  };
  compressed("fp16 (summable codec)", "fp16", false);
  compressed("topk 1% + EF", "topk:ratio=0.01", true);
  compressed("topk 1% f16 values + EF", "topk:ratio=0.01,values=f16", true);
  compressed("onebit + EF", "onebit", true);
  compressed("qsgd s=7", "qsgd:levels=7,bucket=512", false);
  compressed("int8", "int8:bucket=512", false);
  compressed("random-k 1% + EF", "randomk:ratio=0.01", true);
  two_way("two-way topk 1% + EF", "topk:ratio=0.01");
  two_way("two-way onebit + EF", "onebit");
  return v;
}

template <gc::communicator Comm>
std::vector<row> run_suite(Comm& raw, config const& cfg, std::vector<float> const& grad, cpu_token* token) {
  gc::any_communicator any(raw);
  timed_communicator<gc::any_communicator> comm(any, token);
  std::size_t const n = grad.size();
  std::vector<float> out(n);
  std::vector<row> rows;
  for (auto const& c : cases()) {
    if (!cfg.only.empty() && std::find(cfg.only.begin(), cfg.only.end(), c.name) == cfg.only.end()) continue;
    auto step = c.make();
    auto compress = c.make_compress();
    row r;
    r.name = c.name;
    std::vector<double> times, computes, compresses;
    gc::tensor_view<float const> const g(std::span<float const>(grad), gc::tensor_id{1});
    for (int rep = 0; rep <= cfg.reps; ++rep) {  // rep 0 warms up
      raw.barrier();
      double const t0 = now();
      comm.begin();
      gc::collective_result const res = step(comm, g, std::span<float>(out));
      comm.end();
      double t = now() - t0;
      double compute = comm.compute;
      // slowest rank's time, largest compute
      double both[2] = {t, compute};
      raw.all_reduce(std::as_writable_bytes(std::span<double>(both)), gc::comm_type::f64, gc::reduce_op::max);
      if (rep > 0) {
        times.push_back(both[0]);
        computes.push_back(both[1]);
      }
      r.wire = res.wire_bytes;
      r.packet = res.packet_bytes;
      r.path = gc::collective_path_name(res.path);
    }
    for (int rep = 0; rep < std::max(1, cfg.reps); ++rep) {
      if (token != nullptr) token->m.lock();
      double const t0 = now();
      compress(g);
      compresses.push_back(now() - t0);
      if (token != nullptr) token->m.unlock();
    }
    r.time = median(times);
    r.compute = median(computes);
    r.compress = median(compresses);
    rows.push_back(r);
  }
  return rows;
}

void print(std::vector<row> const& rows, config const& cfg, int ranks, char const* transport) {
  std::printf("\ngradcomp collectives: %.0f MiB float32 gradient, %d ranks, %s transport, median of %d steps\n",
              cfg.mib, ranks, transport, cfg.reps);
  std::printf("model@R = compute + %s / R (ring algorithms, latency ignored)\n\n",
              cfg.shared_link ? "ranks x wire/rank (one link shared by all ranks)" : "wire/rank (one link per rank)");
  std::printf("| %-26s | %-16s | %9s | %9s | %9s | %11s |", "collective", "path", "time ms", "compute", "compress",
              "wire/rank");
  for (double rate : cfg.rates) std::printf(" model@%gG ms | x f32 | x 16 |", rate);
  std::printf("\n|%s|%s|%s|%s|%s|%s|", std::string(28, '-').c_str(), std::string(18, '-').c_str(),
              std::string(11, '-').c_str(), std::string(11, '-').c_str(), std::string(11, '-').c_str(),
              std::string(13, '-').c_str());
  for (std::size_t i = 0; i < cfg.rates.size(); ++i) std::printf("%s|%s|%s|", std::string(14, '-').c_str(), "-------", "------");
  std::printf("\n");
  double const links = cfg.shared_link ? static_cast<double>(ranks) : 1.0;
  auto model = [links](row const& r, double rate) {
    return r.compute + links * static_cast<double>(r.wire) * 8.0 / (rate * 1e9);
  };
  auto find = [&](std::string const& name) -> row const* {
    for (auto const& r : rows)
      if (r.name == name) return &r;
    return nullptr;
  };
  row const* f32 = find("dense f32");
  for (auto const& r : rows) {
    std::printf("| %-26s | %-16s | %9.1f | %9.1f | %9.1f | %8.2f MB |", r.name.c_str(), r.path.c_str(), r.time * 1e3,
                r.compute * 1e3, r.compress * 1e3, static_cast<double>(r.wire) / 1e6);
    for (double rate : cfg.rates) {
      double const m = model(r, rate);
      double best16 = 0;
      for (char const* name : {"dense f16", "dense bf16"}) {
        if (row const* d = find(name)) best16 = best16 == 0 ? model(*d, rate) : std::min(best16, model(*d, rate));
      }
      std::printf(" %12.1f | %5.1f | %4.1f |", m * 1e3, f32 ? model(*f32, rate) / m : 0.0, best16 > 0 ? best16 / m : 0.0);
    }
    std::printf("\n");
  }
  std::fflush(stdout);
}

config parse(int argc, char** argv) {
  config cfg;
  gradcomp_bench::arg_reader in(argc, argv, argv[0]);
  while (in.next()) {
    std::string const& a = in.option();
    auto value = [&] { return in.value(); };
    if (a == "--ranks") cfg.ranks = std::stoi(value());
    else if (a == "--mib") cfg.mib = std::stod(value());
    else if (a == "--reps") cfg.reps = std::stoi(value());
    else if (a == "--rates") {
      cfg.rates.clear();
      for (auto const& r : gradcomp_bench::split_list(value())) cfg.rates.push_back(std::stod(r));
    } else if (a == "--only") cfg.only = gradcomp_bench::split_list(value());
    else if (a == "--shared-link") cfg.shared_link = true;
    else if (a == "--threads") setenv("GRADCOMP_NUM_THREADS", value().c_str(), 1);
    else {
      std::fprintf(stderr,
                   "usage: %s [--ranks N] [--mib M] [--reps R] [--rates 1,10] [--only a,b] [--threads T] "
                   "[--shared-link]\n",
                   argv[0]);
      std::exit(a == "--help" || a == "-h" ? 0 : 2);
    }
  }
  return cfg;
}

}  // namespace

int main(int argc, char** argv) {
#if GRADCOMP_HAVE_MPI
  gc::mpi_environment env(&argc, &argv);
  config const cfg = parse(argc, argv);
  gc::mpi_communicator comm(MPI_COMM_WORLD);
  auto const n = static_cast<std::size_t>(cfg.mib * 1024 * 1024 / 4);
  std::vector<float> const g = gradcomp_bench::test_gradient(n, comm.rank());
  auto const rows = run_suite(comm, cfg, g, nullptr);
  if (comm.rank() == 0) print(rows, cfg, comm.size(), "MPI");
  return 0;
#else
  config const cfg = parse(argc, argv);
  auto const n = static_cast<std::size_t>(cfg.mib * 1024 * 1024 / 4);
  std::vector<std::vector<float>> grads(static_cast<std::size_t>(cfg.ranks));
  for (int r = 0; r < cfg.ranks; ++r) grads[static_cast<std::size_t>(r)] = gradcomp_bench::test_gradient(n, r);
  std::vector<row> rows;
  cpu_token token;
  gc::run_in_process(cfg.ranks, [&](gc::in_process_communicator& comm) {
    auto rr = run_suite(comm, cfg, grads[static_cast<std::size_t>(comm.rank())], &token);
    if (comm.rank() == 0) rows = std::move(rr);
  });
  print(rows, cfg, cfg.ranks, "in-process");
  return 0;
#endif
}
