// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The NCCL adapter: `gradcomp::cuda::nccl_communicator` models `communicator` over an
/// `ncclComm_t` and a CUDA stream. Needs `<nccl.h>` and libnccl: link the CMake target
/// `gradcomp::nccl` (created when nccl.h is found).
///
/// Buffers are device memory: every span handed to it holds device pointers (it never reads
/// them on the host). Operations are stream-ordered: each one is enqueued on the communicator's
/// stream, after whatever the caller enqueued there before (the kernels that produced the
/// gradient), and its `request` wraps a `cudaEvent_t` recorded right after it. `wait()` returns
/// once the operation has finished on the device; work enqueued on the same stream later is
/// ordered after it without any wait.
///
/// Mapping: `all_reduce` -> `ncclAllReduce` (in place), `reduce_scatter` -> `ncclReduceScatter`,
/// `all_gather` -> `ncclAllGather`, `broadcast` -> `ncclBroadcast` (in place); `all_gather_v`
/// and `all_to_all_v` are `ncclSend`/`ncclRecv` pairs inside one `ncclGroupStart`/`ncclGroupEnd`
/// (the rank's own block is a device-to-device `cudaMemcpyAsync`); `send`/`recv` are
/// `ncclSend`/`ncclRecv`; `ibarrier` is an all-reduce of one int. The blocking forms wait for
/// their non-blocking one (`blocking_operations`, comm/blocking.hpp). Element types map to
/// `ncclUint8`, `ncclInt32`, `ncclUint32`, `ncclInt64`, `ncclUint64`, `ncclFloat32`,
/// `ncclFloat64`, `ncclFloat16` and `ncclBfloat16`; operations to `ncclSum` / `ncclMax` /
/// `ncclMin`. NCCL counts are `size_t`: no size limit of its own.
///
/// Failures:
/// - `wait()` polls `cudaEventQuery` and `ncclCommGetAsyncError`. An asynchronous NCCL error, or
///   no completion within `nccl_options::timeout`, aborts the communicator (`ncclCommAbort`,
///   which also releases the kernels blocked in it) and throws `comm_error`; the communicator is
///   then broken and every later operation throws `comm_error` at once;
/// - a failed NCCL or CUDA call when an operation is enqueued is a `comm_error` too;
/// - what it cannot see: NCCL matches point-to-point messages by issue order per peer, not by
///   tag (tags are accepted for the concept's sake and otherwise ignored: post receives in the
///   order the sends were posted), and it trusts the byte counts: a receive of another size than
///   the send, or collectives with mismatched sizes, are undefined behaviour in NCCL (typically
///   a hang, which the timeout then reports).
///
/// Threads: like NCCL itself, one thread at a time issues operations on one communicator.
///
/// Status: compiled by nvcc in gradcomp's CUDA header check; its test (tests/cuda/nccl_comm.cu)
/// runs only on a machine with a GPU (see docs/collectives.md for where it has run).

#include <gradcomp/cuda/config.cuh>

#include <gradcomp/comm/blocking.hpp>
#include <gradcomp/comm/detail/checks.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/request.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace cuda {

/// Options of an `nccl_communicator`.
struct nccl_options {
  /// How long `wait()` (and every blocking operation) waits before it aborts the communicator
  /// and throws `comm_error`.
  std::chrono::milliseconds timeout{std::chrono::minutes(2)};
};

namespace detail::nccl {

inline ncclDataType_t data_type(comm_type t) {
  switch (t) {
    case comm_type::u8: return ncclUint8;
    case comm_type::i32: return ncclInt32;
    case comm_type::u32: return ncclUint32;
    case comm_type::i64: return ncclInt64;
    case comm_type::u64: return ncclUint64;
    case comm_type::f32: return ncclFloat32;
    case comm_type::f64: return ncclFloat64;
    case comm_type::f16: return ncclFloat16;
    case comm_type::bf16: return ncclBfloat16;
  }
  throw config_error("gradcomp: unknown comm_type " + std::to_string(static_cast<unsigned>(t)));
}

inline ncclRedOp_t red_op(reduce_op op) {
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::max: return ncclMax;
    case reduce_op::min: return ncclMin;
  }
  throw config_error("gradcomp: unknown reduce_op " + std::to_string(static_cast<unsigned>(op)));
}

// What the communicator and its requests share.
struct comm_state {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;
  bool owned = false;
  int rank = 0;
  int size = 1;
  nccl_options options;
  std::atomic<bool> broken{false};
  std::mutex mutex;
  std::string why;
  int* scratch = nullptr;  // device int for the barrier

  comm_state() = default;
  comm_state(comm_state const&) = delete;
  comm_state& operator=(comm_state const&) = delete;

  ~comm_state() {
    if (scratch != nullptr) (void)cudaFree(scratch);
    if (owned && comm != nullptr) (void)ncclCommDestroy(comm);
  }

  // Aborts the NCCL communicator (once), records why and throws comm_error.
  [[noreturn]] void fail(std::string const& what) {
    bool first = false;
    {
      std::lock_guard lock(mutex);
      if (why.empty()) {
        why = what;
        first = true;
      }
    }
    if (first && comm != nullptr) {
      // Abort releases kernels stuck waiting for peers and frees the communicator, whoever
      // created it: the handle is dead afterwards.
      (void)ncclCommAbort(comm);
      comm = nullptr;
    }
    broken = true;
    throw comm_error("gradcomp: NCCL rank " + std::to_string(rank) + ": " + what);
  }

  void check_usable() {
    if (!broken.load()) return;
    std::lock_guard lock(mutex);
    throw comm_error("gradcomp: NCCL rank " + std::to_string(rank) +
                     ": the communicator is unusable after an earlier failure (" + why + ")");
  }

  void check(ncclResult_t r, char const* what) {
    if (r != ncclSuccess && r != ncclInProgress) {
      char const* last = ncclGetLastError(comm);
      fail(std::string(what) + " failed: " + ncclGetErrorString(r) + " (" +
           (last != nullptr ? last : "") + ")");
    }
  }

  void check(cudaError_t e, char const* what) {
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      fail(std::string(what) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
           ")");
    }
  }
};

// One enqueued operation: an event recorded on the stream after it.
class event_op final : public request::state {
 public:
  event_op(std::shared_ptr<comm_state> s, std::string what)
      : s_(std::move(s)), what_(std::move(what)) {
    s_->check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming),
              "cudaEventCreateWithFlags");
  }
  event_op(event_op const&) = delete;
  event_op& operator=(event_op const&) = delete;
  ~event_op() override {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
  }

  void record() { s_->check(cudaEventRecord(event_, s_->stream), "cudaEventRecord"); }

  bool test() override { return poll(); }

  void wait() override {
    auto const deadline = std::chrono::steady_clock::now() + s_->options.timeout;
    int spins = 0;
    while (!poll()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        s_->fail(what_ + ": timed out after " + std::to_string(s_->options.timeout.count()) +
                 " ms (a peer did not take part); the communicator was aborted");
      }
      if (++spins < 1000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(spins < 10000 ? 20 : 200));
      }
    }
    if (!error_.empty()) s_->fail(error_);
  }

 private:
  // True when the operation finished (or failed: then error_ says why).
  bool poll() {
    if (done_) return true;
    if (s_->broken.load()) {
      error_ = what_ + ": the communicator was aborted by an earlier failure";
      done_ = true;
      return true;
    }
    cudaError_t const e = cudaEventQuery(event_);
    if (e == cudaSuccess) {
      done_ = true;
      return true;
    }
    if (e != cudaErrorNotReady) {
      (void)cudaGetLastError();
      error_ = what_ + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
      done_ = true;
      return true;
    }
    ncclResult_t async = ncclSuccess;
    if (s_->comm != nullptr && ncclCommGetAsyncError(s_->comm, &async) == ncclSuccess &&
        async != ncclSuccess && async != ncclInProgress) {
      error_ = what_ + ": NCCL reported " + ncclGetErrorString(async);
      done_ = true;
      return true;
    }
    return false;
  }

  std::shared_ptr<comm_state> s_;
  std::string what_;
  cudaEvent_t event_ = nullptr;
  std::string error_;
  bool done_ = false;
};

}  // namespace detail::nccl

/// A `communicator` over NCCL (see the file comment). Copies share the communicator.
class nccl_communicator : public blocking_operations<nccl_communicator> {
 public:
  using communicator_concept = communicator_tag;

  /// Wraps an NCCL communicator the caller created (and will destroy, after this object and its
  /// copies are gone), with operations enqueued on `stream` of the current device.
  nccl_communicator(ncclComm_t comm, cudaStream_t stream, nccl_options options = {})
      : s_(std::make_shared<detail::nccl::comm_state>()) {
    s_->comm = comm;
    init(stream, options);
  }

  /// Creates rank `rank` of an `nranks`-rank NCCL communicator identified by `id`
  /// (`ncclGetUniqueId` on one rank, shared with the others out of band) on the current
  /// device; collective over the ranks. The communicator is destroyed with the last copy.
  static nccl_communicator init_rank(int nranks, ncclUniqueId const& id, int rank,
                                     cudaStream_t stream, nccl_options options = {}) {
    ncclComm_t comm = nullptr;
    ncclResult_t const r = ncclCommInitRank(&comm, nranks, id, rank);
    if (r != ncclSuccess) {
      throw comm_error(std::string("gradcomp: ncclCommInitRank(rank ") + std::to_string(rank) +
                       " of " + std::to_string(nranks) + ") failed: " + ncclGetErrorString(r));
    }
    nccl_communicator c(comm, stream, options);
    c.s_->owned = true;
    return c;
  }

  [[nodiscard]] int rank() const noexcept { return s_->rank; }
  [[nodiscard]] int size() const noexcept { return s_->size; }
  [[nodiscard]] ncclComm_t native() const noexcept { return s_->comm; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return s_->stream; }
  /// True once a `comm_error` has aborted the communicator.
  [[nodiscard]] bool broken() const noexcept { return s_->broken.load(); }

  request ibarrier() {
    auto op = start("barrier");
    s_->check(ncclAllReduce(s_->scratch, s_->scratch, 1, ncclInt32, ncclSum, s_->comm, s_->stream),
              "ncclAllReduce");
    return finish(std::move(op));
  }
  request ibroadcast(std::span<std::byte> buf, int root) {
    gradcomp::detail::comm_checks::peer(root, size(), "broadcast root");
    auto op = start("broadcast");
    s_->check(
        ncclBroadcast(buf.data(), buf.data(), buf.size(), ncclUint8, root, s_->comm, s_->stream),
        "ncclBroadcast");
    return finish(std::move(op));
  }

  request iall_reduce(std::span<std::byte> buf, comm_type t, reduce_op op) {
    gradcomp::detail::comm_checks::reduction(buf.size(), t, op, "all_reduce");
    auto p = start(std::string("all_reduce (") + comm_type_name(t) + ", " + reduce_op_name(op) +
                   ", " + std::to_string(buf.size()) + " bytes)");
    s_->check(
        ncclAllReduce(buf.data(), buf.data(), buf.size() / comm_type_size(t),
                      detail::nccl::data_type(t), detail::nccl::red_op(op), s_->comm, s_->stream),
        "ncclAllReduce");
    return finish(std::move(p));
  }

  request ireduce_scatter(std::span<std::byte const> in, std::span<std::byte> out, comm_type t,
                          reduce_op op) {
    gradcomp::detail::comm_checks::reduce_scatter(in.size(), out.size(), t, op, size());
    auto p = start("reduce_scatter");
    s_->check(ncclReduceScatter(in.data(), out.data(), out.size() / comm_type_size(t),
                                detail::nccl::data_type(t), detail::nccl::red_op(op), s_->comm,
                                s_->stream),
              "ncclReduceScatter");
    return finish(std::move(p));
  }

  request iall_gather(std::span<std::byte const> in, std::span<std::byte> out) {
    gradcomp::detail::comm_checks::all_gather(in.size(), out.size(), size());
    auto p = start("all_gather");
    s_->check(ncclAllGather(in.data(), out.data(), in.size(), ncclUint8, s_->comm, s_->stream),
              "ncclAllGather");
    return finish(std::move(p));
  }

  request iall_gather_v(std::span<std::byte const> in, std::span<std::byte> out,
                        std::span<std::size_t const> counts) {
    gradcomp::detail::comm_checks::all_gather_v(in.size(), out.size(), counts, rank(), size());
    auto p = start("all_gather_v");
    // Every rank sends its block to every peer; the own block is a local copy.
    std::size_t at = 0;
    std::size_t mine = 0;
    s_->check(ncclGroupStart(), "ncclGroupStart");
    for (int q = 0; q < size(); ++q) {
      std::size_t const c = counts[static_cast<std::size_t>(q)];
      if (q == rank()) {
        mine = at;
      } else {
        if (!in.empty())
          s_->check(ncclSend(in.data(), in.size(), ncclUint8, q, s_->comm, s_->stream), "ncclSend");
        if (c != 0)
          s_->check(ncclRecv(out.data() + at, c, ncclUint8, q, s_->comm, s_->stream), "ncclRecv");
      }
      at += c;
    }
    s_->check(ncclGroupEnd(), "ncclGroupEnd");
    if (!in.empty()) {
      s_->check(cudaMemcpyAsync(out.data() + mine, in.data(), in.size(), cudaMemcpyDeviceToDevice,
                                s_->stream),
                "cudaMemcpyAsync");
    }
    return finish(std::move(p));
  }

  request iall_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> send_counts,
                        std::span<std::byte> out, std::span<std::size_t const> recv_counts) {
    gradcomp::detail::comm_checks::all_to_all_v(in.size(), send_counts, out.size(), recv_counts,
                                                size());
    auto const me = static_cast<std::size_t>(rank());
    if (send_counts[me] != recv_counts[me]) {
      throw config_error("gradcomp: all_to_all_v sends " + std::to_string(send_counts[me]) +
                         " bytes to its own rank but expects " + std::to_string(recv_counts[me]));
    }
    auto p = start("all_to_all_v");
    std::size_t sat = 0;
    std::size_t rat = 0;
    std::size_t self_from = 0;
    std::size_t self_to = 0;
    s_->check(ncclGroupStart(), "ncclGroupStart");
    for (int q = 0; q < size(); ++q) {
      auto const uq = static_cast<std::size_t>(q);
      if (q == rank()) {
        self_from = sat;
        self_to = rat;
      } else {
        if (send_counts[uq] != 0) {
          s_->check(ncclSend(in.data() + sat, send_counts[uq], ncclUint8, q, s_->comm, s_->stream),
                    "ncclSend");
        }
        if (recv_counts[uq] != 0) {
          s_->check(ncclRecv(out.data() + rat, recv_counts[uq], ncclUint8, q, s_->comm, s_->stream),
                    "ncclRecv");
        }
      }
      sat += send_counts[uq];
      rat += recv_counts[uq];
    }
    s_->check(ncclGroupEnd(), "ncclGroupEnd");
    if (send_counts[me] != 0) {
      s_->check(cudaMemcpyAsync(out.data() + self_to, in.data() + self_from, send_counts[me],
                                cudaMemcpyDeviceToDevice, s_->stream),
                "cudaMemcpyAsync");
    }
    return finish(std::move(p));
  }

  /// `tag` is checked but not used for matching (see the file comment).
  request isend(std::span<std::byte const> in, int peer, int tag) {
    gradcomp::detail::comm_checks::peer(peer, size(), "send peer");
    gradcomp::detail::comm_checks::tag(tag);
    auto p = start("send to rank " + std::to_string(peer));
    s_->check(ncclSend(in.data(), in.size(), ncclUint8, peer, s_->comm, s_->stream), "ncclSend");
    return finish(std::move(p));
  }

  /// `tag` is checked but not used for matching (see the file comment).
  request irecv(std::span<std::byte> out, int peer, int tag) {
    gradcomp::detail::comm_checks::peer(peer, size(), "recv peer");
    gradcomp::detail::comm_checks::tag(tag);
    auto p = start("recv from rank " + std::to_string(peer));
    s_->check(ncclRecv(out.data(), out.size(), ncclUint8, peer, s_->comm, s_->stream), "ncclRecv");
    return finish(std::move(p));
  }

 private:
  void init(cudaStream_t stream, nccl_options options) {
    if (options.timeout.count() <= 0)
      throw config_error("gradcomp: the NCCL timeout must be positive");
    s_->stream = stream;
    s_->options = options;
    s_->check(cudaGetDevice(&s_->device), "cudaGetDevice");
    s_->check(ncclCommUserRank(s_->comm, &s_->rank), "ncclCommUserRank");
    s_->check(ncclCommCount(s_->comm, &s_->size), "ncclCommCount");
    s_->check(cudaMalloc(reinterpret_cast<void**>(&s_->scratch), sizeof(int)), "cudaMalloc");
    s_->check(cudaMemsetAsync(s_->scratch, 0, sizeof(int), stream), "cudaMemsetAsync");
  }

  std::unique_ptr<detail::nccl::event_op> start(std::string what) {
    s_->check_usable();
    return std::make_unique<detail::nccl::event_op>(s_, std::move(what));
  }

  request finish(std::unique_ptr<detail::nccl::event_op> op) {
    op->record();
    return request(std::move(op));
  }

  std::shared_ptr<detail::nccl::comm_state> s_;
};

static_assert(communicator<nccl_communicator>);

}  // namespace cuda
GRADCOMP_NAMESPACE_END
