// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0

#include <gradcomp/comm/any_communicator.hpp>
#include <gradcomp/comm/in_process.hpp>

#include <catch2/catch.hpp>

#include "../support/rank_check.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <stdexcept>
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

// A value of rank r at element i that sums exactly in float (small integers / 4).
float value(int r, std::size_t i) { return static_cast<float>((r * 7 + static_cast<int>(i % 13)) % 17) * 0.25f; }

}  // namespace

static_assert(communicator<in_process_communicator>);
static_assert(communicator<any_communicator>);
static_assert(!blocking_communicator<int>);

TEST_CASE("in-process all_reduce sums, max and min match a reference on 1..8 ranks", "[comm][in_process]") {
  for (int n = 1; n <= 8; ++n) {
    for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
      REQUIRE_NOTHROW(run_in_process(n, [&](in_process_communicator& c) {
        std::vector<float> s(len), mx(len), mn(len);
        for (std::size_t i = 0; i < len; ++i) s[i] = mx[i] = mn[i] = value(c.rank(), i);
        c.all_reduce(bytes_of(s), comm_type::f32, reduce_op::sum);
        c.all_reduce(bytes_of(mx), comm_type::f32, reduce_op::max);
        c.all_reduce(bytes_of(mn), comm_type::f32, reduce_op::min);
        for (std::size_t i = 0; i < len; ++i) {
          float es = 0, emx = value(0, i), emn = value(0, i);
          for (int r = 0; r < n; ++r) {
            es += value(r, i);
            emx = std::max(emx, value(r, i));
            emn = std::min(emn, value(r, i));
          }
          RANK_REQUIRE(s[i] == es);
          RANK_REQUIRE(mx[i] == emx);
          RANK_REQUIRE(mn[i] == emn);
        }
      }));
    }
  }
}

TEST_CASE("in-process all_reduce of integers and 16-bit floats", "[comm][in_process]") {
  REQUIRE_NOTHROW(run_in_process(3, [](in_process_communicator& c) {
    std::vector<std::int64_t> a{c.rank() + 1, -(c.rank() + 1), std::int64_t{1} << 40};
    c.all_reduce(bytes_of(a), comm_type::i64, reduce_op::sum);
    RANK_REQUIRE(a == std::vector<std::int64_t>{6, -6, std::int64_t{3} << 40});
    std::vector<half> h{half(1.5f), half(static_cast<float>(c.rank()))};
    c.all_reduce(bytes_of(h), comm_type::f16, reduce_op::sum);
    RANK_REQUIRE(to_float(h[0]) == 4.5f);
    RANK_REQUIRE(to_float(h[1]) == 3.0f);
    std::vector<bfloat16> b{bfloat16(static_cast<float>(-c.rank()))};
    c.all_reduce(bytes_of(b), comm_type::bf16, reduce_op::min);
    RANK_REQUIRE(to_float(b[0]) == -2.0f);
  }));
}

TEST_CASE("in-process reduce_scatter, all_gather, all_gather_v, all_to_all_v, broadcast", "[comm][in_process]") {
  for (int n : {1, 2, 3, 5}) {
    REQUIRE_NOTHROW(run_in_process(n, [n](in_process_communicator& c) {
      int const r = c.rank();
      // reduce_scatter: block b of rank r holds r + b; rank b gets sum_r (r + b).
      std::vector<std::int32_t> in(static_cast<std::size_t>(n) * 2), out(2);
      for (int b = 0; b < n; ++b) in[static_cast<std::size_t>(b) * 2] = in[static_cast<std::size_t>(b) * 2 + 1] = r + b;
      c.reduce_scatter(cbytes_of(in), bytes_of(out), comm_type::i32, reduce_op::sum);
      RANK_REQUIRE(out[0] == n * (n - 1) / 2 + n * r);
      RANK_REQUIRE(out[1] == out[0]);
      // all_gather
      std::vector<std::int32_t> mine{r, 10 * r}, all(static_cast<std::size_t>(2 * n));
      c.all_gather(cbytes_of(mine), bytes_of(all));
      for (int p = 0; p < n; ++p) {
        RANK_REQUIRE(all[static_cast<std::size_t>(2 * p)] == p);
        RANK_REQUIRE(all[static_cast<std::size_t>(2 * p + 1)] == 10 * p);
      }
      // all_gather_v: rank p contributes p bytes (rank 0 nothing).
      std::vector<std::size_t> counts(static_cast<std::size_t>(n));
      std::iota(counts.begin(), counts.end(), std::size_t{0});
      std::vector<std::uint8_t> v(static_cast<std::size_t>(r), static_cast<std::uint8_t>(r));
      std::vector<std::uint8_t> g(static_cast<std::size_t>(n * (n - 1) / 2));
      c.all_gather_v(cbytes_of(v), bytes_of(g), counts);
      std::size_t at = 0;
      for (int p = 0; p < n; ++p) {
        for (int k = 0; k < p; ++k) RANK_REQUIRE(g[at++] == p);
      }
      // all_to_all_v: rank r sends (r + p) bytes of value 16 r + p to peer p.
      std::vector<std::size_t> sc(static_cast<std::size_t>(n)), rc(static_cast<std::size_t>(n));
      std::vector<std::uint8_t> sbuf, rbuf;
      for (int p = 0; p < n; ++p) {
        sc[static_cast<std::size_t>(p)] = static_cast<std::size_t>(r + p);
        rc[static_cast<std::size_t>(p)] = static_cast<std::size_t>(p + r);
        sbuf.insert(sbuf.end(), static_cast<std::size_t>(r + p), static_cast<std::uint8_t>(16 * r + p));
      }
      rbuf.resize(std::accumulate(rc.begin(), rc.end(), std::size_t{0}));
      c.all_to_all_v(cbytes_of(sbuf), sc, bytes_of(rbuf), rc);
      at = 0;
      for (int p = 0; p < n; ++p) {
        for (int k = 0; k < p + r; ++k) RANK_REQUIRE(rbuf[at++] == 16 * p + r);
      }
      // broadcast from the last rank
      std::vector<double> bc{r == n - 1 ? 2.5 : 0.0, static_cast<double>(r)};
      c.broadcast(bytes_of(bc), n - 1);
      RANK_REQUIRE(bc == std::vector<double>{2.5, static_cast<double>(n - 1)});
      c.barrier();
    }));
  }
}

TEST_CASE("in-process send/recv match in order, also when receives are waited out of order", "[comm][in_process]") {
  REQUIRE_NOTHROW(run_in_process(2, [](in_process_communicator& c) {
    if (c.rank() == 0) {
      for (std::int32_t k = 0; k < 4; ++k) {
        std::vector<std::int32_t> m{k, k * k};
        c.send(cbytes_of(m), 1, 3);
      }
      std::vector<std::int32_t> other{99};
      c.send(cbytes_of(other), 1, 4);
    } else {
      std::vector<std::vector<std::int32_t>> got(4, std::vector<std::int32_t>(2));
      std::vector<request> rs;
      for (auto& g : got) rs.push_back(c.irecv(bytes_of(g), 0, 3));
      std::vector<std::int32_t> other(1);
      c.recv(bytes_of(other), 0, 4);
      RANK_REQUIRE(other[0] == 99);
      for (std::size_t k = rs.size(); k-- > 0;) rs[k].wait();
      for (std::int32_t k = 0; k < 4; ++k) RANK_REQUIRE(got[static_cast<std::size_t>(k)] == std::vector<std::int32_t>{k, k * k});
    }
  }));
}

TEST_CASE("in-process non-blocking collectives overlap and complete in any wait order", "[comm][in_process]") {
  REQUIRE_NOTHROW(run_in_process(4, [](in_process_communicator& c) {
    std::vector<float> a(100, 1.0f), b(50, 2.0f);
    request ra = c.iall_reduce(bytes_of(a), comm_type::f32, reduce_op::sum);
    request rb = c.iall_reduce(bytes_of(b), comm_type::f32, reduce_op::sum);
    rb.wait();
    RANK_REQUIRE(b[49] == 8.0f);
    while (!ra.test()) std::this_thread::yield();
    ra.wait();
    RANK_REQUIRE(a[0] == 4.0f);
  }));
}

TEST_CASE("in-process any_communicator forwards every operation", "[comm][in_process]") {
  REQUIRE_NOTHROW(run_in_process(3, [](in_process_communicator& c) {
    any_communicator a(c);
    RANK_REQUIRE(a.rank() == c.rank());
    RANK_REQUIRE(a.size() == 3);
    RANK_REQUIRE(a.target<in_process_communicator>() != nullptr);
    std::vector<std::uint32_t> v{static_cast<std::uint32_t>(a.rank())};
    a.iall_reduce(bytes_of(v), comm_type::u32, reduce_op::max).wait();
    RANK_REQUIRE(v[0] == 2u);
  }));
}

TEST_CASE("in-process any_communicator::borrow refers to the caller's communicator",
          "[comm][in_process]") {
  REQUIRE_NOTHROW(run_in_process(3, [](in_process_communicator& c) {
    any_communicator a = any_communicator::borrow(c);
    any_communicator const copy = a;  // copies refer to the same communicator
    RANK_REQUIRE(a.rank() == c.rank());
    RANK_REQUIRE(copy.size() == 3);
    RANK_REQUIRE(a.target<in_process_communicator>() == &c);  // the caller's object, not a copy
    std::vector<std::uint32_t> v{static_cast<std::uint32_t>(a.rank()) + 1u};
    a.all_reduce(bytes_of(v), comm_type::u32, reduce_op::sum);
    RANK_REQUIRE(v[0] == 6u);
    v[0] = static_cast<std::uint32_t>(c.rank());
    a.iall_reduce(bytes_of(v), comm_type::u32, reduce_op::max).wait();
    RANK_REQUIRE(v[0] == 2u);
  }));
}

TEST_CASE("in-process mismatched collectives are a comm_error on every rank", "[comm][in_process][errors]") {
  in_process_world world(2, 5s);
  std::atomic<int> errors{0};
  auto body = [&](int r) {
    auto c = world.communicator(r);
    std::vector<float> v(r == 0 ? 4 : 5);
    try {
      c.all_reduce(bytes_of(v), comm_type::f32, reduce_op::sum);
    } catch (comm_error const& e) {
      if (std::string(e.what()).find("all_reduce") != std::string::npos) ++errors;
      
    }
  };
  std::thread t(body, 1);
  body(0);
  t.join();
  REQUIRE(errors == 2);
  REQUIRE(world.broken());
}

TEST_CASE("in-process timeouts, failed and departed ranks give comm_error, not a hang", "[comm][in_process][errors]") {
  SECTION("a peer that never joins: timeout naming it") {
    in_process_world world(2, 200ms);
    auto c = world.communicator(0);
    std::vector<float> v(3);
    REQUIRE_THROWS_AS(c.all_reduce(bytes_of(v), comm_type::f32, reduce_op::sum), comm_error);
    REQUIRE_THROWS_WITH(c.barrier(), Catch::Contains("unusable"));
  }
  SECTION("a rank that throws: the others fail at once, its own exception is rethrown") {
    auto const t0 = std::chrono::steady_clock::now();
    REQUIRE_THROWS_WITH(run_in_process(
                            3,
                            [](in_process_communicator& c) {
                              if (c.rank() == 1) throw std::runtime_error("boom in rank 1");
                              c.barrier();
                            },
                            60s),
                        "boom in rank 1");
    REQUIRE(std::chrono::steady_clock::now() - t0 < 30s);
  }
  SECTION("a rank that returns early: peers waiting on it fail at once") {
    std::atomic<int> errors{0};
    REQUIRE_NOTHROW(run_in_process(
        2,
        [&](in_process_communicator& c) {
          if (c.rank() == 1) return;
          try {
            std::vector<std::byte> b(8);
            c.recv(b, 1, 0);
          } catch (comm_error const& e) {
            RANK_REQUIRE(std::string(e.what()).find("left") != std::string::npos);
            ++errors;
          }
        },
        60s));
    REQUIRE(errors == 1);
  }
  SECTION("a message of the wrong size") {
    REQUIRE_THROWS_AS(run_in_process(2,
                                     [](in_process_communicator& c) {
                                       std::vector<std::byte> b(c.rank() == 0 ? 4 : 8);
                                       if (c.rank() == 0) c.send(b, 1, 0);
                                       else c.recv(b, 0, 0);
                                     }),
                      comm_error);
  }
}

TEST_CASE("in-process argument errors are config_error", "[comm][in_process][errors]") {
  in_process_world world(2);
  auto c = world.communicator(0);
  std::vector<std::byte> b(6), big(12);
  REQUIRE_THROWS_AS(c.iall_reduce(b, comm_type::f32, reduce_op::sum), config_error);
  REQUIRE_THROWS_AS(c.iall_gather(b, b), config_error);
  REQUIRE_THROWS_AS(c.ireduce_scatter(b, b, comm_type::u8, reduce_op::sum), config_error);
  REQUIRE_THROWS_AS(c.isend(b, 2, 0), config_error);
  REQUIRE_THROWS_AS(c.irecv(b, -1, 0), config_error);
  REQUIRE_THROWS_AS(c.isend(b, 1, -1), config_error);
  REQUIRE_THROWS_AS(c.ibroadcast(b, 5), config_error);
  std::vector<std::size_t> counts{6};
  REQUIRE_THROWS_AS(c.iall_gather_v(b, big, counts), config_error);
  REQUIRE_THROWS_AS(world.communicator(2), config_error);
  REQUIRE_THROWS_AS(in_process_world(0), config_error);
  REQUIRE_FALSE(world.broken());
}
