// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Fuzz target: the PowerSGD state loader, `powersgd::load` ("GCPS").
//
// Input: one byte choosing the loader's options (bits 0-1: rank - 1; bits 2-3: min_elements
// 0, 1, 16 or 4096), then the state (its CRC32C trailer recomputed: `sealed`).
//
// Oracle: a state that loads, saved again, loads into a fresh object and saves to the same
// bytes; a rejected state leaves the object as it was.

#include "configs.hpp"
#include "fuzz.hpp"
#include "state_oracle.hpp"

#include <gradcomp/codec/powersgd.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  using namespace gradcomp_fuzz;
  input in(data, size);
  auto const o = powersgd_options_of<gradcomp::powersgd_options>(in.u8());
  // "GCPS" version 2 ends in a CRC32C: recomputed, so that the parser is reached
  check_reload([&] { return gradcomp::powersgd(o); }, sealed(in.rest()));
  return 0;
}
