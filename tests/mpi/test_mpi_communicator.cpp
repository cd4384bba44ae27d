// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// mpi_communicator against plain references, on however many ranks mpirun started.

#include <gradcomp/comm/any_communicator.hpp>
#include <gradcomp/comm/mpi.hpp>
#include <gradcomp/comm/reduce.hpp>

#include "check.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

using namespace gradcomp;
using namespace std::chrono_literals;

namespace {

template <class T>
std::span<std::byte> bytes_of(std::vector<T>& v) {
  return std::as_writable_bytes(std::span(v));
}
template <class T>
std::span<std::byte const> cbytes_of(std::vector<T> const& v) {
  return std::as_bytes(std::span(v));
}

// Values that sum exactly in every type used here (small multiples of 1/4), so the reference does
// not depend on the order in which MPI combines contributions.
double value(int r, std::size_t i) {
  return static_cast<double>((r * 7 + static_cast<int>(i % 13)) % 17) * 0.25 - 1.0;
}

template <class T>
T as(double v) {
  if constexpr (std::same_as<T, half> || std::same_as<T, bfloat16>) {
    return from_float<T>(static_cast<float>(v));
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<std::int64_t>(v * 4) + 8);  // non-negative for unsigned types
  } else {
    return static_cast<T>(v);
  }
}

template <class T>
double back(T x) {
  if constexpr (std::same_as<T, half> || std::same_as<T, bfloat16>) {
    return static_cast<double>(to_float(x));
  } else {
    return static_cast<double>(x);
  }
}

mpi_options test_options() {
  mpi_options o;
  o.timeout = 30s;
  return o;
}

// all_reduce of `len` elements of T with `op`, compared element-wise with a reference that
// combines every rank's contribution (computed locally) with reduce_into.
template <class T>
void check_all_reduce(mpi_communicator& c, std::size_t len, reduce_op op) {
  std::vector<T> mine(len);
  for (std::size_t i = 0; i < len; ++i) mine[i] = as<T>(value(c.rank(), i));
  std::vector<T> expect(len);
  for (std::size_t i = 0; i < len; ++i) expect[i] = as<T>(value(0, i));
  for (int p = 1; p < c.size(); ++p) {
    std::vector<T> theirs(len);
    for (std::size_t i = 0; i < len; ++i) theirs[i] = as<T>(value(p, i));
    reduce_into(comm_type_of<T>, op, reinterpret_cast<std::byte*>(expect.data()),
                reinterpret_cast<std::byte const*>(theirs.data()), len * sizeof(T));
  }
  c.all_reduce(bytes_of(mine), comm_type_of<T>, op);
  for (std::size_t i = 0; i < len; ++i) MPI_CHECK(back(mine[i]) == back(expect[i]));
}

template <class T>
void all_reduce_all_ops(mpi_communicator& c) {
  for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1001}}) {
    for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min})
      check_all_reduce<T>(c, len, op);
  }
}

}  // namespace

static_assert(communicator<mpi_communicator>);

MPI_TEST(all_reduce_every_type_and_op) {
  mpi_communicator c(MPI_COMM_WORLD, test_options());
  all_reduce_all_ops<std::uint8_t>(c);
  all_reduce_all_ops<std::int32_t>(c);
  all_reduce_all_ops<std::uint32_t>(c);
  all_reduce_all_ops<std::int64_t>(c);
  all_reduce_all_ops<std::uint64_t>(c);
  all_reduce_all_ops<float>(c);
  all_reduce_all_ops<double>(c);
  all_reduce_all_ops<half>(c);
  all_reduce_all_ops<bfloat16>(c);
}

MPI_TEST(all_reduce_16_bit_sums_round_like_in_process) {
  // 1 + 2^-11 is not a half: each combination rounds (to nearest even), as reduce_into does.
  mpi_communicator c(MPI_COMM_WORLD, test_options());
  std::vector<half> h(3, from_float<half>(c.rank() == 0 ? 1.0f : 0.00048828125f));
  std::vector<bfloat16> b(3, from_float<bfloat16>(c.rank() == 0 ? 256.0f : 1.0f));
  c.all_reduce(bytes_of(h), comm_type::f16, reduce_op::sum);
  c.all_reduce(bytes_of(b), comm_type::bf16, reduce_op::sum);
  // Each step adds less than half an ulp to 1.0 (f16) or 256 (bf16) and rounds back, whatever
  // the order, as long as the large value is combined before the small ones add up past it.
  // With 2 ranks the result is exact to check; with more it is bounded.
  for (half x : h)
    MPI_CHECK(to_float(x) >= 1.0f &&
              to_float(x) <= 1.0f + 0.00048828125f * static_cast<float>(c.size()));
  for (bfloat16 x : b)
    MPI_CHECK(to_float(x) >= 256.0f && to_float(x) <= 256.0f + static_cast<float>(c.size()));
  if (c.size() == 2) {
    for (half x : h) MPI_CHECK(to_float(x) == 1.0f);
    for (bfloat16 x : b) MPI_CHECK(to_float(x) == 256.0f);
  }
}

MPI_TEST(chunked_operations_match_unchunked) {
  mpi_options o = test_options();
  o.max_chunk_bytes = 12;  // 3 floats, 6 halves: every operation below takes many MPI calls
  mpi_communicator c(MPI_COMM_WORLD, o);
  check_all_reduce<float>(c, 1001, reduce_op::sum);
  check_all_reduce<half>(c, 1001, reduce_op::sum);
  check_all_reduce<double>(c, 5, reduce_op::max);  // chunks are whole elements: 8 bytes each
  std::vector<std::uint8_t> b(1001);
  for (std::size_t i = 0; i < b.size(); ++i)
    b[i] = static_cast<std::uint8_t>(c.rank() == 1 ? i * 3 : 0);
  c.broadcast(bytes_of(b), 1);
  for (std::size_t i = 0; i < b.size(); ++i) MPI_CHECK(b[i] == static_cast<std::uint8_t>(i * 3));
  int const n = c.size();
  std::vector<std::uint8_t> msg(100, static_cast<std::uint8_t>(c.rank()));
  std::vector<std::uint8_t> got(100);
  request s = c.isend(cbytes_of(msg), (c.rank() + 1) % n, 5);
  c.recv(bytes_of(got), (c.rank() + n - 1) % n, 5);
  s.wait();
  for (auto x : got) MPI_CHECK(x == (c.rank() + n - 1) % n);
}

MPI_TEST(reduce_scatter_odd_and_empty_blocks) {
  mpi_communicator c(MPI_COMM_WORLD, test_options());
  auto const n = static_cast<std::size_t>(c.size());
  for (std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{37}}) {
    std::vector<float> in(block * n);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(value(c.rank(), i));
    std::vector<float> out(block);
    c.reduce_scatter(cbytes_of(in), bytes_of(out), comm_type::f32, reduce_op::sum);
    for (std::size_t i = 0; i < block; ++i) {
      double e = 0;
      for (int p = 0; p < c.size(); ++p)
        e += value(p, static_cast<std::size_t>(c.rank()) * block + i);
      MPI_CHECK(out[i] == static_cast<float>(e));
    }
    std::vector<bfloat16> hin(block * n);
    for (std::size_t i = 0; i < hin.size(); ++i) hin[i] = as<bfloat16>(value(c.rank(), i));
    std::vector<bfloat16> hout(block);
    c.reduce_scatter(cbytes_of(hin), bytes_of(hout), comm_type::bf16, reduce_op::max);
    for (std::size_t i = 0; i < block; ++i) {
      double e = -1e30;
      for (int p = 0; p < c.size(); ++p)
        e = std::max(e, value(p, static_cast<std::size_t>(c.rank()) * block + i));
      MPI_CHECK(to_float(hout[i]) == static_cast<float>(e));
    }
  }
}

MPI_TEST(all_gather_and_all_gather_v_with_empty_contributions) {
  mpi_communicator c(MPI_COMM_WORLD, test_options());
  int const n = c.size();
  auto const un = static_cast<std::size_t>(n);
  for (std::size_t len : {std::size_t{0}, std::size_t{5}}) {
    std::vector<std::uint8_t> mine(len);
    for (std::size_t i = 0; i < len; ++i)
      mine[i] = static_cast<std::uint8_t>(10 * c.rank() + static_cast<int>(i));
    std::vector<std::uint8_t> all(len * un);
    c.all_gather(cbytes_of(mine), bytes_of(all));
    for (int p = 0; p < n; ++p) {
      for (std::size_t i = 0; i < len; ++i)
        MPI_CHECK(all[static_cast<std::size_t>(p) * len + i] == 10 * p + static_cast<int>(i));
    }
  }
  // Rank p contributes (p * 5 + 2) % 4 bytes: some ranks nothing; and then everyone nothing.
  for (bool none : {false, true}) {
    std::vector<std::size_t> counts(un);
    for (std::size_t p = 0; p < un; ++p) counts[p] = none ? 0 : (p * 5 + 2) % 4;
    std::vector<std::uint8_t> mine(counts[static_cast<std::size_t>(c.rank())],
                                   static_cast<std::uint8_t>(c.rank() + 1));
    std::vector<std::uint8_t> all(std::accumulate(counts.begin(), counts.end(), std::size_t{0}),
                                  0xee);
    c.all_gather_v(cbytes_of(mine), bytes_of(all), counts);
    std::size_t at = 0;
    for (std::size_t p = 0; p < un; ++p) {
      for (std::size_t k = 0; k < counts[p]; ++k) MPI_CHECK(all[at++] == p + 1);
    }
  }
}

MPI_TEST(all_to_all_v_with_empty_blocks) {
  mpi_communicator c(MPI_COMM_WORLD, test_options());
  int const n = c.size();
  int const r = c.rank();
  auto const un = static_cast<std::size_t>(n);
  std::vector<std::size_t> sc(un), rc(un);
  std::vector<std::uint8_t> in;
  for (int p = 0; p < n; ++p) {
    sc[static_cast<std::size_t>(p)] =
        static_cast<std::size_t>((r * 3 + p) % 4);  // r sends this to p
    rc[static_cast<std::size_t>(p)] =
        static_cast<std::size_t>((p * 3 + r) % 4);  // p sends this to r
    for (std::size_t k = 0; k < sc[static_cast<std::size_t>(p)]; ++k)
      in.push_back(static_cast<std::uint8_t>(16 * r + p));
  }
  std::vector<std::uint8_t> out(std::accumulate(rc.begin(), rc.end(), std::size_t{0}));
  c.all_to_all_v(cbytes_of(in), sc, bytes_of(out), rc);
  std::size_t at = 0;
  for (int p = 0; p < n; ++p) {
    for (std::size_t k = 0; k < rc[static_cast<std::size_t>(p)]; ++k)
      MPI_CHECK(out[at++] == 16 * p + r);
  }
}

MPI_TEST(broadcast_from_every_root) {
  mpi_communicator c(MPI_COMM_WORLD, test_options());
  for (int root = 0; root < c.size(); ++root) {
    std::vector<std::int64_t> v(17, c.rank() == root ? -root - 1 : 99);
    c.broadcast(bytes_of(v), root);
    for (auto x : v) MPI_CHECK(x == -root - 1);
    std::vector<std::byte> empty;
    c.broadcast(empty, root);
  }
}

MPI_TEST(send_recv_in_order_per_tag) {
  mpi_communicator c(MPI_COMM_WORLD, test_options());
  int const n = c.size();
  int const to = (c.rank() + 1) % n;
  int const from = (c.rank() + n - 1) % n;
  // Three messages on tag 1 and one on tag 2, received tag 2 first: per-tag order holds.
  std::vector<std::vector<std::int32_t>> out{{c.rank(), 1}, {c.rank(), 2, 2}, {}, {c.rank(), 7}};
  std::vector<request> sends;
  sends.push_back(c.isend(cbytes_of(out[0]), to, 1));
  sends.push_back(c.isend(cbytes_of(out[1]), to, 1));
  sends.push_back(c.isend(cbytes_of(out[2]), to, 1));
  sends.push_back(c.isend(cbytes_of(out[3]), to, 2));
  std::vector<std::int32_t> t2(2), a(2), b(3), e;
  c.recv(bytes_of(t2), from, 2);
  c.recv(bytes_of(a), from, 1);
  c.recv(bytes_of(b), from, 1);
  c.recv(bytes_of(e), from, 1);
  wait_all(sends);
  MPI_CHECK(t2 == std::vector<std::int32_t>{from, 7});
  MPI_CHECK(a == std::vector<std::int32_t>{from, 1});
  MPI_CHECK(b == std::vector<std::int32_t>{from, 2, 2});
}

MPI_TEST(non_blocking_operations_overlap) {
  mpi_communicator c(MPI_COMM_WORLD, test_options());
  int const n = c.size();
  std::vector<float> big(1 << 18);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(value(c.rank(), i));
  std::vector<half> h(999, from_float<half>(static_cast<float>(c.rank()) * 0.5f));
  std::vector<std::int32_t> mine{c.rank()}, all(static_cast<std::size_t>(n));
  std::vector<std::int32_t> msg{c.rank() * 11}, got(1);
  std::vector<request> reqs;
  reqs.push_back(c.iall_reduce(bytes_of(big), comm_type::f32, reduce_op::sum));
  reqs.push_back(c.iall_reduce(bytes_of(h), comm_type::f16, reduce_op::sum));
  reqs.push_back(c.iall_gather(cbytes_of(mine), bytes_of(all)));
  reqs.push_back(c.irecv(bytes_of(got), (c.rank() + n - 1) % n, 0));
  reqs.push_back(c.isend(cbytes_of(msg), (c.rank() + 1) % n, 0));
  // Computation while the operations are in flight.
  double acc = 0;
  for (int k = 0; k < 100000; ++k) acc += static_cast<double>(k % 7);
  MPI_CHECK(acc > 0);
  while (!reqs[0].test()) {
  }
  for (auto it = reqs.rbegin(); it != reqs.rend(); ++it) it->wait();
  for (std::size_t i = 0; i < big.size(); i += 997) {
    double e = 0;
    for (int p = 0; p < n; ++p) e += value(p, i);
    MPI_CHECK(big[i] == static_cast<float>(e));
  }
  for (half x : h) MPI_CHECK(to_float(x) == 0.25f * static_cast<float>(n * (n - 1)));
  for (int p = 0; p < n; ++p) MPI_CHECK(all[static_cast<std::size_t>(p)] == p);
  MPI_CHECK(got[0] == ((c.rank() + n - 1) % n) * 11);
}

MPI_TEST(mismatched_receive_size_is_comm_error) {
  int const n = [] {
    int s = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &s);
    return s;
  }();
  // Rank 1 expects 4 bytes where rank 0 sends 8 (MPI reports truncation), then, on a second
  // communicator, 16 bytes where rank 0 sends 8 (a short message, which gradcomp checks).
  for (std::size_t expect : {std::size_t{4}, std::size_t{16}}) {
    mpi_communicator c(MPI_COMM_WORLD, test_options());
    std::vector<std::byte> msg(8), buf(expect);
    if (c.rank() == 0) c.send(msg, 1, 3);
    if (c.rank() == 1) {
      MPI_CHECK_THROWS_AS(c.recv(buf, 0, 3), comm_error);
      MPI_CHECK(c.broken());
      MPI_CHECK_THROWS_WITH(c.barrier(), comm_error, "unusable");
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  MPI_CHECK(n >= 2);
}

MPI_TEST(unmatched_receive_times_out_with_comm_error) {
  mpi_options o = test_options();
  o.timeout = 300ms;
  mpi_communicator c(MPI_COMM_WORLD, o);
  if (c.rank() == 1) {
    std::vector<std::byte> buf(64);
    auto const t0 = std::chrono::steady_clock::now();
    MPI_CHECK_THROWS_WITH(c.recv(buf, 0, 42), comm_error, "timed out");
    auto const waited = std::chrono::steady_clock::now() - t0;
    MPI_CHECK(waited >= 300ms);
    MPI_CHECK(waited < 10s);
    MPI_CHECK(c.broken());
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

MPI_TEST(collective_without_peers_times_out_with_comm_error) {
  // Rank 0 all-reduces alone and gives up after the timeout. Its buffer stays in MPI's hands
  // (documented): the other ranks join afterwards so MPI completes the operation before
  // finalize, and the buffer lives until then.
  static std::vector<float> buf;
  buf.assign(16, 1.0f);
  mpi_options o = test_options();
  o.timeout = 300ms;
  auto c = std::make_unique<mpi_communicator>(MPI_COMM_WORLD, o);
  if (c->rank() == 0) {
    MPI_CHECK_THROWS_WITH(c->all_reduce(bytes_of(buf), comm_type::f32, reduce_op::sum), comm_error,
                          "timed out");
    MPI_CHECK(c->broken());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (c->rank() != 0) {
    c->all_reduce(bytes_of(buf), comm_type::f32, reduce_op::sum);
    for (float x : buf) MPI_CHECK(x == static_cast<float>(c->size()));
  }
  // Rank 0 keeps making progress (Testall on the abandoned operation happens inside MPI while
  // it waits here).
  MPI_Barrier(MPI_COMM_WORLD);
}

MPI_TEST(argument_errors_are_config_errors) {
  mpi_communicator c(MPI_COMM_WORLD, test_options());
  int const n = c.size();
  std::vector<std::byte> three(3), four(4);
  MPI_CHECK_THROWS_AS(c.iall_reduce(three, comm_type::f32, reduce_op::sum), config_error);
  MPI_CHECK_THROWS_AS(c.ibroadcast(four, n), config_error);
  MPI_CHECK_THROWS_AS(c.isend(four, -1, 0), config_error);
  MPI_CHECK_THROWS_AS(c.irecv(four, 0, -2), config_error);
  MPI_CHECK_THROWS_AS(c.iall_gather(three, four), config_error);
  std::vector<std::size_t> wrong(static_cast<std::size_t>(n) + 1, 0);
  MPI_CHECK_THROWS_AS(c.iall_gather_v(three, three, wrong), config_error);
  MPI_CHECK_THROWS_AS(c.ireduce_scatter(four, four, comm_type::f32, reduce_op::sum), config_error);
  mpi_options zero;
  zero.timeout = 0ms;
  MPI_CHECK_THROWS_AS(mpi_communicator(MPI_COMM_WORLD, zero), config_error);
  // None of them broke the communicator.
  MPI_CHECK(!c.broken());
  c.barrier();
}

MPI_TEST(behind_any_communicator) {
  any_communicator c = mpi_communicator(MPI_COMM_WORLD, test_options());
  std::vector<double> v(3, static_cast<double>(c.rank()));
  request q = c.iall_reduce(bytes_of(v), comm_type::f64, reduce_op::max);
  q.wait();
  for (double x : v) MPI_CHECK(x == static_cast<double>(c.size() - 1));
  MPI_CHECK(c.target<mpi_communicator>() != nullptr);
}
