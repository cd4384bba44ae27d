// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// The NCCL adapter (comm/nccl.cuh) on real GPUs: one rank per GPU (up to 4; NCCL does not
// allow two ranks of one communicator on one device), each a thread of this process, every
// operation checked against a host reference, on device buffers and on host buffers (staged); then, on one GPU, a receive that no send
// matches must give comm_error at the timeout (and abort the communicator), not hang.
// Exits 77 (ctest: skipped) when no usable CUDA device is present. Own harness, like
// tests/mpi: Catch2's assertions are not thread-safe.

#include <gradcomp/comm/nccl.cuh>

#include <gradcomp/core/dtype.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

using namespace gradcomp;
using gradcomp::nccl_communicator;
using gradcomp::nccl_options;

#include "gpu_harness.hpp"

namespace {

using gpu_harness::cuda_ok;
using gpu_harness::device_count_or_skip;
using gpu_harness::expect;
using gpu_harness::failures;

// A device buffer with host copies in and out.
struct dbuf {
  std::byte* p = nullptr;
  std::size_t n = 0;
  explicit dbuf(std::size_t bytes) : n(bytes) {
    if (n != 0) cuda_ok(cudaMalloc(reinterpret_cast<void**>(&p), n), "cudaMalloc");
  }
  ~dbuf() {
    if (p != nullptr) (void)cudaFree(p);
  }
  dbuf(dbuf const&) = delete;
  dbuf& operator=(dbuf const&) = delete;
  std::span<std::byte> span() { return {p, n}; }
  template <class T>
  void put(std::vector<T> const& v) {
    if (n != 0) cuda_ok(cudaMemcpy(p, v.data(), n, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  template <class T>
  std::vector<T> get() {
    std::vector<T> v(n / sizeof(T));
    if (n != 0) cuda_ok(cudaMemcpy(v.data(), p, n, cudaMemcpyDeviceToHost), "cudaMemcpy");
    return v;
  }
};

float value(int r, std::size_t i) {
  return static_cast<float>((r * 7 + static_cast<int>(i % 13)) % 17) * 0.25f;
}

void run_rank(nccl_communicator& c) {
  int const r = c.rank();
  int const n = c.size();
  auto const un = static_cast<std::size_t>(n);

  // all_reduce f32 sum (odd size), f16 and bf16 sums, i32 max, posted together and waited for
  // in reverse order.
  std::size_t const len = 1001;
  std::vector<float> f(len);
  std::vector<gradcomp::half> h(len);
  std::vector<gradcomp::bfloat16> b(len);
  std::vector<std::int32_t> m(len);
  for (std::size_t i = 0; i < len; ++i) {
    f[i] = value(r, i);
    h[i] = from_float<gradcomp::half>(value(r, i));
    b[i] = from_float<gradcomp::bfloat16>(value(r, i));
    m[i] = static_cast<std::int32_t>(i) * (r + 1);
  }
  dbuf df(len * 4), dh(len * 2), db(len * 2), dm(len * 4);
  df.put(f);
  dh.put(h);
  db.put(b);
  dm.put(m);
  std::vector<request> reqs;
  reqs.push_back(c.iall_reduce(df.span(), comm_type::f32, reduce_op::sum));
  reqs.push_back(c.iall_reduce(dh.span(), comm_type::f16, reduce_op::sum));
  reqs.push_back(c.iall_reduce(db.span(), comm_type::bf16, reduce_op::sum));
  reqs.push_back(c.iall_reduce(dm.span(), comm_type::i32, reduce_op::max));
  for (auto it = reqs.rbegin(); it != reqs.rend(); ++it) it->wait();
  auto rf = df.get<float>();
  auto rh = dh.get<gradcomp::half>();
  auto rb = db.get<gradcomp::bfloat16>();
  auto rm = dm.get<std::int32_t>();
  bool ok = true;
  for (std::size_t i = 0; i < len; ++i) {
    float e = 0;
    for (int p = 0; p < n; ++p) e += value(p, i);
    ok = ok && rf[i] == e && to_float(rh[i]) == e && to_float(rb[i]) == e &&
         rm[i] == static_cast<std::int32_t>(i) * n;
  }
  expect(ok, r, n, "all_reduce f32/f16/bf16 sum, i32 max");

  // reduce_scatter of 3 floats per rank.
  std::vector<float> rs(3 * un);
  for (std::size_t i = 0; i < rs.size(); ++i) rs[i] = value(r, i);
  dbuf drs_in(rs.size() * 4), drs_out(12);
  drs_in.put(rs);
  c.reduce_scatter(drs_in.span(), drs_out.span(), comm_type::f32, reduce_op::sum);
  auto got = drs_out.get<float>();
  ok = true;
  for (std::size_t i = 0; i < 3; ++i) {
    float e = 0;
    for (int p = 0; p < n; ++p) e += value(p, 3 * static_cast<std::size_t>(r) + i);
    ok = ok && got[i] == e;
  }
  expect(ok, r, n, "reduce_scatter");

  // all_gather and all_gather_v (rank 0 contributes nothing).
  std::vector<std::uint8_t> mine{static_cast<std::uint8_t>(r), static_cast<std::uint8_t>(50 + r)};
  dbuf dg_in(2), dg_out(2 * un);
  dg_in.put(mine);
  c.all_gather(dg_in.span(), dg_out.span());
  auto all = dg_out.get<std::uint8_t>();
  ok = true;
  for (int p = 0; p < n; ++p)
    ok = ok && all[2 * static_cast<std::size_t>(p)] == p &&
         all[2 * static_cast<std::size_t>(p) + 1] == 50 + p;
  expect(ok, r, n, "all_gather");
  std::vector<std::size_t> counts(un);
  std::iota(counts.begin(), counts.end(), std::size_t{0});
  std::vector<std::uint8_t> v(static_cast<std::size_t>(r), static_cast<std::uint8_t>(r + 1));
  dbuf dv_in(v.size()), dv_out(un * (un - 1) / 2);
  dv_in.put(v);
  c.all_gather_v(dv_in.span(), dv_out.span(), counts);
  auto gv = dv_out.get<std::uint8_t>();
  ok = true;
  std::size_t at = 0;
  for (int p = 0; p < n; ++p) {
    for (int k = 0; k < p; ++k) ok = ok && gv[at++] == p + 1;
  }
  expect(ok, r, n, "all_gather_v");

  // all_to_all_v: r sends (r + p) % 3 + 1 bytes of 16r + p to p.
  std::vector<std::size_t> sc(un), rc(un);
  std::vector<std::uint8_t> a2a;
  for (int p = 0; p < n; ++p) {
    sc[static_cast<std::size_t>(p)] = static_cast<std::size_t>((r + p) % 3 + 1);
    rc[static_cast<std::size_t>(p)] = static_cast<std::size_t>((p + r) % 3 + 1);
    a2a.insert(a2a.end(), sc[static_cast<std::size_t>(p)], static_cast<std::uint8_t>(16 * r + p));
  }
  dbuf da_in(a2a.size()), da_out(std::accumulate(rc.begin(), rc.end(), std::size_t{0}));
  da_in.put(a2a);
  c.all_to_all_v(da_in.span(), sc, da_out.span(), rc);
  auto ao = da_out.get<std::uint8_t>();
  ok = true;
  at = 0;
  for (int p = 0; p < n; ++p) {
    for (std::size_t k = 0; k < rc[static_cast<std::size_t>(p)]; ++k)
      ok = ok && ao[at++] == 16 * p + r;
  }
  expect(ok, r, n, "all_to_all_v");

  // broadcast from the last rank, send/recv around the ring (posted together: NCCL needs both
  // sides in flight), barrier.
  std::vector<double> bc(5, r == n - 1 ? 4.5 : 0.0);
  dbuf dbc(40);
  dbc.put(bc);
  c.broadcast(dbc.span(), n - 1);
  ok = true;
  for (double x : dbc.get<double>()) ok = ok && x == 4.5;
  expect(ok, r, n, "broadcast");
  if (n > 1) {
    std::vector<std::int32_t> out{r, 7 * r};
    dbuf ds(8), dr(8);
    ds.put(out);
    request rq = c.irecv(dr.span(), (r + n - 1) % n, 0);
    request sq = c.isend(ds.span(), (r + 1) % n, 0);
    sq.wait();
    rq.wait();
    auto in = dr.get<std::int32_t>();
    int const from = (r + n - 1) % n;
    expect(in[0] == from && in[1] == 7 * from, r, n, "send/recv");
  }
  // Host buffers (the collectives' control messages): staged through the device by the
  // adapter, delivered by wait().
  {
    std::vector<std::uint64_t> const mine{static_cast<std::uint64_t>(r) * 3 + 1, 42};
    std::vector<std::uint64_t> all(2 * un, 0);
    c.all_gather(std::as_bytes(std::span<std::uint64_t const>(mine)),
                 std::as_writable_bytes(std::span<std::uint64_t>(all)));
    bool hok = true;
    for (std::size_t q = 0; q < un; ++q) hok = hok && all[2 * q] == 3 * q + 1 && all[2 * q + 1] == 42;
    std::vector<std::int32_t> red{r + 1, -r};
    c.all_reduce(std::as_writable_bytes(std::span<std::int32_t>(red)), comm_type::i32, reduce_op::max);
    hok = hok && red[0] == n && red[1] == 0;
    std::vector<std::uint32_t> bc{r == 0 ? 0xabcdu : 0u};
    c.broadcast(std::as_writable_bytes(std::span<std::uint32_t>(bc)), 0);
    hok = hok && bc[0] == 0xabcdu;
    // A host send buffer into a device receive buffer and back: mixed spans.
    dbuf dall(2 * un * 8);
    c.all_gather(std::as_bytes(std::span<std::uint64_t const>(mine)), dall.span());
    hok = hok && dall.get<std::uint64_t>() == all;
    expect(hok, r, n, "host buffers (staged through the device)");
  }
  c.barrier();
}

void run_world(int n) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) throw std::runtime_error("ncclGetUniqueId failed");
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        cuda_ok(cudaSetDevice(r), "cudaSetDevice");
        cudaStream_t stream = nullptr;
        cuda_ok(cudaStreamCreate(&stream), "cudaStreamCreate");
        {
          nccl_options o;
          o.timeout = std::chrono::seconds(60);
          nccl_communicator c = nccl_communicator::init_rank(n, id, r, stream, o);
          expect(c.rank() == r && c.size() == n, r, n, "rank and size");
          run_rank(c);
        }
        (void)cudaStreamDestroy(stream);
      } catch (std::exception const& e) {
        std::lock_guard lock(gpu_harness::print_mutex);
        std::fprintf(stderr, "FAILED on rank %d of %d: exception: %s\n", r, n, e.what());
        ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
}

// One rank receiving from itself with no send: NCCL cannot complete it.
void unmatched_receive_times_out() {
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreate(&stream), "cudaStreamCreate");
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) throw std::runtime_error("ncclGetUniqueId failed");
  nccl_options o;
  o.timeout = std::chrono::milliseconds(500);
  nccl_communicator c = nccl_communicator::init_rank(1, id, 0, stream, o);
  dbuf d(64);
  auto const t0 = std::chrono::steady_clock::now();
  bool thrown = false;
  try {
    c.recv(d.span(), 0, 0);
  } catch (comm_error const& e) {
    thrown = std::string(e.what()).find("timed out") != std::string::npos;
  }
  auto const waited = std::chrono::steady_clock::now() - t0;
  expect(thrown, 0, 1, "an unmatched receive gives comm_error (timed out)");
  expect(waited < std::chrono::seconds(30), 0, 1, "the timeout is honoured");
  expect(c.broken(), 0, 1, "the communicator is broken after the timeout");
  bool again = false;
  try {
    c.barrier();
  } catch (comm_error const&) {
    again = true;
  }
  expect(again, 0, 1, "later operations fail at once");
  // The stream may hold the aborted kernel's remains; it is not reused.
}

}  // namespace

int main() {
  int const devices = device_count_or_skip();
  if (devices == 0) return 77;
  try {
    int const most = devices < 4 ? devices : 4;
    for (int n = 1; n <= most; ++n) {
      run_world(n);
      std::printf("NCCL adapter on %d GPU(s): %s\n", n, failures.load() == 0 ? "passed" : "FAILED");
    }
    unmatched_receive_times_out();
    std::printf("NCCL unmatched receive: %s\n",
                failures.load() == 0 ? "comm_error after the timeout" : "FAILED");
  } catch (std::exception const& e) {
    std::fprintf(stderr, "FAILED: %s\n", e.what());
    return 1;
  }
  return failures.load() == 0 ? 0 : 1;
}
