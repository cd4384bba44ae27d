// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// The node and lane communicators of a grouping as in-process worlds of their own, as a
// transport's split (NCCL's ncclCommSplit, MPI_Comm_split) makes them: what the tests of
// `all_reduce_hierarchical`'s `hierarchical_groups` overload and of the pipeline's
// `set_hierarchical_groups` hand to every rank.

#include <gradcomp/comm/group.hpp>
#include <gradcomp/comm/in_process.hpp>

#include <chrono>
#include <cstddef>
#include <optional>
#include <vector>

namespace gradcomp_test {

// A communicator size and its grouping into nodes, named for the test's messages.
struct grouping_case {
  char const* name;
  int ranks;
  gradcomp::node_grouping nodes;
};

struct split_worlds {
  gradcomp::node_layout layout;
  int lanes = 1;  // lanes of the hierarchy (0 in the options: the smallest node's size)
  std::vector<gradcomp::in_process_world> nodes, lane_worlds;

  // The worlds of `grouping` over `ranks` ranks with `lanes_option` lanes; their waits give up
  // after 20 s (a test that loses a rank fails instead of hanging).
  split_worlds(gradcomp::node_grouping const& grouping, int ranks, int lanes_option)
      : layout(grouping.layout(ranks)), lanes(lanes_option == 0 ? layout.min_node_size() : lanes_option) {
    for (int k = 0; k < layout.nodes(); ++k)
      nodes.emplace_back(static_cast<int>(layout.node_ranks(k).size()), std::chrono::seconds(20));
    for (int j = 0; j < lanes; ++j) lane_worlds.emplace_back(layout.nodes(), std::chrono::seconds(20));
  }
  // Rank r's node: the node's ranks numbered in ascending parent rank.
  [[nodiscard]] gradcomp::in_process_communicator node(int r) const {
    return nodes[static_cast<std::size_t>(layout.node_of(r))].communicator(layout.local_rank(r));
  }
  // Rank r's lane, numbered by node; none where r owns no shard.
  [[nodiscard]] std::optional<gradcomp::in_process_communicator> lane(int r) const {
    int const j = layout.local_rank(r);
    if (j >= lanes) return std::nullopt;
    return lane_worlds[static_cast<std::size_t>(j)].communicator(layout.node_of(r));
  }
};

}  // namespace gradcomp_test
