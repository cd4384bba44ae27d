// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Checkpoint integrity (issue 35, part 2): a saved state ends in a CRC32C of all its bytes
// (core/serialize.hpp), so one flipped byte anywhere in a real checkpoint — the pipeline's
// "GCPL" with the error-feedback, controller and guard states inside it, the two-way and
// controller states, the 1-bit Adam state — is a format_error that changes nothing.
#include <gradcomp/adapt/any_controller.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/gradcomp.hpp>
#include <gradcomp/optim/onebit_adam.hpp>
#include <gradcomp/pipeline/pipeline.hpp>

#include "../support/rank_check.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace gc = gradcomp;

namespace {

std::vector<float> grad(std::size_t n, std::uint64_t step, std::size_t salt) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    g[i] =
        static_cast<float>(std::sin(0.37 * static_cast<double>(i) +
                                    0.9 * static_cast<double>(step) + static_cast<double>(salt)));
  }
  return g;
}

// Flips each byte of `saved` in turn (all bits, then the lowest bit): every copy must be
// refused by `load` with format_error, and `state()` must not change. Returns the number of
// copies that were accepted (0 expected).
std::size_t accepted_flips(std::vector<std::byte> const& saved,
                           std::function<void(std::span<std::byte const>)> const& load,
                           std::function<std::vector<std::byte>()> const& state) {
  std::vector<std::byte> const before = state();
  std::size_t accepted = 0;
  for (std::size_t i = 0; i < saved.size(); ++i) {
    for (std::byte mask : {std::byte{0xff}, std::byte{0x01}}) {
      std::vector<std::byte> bad = saved;
      bad[i] ^= mask;
      try {
        load(bad);
        ++accepted;
      } catch (gc::format_error const&) {
      }
      if (state() != before) ++accepted;
    }
  }
  return accepted;
}

}  // namespace

TEST_CASE(
    "checkpoints: a flipped byte anywhere in a pipeline checkpoint is refused, nothing changes",
    "[pipeline][checkpoint][integrity]") {
  for (char const* feedback : {"residual", "ef21", "dgc"}) {
    INFO(feedback);
    gc::pipeline_options o;
    o.codec = "topk:ratio=0.1";
    o.feedback = feedback;
    o.guard = "skip:window=4,warmup=2";
    o.measured_timing = false;
    o.buckets.min_compress_elements = 64;
    if (std::string(feedback) == "residual")
      o.controller = "gravac:theta_min=2,theta_max=16,window=2";
    std::vector<std::byte> saved;
    REQUIRE_NOTHROW(gc::run_in_process(1, [&](gc::in_process_communicator& comm) {
      gc::gradient_pipeline p(o);
      for (std::uint64_t s = 0; s < 3; ++s) {
        std::vector<float> a = grad(200, s, 0), b = grad(16, s, 1);
        std::vector<gc::tensor_view<float>> v{
            gc::tensor_view<float>(std::span<float>(a), gc::tensor_id{0}),
            gc::tensor_view<float>(std::span<float>(b), gc::tensor_id{1})};
        p.step(comm, std::span<gc::tensor_view<float> const>(v),
               {.backprop_s = 0.01, .batch_size = 8});
      }
      saved = p.save();
    }));
    gc::gradient_pipeline q(o);
    q.load(saved);  // the real checkpoint loads
    REQUIRE(q.save() == saved);
    CHECK(accepted_flips(
              saved, [&](std::span<std::byte const> b) { q.load(b); }, [&] { return q.save(); }) ==
          0);
    // a truncated one too, and one with a byte appended
    for (std::size_t cut : {std::size_t{0}, std::size_t{19}, saved.size() / 2, saved.size() - 1}) {
      CHECK_THROWS_AS(q.load(std::span<std::byte const>(saved).first(cut)), gc::format_error);
    }
    std::vector<std::byte> longer = saved;
    longer.push_back(std::byte{0});
    CHECK_THROWS_AS(q.load(longer), gc::format_error);
    CHECK(q.save() == saved);
  }
}

TEST_CASE("checkpoints: controller, two-way and 1-bit Adam states refuse every flipped byte",
          "[checkpoint][integrity]") {
  // a controller (its decisions are covered inside the pipeline checkpoint above)
  gc::any_controller c = gc::make_controller("accordion:low=4,high=32,eta=0.5,interval=4,accumulation=2");
  std::vector<std::byte> const cs = c.save();
  CHECK(accepted_flips(
            cs, [&](std::span<std::byte const> b) { c.load(b); }, [&] { return c.save(); }) == 0);

  // two-way compression and 1-bit Adam after a compressed step (their states hold residuals)
  std::vector<std::byte> tws, adam_state;
  REQUIRE_NOTHROW(gc::run_in_process(1, [&](gc::in_process_communicator& comm) {
    gc::two_way_compressor<gc::any_codec> tw(gc::make_codec("topk:ratio=0.2"));
    std::vector<float> const g = grad(50, 0, 2);
    std::vector<float> out(g.size());
    gc::all_reduce_two_way(
        comm, tw, gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{3}),
        std::span<float>(out));
    tws = tw.save();
    gc::onebit_adam<gc::any_codec> opt(gc::make_codec("onebit"), {.warmup = 1});
    std::vector<float> x(40, 0.5f);
    for (std::uint64_t s = 0; s < 3; ++s) {
      std::vector<float> const gs = grad(40, s, 3);
      opt.step(comm, std::span<float>(x),
               gc::tensor_view<float const>(std::span<float const>(gs), gc::tensor_id{0}));
    }
    adam_state = opt.save();
  }));
  gc::two_way_compressor<gc::any_codec> tw(gc::make_codec("topk:ratio=0.2"));
  tw.load(tws);
  CHECK(accepted_flips(
            tws, [&](std::span<std::byte const> b) { tw.load(b); }, [&] { return tw.save(); }) ==
        0);
  gc::onebit_adam<gc::any_codec> opt(gc::make_codec("onebit"), {.warmup = 1});
  opt.load(adam_state);
  CHECK(accepted_flips(
            adam_state, [&](std::span<std::byte const> b) { opt.load(b); },
            [&] { return opt.save(); }) == 0);

  // the frame: a state with its frame byte cleared (as saved before checksums) is refused as such
  std::vector<std::byte> old = cs;
  old[5] = std::byte{0};
  gc::detail::seal_state(old);
  try {
    c.load(old);
    FAIL("a state without a checksum loaded");
  } catch (gc::format_error const& e) {
    CHECK(std::string(e.what()).find("carries no checksum") != std::string::npos);
  }
}
