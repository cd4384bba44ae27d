// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// local_update (DiLoCo family) over MPI ranks: the identity codec against the plain reference
// (within the rounding of MPI's order of summation), identical theta_sync on every rank for a
// gathered codec with error feedback, a run resumed from `save` equal to one that never stopped,
// and a NaN on one rank failing the sync on every rank with every state unchanged.

#include <gradcomp/comm/mpi.hpp>
#include <gradcomp/optim/local_update.hpp>

#include "../unit/optim/local_update_support.hpp"
#include "check.hpp"

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

using namespace gradcomp;
using namespace std::chrono_literals;
using namespace local_update_test;

namespace {

mpi_options local_update_mpi_options() {
  mpi_options o;
  o.timeout = 60s;
  return o;
}

std::uint64_t lu_fnv(std::span<float const> v, std::uint64_t h = 0xcbf29ce484222325ull) {
  for (float f : v) {
    std::uint32_t const b = std::bit_cast<std::uint32_t>(f);
    for (int i = 0; i < 4; ++i) h = (h ^ ((b >> (8 * i)) & 0xffu)) * 0x100000001b3ull;
  }
  return h;
}

// Whether every rank passed the same value.
bool same_everywhere(mpi_communicator& c, std::uint64_t v) {
  std::uint64_t h[2] = {v, ~v};
  c.all_reduce(std::as_writable_bytes(std::span<std::uint64_t>(h)), comm_type::u64, reduce_op::max);
  return h[0] == v && ~h[1] == v;
}

std::uint64_t sync_hash(local_update const& lu) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t k = 0; k < lu_sizes().size(); ++k) h = lu_fnv(lu.synchronized_weights(k), h);
  return h;
}

}  // namespace

MPI_TEST(local_update_matches_reference_over_mpi) {
  mpi_communicator c(MPI_COMM_WORLD, local_update_mpi_options());
  for (char const* outer : {"nesterov", "sparseloco", "average"}) {
    local_update_options o;
    o.outer = outer;
    o.sync_every = 3;
    local_update lu(o);
    weights_t w = lu_initial(c.rank());
    auto s = lu_spans(w);
    lu.start(c, s);
    for (std::uint64_t t = 1; t <= 10; ++t) {
      lu_inner_step(w, c.rank(), t);
      s = lu_spans(w);
      (void)lu.step(c, s);
    }
    lu_reference ref(o, c.size());
    ref.run(10);
    weights_t const& want = ref.w[static_cast<std::size_t>(c.rank())];
    for (std::size_t k = 0; k < w.size(); ++k)
      for (std::size_t i = 0; i < w[k].size(); ++i)
        MPI_CHECK(std::fabs(w[k][i] - want[k][i]) <= 1e-5f * (1.0f + std::fabs(want[k][i])));
    MPI_CHECK(same_everywhere(c, sync_hash(lu)));
  }
}

MPI_TEST(local_update_resumes_bit_identically_over_mpi) {
  mpi_communicator c(MPI_COMM_WORLD, local_update_mpi_options());
  local_update_options o;
  o.sync_every = 4;
  o.fragments = 2;
  o.overlap = 1;
  o.codec = "int8:bucket=64";
  o.feedback = "residual";
  auto run = [&](std::uint64_t from, std::uint64_t to, std::vector<std::byte> const* state, weights_t& w) {
    local_update lu(o);
    if (state != nullptr) {
      lu.load(*state);
    } else {
      w = lu_initial(c.rank());
      auto s = lu_spans(w);
      lu.start(c, s);
    }
    for (std::uint64_t t = from; t <= to; ++t) {
      lu_inner_step(w, c.rank(), t);
      auto s = lu_spans(w);
      (void)lu.step(c, s);
    }
    return lu.save();
  };
  weights_t whole, part;
  std::vector<std::byte> const straight = run(1, 13, nullptr, whole);
  std::vector<std::byte> const mid = run(1, 6, nullptr, part);
  std::vector<std::byte> const resumed = run(7, 13, &mid, part);
  MPI_CHECK(resumed == straight);
  MPI_CHECK(lu_same(part, whole));
  local_update lu(o);
  lu.load(straight);
  MPI_CHECK(same_everywhere(c, sync_hash(lu)));  // gathered int8 packets: the same theta_sync
}

MPI_TEST(local_update_nan_fails_every_rank_over_mpi) {
  mpi_communicator c(MPI_COMM_WORLD, local_update_mpi_options());
  local_update_options o;
  o.outer = "sparseloco";
  o.sync_every = 2;
  o.codec = "chunk_topk:chunk=64,k=4,values=int2";
  local_update lu(o);
  weights_t w = lu_initial(c.rank());
  auto s = lu_spans(w);
  lu.start(c, s);
  lu_inner_step(w, c.rank(), 1);
  (void)lu.step(c, s);
  lu_inner_step(w, c.rank(), 2);
  if (c.rank() == c.size() - 1) w[2][5] = std::numeric_limits<float>::infinity();
  std::vector<std::byte> const before = lu.save();
  weights_t const in = w;
  if (c.rank() == c.size() - 1) {
    MPI_CHECK_THROWS_WITH((void)lu.step(c, s), numeric_error, "tensor 2");
  } else {
    MPI_CHECK_THROWS_AS((void)lu.step(c, s), comm_error);
  }
  MPI_CHECK(lu.save() == before);
  MPI_CHECK(lu.steps() == 1);
  bool same = true;
  for (std::size_t k = 0; k < w.size(); ++k)
    same = same && std::memcmp(w[k].data(), in[k].data(), w[k].size() * sizeof(float)) == 0;
  MPI_CHECK(same);
}
