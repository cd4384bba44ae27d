// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// group_communicator: every operation among a subset of the parent's ranks, checked against
// what the in-process communicator gives over the same ranks (bit for bit), groups on
// overlapping ranks at the same time, non-blocking completion, argument errors, and a member
// that never takes part (comm_error at the parent's timeout, not a hang). node_grouping: the
// three ways to say it, and every way to get it wrong.

#include <gradcomp/comm/any_communicator.hpp>
#include <gradcomp/comm/group.hpp>
#include <gradcomp/comm/in_process.hpp>

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"
#include "../support/rank_check.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace gc = gradcomp;

namespace {

// Values of any sign and magnitude (so that sums round, and the order shows).
std::vector<float> values(std::size_t n, int who) {
  return gradcomp_test::heavy_tailed(n, 2654435761u * static_cast<std::uint64_t>(who + 1));
}

std::vector<std::byte> bytes_of(std::vector<float> const& v, gc::comm_type t) {
  std::vector<std::byte> out(v.size() * gc::comm_type_size(t));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (t == gc::comm_type::f32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      std::uint16_t const h =
          t == gc::comm_type::f16 ? gc::float_to_half_bits(v[i]) : gc::float_to_bfloat16_bits(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// The in-process communicator's all-reduce of `contributions` (one per rank, in rank order).
std::vector<std::byte> in_process_all_reduce(
    std::vector<std::vector<std::byte>> const& contributions, gc::comm_type t, gc::reduce_op op) {
  std::vector<std::byte> result;
  std::mutex m;
  gc::run_in_process(static_cast<int>(contributions.size()), [&](gc::in_process_communicator& c) {
    std::vector<std::byte> buf = contributions[static_cast<std::size_t>(c.rank())];
    c.all_reduce(buf, t, op);
    std::lock_guard lock(m);
    if (c.rank() == 0) result = buf;
  });
  return result;
}

}  // namespace

TEST_CASE("group all-reduce equals the in-process all-reduce over the same ranks, bit for bit",
          "[comm][group]") {
  // 7 ranks: the odd ones in reverse order (group rank i is members[i]), and the even ones.
  std::vector<int> const odd{5, 3, 1}, even{0, 2, 4, 6};
  for (gc::comm_type t : {gc::comm_type::f32, gc::comm_type::f16, gc::comm_type::bf16}) {
    for (gc::reduce_op op : {gc::reduce_op::sum, gc::reduce_op::max, gc::reduce_op::min}) {
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{1001}}) {
        CAPTURE(gc::comm_type_name(t), gc::reduce_op_name(op), n);
        auto contribution = [&](int parent_rank) { return bytes_of(values(n, parent_rank), t); };
        std::vector<std::vector<std::byte>> odd_in, even_in;
        for (int r : odd) odd_in.push_back(contribution(r));
        for (int r : even) even_in.push_back(contribution(r));
        std::vector<std::byte> const want_odd = in_process_all_reduce(odd_in, t, op);
        std::vector<std::byte> const want_even = in_process_all_reduce(even_in, t, op);
        REQUIRE_NOTHROW(gc::run_in_process(7, [&](gc::in_process_communicator& comm) {
          bool const is_odd = comm.rank() % 2 == 1;
          gc::group_communicator group(comm, is_odd ? odd : even);
          RANK_REQUIRE(group.size() == (is_odd ? 3 : 4));
          RANK_REQUIRE(group.parent_rank(group.rank()) == comm.rank());
          std::vector<std::byte> buf = contribution(comm.rank());
          group.all_reduce(buf, t, op);
          RANK_REQUIRE(buf == (is_odd ? want_odd : want_even));
        }));
      }
    }
  }
}

TEST_CASE("group gathers, all-to-all, broadcast and reduce-scatter deliver what was sent",
          "[comm][group]") {
  std::vector<int> const members{4, 0, 2};  // group ranks 0, 1, 2 of a world of 5
  REQUIRE_NOTHROW(gc::run_in_process(5, [&](gc::in_process_communicator& comm) {
    if (comm.rank() % 2 == 1) return;  // ranks 1 and 3 are not in the group
    gc::group_communicator group(comm, members);
    int const me = group.rank();
    auto const g = static_cast<std::size_t>(group.size());
    // all_gather: blocks of 3 bytes, each filled with its sender's group rank.
    std::vector<std::byte> mine(3, std::byte(me + 10)), all(3 * g);
    group.all_gather(mine, all);
    for (std::size_t q = 0; q < g; ++q) RANK_REQUIRE(all[3 * q + 2] == std::byte(q + 10));
    // all_gather_v: rank q contributes q bytes (rank 0 nothing).
    std::vector<std::size_t> counts{0, 1, 2};
    std::vector<std::byte> vin(counts[static_cast<std::size_t>(me)], std::byte(me + 20)), vout(3);
    group.all_gather_v(vin, vout, counts);
    RANK_REQUIRE((vout == std::vector<std::byte>{std::byte(21), std::byte(22), std::byte(22)}));
    // all_to_all_v: rank a sends a + b + 1 bytes of value 16 a + b to rank b.
    std::vector<std::size_t> sc(g), rc(g);
    std::vector<std::byte> ain, aout;
    for (std::size_t b = 0; b < g; ++b) {
      sc[b] = static_cast<std::size_t>(me) + b + 1;
      rc[b] = b + static_cast<std::size_t>(me) + 1;
      ain.insert(ain.end(), sc[b], std::byte(16 * me + static_cast<int>(b)));
    }
    aout.resize(rc[0] + rc[1] + rc[2]);
    group.all_to_all_v(ain, sc, aout, rc);
    std::size_t at = 0;
    for (std::size_t a = 0; a < g; ++a) {
      for (std::size_t i = 0; i < rc[a]; ++i)
        RANK_REQUIRE(aout[at + i] == std::byte(16 * a + static_cast<std::size_t>(me)));
      at += rc[a];
    }
    // broadcast from group rank 2 (parent rank 2).
    std::vector<std::byte> b(4, std::byte(me == 2 ? 77 : 0));
    group.broadcast(b, 2);
    RANK_REQUIRE(b == std::vector<std::byte>(4, std::byte(77)));
    // reduce_scatter of u32: rank q contributes q + 1 in every element; block b has 2 elements.
    std::vector<std::uint32_t> rin(2 * g, static_cast<std::uint32_t>(me + 1)), rout(2);
    group.reduce_scatter(std::as_bytes(std::span<std::uint32_t const>(rin)),
                         std::as_writable_bytes(std::span(rout)), gc::comm_type::u32,
                         gc::reduce_op::sum);
    RANK_REQUIRE(rout[0] == 6u && rout[1] == 6u);
    // in place: `out` is this rank's own block of `in`
    std::vector<std::uint32_t> inplace(2 * g, static_cast<std::uint32_t>(me + 1));
    auto const whole = std::as_writable_bytes(std::span(inplace));
    group.reduce_scatter(whole, whole.subspan(8 * static_cast<std::size_t>(me), 8),
                         gc::comm_type::u32, gc::reduce_op::sum);
    RANK_REQUIRE(inplace[2 * static_cast<std::size_t>(me)] == 6u);
    group.barrier();
    // point to point, ranks translated, the caller's tag kept.
    std::vector<std::byte> msg(5, std::byte(me + 1)), got(5);
    int const next = (me + 1) % group.size(), prev = (me + group.size() - 1) % group.size();
    gc::request r = group.irecv(got, prev, 7);
    group.send(msg, next, 7);
    r.wait();
    RANK_REQUIRE(got == std::vector<std::byte>(5, std::byte(prev + 1)));
  }));
}

TEST_CASE("groups on overlapping ranks run at the same time; requests complete in wait or test",
          "[comm][group]") {
  // 2 nodes of 3 ranks: node groups {0,1,2}, {3,4,5}, lanes {0,3}, {1,4}, {2,5}; each rank posts
  // an all-reduce in its node and one in its lane before waiting for either.
  REQUIRE_NOTHROW(gc::run_in_process(6, [&](gc::in_process_communicator& comm) {
    int const r = comm.rank();
    gc::group_communicator node(comm,
                                r < 3 ? std::vector<int>{0, 1, 2} : std::vector<int>{3, 4, 5});
    gc::group_communicator lane(comm, {r % 3, r % 3 + 3});
    for (int round = 0; round < 3; ++round) {
      std::vector<std::int64_t> a(10, r + 1), b(10, 100 * (r + 1));
      gc::request ra = node.iall_reduce(std::as_writable_bytes(std::span(a)), gc::comm_type::i64,
                                        gc::reduce_op::sum);
      gc::request rb = lane.iall_reduce(std::as_writable_bytes(std::span(b)), gc::comm_type::i64,
                                        gc::reduce_op::sum);
      if (round == 1) {
        while (!ra.test()) {  // test() alone completes the two-phase all-reduce
        }
        RANK_REQUIRE(!ra.pending() || ra.test());
      }
      ra.wait();
      rb.wait();
      std::int64_t const node_sum = r < 3 ? 1 + 2 + 3 : 4 + 5 + 6;
      std::int64_t const lane_sum = 100 * ((r % 3 + 1) + (r % 3 + 4));
      for (std::size_t i = 0; i < 10; ++i) RANK_REQUIRE(a[i] == node_sum && b[i] == lane_sum);
    }
  }));
}

TEST_CASE("a group works over any_communicator", "[comm][group]") {
  REQUIRE_NOTHROW(gc::run_in_process(4, [&](gc::in_process_communicator& c) {
    gc::any_communicator comm(c);
    gc::group_communicator group(comm,
                                 c.rank() < 2 ? std::vector<int>{1, 0} : std::vector<int>{2, 3});
    std::vector<float> v(3, static_cast<float>(c.rank()));
    group.all_reduce(std::as_writable_bytes(std::span(v)), gc::comm_type::f32, gc::reduce_op::sum);
    RANK_REQUIRE(v[2] == (c.rank() < 2 ? 1.0f : 5.0f));
  }));
}

TEST_CASE("group_communicator rejects bad members, tags and arguments", "[comm][group]") {
  REQUIRE_NOTHROW(gc::run_in_process(3, [&](gc::in_process_communicator& comm) {
    auto fails = [](auto&& f, char const* text) {
      try {
        f();
      } catch (gc::config_error const& e) {
        return std::string(e.what()).find(text) != std::string::npos;
      }
      return false;
    };
    RANK_REQUIRE(fails([&] { gc::group_communicator g(comm, {}); }, "at least one member"));
    RANK_REQUIRE(fails(
        [&] {
          gc::group_communicator g(comm, {0, 1, 2, 3});
        },
        "not a rank of the parent"));
    RANK_REQUIRE(fails([&] { gc::group_communicator g(comm, {0, 1, 2, 1}); }, "appears twice"));
    RANK_REQUIRE(
        fails([&] { gc::group_communicator g(comm, {(comm.rank() + 1) % 3}); }, "not a member"));
    RANK_REQUIRE(fails(
        [&] {
          gc::group_communicator g(comm, {0, 1, 2}, {.tag_base = -1});
        },
        "tag_base >= 0"));
    gc::group_communicator g(comm, {0, 1, 2}, {.tag_base = 100, .tag_count = 10});
    std::vector<std::byte> b(4);
    RANK_REQUIRE(fails([&] { g.send(b, 0, 105); }, "reserved for the group's collectives"));
    RANK_REQUIRE(fails([&] { g.recv(b, 3, 1); }, "is not a rank of this communicator"));
    RANK_REQUIRE(fails([&] { g.all_gather(b, b); }, "all_gather needs an output"));
    RANK_REQUIRE(
        fails([&] { g.all_reduce(std::span(b).first(3), gc::comm_type::f32, gc::reduce_op::sum); },
              "whole number"));
  }));
}

TEST_CASE("a group member that never takes part is a comm_error at the parent's timeout",
          "[comm][group]") {
  gc::in_process_world world(3, std::chrono::milliseconds(300));
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      gc::in_process_communicator comm = world.communicator(r);
      try {
        if (r == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(600));  // never joins
          world.leave(r);
          return;
        }
        gc::group_communicator g(comm, {0, 1, 2});
        std::vector<float> v(8, 1.0f);
        g.all_reduce(std::as_writable_bytes(std::span(v)), gc::comm_type::f32, gc::reduce_op::sum);
        errors[static_cast<std::size_t>(r)] = "completed";
      } catch (gc::comm_error const& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r, errors[static_cast<std::size_t>(r)]);
    CHECK(errors[static_cast<std::size_t>(r)].find("gradcomp") != std::string::npos);
    CHECK(errors[static_cast<std::size_t>(r)] != "completed");
  }
}

TEST_CASE("node_grouping: uniform, labelled and explicit nodes, and what is refused",
          "[comm][group]") {
  gc::node_layout const u = gc::node_grouping::uniform(2).layout(6);
  CHECK(u.nodes() == 3);
  CHECK(u.node_ranks(1) == std::vector<int>{2, 3});
  CHECK(u.node_of(5) == 2);
  CHECK(u.local_rank(5) == 1);
  CHECK(u.lane(1) == std::vector<int>{1, 3, 5});

  // Labels: nodes ordered by their lowest rank, ranks ascending within a node.
  gc::node_layout const l = gc::node_grouping::labelled({4, 1, 4, 1, 0}).layout(5);
  CHECK(l.nodes() == 3);
  CHECK(l.node_ranks(0) == std::vector<int>{0, 2});
  CHECK(l.node_ranks(1) == std::vector<int>{1, 3});
  CHECK(l.node_ranks(2) == std::vector<int>{4});
  CHECK(l.min_node_size() == 1);
  CHECK(l.lane(0) == std::vector<int>{0, 1, 4});
  CHECK_THROWS_WITH(l.lane(1), Catch::Contains("does not exist"));

  gc::node_layout const e = gc::node_grouping::explicit_nodes({{3, 0}, {1, 2, 4}}).layout(5);
  CHECK(e.node_ranks(0) == std::vector<int>{0, 3});
  CHECK(e.node_ranks(1) == std::vector<int>{1, 2, 4});
  CHECK(e.local_rank(4) == 2);
  // The same layout, however it was said.
  CHECK(std::vector<int>(e.node_indices().begin(), e.node_indices().end()) ==
        std::vector<int>{0, 1, 1, 0, 1});

  CHECK_THROWS_AS(gc::node_grouping{}.layout(4), gc::config_error);
  CHECK_THROWS_WITH(gc::node_grouping::uniform(3).layout(4), Catch::Contains("does not divide"));
  CHECK_THROWS_WITH(gc::node_grouping::uniform(0).layout(4), Catch::Contains("does not divide"));
  CHECK_THROWS_WITH(gc::node_grouping::labelled({0, 0, 1}).layout(4),
                    Catch::Contains("3 node labels for 4 ranks"));
  CHECK_THROWS_WITH(gc::node_grouping::labelled({0, -1, 1, 1}).layout(4),
                    Catch::Contains("node label -1 (expected a label >= 0)"));
  CHECK_THROWS_WITH(gc::node_grouping::explicit_nodes({{0, 1}, {1, 2, 3}}).layout(4),
                    Catch::Contains("rank 1 is in node 0 and in node 1"));
  CHECK_THROWS_WITH(gc::node_grouping::explicit_nodes({{0, 1}, {3}}).layout(4),
                    Catch::Contains("rank 2 is in no node"));
  CHECK_THROWS_WITH(gc::node_grouping::explicit_nodes({{0, 1}, {}, {2, 3}}).layout(4),
                    Catch::Contains("no ranks"));
  CHECK_THROWS_WITH(gc::node_grouping::explicit_nodes({{0, 1, 2, 4}}).layout(4),
                    Catch::Contains("lists rank 4"));
}
