// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// The step-outcome round and the checksum option (collective/outcome.hpp): what a corrupted
// but well-formed payload does without the option (the step succeeds; the damage is one
// element, bounded by the codec's scale for a quantizer) and with it (format_error on every
// rank, state unchanged).

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/comm/fault.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/feedback/compressor.hpp>

#include "../support/rank_check.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <exception>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace gc = gradcomp;
using namespace std::chrono_literals;

namespace {

using fcomm = gc::fault_injecting_communicator<gc::in_process_communicator>;
constexpr int world_size = 3;
constexpr std::size_t n = 600;

std::vector<float> grad(int rank) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i)
    g[i] = std::sin(0.05f * static_cast<float>(i) + static_cast<float>(rank));
  return g;
}

enum class end { ok, comm, format, other };

struct result {
  std::vector<end> how;
  std::vector<std::vector<float>> out;
  std::vector<std::vector<std::byte>> state_before, state_after;
};

// One all_reduce_compressed with error feedback on 3 ranks (after a clean one, with `warm`);
// rank 1 flips `mask` in byte `byte` of what it sends in its first operation of kind `of`
// (nothing when `byte` < 0).
result run(std::string const& spec, bool checksum, gc::comm_operation of, long byte,
           std::uint8_t mask, bool warm = false) {
  gc::in_process_world world(world_size, 300ms), warm_world(world_size, 300ms);
  gc::fault_plan plan;
  if (byte >= 0) {
    gc::fault f;
    f.kind = gc::fault_kind::corrupt;
    f.rank = 1;
    f.of = of;
    f.byte = static_cast<std::size_t>(byte);
    f.mask = mask;
    plan.faults.push_back(f);
  }
  result res;
  res.how.assign(world_size, end::ok);
  res.out.assign(world_size, {});
  res.state_before.assign(world_size, {});
  res.state_after.assign(world_size, {});
  auto body = [&](int r) {
    auto const ri = static_cast<std::size_t>(r);
    gc::compressor<gc::any_codec, gc::residual_feedback> comp(gc::make_codec(spec));
    std::vector<float> const g = grad(r);
    std::vector<float> out(n);
    gc::collective_options const opt{.op = gc::reduction::average, .checksum = checksum};
    if (warm) {
      gc::in_process_communicator w = warm_world.communicator(r);
      gc::all_reduce_compressed(w, comp, gc::tensor_view<float const>(g, gc::tensor_id{1}),
                                std::span<float>(out), {}, opt);
    }
    res.state_before[ri] = comp.save();
    fcomm c(world.communicator(r), plan);
    try {
      gc::all_reduce_compressed(c, comp, gc::tensor_view<float const>(g, gc::tensor_id{1}),
                                std::span<float>(out), {}, opt);
    } catch (gc::format_error const&) {
      res.how[ri] = end::format;
    } catch (gc::comm_error const&) {
      res.how[ri] = end::comm;
    } catch (...) {
      res.how[ri] = end::other;
    }
    res.out[ri] = out;
    res.state_after[ri] = comp.save();
    world.leave(r);
    warm_world.leave(r);
  };
  std::vector<std::thread> t;
  for (int r = 1; r < world_size; ++r) t.emplace_back(body, r);
  body(0);
  for (auto& x : t) x.join();
  return res;
}

std::size_t packet_bytes(std::string const& spec) {
  std::vector<float> const g = grad(1);
  gc::any_codec const c = gc::make_codec(spec);
  std::vector<std::byte> p(c.max_compressed_bytes(n));
  return c.compress(gc::tensor_view<float const>(g, gc::tensor_id{1}), std::span<std::byte>(p));
}

}  // namespace

TEST_CASE("checksum off: a corrupted int8 value is accepted, bounded by the codec's scale",
          "[faults][collective]") {
  // int8 packets are gathered: rank 1 flips the top bit of its last quantized byte. Without the
  // checksum the packet still decodes; the result differs in that one element, by at most the
  // range of its bucket (the codec's scale) divided by the number of ranks.
  std::string const spec = "int8:bucket=0";
  std::size_t const last = packet_bytes(spec) - 1;
  result const clean = run(spec, false, gc::comm_operation::all_gather_v, -1, 0);
  result const bad =
      run(spec, false, gc::comm_operation::all_gather_v, static_cast<long>(last), 0x80);
  std::vector<float> const g1 = grad(1);
  auto const [lo, hi] = std::minmax_element(g1.begin(), g1.end());
  double const bound = (static_cast<double>(*hi) - *lo) / world_size * (1 + 1e-6);
  for (int r = 0; r < world_size; ++r) {
    auto const ri = static_cast<std::size_t>(r);
    REQUIRE(clean.how[ri] == end::ok);
    REQUIRE(bad.how[ri] == end::ok);
    for (std::size_t i = 0; i + 1 < n; ++i) REQUIRE(bad.out[ri][i] == clean.out[ri][i]);
    double const diff = std::fabs(static_cast<double>(bad.out[ri][n - 1]) - clean.out[ri][n - 1]);
    CAPTURE(diff, bound);
    REQUIRE(diff > 0.0);
    REQUIRE(diff <= bound);
  }
}

TEST_CASE("checksum off: a corrupted float value is accepted as it is", "[faults][collective]") {
  // fp16 values are summed on the wire: a flipped exponent bit of one of rank 1's values
  // changes that element of the sum, unboundedly (a float codec has no scale), and nothing else.
  std::size_t const element = 17;
  long const byte = static_cast<long>(2 * element + 1);  // the high byte of value 17 (binary16)
  result const clean = run("fp16", false, gc::comm_operation::all_reduce, -1, 0);
  result const bad = run("fp16", false, gc::comm_operation::all_reduce, byte, 0x40);
  for (int r = 0; r < world_size; ++r) {
    auto const ri = static_cast<std::size_t>(r);
    REQUIRE(bad.how[ri] == end::ok);
    for (std::size_t i = 0; i < n; ++i) {
      CAPTURE(i);
      if (i == element) {
        REQUIRE(bad.out[ri][i] != clean.out[ri][i]);
      } else {
        REQUIRE(bad.out[ri][i] == clean.out[ri][i]);
      }
    }
  }
}

TEST_CASE("checksum on: the same corruptions fail the step on every rank, state unchanged",
          "[faults][collective]") {
  struct corruption {
    std::string spec;
    gc::comm_operation of;
    long byte;
    std::uint8_t mask;
  };
  std::size_t const last = packet_bytes("int8:bucket=0") - 1;
  for (auto const& c :
       {corruption{"int8:bucket=0", gc::comm_operation::all_gather_v, static_cast<long>(last),
                   0x80},
        corruption{"fp16", gc::comm_operation::all_reduce, 35, 0x40},
        corruption{"topk:ratio=0.05", gc::comm_operation::all_gather_v, 40, 0x01}}) {
    CAPTURE(c.spec);
    result const clean = run(c.spec, true, c.of, -1, 0, true);
    result const bad = run(c.spec, true, c.of, c.byte, c.mask, true);
    for (int r = 0; r < world_size; ++r) {
      auto const ri = static_cast<std::size_t>(r);
      CAPTURE(r);
      REQUIRE(clean.how[ri] == end::ok);
      REQUIRE(bad.how[ri] == end::format);  // a checksum mismatch is seen by every rank
      REQUIRE(bad.state_after[ri] == bad.state_before[ri]);
      REQUIRE(clean.state_after[ri] != clean.state_before[ri]);
    }
  }
}

TEST_CASE("agree_on_outcome: a failure on one rank fails the step on every rank",
          "[faults][collective]") {
  std::vector<std::string> what(3);
  gc::in_process_world world(3, 300ms);
  auto body = [&](int r) {
    gc::in_process_communicator c = world.communicator(r);
    std::exception_ptr local;
    if (r == 2) local = std::make_exception_ptr(gc::format_error("decoding failed here"));
    try {
      gc::agree_on_outcome(c, local, "test step");
      what[static_cast<std::size_t>(r)] = "ok";
    } catch (gc::format_error const& e) {
      what[static_cast<std::size_t>(r)] = std::string("format_error: ") + e.what();
    } catch (gc::comm_error const& e) {
      what[static_cast<std::size_t>(r)] = std::string("comm_error: ") + e.what();
    }
  };
  std::vector<std::thread> t;
  for (int r = 1; r < 3; ++r) t.emplace_back(body, r);
  body(0);
  for (auto& x : t) x.join();
  REQUIRE(what[2] == "format_error: decoding failed here");
  for (int r : {0, 1}) {
    CAPTURE(what[static_cast<std::size_t>(r)]);
    REQUIRE(what[static_cast<std::size_t>(r)].rfind(
                "comm_error: gradcomp: test step: a rank failed after the data moved", 0) == 0);
  }
}
