// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Fuzz target: the error-feedback state loaders, `compressor::load` ("GCEF", each policy) and
// `two_way_compressor::load` ("GCTW").
//
// Input: one byte choosing the loader (`loaders` below, modulo their number), then the state.
//
// Oracle: a state that loads, saved again, loads into a fresh object and saves to the same
// bytes (save ∘ load is idempotent after one round); a failed load leaves the object as it was.

#include "fuzz.hpp"
#include "state_oracle.hpp"

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/feedback/dgc.hpp>
#include <gradcomp/feedback/policies.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

namespace {

namespace gc = gradcomp;
using namespace gradcomp_fuzz;

gc::any_codec codec() { return gc::make_codec("topk:k=2"); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  input in(data, size);
  std::uint8_t const which = in.u8();
  std::span<std::byte const> const state = in.rest();
  switch (which % 6) {
    case 0:
      check_reload([] { return gc::compressor<gc::any_codec, gc::no_feedback>(codec()); }, state);
      break;
    case 1:
      check_reload([] { return gc::compressor<gc::any_codec, gc::residual_feedback>(codec()); },
                   state);
      break;
    case 2:
      check_reload([] { return gc::compressor<gc::any_codec, gc::ef21_feedback>(codec()); }, state);
      break;
    case 3:
      check_reload(
          [] {
            return gc::compressor<gc::any_codec, gc::dgc_feedback>(codec(),
                                                                   gc::dgc_feedback(0.9f, 0.0));
          },
          state);
      break;
    case 4:
      check_reload(
          [] {
            return gc::two_way_compressor<gc::any_codec, gc::no_feedback, gc::no_feedback>(codec());
          },
          state);
      break;
    default:
      check_reload(
          [] {
            return gc::two_way_compressor<gc::any_codec, gc::residual_feedback,
                                          gc::residual_feedback>(codec());
          },
          state);
      break;
  }
  return 0;
}
