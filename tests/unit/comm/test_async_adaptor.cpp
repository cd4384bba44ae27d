// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0

#include <gradcomp/comm/any_communicator.hpp>
#include <gradcomp/comm/async_adaptor.hpp>
#include <gradcomp/comm/in_process.hpp>

#include <catch2/catch.hpp>

#include "../support/rank_check.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace gradcomp;
using namespace std::chrono_literals;

namespace {

// The in-process communicator seen through its blocking operations only: what a user's own
// transport provides.
struct blocking_only {
  using communicator_concept = communicator_tag;
  in_process_communicator c;

  [[nodiscard]] int rank() const { return c.rank(); }
  [[nodiscard]] int size() const { return c.size(); }
  void barrier() { c.barrier(); }
  void broadcast(std::span<std::byte> b, int root) { c.broadcast(b, root); }
  void all_reduce(std::span<std::byte> b, comm_type t, reduce_op op) { c.all_reduce(b, t, op); }
  void reduce_scatter(std::span<std::byte const> in, std::span<std::byte> out, comm_type t,
                      reduce_op op) {
    c.reduce_scatter(in, out, t, op);
  }
  void all_gather(std::span<std::byte const> in, std::span<std::byte> out) {
    c.all_gather(in, out);
  }
  void all_gather_v(std::span<std::byte const> in, std::span<std::byte> out,
                    std::span<std::size_t const> n) {
    c.all_gather_v(in, out, n);
  }
  void all_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> sc,
                    std::span<std::byte> out, std::span<std::size_t const> rc) {
    c.all_to_all_v(in, sc, out, rc);
  }
  void send(std::span<std::byte const> in, int peer, int tag) { c.send(in, peer, tag); }
  void recv(std::span<std::byte> out, int peer, int tag) { c.recv(out, peer, tag); }
};

// One rank whose all_reduce always fails and whose barrier records the thread it ran on.
struct failing_one_rank {
  using communicator_concept = communicator_tag;
  std::thread::id* barrier_thread = nullptr;

  [[nodiscard]] int rank() const { return 0; }
  [[nodiscard]] int size() const { return 1; }
  void barrier() { *barrier_thread = std::this_thread::get_id(); }
  void broadcast(std::span<std::byte>, int) {}
  void all_reduce(std::span<std::byte>, comm_type, reduce_op) {
    throw comm_error("test: the link went down");
  }
  void reduce_scatter(std::span<std::byte const>, std::span<std::byte>, comm_type, reduce_op) {}
  void all_gather(std::span<std::byte const>, std::span<std::byte>) {}
  void all_gather_v(std::span<std::byte const>, std::span<std::byte>,
                    std::span<std::size_t const>) {}
  void all_to_all_v(std::span<std::byte const>, std::span<std::size_t const>, std::span<std::byte>,
                    std::span<std::size_t const>) {}
  void send(std::span<std::byte const>, int, int) {}
  void recv(std::span<std::byte>, int, int) {}
};

template <class T>
std::span<std::byte> bytes_of(std::vector<T>& v) {
  return std::as_writable_bytes(std::span(v));
}
template <class T>
std::span<std::byte const> cbytes_of(std::vector<T> const& v) {
  return std::as_bytes(std::span(v));
}

float value(int r, std::size_t i) {
  return static_cast<float>((r * 5 + static_cast<int>(i % 11)) % 19) * 0.5f;
}

}  // namespace

static_assert(blocking_communicator<blocking_only>);
static_assert(!communicator<blocking_only>);
static_assert(communicator<async_adaptor<blocking_only>>);
static_assert(communicator<async_adaptor<failing_one_rank>>);

TEST_CASE("async_adaptor: every operation matches a reference on 1..5 ranks",
          "[comm][async_adaptor]") {
  for (int n = 1; n <= 5; ++n) {
    REQUIRE_NOTHROW(run_in_process(n, [n](in_process_communicator& ic) {
      async_adaptor<blocking_only> c(blocking_only{ic});
      int const r = c.rank();
      RANK_REQUIRE(r == ic.rank());
      RANK_REQUIRE(c.size() == n);
      auto const un = static_cast<std::size_t>(n);

      // all_reduce, odd length
      std::vector<float> s(13);
      for (std::size_t i = 0; i < s.size(); ++i) s[i] = value(r, i);
      c.all_reduce(bytes_of(s), comm_type::f32, reduce_op::sum);
      for (std::size_t i = 0; i < s.size(); ++i) {
        float e = 0;
        for (int p = 0; p < n; ++p) e += value(p, i);
        RANK_REQUIRE(s[i] == e);
      }

      // reduce_scatter: block of 3 ints per rank
      std::vector<std::int32_t> in(3 * un);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::int32_t>(i) * (r + 1);
      std::vector<std::int32_t> out(3);
      c.reduce_scatter(cbytes_of(in), bytes_of(out), comm_type::i32, reduce_op::max);
      for (std::size_t i = 0; i < 3; ++i) {
        RANK_REQUIRE(out[i] == static_cast<std::int32_t>(3 * static_cast<std::size_t>(r) + i) * n);
      }

      // all_gather
      std::vector<std::uint8_t> mine{static_cast<std::uint8_t>(r),
                                     static_cast<std::uint8_t>(100 + r)};
      std::vector<std::uint8_t> all(2 * un);
      c.all_gather(cbytes_of(mine), bytes_of(all));
      for (int p = 0; p < n; ++p) {
        RANK_REQUIRE(all[2 * static_cast<std::size_t>(p)] == p);
        RANK_REQUIRE(all[2 * static_cast<std::size_t>(p) + 1] == 100 + p);
      }

      // all_gather_v: rank p contributes p bytes of value p (rank 0 contributes nothing)
      std::vector<std::size_t> counts(un);
      std::iota(counts.begin(), counts.end(), std::size_t{0});
      std::vector<std::uint8_t> v(static_cast<std::size_t>(r), static_cast<std::uint8_t>(r));
      std::vector<std::uint8_t> gv(un * (un - 1) / 2);
      c.all_gather_v(cbytes_of(v), bytes_of(gv), counts);
      std::size_t at = 0;
      for (int p = 0; p < n; ++p) {
        for (int k = 0; k < p; ++k) RANK_REQUIRE(gv[at++] == p);
      }

      // all_to_all_v: rank r sends (r + p) % 3 bytes of value 10 * r + p to peer p
      std::vector<std::size_t> sc(un), rc(un);
      std::vector<std::uint8_t> a2a_in;
      for (int p = 0; p < n; ++p) {
        sc[static_cast<std::size_t>(p)] = static_cast<std::size_t>((r + p) % 3);
        rc[static_cast<std::size_t>(p)] = static_cast<std::size_t>((p + r) % 3);
        a2a_in.insert(a2a_in.end(), sc[static_cast<std::size_t>(p)],
                      static_cast<std::uint8_t>(10 * r + p));
      }
      std::vector<std::uint8_t> a2a_out(std::accumulate(rc.begin(), rc.end(), std::size_t{0}));
      c.all_to_all_v(cbytes_of(a2a_in), sc, bytes_of(a2a_out), rc);
      at = 0;
      for (int p = 0; p < n; ++p) {
        for (std::size_t k = 0; k < rc[static_cast<std::size_t>(p)]; ++k)
          RANK_REQUIRE(a2a_out[at++] == 10 * p + r);
      }

      // broadcast from the last rank
      std::vector<std::uint64_t> b(5, static_cast<std::uint64_t>(r));
      c.broadcast(bytes_of(b), n - 1);
      for (auto x : b) RANK_REQUIRE(x == static_cast<std::uint64_t>(n - 1));

      // send / recv around a ring (the in-process send is eager, so all send first)
      if (n > 1) {
        std::vector<std::int64_t> msg{r, -r, 7};
        std::vector<std::int64_t> got(3);
        c.send(cbytes_of(msg), (r + 1) % n, 3);
        c.recv(bytes_of(got), (r + n - 1) % n, 3);
        RANK_REQUIRE(got == std::vector<std::int64_t>{(r + n - 1) % n, -((r + n - 1) % n), 7});
      }
      c.barrier();
    }));
  }
}

TEST_CASE("async_adaptor: non-blocking operations run in issue order and overlap the caller",
          "[comm][async_adaptor]") {
  REQUIRE_NOTHROW(run_in_process(3, [](in_process_communicator& ic) {
    async_adaptor<blocking_only> c(blocking_only{ic});
    int const r = c.rank();
    // Four all-reduces of different sizes and types, posted before any is waited for, then
    // waited for in reverse order. The in-process world checks that every rank presents the
    // same operation at the same position, so a reordering would be a comm_error.
    std::vector<float> a(7, static_cast<float>(r));
    std::vector<std::int32_t> b(11, r + 1);
    std::vector<double> d(1, 0.5 * r);
    std::vector<half> h(5, half(static_cast<float>(r)));
    std::vector<request> reqs;
    reqs.push_back(c.iall_reduce(bytes_of(a), comm_type::f32, reduce_op::sum));
    reqs.push_back(c.iall_reduce(bytes_of(b), comm_type::i32, reduce_op::sum));
    reqs.push_back(c.iall_reduce(bytes_of(d), comm_type::f64, reduce_op::max));
    reqs.push_back(c.iall_reduce(bytes_of(h), comm_type::f16, reduce_op::sum));
    for (auto it = reqs.rbegin(); it != reqs.rend(); ++it) it->wait();
    for (float x : a) RANK_REQUIRE(x == 3.0f);
    for (std::int32_t x : b) RANK_REQUIRE(x == 6);
    RANK_REQUIRE(d[0] == 1.0);
    for (half x : h) RANK_REQUIRE(to_float(x) == 3.0f);
    for (auto& q : reqs) RANK_REQUIRE(!q.pending());
  }));
}

TEST_CASE("async_adaptor: a request is pending while a peer has not joined",
          "[comm][async_adaptor]") {
  std::atomic<bool> checked{false};
  REQUIRE_NOTHROW(run_in_process(2, [&](in_process_communicator& ic) {
    async_adaptor<blocking_only> c(blocking_only{ic});
    std::vector<float> v(4, 1.0f);
    if (c.rank() == 0) {
      request q = c.iall_reduce(bytes_of(v), comm_type::f32, reduce_op::sum);
      // Rank 1 has not posted (it waits for `checked`), so the operation cannot be complete,
      // and the caller's thread is free meanwhile.
      std::this_thread::sleep_for(20ms);
      RANK_REQUIRE(!q.test());
      checked = true;
      q.wait();
    } else {
      while (!checked) std::this_thread::sleep_for(1ms);
      c.all_reduce(bytes_of(v), comm_type::f32, reduce_op::sum);
    }
    for (float x : v) RANK_REQUIRE(x == 2.0f);
  }));
}

TEST_CASE("async_adaptor: failures reach wait(), argument errors the call",
          "[comm][async_adaptor]") {
  std::thread::id barrier_thread;
  async_adaptor<failing_one_rank> c(failing_one_rank{&barrier_thread});
  std::vector<float> v(2);
  request q = c.iall_reduce(bytes_of(v), comm_type::f32, reduce_op::sum);
  REQUIRE_THROWS_WITH(q.wait(), Catch::Contains("the link went down"));
  REQUIRE_FALSE(q.pending());
  REQUIRE_NOTHROW(q.wait());  // a second wait returns at once
  REQUIRE_THROWS_AS(c.all_reduce(bytes_of(v), comm_type::f32, reduce_op::sum), comm_error);
  // The queue carries on after a failure, on the worker thread.
  c.barrier();
  CHECK(barrier_thread != std::thread::id{});
  CHECK(barrier_thread != std::this_thread::get_id());
  // Argument errors are thrown by the call, before anything is queued.
  std::vector<std::byte> odd(3);
  CHECK_THROWS_AS(c.iall_reduce(odd, comm_type::f32, reduce_op::sum), config_error);
  CHECK_THROWS_AS(c.isend(odd, 1, 0), config_error);
  CHECK_THROWS_AS(c.irecv(odd, 0, -1), config_error);
  CHECK_THROWS_AS(c.ibroadcast(odd, 2), config_error);
  std::vector<std::byte> two(2);
  CHECK_THROWS_AS(c.iall_gather(odd, two), config_error);
  std::vector<std::size_t> counts{2, 1};
  CHECK_THROWS_AS(c.iall_gather_v(two, two, counts), config_error);
  std::vector<std::size_t> one{3};
  CHECK_THROWS_AS(c.iall_to_all_v(two, one, odd, one), config_error);
  CHECK_THROWS_AS(c.ireduce_scatter(odd, odd, comm_type::u8, static_cast<reduce_op>(9)),
                  config_error);
}

TEST_CASE("async_adaptor: a peer that leaves gives comm_error from wait(), not a hang",
          "[comm][async_adaptor]") {
  in_process_world world(2, 5s);
  std::vector<float> v(3, 1.0f);
  world.leave(1);  // rank 1 returns without taking part
  async_adaptor<blocking_only> c(blocking_only{world.communicator(0)});
  request q = c.iall_reduce(bytes_of(v), comm_type::f32, reduce_op::sum);
  REQUIRE_THROWS_AS(q.wait(), comm_error);
}

TEST_CASE("async_adaptor: destroying the adaptor finishes queued work", "[comm][async_adaptor]") {
  REQUIRE_NOTHROW(run_in_process(2, [](in_process_communicator& ic) {
    std::vector<std::int32_t> v(9, ic.rank() + 1);
    request q;
    {
      async_adaptor<blocking_only> c(blocking_only{ic});
      q = c.iall_reduce(bytes_of(v), comm_type::i32, reduce_op::sum);
    }  // the worker drains its queue before it stops
    RANK_REQUIRE(q.test());
    q.wait();
    for (auto x : v) RANK_REQUIRE(x == 3);
  }));
}

TEST_CASE("async_adaptor: behind any_communicator", "[comm][async_adaptor]") {
  REQUIRE_NOTHROW(run_in_process(4, [](in_process_communicator& ic) {
    any_communicator c = async_adaptor<blocking_only>(blocking_only{ic});
    std::vector<bfloat16> v(6, bfloat16(static_cast<float>(c.rank()) + 0.5f));
    request q = c.iall_reduce(bytes_of(v), comm_type::bf16, reduce_op::sum);
    q.wait();
    for (auto x : v) RANK_REQUIRE(to_float(x) == 8.0f);
    RANK_REQUIRE(c.target<async_adaptor<blocking_only>>() != nullptr);
  }));
}
