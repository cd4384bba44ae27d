// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Fuzz target: the controllers' saved state, `any_controller::load` ("GCCT"), for every kind
// of controller (`controller_specs`).
//
// Input: one byte choosing the controller, then the state (its CRC32C trailer recomputed
// before loading, so that the fuzzer reaches the parsing; `sealed`).
//
// Oracles: a state that loads, saved again, loads into a fresh controller and saves to the same
// bytes; a rejected state leaves the controller as it was; a loaded controller goes on deciding
// (three steps) with nothing worse than a gradcomp error.

#include "configs.hpp"
#include "controller_steps.hpp"
#include "fuzz.hpp"
#include "state_oracle.hpp"

#include <gradcomp/adapt/any_controller.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  using namespace gradcomp_fuzz;
  input in(data, size);
  std::string_view const spec = pick(controller_specs, in.u8());
  std::vector<std::byte> const state = sealed(in.rest());  // the checksum recomputed
  auto make = [&] { return gradcomp::make_controller(spec); };
  check_reload(make, state);
  gradcomp::any_controller c = make();
  if (accepted([&] { c.load(state); })) (void)accepted([&] { drive_controller(c, 3); });
  return 0;
}
