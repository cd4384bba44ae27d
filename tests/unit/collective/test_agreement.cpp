// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0

#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/collective/parameter_server.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/core/wire.hpp>

#include <catch2/catch.hpp>

#include "collective_support.hpp"

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

using namespace gradcomp_test;
using namespace std::chrono_literals;
using gc::in_process_communicator;
using gc::run_in_process;

TEST_CASE("agree: equal fingerprints pass, one different rank fails everywhere", "[collective][agreement]") {
  for (int w : {1, 2, 5}) {
    REQUIRE_NOTHROW(run_in_process(w, [](in_process_communicator& comm) { gc::agree(comm, 1234, "test"); }));
  }
  std::vector<int> kinds(4, 0);
  REQUIRE_THROWS_AS(run_in_process(4, [&](in_process_communicator& comm) {
    try {
      gc::agree(comm, comm.rank() == 3 ? 1 : 2, "test");
    } catch (gc::config_error const& e) {
      kinds[static_cast<std::size_t>(comm.rank())] = std::string(e.what()).find("rank 3") != std::string::npos ? 1 : 2;
      throw;
    }
  }), gc::config_error);
  REQUIRE(kinds == std::vector<int>{1, 1, 1, 1});
}

TEST_CASE("agree_on_value adopts rank 0's choice", "[collective][agreement]") {
  REQUIRE_NOTHROW(run_in_process(4, [](in_process_communicator& comm) {
    double const mine = 0.01 * (comm.rank() + 1);
    RANK_REQUIRE(gc::agree_on_value(comm, mine) == 0.01);
    RANK_REQUIRE(gc::agree_on_value(comm, comm.rank(), 2) == 2);
  }));
}

TEST_CASE("a rank using a different codec makes every rank throw config_error, none hangs", "[collective][agreement]") {
  // rank 1 differs by codec, by a parameter, by tensor size, by reduction.
  struct variant {
    std::string spec1;
    std::size_t n1;
    gc::reduction op1;
    std::uint32_t id1 = 0;
  };
  for (variant v : {variant{"onebit", 400, gc::reduction::sum}, variant{"topk:ratio=0.2", 400, gc::reduction::sum},
                    variant{"topk:ratio=0.1", 401, gc::reduction::sum}, variant{"topk:ratio=0.1", 400, gc::reduction::average},
                    variant{"fp16", 400, gc::reduction::sum}, variant{"topk:ratio=0.1", 400, gc::reduction::sum, 7}}) {
    CAPTURE(v.spec1, v.n1);
    std::vector<int> kinds(3, 0);
    auto const t0 = std::chrono::steady_clock::now();
    REQUIRE_THROWS_AS(run_in_process(3, [&](in_process_communicator& comm) {
      bool const odd = comm.rank() == 1;
      gc::any_codec const codec = gc::make_codec(odd ? v.spec1 : "topk:ratio=0.1");
      std::size_t const n = odd ? v.n1 : 400;
      auto const g = rank_gradient(n, comm.rank(), 0);
      std::vector<float> out(n);
      gc::collective_options opt;
      opt.op = odd ? v.op1 : gc::reduction::sum;
      try {
        gc::tensor_id const id{odd ? v.id1 : 0u};
        gc::all_reduce_compressed(comm, codec, gc::tensor_view<float const>(std::span<float const>(g), id), std::span<float>(out), {}, opt);
      } catch (gc::config_error const&) {
        kinds[static_cast<std::size_t>(comm.rank())] = 1;
        throw;
      }
    }, 20s), gc::config_error);
    REQUIRE(kinds == std::vector<int>{1, 1, 1});
    REQUIRE(std::chrono::steady_clock::now() - t0 < 10s);
  }
}

TEST_CASE("a rank whose compression fails makes the others throw comm_error, not hang", "[collective][agreement]") {
  std::vector<int> kinds(3, 0);  // 1 numeric_error, 2 comm_error
  REQUIRE_THROWS(run_in_process(3, [&](in_process_communicator& comm) {
    gc::any_codec const codec = gc::make_codec("onebit");
    auto g = rank_gradient(100, comm.rank(), 0);
    if (comm.rank() == 2) g[5] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> out(100);
    try {
      gc::all_reduce_compressed(comm, codec, gc::tensor_view<float const>(std::span<float const>(g)), std::span<float>(out));
    } catch (gc::numeric_error const&) {
      kinds[static_cast<std::size_t>(comm.rank())] = 1;
      throw;
    } catch (gc::comm_error const&) {
      kinds[static_cast<std::size_t>(comm.rank())] = 2;
      throw;
    }
  }));
  REQUIRE(kinds == std::vector<int>{2, 2, 1});
  // The communicator is still usable afterwards: agreement failures break nothing.
  REQUIRE_NOTHROW(run_in_process(2, [](in_process_communicator& comm) {
    gc::any_codec const codec = gc::make_codec("onebit");
    std::vector<float> g(50, comm.rank() == 0 ? std::numeric_limits<float>::infinity() : 1.0f), out(50);
    bool threw = false;
    try {
      gc::all_reduce_compressed(comm, codec, gc::tensor_view<float const>(std::span<float const>(g)), std::span<float>(out));
    } catch (gc::error const&) {
      threw = true;
    }
    RANK_REQUIRE(threw);
    std::vector<float> ok(50, 1.0f);
    gc::all_reduce_compressed(comm, codec, gc::tensor_view<float const>(std::span<float const>(ok)), std::span<float>(out));
    RANK_REQUIRE(out == std::vector<float>(50, 2.0f));
  }));
}

TEST_CASE("a peer killed mid-collective gives comm_error on the others, not a hang", "[collective][agreement]") {
  // The failing rank dies at its k-th communication call: inside the agreement round, or
  // between the round and the payload, of each collective kind.
  for (int k : {0, 1}) {
    for (std::string spec : {"topk:ratio=0.1", "fp16"}) {
      for (bool two_way_mode : {false, true}) {
        CAPTURE(k, spec, two_way_mode);
        std::vector<int> kinds(4, 0);  // 1 injected, 2 comm_error
        auto const t0 = std::chrono::steady_clock::now();
        REQUIRE_THROWS(run_in_process(4, [&](in_process_communicator& c) {
          faulty_communicator comm(c, c.rank() == 2 ? k : 1000);
          gc::any_codec const codec = gc::make_codec(spec);
          gc::two_way_compressor<gc::any_codec> tw(codec);
          auto const g = rank_gradient(1000, c.rank(), 0);
          std::vector<float> out(1000);
          try {
            for (int step = 0; step < 2; ++step) {
              gc::tensor_view<float const> v{std::span<float const>(g)};
              if (two_way_mode) gc::all_reduce_two_way(comm, tw, v, std::span<float>(out));
              else gc::all_reduce_compressed(comm, codec, v, std::span<float>(out));
            }
          } catch (gc::comm_error const&) {
            kinds[static_cast<std::size_t>(c.rank())] = 2;
            throw;
          } catch (std::runtime_error const&) {
            kinds[static_cast<std::size_t>(c.rank())] = 1;
            throw;
          }
        }, 30s));
        REQUIRE(kinds == std::vector<int>{2, 2, 1, 2});
        REQUIRE(std::chrono::steady_clock::now() - t0 < 15s);
      }
    }
  }
}

TEST_CASE(
    "a peer announcing an impossible packet size is a format_error before anything is allocated",
    "[collective][agreement][regression]") {
  // Regression (fuzz, tests/fuzz/regressions/peer/two-way-unchecked-size): the packet sizes in
  // agreement reports and parameter-server replies came from the peers unchecked, so a peer
  // announcing 2^58 bytes made rank 0 allocate that much (and a sum of such sizes could wrap
  // around). Rank 1 here overwrites the size fields of everything it sends.
  auto forge = [](std::vector<std::byte>& m) {
    if (m.size() < gc::rank_report_bytes || (m.size() - gc::rank_report_bytes) % 8 != 0) return;
    for (std::size_t at = 24; at + 8 <= m.size(); at += 8)
      gc::detail::store_le<std::uint64_t>(m.data() + at, std::uint64_t{1} << 58);
  };
  for (int mode = 0; mode < 4; ++mode) {
    CAPTURE(mode);
    std::vector<std::string> errors(2);
    REQUIRE_THROWS(run_in_process(2, [&](in_process_communicator& c) {
      faulty_communicator comm(
          c, 1000,
          c.rank() == 1 ? faulty_communicator::forger(forge) : faulty_communicator::forger{});
      gc::any_codec const codec = gc::make_codec("topk:k=10");
      gc::two_way_compressor<gc::any_codec> tw(codec);
      auto const g = rank_gradient(100, c.rank(), 0);
      std::vector<float> out(g.size());
      gc::tensor_view<float const> const v{std::span<float const>(g)};
      try {
        if (mode == 0) {
          gc::all_reduce_compressed(comm, codec, v, std::span<float>(out));
        } else if (mode == 1) {
          gc::bucketed_all_reduce<gc::any_codec> b(codec, {.min_compress_elements = 10});
          std::vector<gc::bucket_item> const items{{v, std::span<float>(out)}};
          (void)b.run(comm, std::span<gc::bucket_item const>(items));
        } else if (mode == 2) {
          gc::all_reduce_two_way(comm, tw, v, std::span<float>(out));
        } else if (c.rank() == 0) {
          gc::ps_push_pull(comm, tw, v, std::span<float>(out));
        } else {
          gc::ps_serve(comm, tw, v.id(), g.size());
        }
      } catch (gc::format_error const& e) {
        errors[static_cast<std::size_t>(c.rank())] = e.what();
        throw;
      }
    }));
    INFO(errors[0]);
    // The message names the forged size (2^58), whichever check caught it.
    CHECK(errors[0].find("288230376151711744") != std::string::npos);
  }
}
