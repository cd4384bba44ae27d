// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Fuzz target: every message a rank decodes from its peers. Rank 0 runs a real collective
// (agreement rounds, all_reduce_compressed of each aggregation kind, error feedback, PowerSGD,
// two-way, parameter server, buckets, the gradient pipeline, dense) against a scripted peer
// whose every byte comes from the input (`scripted_peer`).
//
// Input: scenario, variant and size bytes (see `run_peer`), then the peer's bytes in the order
// rank 0 receives them.
//
// Oracle: the collective returns or throws a gradcomp error; a peer can make a step fail, never
// make rank 0 read or write out of bounds, allocate from an unchecked size, or hang.

#include "fuzz.hpp"
#include "scenarios.hpp"
#include "scripted_peer.hpp"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  using namespace gradcomp_fuzz;
  input in(data, size);
  unsigned const scenario = in.u8(), variant = in.u8(), n = in.u8();
  scripted_peer comm(in);
  (void)accepted([&] { run_peer(comm, scenario, variant, n); });
  return 0;
}
