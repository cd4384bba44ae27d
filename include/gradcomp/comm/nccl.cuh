// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The NCCL adapter: `nccl_communicator` models `communicator` over an `ncclComm_t` and a CUDA
/// stream, and carries every collective of the library (collective/), whose payloads live on
/// the device when the codec's do (cuda/collective.cuh) and whose control messages live on the
/// host. Needs `<nccl.h>` and libnccl: link the CMake target `gradcomp::nccl`. It sits in
/// `comm/` beside the MPI adapter; it is CUDA code and compiles only under nvcc, but it uses
/// the CUDA runtime and NCCL only, so it includes nothing from `cuda/` (a layer above `comm/`).
///
/// **Host and device buffers.** A span handed to it may be device memory or host memory; the
/// adapter asks `cudaPointerGetAttributes` which. Device (and managed) memory goes to NCCL as
/// it is. Host memory, which the collectives use for their small control messages (agreement
/// reports, packet sizes, the outcome round: tens of bytes per rank), is staged: copied into a
/// pinned block, then into a stream-ordered device buffer (`cudaMallocAsync`) before the NCCL
/// call, and back the same way after it; the host copy into the caller's buffer happens in the
/// request's `wait()`. Staging through NCCL itself rather than a side channel (a socket, MPI)
/// keeps one transport, one ordering and one failure path for both kinds of message, and costs
/// two small copies per control message; pinned blocks (pooled per communicator) keep every
/// copy asynchronous, so no call blocks the host on a peer.
///
/// **Ordering.** Each operation is enqueued on the communicator's stream after whatever the
/// caller enqueued there before (the kernels that wrote a packet), and its `request` wraps a
/// `cudaEvent_t` recorded after it. `wait()` returns once it finished on the device; work
/// enqueued on the same stream later is ordered after it without any wait. Use the stream of
/// the device codecs (`cuda::stream_codec::stream()`) here, or order the two yourself.
///
/// **Mapping.** `all_reduce` -> `ncclAllReduce` (in place), `reduce_scatter` ->
/// `ncclReduceScatter`, `all_gather` -> `ncclAllGather`, `broadcast` -> `ncclBroadcast` (in
/// place); `all_gather_v` and `all_to_all_v` are `ncclSend`/`ncclRecv` pairs inside one
/// `ncclGroupStart`/`ncclGroupEnd` (the rank's own block is a device-to-device copy);
/// `send`/`recv` are `ncclSend`/`ncclRecv`; `ibarrier` is an all-reduce of one int. The blocking
/// forms wait for their non-blocking one (`blocking_operations`, comm/blocking.hpp). Element
/// types map to `ncclUint8`, `ncclInt32`, `ncclUint32`, `ncclInt64`, `ncclUint64`,
/// `ncclFloat32`, `ncclFloat64`, `ncclFloat16` and `ncclBfloat16`; operations to `ncclSum` /
/// `ncclMax` / `ncclMin`.
///
/// **Failures: `comm_error`, never a hang.** `init_rank` creates a *non-blocking* NCCL
/// communicator (`ncclCommInitRankConfig` with `blocking = 0`): no NCCL call then blocks the
/// host; a call that answers `ncclInProgress` (initialization, connection setup, a group) is
/// polled with `ncclCommGetAsyncError` until it settles. Every wait is bounded by
/// `nccl_options::timeout`: an initialization that a rank never joins, an operation a peer
/// never joins (a dead or hung peer), or an asynchronous NCCL error aborts the communicator
/// (`ncclCommAbort`, which also releases the kernels blocked in it) and throws `comm_error`;
/// the communicator is then broken and every later operation throws `comm_error` at once. A
/// failed CUDA or NCCL call when an operation is enqueued is a `comm_error` too. A communicator
/// the caller created (the wrapping constructor) may be blocking; NCCL calls on it can then
/// block the host while NCCL sets up connections, and only the completion waits are bounded.
///
/// What it cannot see: NCCL matches point-to-point messages by issue order per peer, not by
/// tag (tags are checked for the concept's sake and otherwise ignored: post receives in the
/// order the sends were posted), and it trusts the byte counts: collectives with mismatched
/// sizes are undefined behaviour in NCCL (typically a hang, which the timeout reports). The
/// library's collectives agree on every size before a payload moves.
///
/// Threads: like NCCL itself, one thread at a time issues operations on one communicator.
///
/// Status: compiled by nvcc in gradcomp's CUDA header check; its tests (tests/cuda/nccl_comm.cu
/// and tests/cuda/collective_gpu.cu) run only on a machine with a GPU (docs/cuda.md says where
/// they have run).

#if !defined(__CUDACC__)
#  error "gradcomp/comm/nccl.cuh needs a CUDA compiler (nvcc) and NCCL; the CPU transports are comm/*.hpp"
#endif

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
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Options of an `nccl_communicator`.
struct nccl_options {
  /// How long any wait of the adapter (initialization, an NCCL call in progress, `wait()` and
  /// every blocking operation) lasts before it aborts the communicator and throws `comm_error`.
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

/// Sleeps a little longer the longer a poll has gone on (yield first, then 20 and 200 us).
inline void backoff(int& spins) {
  if (++spins < 1000) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(spins < 10000 ? 20 : 200));
  }
}

/// A pinned host block of the staging pool.
struct pinned_block {
  std::byte* data = nullptr;
  std::size_t capacity = 0;
};

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
  int* scratch = nullptr;            // device int for the barrier
  std::vector<pinned_block> pinned;   // free staging blocks (guarded by `mutex`)
  std::vector<pinned_block> retired;  // blocks of failed operations, freed with the communicator

  comm_state() = default;
  comm_state(comm_state const&) = delete;
  comm_state& operator=(comm_state const&) = delete;

  ~comm_state() {
    if (owned && comm != nullptr) {
      // A non-blocking communicator finalizes in the background: bounded by the timeout, after
      // which it is aborted instead of destroyed.
      bool settled = ncclCommFinalize(comm) == ncclSuccess || poll_settled();
      if (settled) (void)ncclCommDestroy(comm);
      else (void)ncclCommAbort(comm);
    }
    if (scratch != nullptr) (void)cudaFree(scratch);
    for (pinned_block const& b : pinned) (void)cudaFreeHost(b.data);
    for (pinned_block const& b : retired) (void)cudaFreeHost(b.data);
  }

  // Polls ncclCommGetAsyncError until it is no longer in progress: true on success, false on
  // an error or at the timeout. Never throws (destructor).
  bool poll_settled() noexcept {
    auto const deadline = std::chrono::steady_clock::now() + options.timeout;
    int spins = 0;
    for (;;) {
      ncclResult_t st = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) return false;
      if (st == ncclSuccess) return true;
      if (st != ncclInProgress || std::chrono::steady_clock::now() >= deadline) return false;
      backoff(spins);
    }
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

  // Waits until a call that answered ncclInProgress has settled (bounded by the timeout).
  void settle(char const* what) {
    auto const deadline = std::chrono::steady_clock::now() + options.timeout;
    int spins = 0;
    for (;;) {
      ncclResult_t st = ncclSuccess;
      ncclResult_t const q = ncclCommGetAsyncError(comm, &st);
      if (q != ncclSuccess) fail(std::string(what) + ": ncclCommGetAsyncError failed: " + ncclGetErrorString(q));
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) {
        char const* last = ncclGetLastError(comm);
        fail(std::string(what) + " failed: " + ncclGetErrorString(st) + " (" + (last != nullptr ? last : "") + ")");
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        fail(std::string(what) + ": timed out after " + std::to_string(options.timeout.count()) +
             " ms still in progress (a peer did not take part); the communicator was aborted");
      }
      backoff(spins);
    }
  }

  void check(ncclResult_t r, char const* what) {
    if (r == ncclSuccess) return;
    if (r == ncclInProgress) {
      settle(what);
      return;
    }
    char const* last = ncclGetLastError(comm);
    fail(std::string(what) + " failed: " + ncclGetErrorString(r) + " (" + (last != nullptr ? last : "") + ")");
  }

  void check(cudaError_t e, char const* what) {
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      fail(std::string(what) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
    }
  }

  // A pinned block of at least `bytes` from the pool (allocated when none fits).
  pinned_block acquire(std::size_t bytes) {
    {
      std::lock_guard lock(mutex);
      for (std::size_t i = 0; i < pinned.size(); ++i) {
        if (pinned[i].capacity >= bytes) {
          pinned_block const b = pinned[i];
          pinned.erase(pinned.begin() + static_cast<std::ptrdiff_t>(i));
          return b;
        }
      }
    }
    pinned_block b;
    b.capacity = bytes < 256 ? 256 : bytes;
    check(cudaMallocHost(reinterpret_cast<void**>(&b.data), b.capacity), "cudaMallocHost");
    return b;
  }
  void release(pinned_block b) {
    std::lock_guard lock(mutex);
    pinned.push_back(b);
  }
};

/// Whether `p` is device (or managed) memory, which NCCL takes as it is.
inline bool device_pointer(comm_state& s, void const* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes a{};
  s.check(cudaPointerGetAttributes(&a, p), "cudaPointerGetAttributes");
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// One enqueued operation: its staging (host spans copied through pinned and device buffers)
// and an event recorded on the stream after it.
class event_op final : public request::state {
 public:
  event_op(std::shared_ptr<comm_state> s, std::string what) : s_(std::move(s)), what_(std::move(what)) {
    s_->check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  }
  event_op(event_op const&) = delete;
  event_op& operator=(event_op const&) = delete;
  ~event_op() override {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
    // Blocks whose copies may still be in flight (a failed operation) are not reused; the
    // communicator's pool frees the others.
    if (done_ && error_.empty()) {
      for (pinned_block const& b : blocks_) s_->release(b);
    } else {
      for (pinned_block const& b : blocks_) abandoned_.push_back(b);
      hand_over_abandoned();
    }
  }

  /// The device address NCCL reads `in` from: `in` itself on the device; for host memory a
  /// staging copy enqueued now.
  std::byte const* input(std::span<std::byte const> in) {
    if (in.empty() || device_pointer(*s_, in.data())) return in.data();
    return copy_in(in);
  }
  /// The device address NCCL writes `out` to: `out` itself on the device; for host memory a
  /// staging buffer, copied back into `out` when the operation has completed. `in_place`:
  /// stage the current contents of `out` too (in-place operations read it).
  std::byte* output(std::span<std::byte> out, bool in_place = false) {
    if (out.empty() || device_pointer(*s_, out.data())) return out.data();
    std::byte* d = in_place ? copy_in(out) : stage(out.size());
    outputs_.push_back({d, out, blocks_.size() - 1});
    return d;
  }

  /// After the operation: enqueues the copies of staged outputs to their pinned blocks, frees
  /// the staging buffers stream-ordered, and records the event.
  void record() {
    for (auto const& o : outputs_) {
      s_->check(cudaMemcpyAsync(blocks_[o.block].data, o.device, o.host.size(), cudaMemcpyDeviceToHost, s_->stream),
                "cudaMemcpyAsync (a host message back)");
    }
    for (std::byte* d : device_) s_->check(cudaFreeAsync(d, s_->stream), "cudaFreeAsync");
    device_.clear();
    s_->check(cudaEventRecord(event_, s_->stream), "cudaEventRecord");
  }

  bool test() override {
    if (!poll()) return false;
    if (!error_.empty()) s_->fail(error_);
    deliver();
    return true;
  }

  void wait() override {
    auto const deadline = std::chrono::steady_clock::now() + s_->options.timeout;
    int spins = 0;
    while (!poll()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        s_->fail(what_ + ": timed out after " + std::to_string(s_->options.timeout.count()) +
                 " ms (a peer did not take part); the communicator was aborted");
      }
      backoff(spins);
    }
    if (!error_.empty()) s_->fail(error_);
    deliver();
  }

 private:
  struct staged_output {
    std::byte* device;
    std::span<std::byte> host;
    std::size_t block;
  };

  // Stages host bytes `in`: pinned copy now, device copy enqueued on the stream.
  std::byte* copy_in(std::span<std::byte const> in) {
    std::byte* d = stage(in.size());
    std::memcpy(blocks_.back().data, in.data(), in.size());
    s_->check(cudaMemcpyAsync(d, blocks_.back().data, in.size(), cudaMemcpyHostToDevice, s_->stream),
              "cudaMemcpyAsync (staging a host message)");
    return d;
  }

  // A pinned block and a device buffer of `bytes` for one host span.
  std::byte* stage(std::size_t bytes) {
    blocks_.push_back(s_->acquire(bytes));
    void* d = nullptr;
    s_->check(cudaMallocAsync(&d, bytes, s_->stream), "cudaMallocAsync (staging)");
    device_.push_back(static_cast<std::byte*>(d));
    return static_cast<std::byte*>(d);
  }

  // Copies staged outputs into the caller's host buffers (once).
  void deliver() {
    if (delivered_) return;
    for (auto const& o : outputs_) std::memcpy(o.host.data(), blocks_[o.block].data, o.host.size());
    delivered_ = true;
  }

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
    if (s_->comm != nullptr && ncclCommGetAsyncError(s_->comm, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
      error_ = what_ + ": NCCL reported " + ncclGetErrorString(async);
      done_ = true;
      return true;
    }
    return false;
  }

  // Pinned blocks of a failed or unfinished operation go to the communicator's free list only
  // once the stream is idle; until then they are kept out of the pool (and freed with it).
  void hand_over_abandoned() noexcept {
    if (abandoned_.empty()) return;
    try {
      std::lock_guard lock(s_->mutex);
      s_->retired.insert(s_->retired.end(), abandoned_.begin(), abandoned_.end());
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory; the blocks leak
    }
  }

  std::shared_ptr<comm_state> s_;
  std::string what_;
  cudaEvent_t event_ = nullptr;
  std::string error_;
  bool done_ = false;
  bool delivered_ = false;
  std::vector<pinned_block> blocks_;
  std::vector<pinned_block> abandoned_;
  std::vector<std::byte*> device_;
  std::vector<staged_output> outputs_;
};

}  // namespace detail::nccl

/// A `communicator` over NCCL (see the file comment). Copies share the communicator.
class nccl_communicator : public blocking_operations<nccl_communicator> {
 public:
  using communicator_concept = communicator_tag;

  /// Wraps an NCCL communicator the caller created (and will destroy, after this object and its
  /// copies are gone), with operations enqueued on `stream` of the current device. A blocking
  /// communicator works too, with the limits the file comment names.
  nccl_communicator(ncclComm_t comm, cudaStream_t stream, nccl_options options = {})
      : s_(std::make_shared<detail::nccl::comm_state>()) {
    check_options(options);
    s_->comm = comm;
    init(stream, options);
  }

  /// Creates rank `rank` of an `nranks`-rank non-blocking NCCL communicator identified by `id`
  /// (`ncclGetUniqueId` on one rank, shared with the others out of band) on the current device;
  /// collective over the ranks. If the ranks do not all join within `options.timeout`, or NCCL
  /// reports an error, the communicator is aborted and this throws `comm_error`. The
  /// communicator is finalized and destroyed with the last copy.
  static nccl_communicator init_rank(int nranks, ncclUniqueId const& id, int rank, cudaStream_t stream,
                                     nccl_options options = {}) {
    check_options(options);
    if (nranks < 1 || rank < 0 || rank >= nranks) {
      throw config_error("gradcomp: NCCL rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
                         " (expected 0 <= rank < nranks)");
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t const r = ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
    auto s = std::make_shared<detail::nccl::comm_state>();
    s->comm = comm;
    s->rank = rank;
    s->size = nranks;
    s->options = options;
    std::string const what = "ncclCommInitRankConfig (rank " + std::to_string(rank) + " of " +
                             std::to_string(nranks) + ")";
    if (comm == nullptr) {
      throw comm_error("gradcomp: " + what + " failed: " + ncclGetErrorString(r));
    }
    s->check(r, what.c_str());  // waits (bounded) for the ranks to join; aborts on failure
    s->owned = true;
    nccl_communicator c(std::move(s));
    c.init(stream, options);
    return c;
  }

  /// The ranks that pass the same `color` (>= 0), as a new non-blocking communicator
  /// (`ncclCommSplit`) numbered by `key` (ties by rank), with this one's stream and options;
  /// collective over every rank of this communicator. A rank that passes a negative color joins
  /// none and gets `std::nullopt`. Made once and kept: the node and lane communicators of
  /// `all_reduce_hierarchical` (collective/hierarchical.hpp, `hierarchical_groups`). If a rank
  /// never joins within `options().timeout`, or NCCL reports an error, the new communicator is
  /// aborted and this throws `comm_error`.
  [[nodiscard]] std::optional<nccl_communicator> split(int color, int key) {
    s_->check_usable();
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t sub = nullptr;
    ncclResult_t const r =
        ncclCommSplit(s_->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, &config);
    std::string const what = "ncclCommSplit (color " + std::to_string(color) + ", key " +
                             std::to_string(key) + ")";
    if (r != ncclSuccess && r != ncclInProgress) {
      if (sub != nullptr) (void)ncclCommAbort(sub);
      throw comm_error("gradcomp: " + what + " failed: " + ncclGetErrorString(r));
    }
    if (color < 0) return std::nullopt;
    if (sub == nullptr) throw comm_error("gradcomp: " + what + " returned no communicator");
    auto s = std::make_shared<detail::nccl::comm_state>();
    s->comm = sub;
    s->options = s_->options;
    s->owned = true;  // finalized and destroyed with the last copy, aborted on failure
    s->check(r, what.c_str());  // waits (bounded) until the split settles
    nccl_communicator c(std::move(s));
    c.init(s_->stream, s_->options);
    return c;
  }

  [[nodiscard]] int rank() const noexcept { return s_->rank; }
  [[nodiscard]] int size() const noexcept { return s_->size; }
  [[nodiscard]] ncclComm_t native() const noexcept { return s_->comm; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return s_->stream; }
  /// The options it was created with.
  [[nodiscard]] nccl_options const& options() const noexcept { return s_->options; }
  /// True once a `comm_error` has aborted the communicator.
  [[nodiscard]] bool broken() const noexcept { return s_->broken.load(); }

  request ibarrier() {
    auto op = start("barrier");
    s_->check(ncclAllReduce(s_->scratch, s_->scratch, 1, ncclInt32, ncclSum, s_->comm, s_->stream), "ncclAllReduce");
    return finish(std::move(op));
  }

  request ibroadcast(std::span<std::byte> buf, int root) {
    gradcomp::detail::comm_checks::peer(root, size(), "broadcast root");
    auto op = start("broadcast");
    std::byte* d = op->output(buf, true);
    s_->check(ncclBroadcast(d, d, buf.size(), ncclUint8, root, s_->comm, s_->stream), "ncclBroadcast");
    return finish(std::move(op));
  }

  request iall_reduce(std::span<std::byte> buf, comm_type t, reduce_op op) {
    gradcomp::detail::comm_checks::reduction(buf.size(), t, op, "all_reduce");
    auto p = start(std::string("all_reduce (") + comm_type_name(t) + ", " + reduce_op_name(op) + ", " +
                   std::to_string(buf.size()) + " bytes)");
    std::byte* d = p->output(buf, true);
    s_->check(ncclAllReduce(d, d, buf.size() / comm_type_size(t), detail::nccl::data_type(t),
                            detail::nccl::red_op(op), s_->comm, s_->stream),
              "ncclAllReduce");
    return finish(std::move(p));
  }

  request ireduce_scatter(std::span<std::byte const> in, std::span<std::byte> out, comm_type t, reduce_op op) {
    gradcomp::detail::comm_checks::reduce_scatter(in.size(), out.size(), t, op, size());
    auto p = start("reduce_scatter");
    std::byte const* din = p->input(in);
    std::byte* dout = p->output(out);
    s_->check(ncclReduceScatter(din, dout, out.size() / comm_type_size(t), detail::nccl::data_type(t),
                                detail::nccl::red_op(op), s_->comm, s_->stream),
              "ncclReduceScatter");
    return finish(std::move(p));
  }

  request iall_gather(std::span<std::byte const> in, std::span<std::byte> out) {
    gradcomp::detail::comm_checks::all_gather(in.size(), out.size(), size());
    auto p = start("all_gather");
    std::byte const* din = p->input(in);
    std::byte* dout = p->output(out);
    s_->check(ncclAllGather(din, dout, in.size(), ncclUint8, s_->comm, s_->stream), "ncclAllGather");
    return finish(std::move(p));
  }

  request iall_gather_v(std::span<std::byte const> in, std::span<std::byte> out, std::span<std::size_t const> counts) {
    gradcomp::detail::comm_checks::all_gather_v(in.size(), out.size(), counts, rank(), size());
    auto p = start("all_gather_v");
    std::byte const* din = p->input(in);
    std::byte* dout = p->output(out);
    // Every rank sends its block to every peer; the own block is a local copy.
    std::size_t at = 0;
    std::size_t mine = 0;
    s_->check(ncclGroupStart(), "ncclGroupStart");
    for (int q = 0; q < size(); ++q) {
      std::size_t const c = counts[static_cast<std::size_t>(q)];
      if (q == rank()) {
        mine = at;
      } else {
        if (!in.empty()) s_->check(ncclSend(din, in.size(), ncclUint8, q, s_->comm, s_->stream), "ncclSend");
        if (c != 0) s_->check(ncclRecv(dout + at, c, ncclUint8, q, s_->comm, s_->stream), "ncclRecv");
      }
      at += c;
    }
    s_->check(ncclGroupEnd(), "ncclGroupEnd");
    if (!in.empty()) {
      s_->check(cudaMemcpyAsync(dout + mine, din, in.size(), cudaMemcpyDeviceToDevice, s_->stream), "cudaMemcpyAsync");
    }
    return finish(std::move(p));
  }

  request iall_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> send_counts,
                        std::span<std::byte> out, std::span<std::size_t const> recv_counts) {
    gradcomp::detail::comm_checks::all_to_all_v(in.size(), send_counts, out.size(), recv_counts, size());
    auto const me = static_cast<std::size_t>(rank());
    if (send_counts[me] != recv_counts[me]) {
      throw config_error("gradcomp: all_to_all_v sends " + std::to_string(send_counts[me]) +
                         " bytes to its own rank but expects " + std::to_string(recv_counts[me]));
    }
    auto p = start("all_to_all_v");
    std::byte const* din = p->input(in);
    std::byte* dout = p->output(out);
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
          s_->check(ncclSend(din + sat, send_counts[uq], ncclUint8, q, s_->comm, s_->stream), "ncclSend");
        }
        if (recv_counts[uq] != 0) {
          s_->check(ncclRecv(dout + rat, recv_counts[uq], ncclUint8, q, s_->comm, s_->stream), "ncclRecv");
        }
      }
      sat += send_counts[uq];
      rat += recv_counts[uq];
    }
    s_->check(ncclGroupEnd(), "ncclGroupEnd");
    if (send_counts[me] != 0) {
      s_->check(cudaMemcpyAsync(dout + self_to, din + self_from, send_counts[me], cudaMemcpyDeviceToDevice,
                                s_->stream),
                "cudaMemcpyAsync");
    }
    return finish(std::move(p));
  }

  /// `tag` is checked but not used for matching (see the file comment).
  request isend(std::span<std::byte const> in, int peer, int tag) {
    gradcomp::detail::comm_checks::peer(peer, size(), "send peer");
    gradcomp::detail::comm_checks::tag(tag);
    auto p = start("send to rank " + std::to_string(peer));
    std::byte const* din = p->input(in);
    s_->check(ncclSend(din, in.size(), ncclUint8, peer, s_->comm, s_->stream), "ncclSend");
    return finish(std::move(p));
  }

  /// `tag` is checked but not used for matching (see the file comment).
  request irecv(std::span<std::byte> out, int peer, int tag) {
    gradcomp::detail::comm_checks::peer(peer, size(), "recv peer");
    gradcomp::detail::comm_checks::tag(tag);
    auto p = start("recv from rank " + std::to_string(peer));
    std::byte* dout = p->output(out);
    s_->check(ncclRecv(dout, out.size(), ncclUint8, peer, s_->comm, s_->stream), "ncclRecv");
    return finish(std::move(p));
  }

 private:
  explicit nccl_communicator(std::shared_ptr<detail::nccl::comm_state> s) noexcept : s_(std::move(s)) {}

  static void check_options(nccl_options const& options) {
    if (options.timeout.count() <= 0) throw config_error("gradcomp: the NCCL timeout must be positive");
  }

  void init(cudaStream_t stream, nccl_options options) {
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

GRADCOMP_NAMESPACE_END
