// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// all_reduce_hierarchical on in-process ranks grouped into nodes: the plain dense average on
// every rank for every node shape (uniform, uneven, one node, one rank per node, leader and
// all-lanes), bit-identity with its definition (node sums, then all_reduce_compressed per lane)
// for every codec family, mass conservation of the owners' error feedback over steps, and the
// failures: a grouping that differs between ranks or is invalid, bad lanes, EF21, sizes that
// differ, a non-finite node sum, a corrupted intra-node message; each refused on every rank,
// with every rank's state as it was.

#include <gradcomp/collective/dense.hpp>
#include <gradcomp/collective/hierarchical.hpp>
#include <gradcomp/comm/fault.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/feedback/compressor.hpp>

#include <catch2/catch.hpp>

#include "../support/split_worlds.hpp"
#include "collective_support.hpp"

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <vector>

using namespace gradcomp_test;

namespace {

// A codec with residual error feedback.
using comp = gc::compressor<gc::any_codec, gc::residual_feedback>;

using shape = gradcomp_test::grouping_case;

std::vector<shape> shapes() {
  return {{"4 ranks as 2 nodes of 2", 4, gc::node_grouping::uniform(2)},
          {"6 ranks as 3 nodes of 2", 6, gc::node_grouping::uniform(2)},
          {"6 ranks as 2 nodes of 3", 6, gc::node_grouping::uniform(3)},
          {"1 node of 4", 4, gc::node_grouping::uniform(4)},
          {"4 nodes of 1", 4, gc::node_grouping::uniform(1)},
          {"uneven, labelled: {0,1,4} {2,3}", 5, gc::node_grouping::labelled({7, 7, 2, 2, 7})},
          {"uneven, explicit: {0,3} {1,2,4}", 5,
           gc::node_grouping::explicit_nodes({{0, 3}, {1, 2, 4}})},
          {"1 rank", 1, gc::node_grouping::uniform(1)}};
}

// Small integers: every sum is exact in any order, and in binary16 and bfloat16 too.
std::vector<float> int_gradient(std::size_t n, int rank, int step = 0) {
  std::vector<float> g(n);
  test_rng r(977u * static_cast<std::uint64_t>(rank + 1) + 131u * static_cast<std::uint64_t>(step));
  for (auto& v : g) v = static_cast<float>(static_cast<int>(r.next() % 17) - 8);
  return g;
}

gc::tensor_view<float const> view(std::vector<float> const& g,
                                  gc::tensor_id id = gc::tensor_id{3}) {
  return gc::tensor_view<float const>(std::span<float const>(g), id);
}

// Runs `body(comm)` on every rank of a world of `w`, each rank recording what it threw.
template <class Body>
std::vector<std::exception_ptr> run_collecting(int w, Body&& body) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(w));
  REQUIRE_NOTHROW(gc::run_in_process(w, [&](gc::in_process_communicator& comm) {
    try {
      body(comm);
    } catch (...) {
      errors[static_cast<std::size_t>(comm.rank())] = std::current_exception();
    }
  }));
  return errors;
}

template <class E>
bool throws_as(std::exception_ptr const& e, char const* text = "") {
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (E const& x) {
    return std::string(x.what()).find(text) != std::string::npos;
  } catch (...) {
  }
  return false;
}

std::string message(std::exception_ptr const& e) {
  if (!e) return "(none)";
  try {
    std::rethrow_exception(e);
  } catch (std::exception const& x) {
    return x.what();
  }
}

// Runs `step`; if it throws, `after` gets the state of `c` before the exception goes on.
template <class C, class F>
void keeping_state_on_failure(C const& c, std::vector<std::byte>& after, F&& step) {
  try {
    step();
  } catch (...) {
    after = c.save();
    throw;
  }
}

// A step that failed everywhere: rank `culprit` threw its own E (whose message holds `text`),
// every other rank a comm_error (holding `others`).
template <class E>
void check_failed_step(std::vector<std::exception_ptr> const& errors, int culprit,
                       char const* text = "", char const* others = "") {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    CAPTURE(r, message(errors[r]));
    if (static_cast<int>(r) == culprit)
      CHECK(throws_as<E>(errors[r], text));
    else
      CHECK(throws_as<gc::comm_error>(errors[r], others));
  }
}

}  // namespace

TEST_CASE("hierarchical all-reduce with the identity codec is the dense all-reduce on every rank",
          "[collective][hierarchical]") {
  for (shape const& s : shapes()) {
    for (int lanes : {0, 1}) {
      for (gc::dense_format intra :
           {gc::dense_format::f32, gc::dense_format::f16, gc::dense_format::bf16}) {
        for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1001}}) {
          gc::reduction const op =
              intra == gc::dense_format::f16 ? gc::reduction::sum : gc::reduction::average;
          CAPTURE(s.name, lanes, gc::dense_format_name(intra), n);
          int const silent = s.ranks > 2 ? 1 : -1;  // contributes nothing
          REQUIRE_NOTHROW(gc::run_in_process(s.ranks, [&](gc::in_process_communicator& comm) {
            std::vector<float> const g =
                comm.rank() == silent ? std::vector<float>{} : int_gradient(n, comm.rank());
            std::vector<float> out(n, -1.0f), dense(n, -2.0f);
            gc::hierarchical_options opt;
            opt.nodes = s.nodes;
            opt.lanes = lanes;
            opt.intra = intra;
            opt.op = op;
            gc::hierarchical_result const r = gc::all_reduce_hierarchical(
                comm, gc::make_codec("identity"), view(g), std::span<float>(out), {}, opt);
            gc::all_reduce_dense(comm, std::span<float const>(g), std::span<float>(dense),
                                 gc::dense_format::f32, {op});
            if (intra !=
                gc::dense_format::f32) {  // the owners round the result once into the format
              for (float& v : dense) {
                v = intra == gc::dense_format::f16
                        ? gc::half_bits_to_float(gc::float_to_half_bits(v))
                        : gc::bfloat16_bits_to_float(gc::float_to_bfloat16_bits(v));
              }
            }
            RANK_REQUIRE(out == dense);
            RANK_REQUIRE(r.path == gc::collective_path::hierarchical);
            gc::node_layout const layout = s.nodes.layout(s.ranks);
            RANK_REQUIRE(r.nodes == layout.nodes());
            RANK_REQUIRE(r.lanes == (lanes == 0 ? layout.min_node_size() : lanes));
            RANK_REQUIRE(r.inter_path == (layout.nodes() > 1 ? gc::collective_path::summable
                                                             : gc::collective_path::dense_f32));
          }));
        }
      }
    }
  }
}

TEST_CASE(
    "hierarchical all-reduce of real gradients: within rounding of the exact sum, the same bits on "
    "every rank",
    "[collective][hierarchical]") {
  std::size_t const n = 1003;
  for (shape const& s : shapes()) {
    CAPTURE(s.name);
    std::vector<double> exact(n, 0.0), magnitude(n, 0.0);
    for (int r = 0; r < s.ranks; ++r) {
      std::vector<float> const g = rank_gradient(n, r, 0);
      for (std::size_t i = 0; i < n; ++i) {
        exact[i] += g[i];
        magnitude[i] += std::fabs(g[i]);
      }
    }
    std::vector<std::vector<float>> outs(static_cast<std::size_t>(s.ranks));
    REQUIRE_NOTHROW(gc::run_in_process(s.ranks, [&](gc::in_process_communicator& comm) {
      std::vector<float> g = rank_gradient(n, comm.rank(), 0);
      gc::hierarchical_options opt;
      opt.nodes = s.nodes;
      // in place: the output is the gradient
      gc::all_reduce_hierarchical(comm, gc::make_codec("identity"), view(g), std::span<float>(g),
                                  {}, opt);
      outs[static_cast<std::size_t>(comm.rank())] = g;
    }));
    for (auto const& o : outs) REQUIRE(o == outs.front());
    for (std::size_t i = 0; i < n; ++i) {
      REQUIRE(std::fabs(outs.front()[i] - exact[i]) <= 8.0 * s.ranks * 0x1p-24 * magnitude[i]);
    }
  }
}

TEST_CASE(
    "hierarchical all-reduce is the node sums all-reduced per lane by all_reduce_compressed, bit "
    "for bit",
    "[collective][hierarchical]") {
  std::vector<std::string> const codecs = {"fp16",
                                           "bf16",
                                           "onebit",
                                           "topk:ratio=0.05",
                                           "qsgd:levels=3,bucket=64",
                                           "int8:bucket=32",
                                           "randomk:ratio=0.1"};
  std::vector<shape> const cases = {shapes()[0], shapes()[1], shapes()[2], shapes()[5],
                                    shapes()[6]};
  std::size_t const n = 777;
  gc::tensor_id const id{9};
  for (std::string const& spec : codecs) {
    for (shape const& s : cases) {
      for (int lanes : {0, 1}) {
        CAPTURE(spec, s.name, lanes);
        gc::any_codec const codec = gc::make_codec(spec);
        bool const shared = codec.aggregation() == gc::aggregation_kind::shared_support;
        auto ctx_of = [&](int rank) {
          gc::codec_context c;
          c.seed = shared ? 11 : 11 + static_cast<std::uint64_t>(rank);
          c.step = 4;
          return c;
        };
        gc::node_layout const layout = s.nodes.layout(s.ranks);
        int const l = lanes == 0 ? layout.min_node_size() : lanes;
        // The definition: node sums (float32, rank order), then each lane's collective.
        std::vector<float> want(n, 0.0f);
        for (int j = 0; j < l; ++j) {
          auto const range =
              gc::shard_range(n, static_cast<std::size_t>(j), static_cast<std::size_t>(l));
          std::size_t const b = range.first, e = range.second;  // (Clang 14 captures no bindings)
          std::vector<int> const lane = layout.lane(j);
          std::vector<std::vector<float>> sums;
          for (int k = 0; k < layout.nodes(); ++k) {
            std::vector<float> sum;
            for (int r : layout.node_ranks(k)) {
              std::vector<float> const g = rank_gradient(n, r, 1);
              if (sum.empty()) {
                sum.assign(g.begin() + static_cast<std::ptrdiff_t>(b),
                           g.begin() + static_cast<std::ptrdiff_t>(e));
              } else {
                for (std::size_t i = b; i < e; ++i) sum[i - b] += g[i];
              }
            }
            sums.push_back(sum);
          }
          REQUIRE_NOTHROW(gc::run_in_process(layout.nodes(), [&](gc::in_process_communicator& c) {
            std::vector<float> out(e - b);
            auto const k = static_cast<std::size_t>(c.rank());
            gc::all_reduce_compressed(
                c, codec,
                gc::tensor_view<float const>(std::span<float const>(sums[k]),
                                             gc::hierarchical_shard_id(id, j, l)),
                std::span<float>(out), ctx_of(lane[k]));
            if (c.rank() == 0)
              std::copy(out.begin(), out.end(), want.begin() + static_cast<std::ptrdiff_t>(b));
          }));
        }
        REQUIRE_NOTHROW(gc::run_in_process(s.ranks, [&](gc::in_process_communicator& comm) {
          std::vector<float> const g = rank_gradient(n, comm.rank(), 1);
          std::vector<float> out(n);
          gc::hierarchical_options opt;
          opt.nodes = s.nodes;
          opt.lanes = lanes;
          gc::hierarchical_result const r = gc::all_reduce_hierarchical(
              comm, codec, view(g, id), std::span<float>(out), ctx_of(comm.rank()), opt);
          RANK_REQUIRE(out == want);
          bool const owner = layout.local_rank(comm.rank()) < l;
          RANK_REQUIRE((r.packet_bytes > 0) == owner);
          RANK_REQUIRE((r.inter_node_bytes > 0) == owner);
        }));
      }
    }
  }
}

TEST_CASE("hierarchical all-reduce with error feedback conserves mass over steps",
          "[collective][hierarchical]") {
  std::size_t const n = 501;
  int const steps = 6;
  gc::tensor_id const id{5};
  struct run {
    shape s;
    int lanes;
  };
  std::vector<run> const runs = {
      {shapes()[0], 0}, {shapes()[0], 1}, {shapes()[1], 0}, {shapes()[5], 0}};
  for (std::string spec :
       {"topk:ratio=0.05", "onebit", "qsgd:levels=3,bucket=64", "randomk:ratio=0.1"}) {
    for (run const& rn : runs) {
      CAPTURE(spec, rn.s.name, rn.lanes);
      int const w = rn.s.ranks;
      gc::node_layout const layout = rn.s.nodes.layout(w);
      int const l = rn.lanes == 0 ? layout.min_node_size() : rn.lanes;
      std::vector<double> delivered(n, 0.0), residuals(n, 0.0), inputs(n, 0.0), magnitude(n, 1.0);
      for (int t = 0; t < steps; ++t) {
        for (int r = 0; r < w; ++r) {
          std::vector<float> const g = rank_gradient(n, r, t);
          for (std::size_t i = 0; i < n; ++i) {
            inputs[i] += g[i];
            magnitude[i] += std::fabs(g[i]);
          }
        }
      }
      std::vector<std::vector<float>> last(static_cast<std::size_t>(w));
      std::vector<std::vector<float>> residual_of(static_cast<std::size_t>(w));
      std::vector<char> untouched(static_cast<std::size_t>(w), 0);
      REQUIRE_NOTHROW(gc::run_in_process(w, [&](gc::in_process_communicator& comm) {
        comp c(gc::make_codec(spec));
        std::vector<std::byte> const fresh = c.save();
        gc::hierarchical_options opt;
        opt.nodes = rn.s.nodes;
        opt.lanes = rn.lanes;
        std::vector<double> total(n, 0.0);
        for (int t = 0; t < steps; ++t) {
          gc::codec_context ctx;
          ctx.seed = 3;
          ctx.step = static_cast<std::uint32_t>(t);
          std::vector<float> const g = rank_gradient(n, comm.rank(), t);
          std::vector<float> out(n);
          gc::all_reduce_hierarchical(comm, c, view(g, id), std::span<float>(out), ctx, opt);
          for (std::size_t i = 0; i < n; ++i) total[i] += out[i];
          last[static_cast<std::size_t>(comm.rank())] = out;
        }
        int const j = layout.local_rank(comm.rank());
        if (j < l && layout.nodes() > 1) {
          auto const st = c.state(gc::hierarchical_shard_id(id, j, l)).values();
          residual_of[static_cast<std::size_t>(comm.rank())].assign(st.begin(), st.end());
        } else {
          untouched[static_cast<std::size_t>(comm.rank())] = c.save() == fresh ? 1 : 0;
        }
        if (comm.rank() == 0) {
          for (std::size_t i = 0; i < n; ++i) delivered[i] = total[i];
        }
      }));
      for (int r = 0; r < w; ++r) {
        REQUIRE(last[static_cast<std::size_t>(r)] == last.front());  // the same bits everywhere
        int const j = layout.local_rank(r);
        if (j >= l) {
          REQUIRE(untouched[static_cast<std::size_t>(r)] ==
                  1);  // no state where nothing is compressed
          continue;
        }
        auto const [b, e] =
            gc::shard_range(n, static_cast<std::size_t>(j), static_cast<std::size_t>(l));
        auto const& res = residual_of[static_cast<std::size_t>(r)];
        REQUIRE(res.size() == e - b);
        for (std::size_t i = b; i < e; ++i) residuals[i] += res[i - b];
      }
      double lost = 0.0;
      for (std::size_t i = 0; i < n; ++i) {
        REQUIRE(std::fabs(delivered[i] + residuals[i] - inputs[i]) <= 2e-5 * magnitude[i]);
        lost += std::fabs(residuals[i]);
      }
      REQUIRE(lost > 1e-3);  // the codec is lossy: the residuals hold real mass
    }
  }
}

TEST_CASE("hierarchical all-reduce refuses a grouping that differs between ranks or is invalid",
          "[collective][hierarchical][agreement]") {
  std::vector<float> const g(10, 1.0f);
  auto attempt = [&](gc::in_process_communicator& comm, gc::hierarchical_options const& opt) {
    std::vector<float> out(10);
    gc::all_reduce_hierarchical(comm, gc::make_codec("topk:ratio=0.5"), view(g),
                                std::span<float>(out), {}, opt);
  };
  SECTION("different groupings: config_error naming the grouping on every rank") {
    auto const errors = run_collecting(4, [&](gc::in_process_communicator& comm) {
      gc::hierarchical_options opt;
      opt.nodes = comm.rank() == 3 ? gc::node_grouping::labelled({0, 1, 0, 1})
                                   : gc::node_grouping::uniform(2);
      attempt(comm, opt);
    });
    for (auto const& e : errors)
      CHECK(throws_as<gc::config_error>(e, "disagree on the node grouping"));
  }
  SECTION("the same grouping said two ways is the same grouping") {
    auto const errors = run_collecting(4, [&](gc::in_process_communicator& comm) {
      gc::hierarchical_options opt;
      opt.nodes = comm.rank() == 3 ? gc::node_grouping::explicit_nodes({{0, 1}, {2, 3}})
                                   : gc::node_grouping::uniform(2);
      attempt(comm, opt);
    });
    for (auto const& e : errors) CHECK_FALSE(e);
  }
  SECTION("an invalid grouping on every rank: its config_error on every rank") {
    auto const errors = run_collecting(4, [&](gc::in_process_communicator& comm) {
      gc::hierarchical_options opt;
      opt.nodes = gc::node_grouping::uniform(3);
      attempt(comm, opt);
    });
    for (auto const& e : errors) CHECK(throws_as<gc::config_error>(e, "does not divide"));
  }
  SECTION(
      "an invalid grouping on one rank: its config_error there, comm_error elsewhere, no hang") {
    auto const errors = run_collecting(4, [&](gc::in_process_communicator& comm) {
      gc::hierarchical_options opt;
      opt.nodes =
          comm.rank() == 2 ? gc::node_grouping::labelled({0, 0, 1}) : gc::node_grouping::uniform(2);
      attempt(comm, opt);
    });
    check_failed_step<gc::config_error>(errors, 2, "3 node labels for 4 ranks", "rank 2 failed");
  }
  SECTION("no grouping, or more lanes than the smallest node has") {
    auto const errors = run_collecting(5, [&](gc::in_process_communicator& comm) {
      gc::hierarchical_options opt;
      if (comm.rank() != 0) {
        opt.nodes = gc::node_grouping::labelled({0, 0, 1, 1, 1});
        opt.lanes = 3;
      }
      attempt(comm, opt);
    });
    CHECK(throws_as<gc::config_error>(errors[0], "none given"));
    for (int r = 1; r < 5; ++r)
      CHECK(throws_as<gc::config_error>(errors[static_cast<std::size_t>(r)], "lanes must be"));
  }
}

TEST_CASE(
    "hierarchical all-reduce refuses sizes that differ, EF21 and low-rank codecs on every rank",
    "[collective][hierarchical][agreement]") {
  gc::hierarchical_options opt;
  opt.nodes = gc::node_grouping::uniform(2);
  SECTION("sizes") {
    auto const errors = run_collecting(4, [&](gc::in_process_communicator& comm) {
      std::size_t const n = comm.rank() == 1 ? 10 : 11;
      std::vector<float> const g(n, 1.0f);
      std::vector<float> out(n);
      gc::all_reduce_hierarchical(comm, gc::make_codec("onebit"), view(g), std::span<float>(out),
                                  {}, opt);
    });
    for (auto const& e : errors) CHECK(throws_as<gc::config_error>(e, "disagree"));
  }
  SECTION("EF21") {
    auto const errors = run_collecting(4, [&](gc::in_process_communicator& comm) {
      gc::compressor<gc::any_codec, gc::ef21_feedback> c(gc::make_codec("topk:ratio=0.1"));
      std::vector<float> const g(12, 1.0f);
      std::vector<float> out(12);
      gc::all_reduce_hierarchical(comm, c, view(g), std::span<float>(out), {}, opt);
    });
    for (auto const& e : errors) CHECK(throws_as<gc::config_error>(e, "EF21"));
  }
  SECTION("a gradient and an output of different sizes") {
    auto const errors = run_collecting(4, [&](gc::in_process_communicator& comm) {
      std::vector<float> const g(12, 1.0f);
      std::vector<float> out(13);
      gc::all_reduce_hierarchical(comm, gc::make_codec("fp16"), view(g), std::span<float>(out), {},
                                  opt);
    });
    for (auto const& e : errors)
      CHECK(throws_as<gc::config_error>(e, "12 elements for an output of 13"));
  }
}

TEST_CASE(
    "hierarchical all-reduce: a non-finite node sum follows the codec's policy; a failed step "
    "changes no state",
    "[collective][hierarchical]") {
  std::size_t const n = 40;
  gc::hierarchical_options opt;
  opt.nodes = gc::node_grouping::uniform(2);
  SECTION(
      "onebit refuses it: numeric_error where the node sum is compressed, comm_error elsewhere") {
    // Rank 3 (node 1) holds the NaN in shard 0, which node 1's first rank (rank 2) compresses.
    std::vector<std::vector<std::byte>> before(4), after(4);
    auto const errors = run_collecting(4, [&](gc::in_process_communicator& comm) {
      comp c(gc::make_codec("onebit"));
      std::vector<float> out(n);
      std::vector<float> g = rank_gradient(n, comm.rank(), 0);
      gc::all_reduce_hierarchical(comm, c, view(g), std::span<float>(out), {},
                                  opt);  // a good step first
      before[static_cast<std::size_t>(comm.rank())] = c.save();
      if (comm.rank() == 3) g[0] = std::numeric_limits<float>::quiet_NaN();
      keeping_state_on_failure(c, after[static_cast<std::size_t>(comm.rank())], [&] {
        gc::all_reduce_hierarchical(comm, c, view(g), std::span<float>(out), {}, opt);
      });
    });
    check_failed_step<gc::numeric_error>(errors, 2);
    CHECK(after == before);
  }
  SECTION("fp16 carries it: NaN on every rank, as the dense all-reduce does") {
    REQUIRE_NOTHROW(gc::run_in_process(4, [&](gc::in_process_communicator& comm) {
      std::vector<float> g = rank_gradient(n, comm.rank(), 0);
      if (comm.rank() == 3) g[n - 1] = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> out(n);
      gc::all_reduce_hierarchical(comm, gc::make_codec("fp16"), view(g), std::span<float>(out), {},
                                  opt);
      RANK_REQUIRE(std::isnan(out[n - 1]));
      RANK_REQUIRE(std::isfinite(out[0]));
    }));
  }
}

TEST_CASE(
    "hierarchical all-reduce with checksums: the same result, and a corrupted intra-node message "
    "fails the step",
    "[collective][hierarchical][checksum]") {
  std::size_t const n = 300;
  for (gc::dense_format intra : {gc::dense_format::f32, gc::dense_format::bf16}) {
    CAPTURE(gc::dense_format_name(intra));
    std::vector<std::vector<float>> plain(6), checked(6);
    for (bool checksum : {false, true}) {
      REQUIRE_NOTHROW(gc::run_in_process(6, [&](gc::in_process_communicator& comm) {
        comp c(gc::make_codec("topk:ratio=0.1"));
        gc::hierarchical_options opt;
        opt.nodes = gc::node_grouping::uniform(3);
        opt.intra = intra;
        opt.checksum = checksum;
        std::vector<float> const g = rank_gradient(n, comm.rank(), 0);
        std::vector<float> out(n);
        gc::all_reduce_hierarchical(comm, c, view(g), std::span<float>(out), {}, opt);
        (checksum ? checked : plain)[static_cast<std::size_t>(comm.rank())] = out;
      }));
    }
    CHECK(plain == checked);
  }
  // Rank 1's first point-to-point message (its shard 0 slice to rank 0) has a bit flipped.
  std::vector<std::vector<std::byte>> before(4), after(4);
  auto const errors = run_collecting(4, [&](gc::in_process_communicator& inner) {
    gc::fault_plan plan;
    plan.faults.push_back(
        {.kind = gc::fault_kind::corrupt, .rank = 1, .index = 0, .of = gc::comm_operation::send});
    gc::fault_injecting_communicator<gc::in_process_communicator> comm(inner, plan);
    comp c(gc::make_codec("onebit"));
    gc::hierarchical_options opt;
    opt.nodes = gc::node_grouping::uniform(2);
    opt.checksum = true;
    std::vector<float> const g = rank_gradient(n, comm.rank(), 0);
    std::vector<float> out(n);
    before[static_cast<std::size_t>(comm.rank())] = c.save();
    keeping_state_on_failure(c, after[static_cast<std::size_t>(comm.rank())], [&] {
      gc::all_reduce_hierarchical(comm, c, view(g), std::span<float>(out), {}, opt);
    });
  });
  check_failed_step<gc::format_error>(errors, 0, "checksum mismatch", "rank 0 failed");
  CHECK(after == before);
}

TEST_CASE("hierarchical all-reduce of 16-bit gradients is the float32 one rounded once",
          "[collective][hierarchical]") {
  std::size_t const n = 257;
  REQUIRE_NOTHROW(gc::run_in_process(4, [&](gc::in_process_communicator& comm) {
    std::vector<float> const g32 = rank_gradient(n, comm.rank(), 2);
    std::vector<gc::bfloat16> g16(n), out16(n);
    std::vector<float> wide(n), out32(n);
    for (std::size_t i = 0; i < n; ++i) {
      g16[i] = gc::bfloat16(g32[i]);
      wide[i] = static_cast<float>(g16[i]);
    }
    gc::hierarchical_options opt;
    opt.nodes = gc::node_grouping::uniform(2);
    opt.op = gc::reduction::average;
    gc::any_codec const codec = gc::make_codec("qsgd:levels=7,bucket=64");
    gc::all_reduce_hierarchical(
        comm, codec,
        gc::tensor_view<gc::bfloat16 const>(std::span<gc::bfloat16 const>(g16), gc::tensor_id{3}),
        std::span<gc::bfloat16>(out16), {}, opt);
    gc::all_reduce_hierarchical(comm, codec, view(wide), std::span<float>(out32), {}, opt);
    for (std::size_t i = 0; i < n; ++i) RANK_REQUIRE(out16[i].bits == gc::bfloat16(out32[i]).bits);
  }));
}

using gradcomp_test::split_worlds;

TEST_CASE(
    "hierarchical all-reduce over the caller's node and lane communicators gives the bits of the "
    "point-to-point groups",
    "[collective][hierarchical]") {
  std::size_t const n = 613;
  gc::tensor_id const id{21};
  std::vector<shape> const cases = {shapes()[0], shapes()[2], shapes()[3], shapes()[4], shapes()[6]};
  for (std::string const spec : {"fp16", "topk:ratio=0.05", "randomk:ratio=0.1", "int8:bucket=32"}) {
    for (shape const& s : cases) {
      for (int lanes : {0, 1}) {
        for (gc::dense_format intra : {gc::dense_format::f32, gc::dense_format::bf16}) {
          CAPTURE(spec, s.name, lanes, static_cast<int>(intra));
          gc::hierarchical_options opt;
          opt.nodes = s.nodes;
          opt.lanes = lanes;
          opt.intra = intra;
          opt.op = gc::reduction::average;
          split_worlds const sub(s.nodes, s.ranks, lanes);
          auto w = static_cast<std::size_t>(s.ranks);
          std::vector<std::vector<float>> out_p2p(w), out_split(w);
          std::vector<std::vector<std::byte>> state_p2p(w), state_split(w);
          std::vector<gc::hierarchical_result> res_p2p(w), res_split(w);
          for (int mode = 0; mode < 2; ++mode) {
            REQUIRE_NOTHROW(gc::run_in_process(s.ranks, [&](gc::in_process_communicator& comm) {
              auto const r = static_cast<std::size_t>(comm.rank());
              comp c(gc::make_codec(spec));
              gc::in_process_communicator node = sub.node(comm.rank());
              std::optional<gc::in_process_communicator> lane = sub.lane(comm.rank());
              gc::hierarchical_groups<gc::in_process_communicator> const groups{&node,
                                                                                lane ? &*lane : nullptr};
              std::vector<float> out(n);
              for (int t = 0; t < 3; ++t) {
                gc::codec_context ctx;
                ctx.seed = 5;
                ctx.step = static_cast<std::uint32_t>(t);
                std::vector<float> const g = rank_gradient(n, comm.rank(), t);
                (mode == 0 ? res_p2p : res_split)[r] =
                    mode == 0 ? gc::all_reduce_hierarchical(comm, c, view(g, id), std::span<float>(out), ctx, opt)
                              : gc::all_reduce_hierarchical(comm, groups, c, view(g, id),
                                                            std::span<float>(out), ctx, opt);
              }
              (mode == 0 ? out_p2p : out_split)[r] = out;
              (mode == 0 ? state_p2p : state_split)[r] = c.save();
            }));
          }
          for (std::size_t r = 0; r < w; ++r) {
            CAPTURE(r);
            REQUIRE(out_split[r] == out_p2p[r]);
            REQUIRE(out_split[r] == out_split.front());
            REQUIRE(state_split[r] == state_p2p[r]);  // the owners' residuals
            REQUIRE(res_split[r].packet_bytes == res_p2p[r].packet_bytes);
            REQUIRE(res_split[r].wire_bytes == res_p2p[r].wire_bytes);
            REQUIRE(res_split[r].inter_node_bytes == res_p2p[r].inter_node_bytes);
            REQUIRE(res_split[r].inter_path == res_p2p[r].inter_path);
          }
        }
      }
    }
  }
}

TEST_CASE("hierarchical all-reduce refuses node and lane communicators that do not match the grouping",
          "[collective][hierarchical][agreement]") {
  std::size_t const n = 64;
  shape const s = shapes()[1];  // 6 ranks as 3 nodes of 2
  split_worlds const sub(s.nodes, s.ranks, 0);
  gc::hierarchical_options opt;
  opt.nodes = s.nodes;
  struct bad {
    char const* name;
    int culprit;
    char const* text;
  };
  for (bad const b : {bad{"a node communicator of another node's size", 3, "node communicator has rank"},
                      bad{"the node's ranks in another order", 2, "node communicator has rank"},
                      bad{"no lane on a shard owner", 5, "no lane communicator"},
                      bad{"the lane of another shard", 4, "lane communicator has rank"},
                      bad{"no node communicator", 1, "no node communicator"}}) {
    CAPTURE(b.name);
    std::string const name = b.name;
    gc::in_process_world const three(3, std::chrono::seconds(20));
    std::vector<std::vector<std::byte>> before(6), after(6);
    auto const errors = run_collecting(s.ranks, [&](gc::in_process_communicator& comm) {
      int const r = comm.rank();
      comp c(gc::make_codec("topk:ratio=0.1"));
      std::vector<float> const g = rank_gradient(n, r, 0);
      std::vector<float> out(n);
      gc::codec_context ctx;
      gc::all_reduce_hierarchical(comm, c, view(g), std::span<float>(out), ctx, opt);  // a state
      before[static_cast<std::size_t>(r)] = c.save();
      gc::in_process_communicator node = sub.node(r);
      std::optional<gc::in_process_communicator> lane = sub.lane(r);
      gc::hierarchical_groups<gc::in_process_communicator> groups{&node, lane ? &*lane : nullptr};
      gc::in_process_communicator other = three.communicator(r == b.culprit ? 1 : 0);
      if (r == b.culprit) {
        if (name.starts_with("a node")) groups.node = &other;
        if (name.starts_with("the node's")) node = sub.node(r + 1);  // rank 3: local rank 1, not 0
        if (name.starts_with("no lane")) groups.lane = nullptr;
        if (name.starts_with("the lane")) lane = sub.lane(r - 1);  // lane 1's rank 1, not lane 0's rank 2
        if (name.starts_with("no node")) groups.node = nullptr;
      }
      keeping_state_on_failure(c, after[static_cast<std::size_t>(r)], [&] {
        gc::all_reduce_hierarchical(comm, groups, c, view(g), std::span<float>(out), ctx, opt);
      });
    });
    check_failed_step<gc::config_error>(errors, b.culprit, b.text);
    REQUIRE(after == before);  // nothing moved: every rank's residuals as they were
  }
}
