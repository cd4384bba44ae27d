// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Finite gradients beyond a 16-bit wire type's range (issue 35, part 1): the codecs saturate
// them at the type's largest finite value, every error-feedback state stays finite after every
// committed step (the excess stays in the residual, so mass is conserved), for every codec with
// 16-bit values x every feedback policy, alone and in gradient_pipeline under each guard policy.
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/gradcomp.hpp>
#include <gradcomp/pipeline/pipeline.hpp>

#include "../support/rank_check.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace gc = gradcomp;

namespace {

// Every codec whose packets carry 16-bit values, each with whether they are bfloat16.
struct half_spec {
  char const* spec;
  bool bf16;
};
std::vector<half_spec> half_codecs() {
  return {{"fp16", false},
          {"bf16", true},
          {"topk:ratio=0.25,values=f16", false},
          {"topk:ratio=0.25,values=bf16", true},
          {"threshold:value=0.5,values=f16", false},
          {"threshold:value=0.5,values=bf16", true},
          {"randomk:ratio=0.25,scale=true,values=f16", false},
          {"randomk:ratio=0.25,values=bf16", true},
          {"approx_topk:ratio=0.25,values=f16", false},
          {"approx_topk:ratio=0.25,values=bf16", true}};
}

char const* const feedbacks[] = {"none", "residual", "ef21", "dgc", "dgc:momentum=0.5"};

bool all_finite(std::span<float const> v) {
  for (float x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

// Step `step` of a 64-element gradient: step 0 holds finite values beyond the wire type's
// range (both signs), the later steps are ordinary.
std::vector<float> gradient(std::uint64_t step, bool bf16) {
  std::vector<float> g(64);
  for (std::size_t i = 0; i < g.size(); ++i) {
    g[i] = static_cast<float>(std::sin(0.7 * static_cast<double>(i) + static_cast<double>(step)));
  }
  if (step == 0) {
    if (bf16) {
      g[3] = 3.4e38f;  // above the largest bfloat16 (3.3895e38): rounds to +inf unsaturated
      g[17] = -std::numeric_limits<float>::max();
    } else {
      g[3] = 1e5f;
      g[17] = -3e6f;
      g[30] = 65520.0f;  // the tie that rounds to +inf
      g[41] = 1e30f;
    }
  }
  return g;
}

}  // namespace

TEST_CASE("16-bit codecs saturate a finite overflow at the largest finite value",
          "[codec][fp16][bf16][saturate]") {
  for (half_spec const& h : half_codecs()) {
    INFO(h.spec);
    gc::any_codec const codec = gc::make_codec(h.spec);
    std::vector<float> g = gradient(0, h.bf16);
    bool const dense = std::string(h.spec).find(':') == std::string::npos;
    // a true infinity is still sent as one (the sparse codecs refuse it)
    if (dense) g[50] = std::numeric_limits<float>::infinity();
    std::vector<std::byte> p(codec.max_compressed_bytes(g.size()));
    p.resize(
        codec.compress(gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{0}),
                       std::span<std::byte>(p)));
    std::vector<float> d(g.size());
    codec.decompress(std::span<std::byte const>(p), std::span<float>(d));
    float const top = h.bf16 ? gc::quant::bfloat16_max : gc::quant::half_max;
    for (std::size_t i = 0; i < g.size(); ++i) {
      INFO(i);
      if (i == 50 && dense) {
        REQUIRE(d[i] == std::numeric_limits<float>::infinity());
      } else {
        REQUIRE(std::isfinite(d[i]));
        if (std::fabs(g[i]) > top && d[i] != 0.0f) REQUIRE(d[i] == std::copysign(top, g[i]));
      }
    }
  }
  // The plain conversions (half, bfloat16) are unchanged: they still round to infinity.
  REQUIRE(gc::float_to_half_bits(1e5f) == 0x7c00u);
  REQUIRE(gc::quant::half_bits_saturated(1e5f) == 0x7bffu);
  REQUIRE(gc::quant::half_bits_saturated(-std::numeric_limits<float>::infinity()) == 0xfc00u);
  REQUIRE(gc::quant::bfloat16_bits_saturated(std::numeric_limits<float>::max()) == 0x7f7fu);
}

TEST_CASE(
    "16-bit values x every feedback policy: every committed state is finite, mass is conserved",
    "[feedback][fp16][bf16][saturate]") {
  for (half_spec const& h : half_codecs()) {
    for (char const* fb : feedbacks) {
      INFO(h.spec << " / " << fb);
      gc::any_codec const codec = gc::make_codec(h.spec);
      auto comp = gc::make_feedback(fb, codec);
      std::size_t const n = 64;
      std::vector<double> sum_g(n, 0.0), sum_d(n, 0.0);
      for (std::uint64_t step = 0; step < 3; ++step) {
        INFO("step " << step);
        std::vector<float> const g = gradient(step, h.bf16);
        gc::codec_context ctx;
        ctx.step = static_cast<std::uint32_t>(step);
        std::vector<std::byte> p(codec.max_compressed_bytes(n));
        std::vector<float> d(n);
        std::span<float const> state;
        bool refused = false;
        std::visit(
            [&](auto& c) {
              std::span<float const> const before = c.state(gc::tensor_id{7}).values();
              std::vector<float> const kept(before.begin(), before.end());
              try {
                p.resize(c.compress(
                    gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{7}),
                    std::span<std::byte>(p), ctx));
              } catch (gc::numeric_error const&) {
                // Only float32 itself may overflow (a bfloat16-range value accumulated by DGC's
                // momentum): refused, state unchanged. Never with binary16's range.
                REQUIRE(h.bf16);
                std::span<float const> const after = c.state(gc::tensor_id{7}).values();
                REQUIRE(std::vector<float>(after.begin(), after.end()) == kept);
                refused = true;
                state = after;
                return;
              }
              codec.decompress(std::span<std::byte const>(p), std::span<float>(d), ctx);
              REQUIRE(all_finite(d));  // a finite gradient never puts an infinity on the wire
              std::vector<float> io = d;
              c.receive(gc::tensor_id{7}, std::span<float>(io));  // EF21: the receiver's estimate
              REQUIRE(all_finite(io));
              state = c.state(gc::tensor_id{7}).values();
            },
            comp);
        REQUIRE(all_finite(state));
        if (refused) continue;
        for (std::size_t i = 0; i < n; ++i) {
          sum_g[i] += g[i];
          sum_d[i] += d[i];
        }
        if (std::string(fb) == "residual") {
          // sum of decoded packets + residual = sum of gradients (float rounding only)
          REQUIRE(state.size() == n);
          for (std::size_t i = 0; i < n; ++i) {
            double const scale = std::fabs(sum_g[i]) + std::fabs(sum_d[i]) + 1.0;
            REQUIRE(std::fabs(sum_d[i] + state[i] - sum_g[i]) <= 1e-6 * scale);
          }
        }
        if (std::string(fb) == "ef21") {
          // h = sum of the decoded packets
          for (std::size_t i = 0; i < n; ++i) {
            REQUIRE(std::fabs(state[i] - sum_d[i]) <= 1e-6 * (std::fabs(sum_d[i]) + 1.0));
          }
        }
      }
    }
  }
}

TEST_CASE(
    "16-bit values in gradient_pipeline: a finite overflow never poisons the state, under every "
    "guard",
    "[pipeline][guard][saturate]") {
  char const* const codecs[] = {"fp16", "topk:ratio=0.05,values=f16",
                                "threshold:value=0.5,values=bf16"};
  char const* const guards[] = {"raise", "skip", "dense", "off"};
  char const* const fbs[] = {"residual", "ef21", "dgc"};
  for (char const* codec : codecs) {
    for (char const* fb : fbs) {
      for (char const* guard : guards) {
        INFO(codec << " / " << fb << " / guard " << guard);
        bool const bf16 = std::string(codec).find("bf16") != std::string::npos;
        REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
          gc::pipeline_options o;
          o.codec = codec;
          o.feedback = fb;
          o.guard = guard;
          o.measured_timing = false;
          o.buckets.min_compress_elements = 32;
          gc::gradient_pipeline p(o);
          for (std::uint64_t step = 0; step < 4; ++step) {
            // the overflow on rank 0 only (a sum of two saturated values would overflow the
            // 16-bit sum itself)
            std::vector<float> g = gradient(comm.rank() == 0 ? step : step + 1, bf16);
            if (bf16 && step == 0 && comm.rank() == 0) g[17] = 0.0f;
            std::vector<gc::tensor_view<float>> v{
                gc::tensor_view<float>(std::span<float>(g), gc::tensor_id{0})};
            gc::pipeline_stats const st = p.step(comm, std::span<gc::tensor_view<float> const>(v));
            RANK_REQUIRE(st.guard == gc::guard_action::none);
            RANK_REQUIRE(all_finite(g));
            RANK_REQUIRE(all_finite(p.feedback_state(gc::tensor_id{0})));
          }
          RANK_REQUIRE(p.step_count() == 4);
        }));
      }
    }
  }
}
