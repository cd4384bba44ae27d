// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// The mock of the host-emulated collective tests (collective_host.cu, two_way_host.cu): an
// in-process communicator under the NCCL adapter's contract (comm/nccl.cuh: any span may be
// host or device memory, told apart by its pointer; a rank that fails or disappears fails
// every peer with comm_error), recording which operations carried device payloads and which
// carried host control messages. Build with Thrust's CPP device system, where cuda/memory.cuh
// records the emulated device allocations.

#pragma once

#include <gradcomp/comm/blocking.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/cuda/memory.cuh>

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <span>
#include <utility>

namespace gc = gradcomp;

namespace gct {

struct traffic {
  std::mutex mutex;
  std::size_t device_ops = 0;    // operations whose buffers are device memory (payloads)
  std::size_t device_bytes = 0;  // their bytes sent
  std::size_t host_ops = 0;      // operations on host memory (control messages)
  std::size_t host_max = 0;      // the largest host message a rank sent
  std::size_t mixed = 0;         // operations mixing host and device buffers

  void note(std::span<std::byte const> a, std::span<std::byte const> b, std::size_t sent) {
    bool const da =
        !a.empty() && gc::cuda::memory_kind_of(a.data()) == gc::cuda::memory_kind::device;
    bool const db =
        !b.empty() && gc::cuda::memory_kind_of(b.data()) == gc::cuda::memory_kind::device;
    bool const ha = !a.empty() && !da;
    bool const hb = !b.empty() && !db;
    std::lock_guard lock(mutex);
    if ((da || db) && (ha || hb)) ++mixed;
    if (da || db) {
      ++device_ops;
      device_bytes += sent;
    } else if (ha || hb) {
      ++host_ops;
      host_max = std::max(host_max, sent);
    }
  }
};

class emulated_nccl : public gc::blocking_operations<emulated_nccl> {
 public:
  using communicator_concept = gc::communicator_tag;

  emulated_nccl(gc::in_process_communicator inner, traffic& log)
      : inner_(std::move(inner)), log_(&log) {}

  [[nodiscard]] int rank() const noexcept { return inner_.rank(); }
  [[nodiscard]] int size() const noexcept { return inner_.size(); }

  gc::request ibarrier() { return inner_.ibarrier(); }
  gc::request ibroadcast(std::span<std::byte> buf, int root) {
    log_->note(buf, {}, buf.size());
    return inner_.ibroadcast(buf, root);
  }
  gc::request iall_reduce(std::span<std::byte> buf, gc::comm_type t, gc::reduce_op op) {
    log_->note(buf, {}, buf.size());
    return inner_.iall_reduce(buf, t, op);
  }
  gc::request ireduce_scatter(std::span<std::byte const> in, std::span<std::byte> out,
                              gc::comm_type t, gc::reduce_op op) {
    log_->note(in, out, in.size());
    return inner_.ireduce_scatter(in, out, t, op);
  }
  gc::request iall_gather(std::span<std::byte const> in, std::span<std::byte> out) {
    log_->note(in, out, in.size());
    return inner_.iall_gather(in, out);
  }
  gc::request iall_gather_v(std::span<std::byte const> in, std::span<std::byte> out,
                            std::span<std::size_t const> counts) {
    log_->note(in, out, in.size());
    return inner_.iall_gather_v(in, out, counts);
  }
  gc::request iall_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> sc,
                            std::span<std::byte> out, std::span<std::size_t const> rc) {
    log_->note(in, out, in.size());
    return inner_.iall_to_all_v(in, sc, out, rc);
  }
  gc::request isend(std::span<std::byte const> in, int peer, int tag) {
    log_->note(in, {}, in.size());
    return inner_.isend(in, peer, tag);
  }
  gc::request irecv(std::span<std::byte> out, int peer, int tag) {
    log_->note(out, {}, 0);
    return inner_.irecv(out, peer, tag);
  }

 private:
  gc::in_process_communicator inner_;
  traffic* log_;
};

static_assert(gc::communicator<emulated_nccl>);

}  // namespace gct
