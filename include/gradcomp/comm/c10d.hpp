// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The torch.distributed adapter: `c10d_communicator` models `communicator` over a PyTorch
/// process group (`c10d::ProcessGroup`: gloo on CPU, NCCL or MPI where PyTorch has them), so the
/// library's collectives, agreement rounds and gossip run over the process group a training
/// script already has. Needs libtorch's headers and libraries (PyTorch 2.4 or later): link the
/// CMake target `gradcomp::torch` (`find_package(gradcomp COMPONENTS torch)` with
/// `torch.utils.cmake_prefix_path` on `CMAKE_PREFIX_PATH`; docs/packaging.md). Pass a
/// `c10d::ProcessGroup` (the default group, `dist.new_group()`), not one of its `Backend`s. Not included by
/// `gradcomp/gradcomp.hpp`. The Python package (python/, docs/pytorch.md) builds on it.
///
/// How operations map onto the process group (every buffer is wrapped, not copied, as a tensor
/// with `torch::from_blob`):
/// - `all_reduce` of a sum over f32, f64, i32, i64, u8, f16 (and u32 / u64, summed as i32 / i64:
///   the same bits modulo 2^32 / 2^64) is the process group's `allreduce`, which for gloo sums
///   16-bit floats in float32 and rounds once per peer, like the library's own reduction.
///   Everything else (bfloat16, which gloo lacks in 1.13, and every `max` / `min`, whose NaN
///   rules are the library's) is reduced by the library: an `alltoall_base` hands each rank
///   its 1/size() share of every buffer, the rank combines them in rank order with
///   `reduce_into` (comm/reduce.hpp), and an all-gather returns the shares to everyone;
/// - `reduce_scatter`: the same `alltoall_base` and `reduce_into`, without the all-gather;
/// - `all_gather`: `allgather` into views of the output; `all_gather_v`: the same with every
///   rank's block padded to the largest count (gloo's all-gather needs equal blocks), then
///   compacted; `all_to_all_v`: `alltoall_base` with the counts as splits;
/// - `broadcast`, `barrier`, `send` / `recv` (with the tag): the process group's own.
///
/// Failures: whatever the process group throws (a peer that closed its connections, gloo's
/// timeout, a mismatched collective) becomes a `comm_error` naming the operation and carrying
/// the process group's message; `c10d_options::timeout` bounds every wait. After a
/// `comm_error` the communicator is broken and every later operation fails at once, as with
/// MPI: recover by making a new process group.
///
/// Threads: operations may be posted from any one thread at a time; every rank must post its
/// collectives in the same order (the process group matches them by order). Each non-blocking
/// operation is one process-group call posted at once, except the library's reductions, which
/// take two calls and therefore complete before `iall_reduce` returns (a later call could
/// otherwise come between them on one rank and not on another).

#include <gradcomp/comm/blocking.hpp>
#include <gradcomp/comm/detail/checks.hpp>
#include <gradcomp/comm/reduce.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/request.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Options of a `c10d_communicator`.
struct c10d_options {
  /// How long a wait for one operation may take before it throws `comm_error` (and breaks the
  /// communicator). The process group's own timeout (`init_process_group(timeout=...)`) applies
  /// as well; the shorter one wins.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

namespace detail::c10d_comm {

using work_ptr = c10::intrusive_ptr<::c10d::Work>;

// The process group's all-to-all with splits: `all_to_all_single` where the process group has
// it (torch 2.10 and later, which deprecate `alltoall_base`), else `alltoall_base`.
template <class PG>
work_ptr all_to_all(PG& pg, at::Tensor& out, at::Tensor& in, std::vector<std::int64_t>& recv,
                    std::vector<std::int64_t>& send) {
  if constexpr (requires { pg.all_to_all_single(out, in, recv, send); }) {
    return pg.all_to_all_single(out, in, recv, send);
  } else {
    return pg.alltoall_base(out, in, recv, send);
  }
}

// A byte range as a tensor of `n` elements of `dtype`, without a copy. An empty range still
// gets a valid pointer: some backends reject null data.
inline at::Tensor wrap(void const* data, std::size_t elements, at::ScalarType dtype) {
  static std::byte empty[16];
  void* p = elements == 0 ? static_cast<void*>(empty) : const_cast<void*>(data);
  return torch::from_blob(p, {static_cast<std::int64_t>(elements)}, torch::TensorOptions().dtype(dtype));
}

inline at::Tensor bytes(std::span<std::byte const> s) { return wrap(s.data(), s.size(), at::kByte); }

// The process group's native sum, or nothing when the library reduces (see file comment).
inline bool native_sum(comm_type t, at::ScalarType& dtype) noexcept {
  switch (t) {
    case comm_type::f32: dtype = at::kFloat; return true;
    case comm_type::f64: dtype = at::kDouble; return true;
    case comm_type::i32:
    case comm_type::u32: dtype = at::kInt; return true;
    case comm_type::i64:
    case comm_type::u64: dtype = at::kLong; return true;
    case comm_type::u8: dtype = at::kByte; return true;
    case comm_type::f16: dtype = at::kHalf; return true;
    case comm_type::bf16: return false;
  }
  return false;
}

// State shared by the communicator and its pending operations.
struct shared {
  c10::intrusive_ptr<::c10d::ProcessGroup> pg;
  c10d_options options;
  std::atomic<bool> broken{false};
};

// One pending operation: a chain of process-group calls, each started when the one before it
// has completed, and a final step on the host.
class pending final : public request::state {
 public:
  using stage = std::function<work_ptr()>;

  pending(std::shared_ptr<shared> s, std::string what) : s_(std::move(s)), what_(std::move(what)) {}

  // Starts the first stage now; the others follow in order. `then` runs on the host after the
  // last one.
  void run(std::vector<stage> stages, std::function<void()> then = {}) {
    stages_ = std::move(stages);
    then_ = std::move(then);
    guarded([&] { advance(); });
  }

  bool test() override {
    if (done_ || failed_) return true;
    bool finished = false;
    guarded([&] {
      while (work_ && work_->isCompleted()) {
        work_->wait();  // rethrows the stage's failure, if any
        work_.reset();
        advance();
      }
      finished = done_;
    });
    return finished || failed_;
  }

  void wait() override {
    if (error_) std::rethrow_exception(error_);
    guarded([&] {
      while (!done_) {
        if (work_) {
          if (!work_->wait(s_->options.timeout)) {
            throw std::runtime_error("timed out after " + std::to_string(s_->options.timeout.count()) + " ms");
          }
          work_.reset();
        }
        advance();
      }
    });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  // Posts the next stage, or finishes.
  void advance() {
    if (work_ || done_) return;
    if (next_ < stages_.size()) {
      work_ = stages_[next_++]();
      if (!work_) advance();
      return;
    }
    if (then_) then_();
    done_ = true;
  }

  template <class F>
  void guarded(F&& f) {
    if (failed_) return;
    try {
      f();
    } catch (gradcomp::error const&) {
      fail(std::current_exception());
    } catch (std::exception const& e) {
      fail(std::make_exception_ptr(comm_error("gradcomp: c10d " + what_ + " failed: " + e.what())));
    }
  }

  void fail(std::exception_ptr e) {
    failed_ = true;
    work_.reset();
    s_->broken.store(true);
    error_ = std::move(e);
  }

  std::shared_ptr<shared> s_;
  std::string what_;
  std::vector<stage> stages_;
  std::size_t next_ = 0;
  std::function<void()> then_;
  work_ptr work_;
  bool done_ = false;
  bool failed_ = false;
  std::exception_ptr error_;
};

}  // namespace detail::c10d_comm

/// A `communicator` over a PyTorch process group (see file comment). Cheap to copy: copies
/// share the process group and the broken flag.
class c10d_communicator : public blocking_operations<c10d_communicator> {
 public:
  using communicator_concept = communicator_tag;

  /// Wraps `pg` (which must outlive no one: the communicator keeps a reference).
  explicit c10d_communicator(c10::intrusive_ptr<::c10d::ProcessGroup> pg, c10d_options options = {})
      : s_(std::make_shared<detail::c10d_comm::shared>()) {
    if (!pg) throw config_error("gradcomp: c10d_communicator needs a process group");
    if (options.timeout.count() <= 0) throw config_error("gradcomp: the c10d timeout must be positive");
    s_->pg = std::move(pg);
    s_->options = options;
    rank_ = s_->pg->getRank();
    size_ = s_->pg->getSize();
  }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] c10::intrusive_ptr<::c10d::ProcessGroup> const& process_group() const noexcept { return s_->pg; }
  [[nodiscard]] c10d_options const& options() const noexcept { return s_->options; }
  /// True once a `comm_error` has made the communicator unusable.
  [[nodiscard]] bool broken() const noexcept { return s_->broken.load(); }

  request ibarrier() {
    return post("barrier", {[pg = s_->pg] { return pg->barrier(); }});
  }

  request ibroadcast(std::span<std::byte> buf, int root) {
    detail::comm_checks::peer(root, size(), "broadcast root");
    at::Tensor t = detail::c10d_comm::bytes(buf);
    return post("broadcast of " + std::to_string(buf.size()) + " bytes from rank " + std::to_string(root),
                {[pg = s_->pg, t, root]() mutable {
                  std::vector<at::Tensor> v{t};
                  ::c10d::BroadcastOptions o;
                  o.rootRank = root;
                  return pg->broadcast(v, o);
                }});
  }

  request iall_reduce(std::span<std::byte> buf, comm_type t, reduce_op op) {
    detail::comm_checks::reduction(buf.size(), t, op, "all_reduce");
    std::string what = std::string("all_reduce (") + comm_type_name(t) + ", " + reduce_op_name(op) + ", " +
                       std::to_string(buf.size()) + " bytes)";
    at::ScalarType dtype{};
    if (op == reduce_op::sum && detail::c10d_comm::native_sum(t, dtype)) {
      at::Tensor x = detail::c10d_comm::wrap(buf.data(), buf.size() / comm_type_size(t), dtype);
      return post(std::move(what), {[pg = s_->pg, x]() mutable {
                    std::vector<at::Tensor> v{x};
                    return pg->allreduce(v);
                  }});
    }
    // The library's reduction: reduce-scatter by alltoall, then all-gather the shares.
    auto plan = share_plan(buf.size() / comm_type_size(t), comm_type_size(t));
    auto mine = std::make_shared<std::vector<std::byte>>(plan->counts[static_cast<std::size_t>(rank_)]);
    std::vector<detail::c10d_comm::pending::stage> stages = reduce_stages(std::span<std::byte const>(buf), plan, t, op, mine);
    auto g = std::make_shared<gather_buffers>();
    stages.push_back([pg = s_->pg, g, plan, mine, buf]() { return gather_v_stage(*pg, *g, std::span<std::byte const>(*mine), buf, plan->counts); });
    // Two process-group calls: run at once, so that no operation posted later can slip
    // between them on one rank and not on another (the group matches calls by order).
    return post(std::move(what), std::move(stages), [g, plan, buf] { compact_padded(*g, buf, plan->counts); }, true);
  }

  request ireduce_scatter(std::span<std::byte const> in, std::span<std::byte> out, comm_type t, reduce_op op) {
    detail::comm_checks::reduce_scatter(in.size(), out.size(), t, op, size());
    auto plan = std::make_shared<shares>();
    plan->counts.assign(static_cast<std::size_t>(size_), out.size());
    auto mine = std::make_shared<std::vector<std::byte>>(out.size());
    return post(std::string("reduce_scatter (") + comm_type_name(t) + ", " + reduce_op_name(op) + ", " +
                    std::to_string(out.size()) + " bytes per rank)",
                reduce_stages(in, plan, t, op, mine),
                [mine, out] {
                  if (!out.empty()) std::memcpy(out.data(), mine->data(), out.size());
                });
  }

  request iall_gather(std::span<std::byte const> in, std::span<std::byte> out) {
    detail::comm_checks::all_gather(in.size(), out.size(), size());
    std::vector<std::size_t> counts(static_cast<std::size_t>(size_), in.size());
    return post("all_gather (" + std::to_string(in.size()) + " bytes each)",
                {[pg = s_->pg, in, out, counts] {
                  gather_buffers unused;
                  return gather_v_stage(*pg, unused, in, out, counts);
                }});
  }

  /// `counts` is copied: it need not outlive the call.
  request iall_gather_v(std::span<std::byte const> in, std::span<std::byte> out, std::span<std::size_t const> counts) {
    detail::comm_checks::all_gather_v(in.size(), out.size(), counts, rank(), size());
    std::vector<std::size_t> c(counts.begin(), counts.end());
    auto g = std::make_shared<gather_buffers>();
    return post("all_gather_v (" + std::to_string(out.size()) + " bytes in all)",
                {[pg = s_->pg, g, in, out, c] { return gather_v_stage(*pg, *g, in, out, c); }},
                [g, out, c] { compact_padded(*g, out, c); });
  }

  /// The counts are copied: they need not outlive the call.
  request iall_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> send_counts, std::span<std::byte> out,
                        std::span<std::size_t const> recv_counts) {
    detail::comm_checks::all_to_all_v(in.size(), send_counts, out.size(), recv_counts, size());
    std::vector<std::int64_t> sc(send_counts.begin(), send_counts.end());
    std::vector<std::int64_t> rc(recv_counts.begin(), recv_counts.end());
    at::Tensor i = detail::c10d_comm::bytes(in);
    at::Tensor o = detail::c10d_comm::bytes(std::span<std::byte const>(out));
    return post("all_to_all_v (" + std::to_string(in.size()) + " bytes out, " + std::to_string(out.size()) + " in)",
                {[pg = s_->pg, i, o, sc, rc]() mutable { return detail::c10d_comm::all_to_all(*pg, o, i, rc, sc); }});
  }

  request isend(std::span<std::byte const> in, int peer, int tag) {
    detail::comm_checks::peer(peer, size(), "send peer");
    detail::comm_checks::tag(tag);
    at::Tensor t = detail::c10d_comm::bytes(in);
    return post("send of " + std::to_string(in.size()) + " bytes to rank " + std::to_string(peer) + " (tag " +
                    std::to_string(tag) + ")",
                {[pg = s_->pg, t, peer, tag]() mutable {
                  std::vector<at::Tensor> v{t};
                  return pg->send(v, peer, tag);
                }});
  }

  request irecv(std::span<std::byte> out, int peer, int tag) {
    detail::comm_checks::peer(peer, size(), "recv peer");
    detail::comm_checks::tag(tag);
    at::Tensor t = detail::c10d_comm::bytes(std::span<std::byte const>(out));
    return post("recv of " + std::to_string(out.size()) + " bytes from rank " + std::to_string(peer) + " (tag " +
                    std::to_string(tag) + ")",
                {[pg = s_->pg, t, peer, tag]() mutable {
                  std::vector<at::Tensor> v{t};
                  return pg->recv(v, peer, tag);
                }});
  }

 private:
  // How a buffer is split into per-rank shares (bytes), for the library's reductions.
  struct shares {
    std::vector<std::size_t> counts;
  };

  std::shared_ptr<shares> share_plan(std::size_t elements, std::size_t es) const {
    auto p = std::make_shared<shares>();
    auto const n = static_cast<std::size_t>(size_);
    for (std::size_t r = 0; r < n; ++r) p->counts.push_back((elements * (r + 1) / n - elements * r / n) * es);
    return p;
  }

  // Stages of a reduce-scatter by alltoall: share r of `in` goes to rank r, which combines the
  // size() copies it receives in rank order into `mine`.
  std::vector<detail::c10d_comm::pending::stage> reduce_stages(std::span<std::byte const> in, std::shared_ptr<shares> plan,
                                                               comm_type t, reduce_op op,
                                                               std::shared_ptr<std::vector<std::byte>> mine) {
    auto const n = static_cast<std::size_t>(size_);
    std::size_t const own = plan->counts[static_cast<std::size_t>(rank_)];
    auto recv = std::make_shared<std::vector<std::byte>>(own * n);
    std::vector<std::int64_t> sc(plan->counts.begin(), plan->counts.end());
    std::vector<std::int64_t> rc(n, static_cast<std::int64_t>(own));
    at::Tensor i = detail::c10d_comm::bytes(in);
    at::Tensor o = detail::c10d_comm::bytes(std::span<std::byte const>(*recv));
    return {[pg = s_->pg, i, o, sc, rc]() mutable { return detail::c10d_comm::all_to_all(*pg, o, i, rc, sc); },
            [recv, mine, own, n, t, op]() -> detail::c10d_comm::work_ptr {
              if (own != 0) {
                std::memcpy(mine->data(), recv->data(), own);
                for (std::size_t r = 1; r < n; ++r) reduce_into(t, op, mine->data(), recv->data() + r * own, own);
              }
              return {};
            }};
  }

  // All-gather of blocks of `counts[r]` bytes (this rank's is `in`) into `out`. Equal blocks go
  // straight into `out`; unequal ones are padded to the largest into a staging buffer, which
  // `compact_padded` copies out after the wait.
  struct gather_buffers {
    std::vector<std::byte> staging;
    std::vector<std::byte> padded_in;
  };

  static detail::c10d_comm::work_ptr gather_v_stage(::c10d::ProcessGroup& pg, gather_buffers& g, std::span<std::byte const> in,
                                                    std::span<std::byte> out, std::vector<std::size_t> const& counts) {
    std::size_t const most = *std::max_element(counts.begin(), counts.end());
    if (most == 0) return {};
    bool const equal = std::all_of(counts.begin(), counts.end(), [&](std::size_t c) { return c == most; });
    std::vector<at::Tensor> outs;
    std::span<std::byte> target = out;
    if (!equal) {
      g.staging.assign(most * counts.size(), std::byte{0});
      target = std::span<std::byte>(g.staging);
    }
    for (std::size_t r = 0; r < counts.size(); ++r) {
      outs.push_back(detail::c10d_comm::wrap(target.data() + r * most, most, at::kByte));
    }
    at::Tensor i = detail::c10d_comm::bytes(in);
    if (!equal) {
      g.padded_in.assign(most, std::byte{0});
      if (!in.empty()) std::memcpy(g.padded_in.data(), in.data(), in.size());
      i = detail::c10d_comm::wrap(g.padded_in.data(), most, at::kByte);
    }
    std::vector<std::vector<at::Tensor>> o{std::move(outs)};
    std::vector<at::Tensor> v{i};
    return pg.allgather(o, v);
  }

  static void compact_padded(gather_buffers const& g, std::span<std::byte> out, std::vector<std::size_t> const& counts) {
    std::size_t const most = *std::max_element(counts.begin(), counts.end());
    bool const equal = std::all_of(counts.begin(), counts.end(), [&](std::size_t c) { return c == most; });
    if (equal || most == 0) return;
    std::size_t at = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      if (counts[r] != 0) std::memcpy(out.data() + at, g.staging.data() + r * most, counts[r]);
      at += counts[r];
    }
  }

  // Posts an operation. `complete_now`: wait for it before returning (its failure is kept for
  // the request's wait()).
  request post(std::string what, std::vector<detail::c10d_comm::pending::stage> stages, std::function<void()> then = {},
               bool complete_now = false) {
    if (s_->broken.load()) {
      throw comm_error("gradcomp: c10d " + what + ": the communicator is broken by an earlier failure");
    }
    auto p = std::make_unique<detail::c10d_comm::pending>(s_, std::move(what));
    p->run(std::move(stages), std::move(then));
    if (complete_now) {
      try {
        p->wait();
      } catch (...) {  // kept in the request: its wait() rethrows it
      }
    }
    return request(std::move(p));
  }

  std::shared_ptr<detail::c10d_comm::shared> s_;
  int rank_ = 0;
  int size_ = 1;
};

GRADCOMP_NAMESPACE_END
