// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// A user-defined communicator: gradcomp's collectives over Gloo (Debian's libgloo-dev), written
// entirely in user code. The point is what it does NOT need: no gradcomp base class, no
// registration, no change to gradcomp. A type that declares
//   using communicator_concept = gradcomp::communicator_tag;
// and provides the blocking operations models gradcomp::blocking_communicator, and
// gradcomp::async_adaptor adds the non-blocking forms, which makes it a full
// gradcomp::communicator that every collective (and any_communicator) accepts.
//
// The program runs N ranks as threads of one process (Gloo's in-memory HashStore is the
// rendezvous; each rank has its own TCP device on 127.0.0.1, so the bytes really go through
// sockets), pushes every operation through the adaptor and checks each result against a plain
// reference. Exit status 0 when every check holds.
//
//   gradcomp_gloo_communicator [ranks]     (default 4)

#include <gradcomp/comm/any_communicator.hpp>
#include <gradcomp/comm/async_adaptor.hpp>
#include <gradcomp/comm/reduce.hpp>
#include <gradcomp/concepts/communicator.hpp>

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

// ------------------------------------------------------------------------------------------------
// The user's communicator. Everything gradcomp asks of a transport is in this class.
// ------------------------------------------------------------------------------------------------
class gloo_communicator {
 public:
  using communicator_concept = gradcomp::communicator_tag;

  explicit gloo_communicator(std::shared_ptr<gloo::Context> ctx) : ctx_(std::move(ctx)) {}

  [[nodiscard]] int rank() const { return ctx_->rank; }
  [[nodiscard]] int size() const { return ctx_->size; }

  void barrier() {
    guarded("barrier", [&] {
      gloo::BarrierOptions opts(ctx_);
      gloo::barrier(opts);
    });
  }

  void broadcast(std::span<std::byte> buf, int root) {
    guarded("broadcast", [&] {
      gloo::BroadcastOptions opts(ctx_);
      opts.setRoot(root);
      opts.setOutput(reinterpret_cast<std::uint8_t*>(nonnull(buf.data())), buf.size());
      gloo::broadcast(opts);
    });
  }

  // Gloo reduces opaque elements with a function we supply: gradcomp's reduce_into knows every
  // comm_type, 16-bit floats included. Gloo only needs the element size from the type argument.
  void all_reduce(std::span<std::byte> buf, gradcomp::comm_type t, gradcomp::reduce_op op) {
    std::size_t const es = gradcomp::comm_type_size(t);
    if (buf.empty()) return;
    guarded("all_reduce", [&] {
      gloo::AllreduceOptions opts(ctx_);
      auto fn = [t, op, es](void* out, void const* a, void const* b, std::size_t n) {
        auto* o = static_cast<std::byte*>(out);
        if (o != static_cast<std::byte const*>(a)) std::memmove(o, a, n * es);
        gradcomp::reduce_into(t, op, o, static_cast<std::byte const*>(b), n * es);
      };
      opts.setReduceFunction(fn);
      switch (es) {
        case 1: opts.setOutput(reinterpret_cast<std::uint8_t*>(buf.data()), buf.size()); break;
        case 2: opts.setOutput(reinterpret_cast<std::uint16_t*>(buf.data()), buf.size() / 2); break;
        case 4: opts.setOutput(reinterpret_cast<std::uint32_t*>(buf.data()), buf.size() / 4); break;
        default:
          opts.setOutput(reinterpret_cast<std::uint64_t*>(buf.data()), buf.size() / 8);
          break;
      }
      gloo::allreduce(opts);
    });
  }

  // Gloo's options-style API has no reduce-scatter: all-reduce a copy and keep our block.
  void reduce_scatter(std::span<std::byte const> in, std::span<std::byte> out,
                      gradcomp::comm_type t, gradcomp::reduce_op op) {
    std::vector<std::byte> all(in.begin(), in.end());
    all_reduce(all, t, op);
    if (!out.empty())
      std::memcpy(out.data(), all.data() + static_cast<std::size_t>(rank()) * out.size(),
                  out.size());
  }

  void all_gather(std::span<std::byte const> in, std::span<std::byte> out) {
    std::vector<std::size_t> counts(static_cast<std::size_t>(size()), in.size());
    all_gather_v(in, out, counts);
  }

  void all_gather_v(std::span<std::byte const> in, std::span<std::byte> out,
                    std::span<std::size_t const> counts) {
    guarded("all_gather_v", [&] {
      gloo::AllgathervOptions opts(ctx_);
      opts.setInput(
          const_cast<std::uint8_t*>(reinterpret_cast<std::uint8_t const*>(nonnull(in.data()))),
          in.size());
      opts.setOutput(reinterpret_cast<std::uint8_t*>(nonnull(out.data())),
                     std::vector<std::size_t>(counts.begin(), counts.end()));
      gloo::allgatherv(opts);
    });
  }

  void all_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> send_counts,
                    std::span<std::byte> out, std::span<std::size_t const> recv_counts) {
    guarded("all_to_all_v", [&] {
      gloo::AlltoallvOptions opts(ctx_);
      opts.setInput(
          const_cast<std::uint8_t*>(reinterpret_cast<std::uint8_t const*>(nonnull(in.data()))),
          std::vector<std::int64_t>(send_counts.begin(), send_counts.end()));
      opts.setOutput(reinterpret_cast<std::uint8_t*>(nonnull(out.data())),
                     std::vector<std::int64_t>(recv_counts.begin(), recv_counts.end()));
      gloo::alltoallv(opts);
    });
  }

  // Point to point through Gloo's unbound buffers; the tag picks the slot, so messages with one
  // tag between two ranks arrive in order.
  void send(std::span<std::byte const> in, int peer, int tag) {
    guarded("send", [&] {
      auto b = ctx_->createUnboundBuffer(const_cast<std::byte*>(nonnull(in.data())), in.size());
      b->send(peer, slot(tag), 0, in.size());
      b->waitSend(ctx_->getTimeout());
    });
  }

  void recv(std::span<std::byte> out, int peer, int tag) {
    guarded("recv", [&] {
      auto b = ctx_->createUnboundBuffer(nonnull(out.data()), out.size());
      b->recv(peer, slot(tag), 0, out.size());
      b->waitRecv(ctx_->getTimeout());
    });
  }

 private:
  static std::uint64_t slot(int tag) {
    return (std::uint64_t{0x6763} << 32) | static_cast<std::uint32_t>(tag);
  }

  static std::byte* nonnull(std::byte* p) {
    static std::byte dummy{};
    return p != nullptr ? p : &dummy;
  }
  static std::byte const* nonnull(std::byte const* p) {
    return p != nullptr ? p : nonnull(static_cast<std::byte*>(nullptr));
  }

  // gradcomp's contract: transport failures (Gloo's timeouts and I/O errors) are comm_error.
  template <class Fn>
  void guarded(char const* what, Fn fn) {
    try {
      fn();
    } catch (gradcomp::error const&) {
      throw;
    } catch (std::exception const& e) {
      throw gradcomp::comm_error(std::string("gloo ") + what + " on rank " +
                                 std::to_string(rank()) + ": " + e.what());
    }
  }

  std::shared_ptr<gloo::Context> ctx_;
};

// This is the whole contract.
static_assert(gradcomp::blocking_communicator<gloo_communicator>);
static_assert(!gradcomp::communicator<gloo_communicator>);  // no non-blocking forms of its own
static_assert(gradcomp::communicator<gradcomp::async_adaptor<gloo_communicator>>);

// ------------------------------------------------------------------------------------------------
// The checks: each operation through the adaptor against a reference.
// ------------------------------------------------------------------------------------------------
std::atomic<int> failures{0};

void expect(bool ok, int rank, char const* what) {
  if (!ok) {
    std::fprintf(stderr, "rank %d: %s: wrong result\n", rank, what);
    ++failures;
  }
}

template <class T>
std::span<std::byte> bytes_of(std::vector<T>& v) {
  return std::as_writable_bytes(std::span(v));
}
template <class T>
std::span<std::byte const> cbytes_of(std::vector<T> const& v) {
  return std::as_bytes(std::span(v));
}

void run_rank(gradcomp::async_adaptor<gloo_communicator>& comm) {
  int const r = comm.rank();
  int const n = comm.size();
  auto const un = static_cast<std::size_t>(n);

  // A gradient all-reduce, non-blocking: the adaptor's worker runs it while this thread works.
  std::vector<float> grad(1000003);
  for (std::size_t i = 0; i < grad.size(); ++i)
    grad[i] = static_cast<float>((i + static_cast<std::size_t>(r)) % 8) * 0.5f;
  gradcomp::request pending =
      comm.iall_reduce(bytes_of(grad), gradcomp::comm_type::f32, gradcomp::reduce_op::sum);
  double busy = 0;
  for (int k = 0; k < 1000; ++k) busy += k;
  pending.wait();
  bool ok = busy > 0;
  for (std::size_t i = 0; i < grad.size(); ++i) {
    float e = 0;
    for (int p = 0; p < n; ++p)
      e += static_cast<float>((i + static_cast<std::size_t>(p)) % 8) * 0.5f;
    ok = ok && grad[i] == e;
  }
  expect(ok, r, "iall_reduce f32 sum");

  // 16-bit floats, which Gloo knows nothing about, reduced by gradcomp's reduce_into.
  std::vector<gradcomp::bfloat16> h(
      7, gradcomp::from_float<gradcomp::bfloat16>(static_cast<float>(r) + 0.5f));
  comm.all_reduce(bytes_of(h), gradcomp::comm_type::bf16, gradcomp::reduce_op::max);
  ok = true;
  for (auto x : h) ok = ok && gradcomp::to_float(x) == static_cast<float>(n - 1) + 0.5f;
  expect(ok, r, "all_reduce bf16 max");

  // reduce_scatter: blocks of 3 int64s.
  std::vector<std::int64_t> rs_in(3 * un);
  std::iota(rs_in.begin(), rs_in.end(), std::int64_t{r});
  std::vector<std::int64_t> rs_out(3);
  comm.reduce_scatter(cbytes_of(rs_in), bytes_of(rs_out), gradcomp::comm_type::i64,
                      gradcomp::reduce_op::sum);
  ok = true;
  for (std::size_t i = 0; i < 3; ++i) {
    std::int64_t const base = static_cast<std::int64_t>(3 * static_cast<std::size_t>(r) + i);
    ok = ok && rs_out[i] == base * n + static_cast<std::int64_t>(n) * (n - 1) / 2;
  }
  expect(ok, r, "reduce_scatter i64 sum");

  // all_gather_v with rank 0 contributing nothing; all_gather.
  std::vector<std::size_t> counts(un);
  for (std::size_t p = 0; p < un; ++p) counts[p] = p;
  std::vector<std::uint8_t> mine(static_cast<std::size_t>(r), static_cast<std::uint8_t>(r));
  std::vector<std::uint8_t> gathered(un * (un - 1) / 2);
  comm.all_gather_v(cbytes_of(mine), bytes_of(gathered), counts);
  ok = true;
  std::size_t at = 0;
  for (int p = 0; p < n; ++p) {
    for (int k = 0; k < p; ++k) ok = ok && gathered[at++] == p;
  }
  expect(ok, r, "all_gather_v");
  std::vector<std::int32_t> one{r * r}, all(un);
  comm.all_gather(cbytes_of(one), bytes_of(all));
  ok = true;
  for (int p = 0; p < n; ++p) ok = ok && all[static_cast<std::size_t>(p)] == p * p;
  expect(ok, r, "all_gather");

  // all_to_all_v: rank r sends (r + p) % 3 bytes of value 10r + p to rank p.
  std::vector<std::size_t> sc(un), rc(un);
  std::vector<std::uint8_t> a2a_in;
  for (int p = 0; p < n; ++p) {
    sc[static_cast<std::size_t>(p)] = static_cast<std::size_t>((r + p) % 3);
    rc[static_cast<std::size_t>(p)] = static_cast<std::size_t>((p + r) % 3);
    a2a_in.insert(a2a_in.end(), sc[static_cast<std::size_t>(p)],
                  static_cast<std::uint8_t>(10 * r + p));
  }
  std::vector<std::uint8_t> a2a_out(std::accumulate(rc.begin(), rc.end(), std::size_t{0}));
  comm.all_to_all_v(cbytes_of(a2a_in), sc, bytes_of(a2a_out), rc);
  ok = true;
  at = 0;
  for (int p = 0; p < n; ++p) {
    for (std::size_t k = 0; k < rc[static_cast<std::size_t>(p)]; ++k)
      ok = ok && a2a_out[at++] == 10 * p + r;
  }
  expect(ok, r, "all_to_all_v");

  // broadcast from the last rank; send/recv around a ring. Gloo's send completes only once the
  // receiver has posted its receive, and the adaptor runs one operation at a time, so the ring
  // is ordered: rank 0 sends first, every other rank receives before it sends (with "everyone
  // receives first" each worker would wait in its receive forever; see async_adaptor.hpp).
  std::vector<double> b(5, r == n - 1 ? 2.5 : 0.0);
  comm.broadcast(bytes_of(b), n - 1);
  ok = true;
  for (double x : b) ok = ok && x == 2.5;
  expect(ok, r, "broadcast");
  if (n > 1) {
    std::vector<std::int32_t> out{r, 100 + r}, in(2);
    if (r == 0) {
      gradcomp::request sq = comm.isend(cbytes_of(out), 1, 7);
      comm.recv(bytes_of(in), n - 1, 7);
      sq.wait();
    } else {
      comm.recv(bytes_of(in), r - 1, 7);
      comm.send(cbytes_of(out), (r + 1) % n, 7);
    }
    int const from = (r + n - 1) % n;
    expect(in[0] == from && in[1] == 100 + from, r, "send/recv");
  }

  // The same communicator, chosen at run time.
  gradcomp::any_communicator any = comm;
  std::vector<std::uint32_t> u{1};
  any.all_reduce(bytes_of(u), gradcomp::comm_type::u32, gradcomp::reduce_op::sum);
  expect(u[0] == static_cast<std::uint32_t>(n), r, "any_communicator all_reduce");
  comm.barrier();
}

}  // namespace

int main(int argc, char** argv) {
  int const n = argc > 1 ? std::atoi(argv[1]) : 4;
  if (n < 1 || n > 64) {
    std::fprintf(stderr, "usage: gradcomp_gloo_communicator [ranks 1..64]\n");
    return 2;
  }
  gloo::rendezvous::HashStore store;  // rendezvous of threads in one process
  std::vector<std::thread> threads;
  std::atomic<int> errors{0};
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";
        auto device = gloo::transport::tcp::CreateDevice(attr);
        auto ctx = std::make_shared<gloo::rendezvous::Context>(r, n);
        ctx->setTimeout(std::chrono::seconds(20));
        gloo::rendezvous::PrefixStore prefixed("gradcomp-example", store);
        ctx->connectFullMesh(prefixed, device);
        gradcomp::async_adaptor<gloo_communicator> comm{gloo_communicator(ctx)};
        run_rank(comm);
      } catch (std::exception const& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        ++errors;
      }
    });
  }
  for (auto& t : threads) t.join();
  int const bad = failures.load() + errors.load();
  std::printf("gloo communicator on %d ranks: %s\n", n, bad == 0 ? "every check passed" : "FAILED");
  return bad == 0 ? 0 : 1;
}
