// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// fault_injecting_communicator (comm/fault.hpp): each fault does what its documentation says,
// at the operation it names, on the rank it names, and only there.

#include <gradcomp/comm/any_communicator.hpp>
#include <gradcomp/comm/fault.hpp>
#include <gradcomp/comm/in_process.hpp>

#include "../support/rank_check.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace gc = gradcomp;
using namespace std::chrono_literals;

namespace {

using fcomm = gc::fault_injecting_communicator<gc::in_process_communicator>;

static_assert(gc::communicator<fcomm>);
static_assert(gc::communicator<gc::fault_injecting_communicator<gc::in_process_communicator&>>);
static_assert(gc::communicator<gc::fault_injecting_communicator<gc::any_communicator>>);
static_assert(!std::is_copy_constructible_v<fcomm>);

enum class end { ok, dropped, comm, format, other };

// Runs `fn(comm)` on `n` ranks, each wrapped with `plan`; a rank that throws leaves the world
// (so its peers fail at once on it). Returns how each rank ended.
template <class Fn>
std::vector<end> run(int n, gc::fault_plan plan, Fn fn, std::chrono::milliseconds timeout = 200ms) {
  gc::in_process_world world(n, timeout);
  std::atomic<int> dropped_calls{0};
  plan.on_drop = [&](int r) {
    ++dropped_calls;
    world.leave(r);
  };
  std::vector<end> how(static_cast<std::size_t>(n), end::ok);
  auto body = [&](int r) {
    fcomm c(world.communicator(r), plan);
    try {
      fn(c);
    } catch (gc::rank_dropped const&) {
      how[static_cast<std::size_t>(r)] = end::dropped;
    } catch (gc::comm_error const&) {
      how[static_cast<std::size_t>(r)] = end::comm;
    } catch (gc::format_error const&) {
      how[static_cast<std::size_t>(r)] = end::format;
    } catch (...) {
      how[static_cast<std::size_t>(r)] = end::other;
    }
    world.leave(r);
  };
  std::vector<std::thread> t;
  for (int r = 1; r < n; ++r) t.emplace_back(body, r);
  body(0);
  for (auto& x : t) x.join();
  return how;
}

std::span<std::byte> bytes_of(std::vector<float>& v) {
  return std::as_writable_bytes(std::span<float>(v));
}

}  // namespace

TEST_CASE("fault_injecting_communicator counts operations and passes clean ones through",
          "[faults][comm]") {
  std::vector<std::vector<float>> sums(3);
  auto how = run(3, {}, [&](fcomm& c) {
    std::vector<float> v(8, static_cast<float>(c.rank() + 1));
    c.all_reduce(bytes_of(v), gc::comm_type::f32, gc::reduce_op::sum);
    c.barrier();
    std::vector<float> g(3 * 8);
    c.all_gather(std::as_bytes(std::span<float const>(v)), bytes_of(g));
    RANK_REQUIRE(c.operations() == 3);
    RANK_REQUIRE(c.operations(gc::comm_operation::all_reduce) == 1);
    RANK_REQUIRE(c.operations(gc::comm_operation::barrier) == 1);
    RANK_REQUIRE(c.events().empty() && !c.faulted() && !c.dropped());
    sums[static_cast<std::size_t>(c.rank())] = v;
  });
  for (auto h : how) REQUIRE(h == end::ok);
  for (auto const& s : sums) REQUIRE(s == std::vector<float>(8, 6.0f));
}

TEST_CASE("fault_injecting_communicator: corruption on the send and on the receive side",
          "[faults][comm]") {
  for (gc::fault_side side : {gc::fault_side::send, gc::fault_side::receive}) {
    CAPTURE(static_cast<int>(side));
    gc::fault f;
    f.kind = gc::fault_kind::corrupt;
    f.rank = 1;
    f.of = gc::comm_operation::all_reduce;
    f.index = 1;  // the second all-reduce
    f.side = side;
    f.byte = 4 * 5 + 2;  // the third byte of element 5 (little-endian float32) ...
    f.mask = 0x80;  // ... whose top bit is the exponent's lowest: the element doubles or halves
    std::vector<std::vector<float>> got(3);
    std::vector<std::size_t> events(3);
    auto how = run(3, gc::fault_plan{{f}, {}}, [&](fcomm& c) {
      std::vector<float> v(8, 1.0f);
      c.all_reduce(bytes_of(v), gc::comm_type::f32, gc::reduce_op::sum);  // untouched: index 0
      RANK_REQUIRE(v == std::vector<float>(8, 3.0f));
      std::vector<float> w(8, static_cast<float>(c.rank() + 1));
      c.all_reduce(bytes_of(w), gc::comm_type::f32, gc::reduce_op::sum);
      got[static_cast<std::size_t>(c.rank())] = w;
      events[static_cast<std::size_t>(c.rank())] = c.events().size();
      if (c.rank() == 1)
        RANK_REQUIRE(c.events().size() == 1 && c.events()[0].effective && c.events()[0].index == 1);
    });
    for (auto h : how) REQUIRE(h == end::ok);
    REQUIRE(events == std::vector<std::size_t>{0, 1, 0});
    for (int r = 0; r < 3; ++r) {
      auto const& w = got[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < w.size(); ++i) {
        bool const hit = i == 5 && (side == gc::fault_side::send || r == 1);
        // send side: rank 1 contributes 2 -> 4, so element 5 sums to 8 on every rank; receive
        // side: only rank 1 reads 6 -> 3 there.
        float const expect = hit ? (side == gc::fault_side::send ? 8.0f : 3.0f) : 6.0f;
        CAPTURE(r, i);
        REQUIRE(w[i] == expect);
      }
    }
  }
}

TEST_CASE("fault_injecting_communicator: a fault with nothing to act on is not effective",
          "[faults][comm]") {
  gc::fault f;
  f.kind = gc::fault_kind::corrupt;
  f.side = gc::fault_side::send;
  f.rank = 1;
  f.of = gc::comm_operation::recv;  // a receive sends nothing
  std::vector<float> got;
  auto how = run(2, gc::fault_plan{{f}, {}}, [&](fcomm& c) {
    std::vector<float> v{1.0f, 2.0f, 3.0f};
    if (c.rank() == 0) {
      c.send(std::as_bytes(std::span<float const>(v)), 1, 7);
    } else {
      std::vector<float> in(3);
      c.recv(bytes_of(in), 0, 7);
      got = in;
      RANK_REQUIRE(c.events().size() == 1 && !c.events()[0].effective && !c.faulted());
    }
  });
  for (auto h : how) REQUIRE(h == end::ok);
  REQUIRE(got == std::vector<float>{1.0f, 2.0f, 3.0f});
}

TEST_CASE("fault_injecting_communicator: drop, stall, truncate end in comm_error on every rank",
          "[faults][comm]") {
  auto step = [](fcomm& c) {
    std::vector<float> v(16, 1.0f);
    c.all_reduce(bytes_of(v), gc::comm_type::f32, gc::reduce_op::sum);
    std::vector<float> g(16 * static_cast<std::size_t>(c.size()));
    c.all_gather(std::as_bytes(std::span<float const>(v)), bytes_of(g));
  };
  SECTION("drop: the rank exits; its later operations throw rank_dropped") {
    gc::fault f{.kind = gc::fault_kind::drop, .rank = 2, .index = 1};
    auto const t0 = std::chrono::steady_clock::now();
    auto how = run(3, gc::fault_plan{{f}, {}}, step);
    REQUIRE(how == std::vector<end>{end::comm, end::comm, end::dropped});
    REQUIRE(std::chrono::steady_clock::now() - t0 < 150ms);  // the peers see it leave at once
  }
  SECTION("stall past the timeout") {
    gc::fault f{.kind = gc::fault_kind::stall, .rank = 0, .index = 0, .duration = 300ms};
    auto how = run(3, gc::fault_plan{{f}, {}}, step);
    REQUIRE(how == std::vector<end>{end::comm, end::comm, end::comm});
  }
  SECTION("truncate: the in-process transport sees the lengths differ") {
    for (std::uint64_t i : {0u, 1u}) {
      gc::fault f{.kind = gc::fault_kind::truncate, .rank = 1, .index = i};
      auto how = run(3, gc::fault_plan{{f}, {}}, step);
      REQUIRE(how == std::vector<end>{end::comm, end::comm, end::comm});
    }
  }
  SECTION("a stall without a duration is a configuration error") {
    gc::in_process_world world(1);
    gc::fault f{.kind = gc::fault_kind::stall};
    REQUIRE_THROWS_AS(fcomm(world.communicator(0), gc::fault_plan{{f}, {}}), gc::config_error);
  }
}

TEST_CASE("fault_injecting_communicator: delay and duplicate", "[faults][comm]") {
  SECTION("a delay within the timeout changes nothing") {
    gc::fault f{.kind = gc::fault_kind::delay, .rank = 1, .index = 0, .duration = 30ms};
    std::vector<std::vector<float>> got(3);
    auto how = run(3, gc::fault_plan{{f}, {}}, [&](fcomm& c) {
      std::vector<float> v(4, static_cast<float>(c.rank()));
      c.all_reduce(bytes_of(v), gc::comm_type::f32, gc::reduce_op::sum);
      got[static_cast<std::size_t>(c.rank())] = v;
    });
    for (auto h : how) REQUIRE(h == end::ok);
    for (auto const& v : got) REQUIRE(v == std::vector<float>(4, 3.0f));
  }
  SECTION("a duplicated send arrives twice") {
    gc::fault f{.kind = gc::fault_kind::duplicate, .rank = 0, .of = gc::comm_operation::send};
    std::vector<float> first(2), second(2);
    auto how = run(2, gc::fault_plan{{f}, {}}, [&](fcomm& c) {
      if (c.rank() == 0) {
        std::vector<float> v{4.0f, 5.0f};
        c.send(std::as_bytes(std::span<float const>(v)), 1, 3);
      } else {
        c.recv(bytes_of(first), 0, 3);
        c.recv(bytes_of(second), 0, 3);
      }
    });
    for (auto h : how) REQUIRE(h == end::ok);
    REQUIRE(first == std::vector<float>{4.0f, 5.0f});
    REQUIRE(second == first);
  }
}
