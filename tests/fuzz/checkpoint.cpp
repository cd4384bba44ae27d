// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Fuzz target: the gradient pipeline's checkpoint, `gradient_pipeline::load` ("GCPL", with the
// error-feedback, controller, PowerSGD and two-way states inside), for every pipeline setup
// (`pipeline_setups`).
//
// Input: one byte choosing the setup, then the checkpoint (its CRC32C trailer is recomputed
// before loading, so that the fuzzer reaches the parsing; `sealed`).
//
// Oracles: a checkpoint that loads, saved again, loads into a fresh pipeline and saves to the
// same bytes; a rejected one leaves the pipeline as it was.

#include "configs.hpp"
#include "fuzz.hpp"
#include "scenarios.hpp"
#include "state_oracle.hpp"

#include <gradcomp/pipeline/pipeline.hpp>

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  using namespace gradcomp_fuzz;
  input in(data, size);
  gradcomp::pipeline_options const o = pipeline_options_of(pick(pipeline_setups, in.u8()));
  check_reload([&] { return gradcomp::gradient_pipeline(o); },
               sealed(in.rest()));  // checksum recomputed
  return 0;
}
