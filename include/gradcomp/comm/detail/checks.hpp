// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Argument checks shared by the communicator adapters (async_adaptor, MPI, NCCL): each throws
/// `config_error` naming the operation, what it got and what it expected. They check what one
/// rank can see locally; agreement between ranks is the transport's business.

#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <cstddef>
#include <numeric>
#include <span>
#include <string>

GRADCOMP_NAMESPACE_BEGIN
namespace detail::comm_checks {

/// `peer` is a rank of a communicator of `size` ranks.
inline void peer(int p, int size, char const* what) {
  if (p < 0 || p >= size) {
    throw config_error(std::string("gradcomp: ") + what + " " + std::to_string(p) +
                       " is not a rank of this communicator (size " + std::to_string(size) + ")");
  }
}

/// Message tags are non-negative.
inline void tag(int t) {
  if (t < 0) throw config_error("gradcomp: message tags must be >= 0, got " + std::to_string(t));
}

/// A known type and operation, and a whole number of elements.
inline void reduction(std::size_t bytes, comm_type t, reduce_op op, char const* what) {
  std::size_t const es = comm_type_size(t);
  if (es == 0) {
    throw config_error(std::string("gradcomp: ") + what + " with an unknown comm_type " +
                       std::to_string(static_cast<unsigned>(t)));
  }
  if (op != reduce_op::sum && op != reduce_op::max && op != reduce_op::min) {
    throw config_error(std::string("gradcomp: ") + what + " with an unknown reduce_op " +
                       std::to_string(static_cast<unsigned>(op)));
  }
  if (bytes % es != 0) {
    throw config_error(std::string("gradcomp: ") + what + " of " + std::to_string(bytes) +
                       " bytes is not a whole number of " + comm_type_name(t) + " elements");
  }
}

/// One count per rank.
inline void counts(std::span<std::size_t const> c, int size, char const* what) {
  if (c.size() != static_cast<std::size_t>(size)) {
    throw config_error(std::string("gradcomp: ") + what + " has " + std::to_string(c.size()) +
                       " entries, the communicator has " + std::to_string(size) + " ranks");
  }
}

/// reduce_scatter: `in` holds `size` blocks of `out.size()` bytes.
inline void reduce_scatter(std::size_t in, std::size_t out, comm_type t, reduce_op op, int size) {
  reduction(out, t, op, "reduce_scatter");
  if (in != out * static_cast<std::size_t>(size)) {
    throw config_error("gradcomp: reduce_scatter needs an input of size() * output bytes (" +
                       std::to_string(size) + " * " + std::to_string(out) + "), got " +
                       std::to_string(in));
  }
}

/// all_gather: `out` holds `size` copies of `in.size()` bytes.
inline void all_gather(std::size_t in, std::size_t out, int size) {
  if (out != in * static_cast<std::size_t>(size)) {
    throw config_error("gradcomp: all_gather needs an output of size() * input bytes (" +
                       std::to_string(size) + " * " + std::to_string(in) + "), got " +
                       std::to_string(out));
  }
}

/// all_gather_v: one count per rank, ours equal to `in`, their sum equal to `out`.
inline void all_gather_v(std::size_t in, std::size_t out, std::span<std::size_t const> c, int rank,
                         int size) {
  counts(c, size, "all_gather_v counts");
  auto const r = static_cast<std::size_t>(rank);
  if (c[r] != in) {
    throw config_error("gradcomp: all_gather_v counts[" + std::to_string(rank) + "] is " +
                       std::to_string(c[r]) + " but this rank contributes " + std::to_string(in) +
                       " bytes");
  }
  std::size_t const total = std::accumulate(c.begin(), c.end(), std::size_t{0});
  if (total != out) {
    throw config_error("gradcomp: all_gather_v counts add up to " + std::to_string(total) +
                       " bytes, the output has " + std::to_string(out));
  }
}

/// all_to_all_v: one count per rank each way, sums equal to the buffers.
inline void all_to_all_v(std::size_t in, std::span<std::size_t const> sc, std::size_t out,
                         std::span<std::size_t const> rc, int size) {
  counts(sc, size, "all_to_all_v send counts");
  counts(rc, size, "all_to_all_v receive counts");
  std::size_t const st = std::accumulate(sc.begin(), sc.end(), std::size_t{0});
  std::size_t const rt = std::accumulate(rc.begin(), rc.end(), std::size_t{0});
  if (st != in || rt != out) {
    throw config_error("gradcomp: all_to_all_v counts add up to " + std::to_string(st) +
                       " sent / " + std::to_string(rt) + " received bytes, the buffers have " +
                       std::to_string(in) + " / " + std::to_string(out));
  }
}

}  // namespace detail::comm_checks
GRADCOMP_NAMESPACE_END
