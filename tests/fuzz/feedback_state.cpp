// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Fuzz target: the error-feedback state loaders, `compressor::load` ("GCEF", each policy) and
// `two_way_compressor::load` ("GCTW"); and error feedback with 16-bit wire values on arbitrary
// gradients (`half_steps`).
//
// Input: one byte choosing the case (modulo 7): 0-5 a loader, then the state (with its CRC32C
// trailer recomputed: `sealed`; "GCEF" version 3 and "GCTW" end in one); 6 the 16-bit
// steps: one byte choosing the codec (`half_codecs`), one the policy, then up to 8 steps of 16
// float32 values (raw little-endian bits: NaNs, infinities, huge finite values).
//
// Oracles: a state that loads, saved again, loads into a fresh object and saves to the same
// bytes (save ∘ load is idempotent after one round); a failed load leaves the object as it was.
// A 16-bit step either succeeds, and then the committed state (residual, EF21 estimate and
// receiver, DGC [u | v]) is finite and the packet of a finite gradient decodes to finite
// values; or it throws a gradcomp error and the state is as before the step. A binary16 codec
// never refuses a step while every gradient so far was finite and at most 1e30 in magnitude
// (its wire range saturates; float32 itself cannot overflow there).

#include "fuzz.hpp"
#include "state_oracle.hpp"

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/feedback/dgc.hpp>
#include <gradcomp/feedback/policies.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace {

namespace gc = gradcomp;
using namespace gradcomp_fuzz;

gc::any_codec codec() { return gc::make_codec("topk:k=2"); }

// Every codec whose packets carry 16-bit values; the first half binary16.
constexpr char const* half_codecs[] = {"fp16",
                                       "topk:k=4,values=f16",
                                       "threshold:value=0.5,values=f16",
                                       "randomk:k=4,scale=true,values=f16",
                                       "approx_topk:k=4,values=f16",
                                       "bf16",
                                       "topk:k=4,values=bf16",
                                       "threshold:value=0.5,values=bf16",
                                       "randomk:k=4,values=bf16",
                                       "approx_topk:k=4,values=bf16"};
constexpr std::size_t binary16_codecs = 5;
constexpr std::size_t n = 16;

std::vector<float> values(std::span<float const> s) { return {s.begin(), s.end()}; }

bool finite(std::span<float const> v) {
  for (float x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

template <class Compressor>
void run_steps(Compressor c, bool binary16, input& in) {
  gc::tensor_id const id{1};
  gc::codec_context ctx = context();
  std::vector<std::byte> p(c.codec().max_compressed_bytes(n));
  bool all_tame = true;  // every step so far had a tame gradient
  for (int step = 0; step < 8 && in.left() >= 4 * n; ++step) {
    std::vector<float> g(n);
    bool tame = true;
    for (float& v : g) {
      v = std::bit_cast<float>(in.u32());
      tame = tame && std::isfinite(v) && std::fabs(v) <= 1e30f;
    }
    all_tame = all_tame && tame;
    std::vector<float> const before = values(c.state(id).values());
    ctx.step = static_cast<std::uint32_t>(step);
    std::size_t bytes = 0;
    bool const ok = accepted([&] {
      bytes = c.compress(gc::tensor_view<float const>(std::span<float const>(g), id),
                         std::span<std::byte>(p), ctx);
    });
    if (!ok) {
      GRADCOMP_FUZZ_CHECK(values(c.state(id).values()) == before,
                          "a refused step changed the state");
      GRADCOMP_FUZZ_CHECK(!(binary16 && all_tame),
                          "a binary16 codec refused a finite gradient within float32's range");
      continue;
    }
    GRADCOMP_FUZZ_CHECK(finite(c.state(id).values()), "a committed step left a non-finite state");
    std::vector<float> out(n);
    c.codec().decompress(std::span<std::byte const>(p).first(bytes), std::span<float>(out), ctx);
    if (!finite(g)) continue;  // only no_feedback accepts it (fp16 and bf16 carry NaN and inf)
    GRADCOMP_FUZZ_CHECK(finite(out), "a finite gradient put an infinity on the wire");
    // EF21's receiver adds the increments: finite while their sum is (one sender here).
    c.receive(id, std::span<float>(out));
    GRADCOMP_FUZZ_CHECK(finite(out), "the receiver's estimate is not finite");
  }
}

void half_steps(input& in) {
  std::size_t const k = in.u8() % std::size(half_codecs);
  gc::any_codec const codec = gc::make_codec(half_codecs[k]);
  bool const binary16 = k < binary16_codecs;
  switch (in.u8() % 4) {
    case 0: run_steps(gc::compressor<gc::any_codec, gc::no_feedback>(codec), binary16, in); break;
    case 1:
      run_steps(gc::compressor<gc::any_codec, gc::residual_feedback>(codec), binary16, in);
      break;
    case 2: run_steps(gc::compressor<gc::any_codec, gc::ef21_feedback>(codec), binary16, in); break;
    default:
      run_steps(gc::compressor<gc::any_codec, gc::dgc_feedback>(codec, gc::dgc_feedback(0.9f, 0.0)),
                binary16, in);
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  input in(data, size);
  std::uint8_t const which = in.u8();
  if (which % 7 == 6) {
    half_steps(in);
    return 0;
  }
  std::span<std::byte const> const state = in.rest();
  // Every state ends in a CRC32C ("GCEF" v3, "GCTW"): recomputed, so that the parser is reached
  std::vector<std::byte> const framed = sealed(state);
  switch (which % 7) {
    case 0:
      check_reload([] { return gc::compressor<gc::any_codec, gc::no_feedback>(codec()); }, framed);
      break;
    case 1:
      check_reload([] { return gc::compressor<gc::any_codec, gc::residual_feedback>(codec()); },
                   framed);
      break;
    case 2:
      check_reload([] { return gc::compressor<gc::any_codec, gc::ef21_feedback>(codec()); }, framed);
      break;
    case 3:
      check_reload(
          [] {
            return gc::compressor<gc::any_codec, gc::dgc_feedback>(codec(),
                                                                   gc::dgc_feedback(0.9f, 0.0));
          },
          framed);
      break;
    case 4:
      check_reload(
          [] {
            return gc::two_way_compressor<gc::any_codec, gc::no_feedback, gc::no_feedback>(codec());
          },
          framed);
      break;
    default:
      check_reload(
          [] {
            return gc::two_way_compressor<gc::any_codec, gc::residual_feedback,
                                          gc::residual_feedback>(codec());
          },
          framed);
      break;
  }
  return 0;
}
