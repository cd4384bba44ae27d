// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// The engine behind gradcomp's DDP communication hook (python/gradcomp/ddp.py): a
// `gradient_pipeline` over a `c10d_communicator`, fed with DDP's buckets as the backward pass
// produces them, on a worker thread of its own so that the hook returns at once.
//
// DDP calls the hook once per bucket, in bucket order, and waits for every bucket's future at
// the end of the backward pass. The engine turns one DDP iteration into one pipeline step:
//   - the first bucket of an iteration opens the step (`begin`);
//   - each bucket is compressed on arrival (`submit`), while autograd goes on with the next;
//   - the last bucket (`is_last`) closes it (`finish`): agreement, exchange, error-feedback
//     commit, and the average written into every bucket; then every bucket's future completes
//     with its bucket (or fails, on every rank, with the step's error; the pipeline's state is
//     then as before the step).
// The first `start_iter` iterations (a warm-up), and every iteration of the identity codec
// without feedback, controller or two-way compression (no compression at all), are plain
// all-reduces of DDP's bucket: DDP's own arithmetic, sum then divide by the world size.
// Pipeline tensors are keyed by the caller's key for each piece (the Python hook passes every
// parameter's gradient as a piece, keyed by the parameter's index in order of first
// appearance, which is the same in every run of a model), so DDP's bucket rebuild, and a resumed
// run's first iteration on DDP's initial buckets, find their state. Pieces without a key are
// keyed by (bucket index, position); a key whose size or dtype changes gets a fresh id.

#include <gradcomp/comm/c10d.hpp>
#include <gradcomp/pipeline/pipeline.hpp>

#include <ATen/core/ivalue.h>
#include <torch/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <vector>

namespace gradcomp_python {

using future_ptr = c10::intrusive_ptr<c10::ivalue::Future>;

// The Python binding fills it from the option table gradcomp/_options.py (python/src/module.cpp,
// `engine_options_from`); the defaults here are those of the table (tests/python/test_options.py
// compares them through `_C.engine_defaults()`).
struct engine_options {
  gradcomp::pipeline_options pipeline;
  std::int64_t start_iter = 0;       // plain all-reduce iterations before compression starts
  std::uint64_t batch_size = 0;      // samples per worker per step (GraVAC's throughput)
  std::int64_t log_every = 0;        // print a line every this many steps on rank 0 (0: never)
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

// Statistics the Python side reads.
struct engine_totals {
  std::uint64_t iterations = 0;       // DDP iterations completed (warm-up included)
  std::uint64_t bytes_sent = 0;       // this rank's payload bytes over all iterations
  double hook_s = 0.0;                // first bucket in -> last future completed, summed
  std::uint64_t layout_changes = 0;   // buckets that changed shape after compression started
};

// One piece of a bucket handed to the pipeline: a view of the bucket's buffer.
struct piece {
  at::Tensor view;        // 1-D, contiguous, a view of the bucket buffer
  std::int64_t rows = 0;  // matrix shape for low-rank codecs (0: the pipeline's default)
  std::int64_t cols = 0;
  std::int64_t key = -1;  // the caller's stable key (a parameter's index); -1: by position
};

class ddp_engine {
 public:
  ddp_engine(c10::intrusive_ptr<::c10d::ProcessGroup> pg, engine_options opt)
      : opt_(std::move(opt)),
        comm_(std::move(pg), gradcomp::c10d_options{opt_.timeout}),
        pipe_(opt_.pipeline) {
    if (opt_.start_iter < 0) throw gradcomp::config_error("gradcomp: start_iter must be >= 0");
    // The identity codec without feedback, controller or two-way compression is no compression:
    // the bucket is all-reduced as DDP itself does (bit-identical to DDP's default).
    auto const& po = opt_.pipeline;
    plain_ = po.codec == "identity" && po.feedback == "none" && po.controller.empty() && !po.two_way;
    worker_ = std::thread([this] { loop(); });
  }

  ddp_engine(ddp_engine const&) = delete;
  ddp_engine& operator=(ddp_engine const&) = delete;

  // Stops the worker. The caller must not hold the Python GIL (the binding releases it): the
  // worker may need it to let go of the futures' Python values.
  ~ddp_engine() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  // This rank's loss for the divergence guard of the next compressed iteration (the one whose
  // first bucket arrives next); one value, replaced by a later report.
  void report_loss(double loss) {
    std::lock_guard<std::mutex> lock(mu_);
    loss_ = loss;
  }

  // Queues bucket `index` (its flat buffer and the pieces to compress) and returns the future
  // DDP waits for. Never blocks.
  future_ptr submit(std::int64_t index, at::Tensor buffer, std::vector<piece> pieces, bool is_last) {
    auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get());
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(task{index, std::move(buffer), std::move(pieces), is_last, fut, clock::now()});
      ++in_flight_;
    }
    cv_.notify_all();
    return fut;
  }

  // Blocks until every queued bucket has been handled (the futures completed).
  void wait_idle() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [&] { return in_flight_ == 0 && !open_; });
  }

  [[nodiscard]] std::vector<std::byte> save() {
    wait_idle();
    std::lock_guard<std::mutex> lock(mu_);
    gradcomp::detail::byte_writer w;
    w.begin(magic, version);
    w.put_u64(static_cast<std::uint64_t>(iteration_));
    w.put_u64(next_id_);
    w.put_u64(ids_.size());
    for (auto const& [key, id] : ids_) {
      w.put_u64(static_cast<std::uint64_t>(std::get<0>(key)));
      w.put_u64(static_cast<std::uint64_t>(std::get<1>(key)));
      w.put_u64(static_cast<std::uint64_t>(std::get<2>(key)));
      w.put_u64(static_cast<std::uint64_t>(std::get<3>(key)));
      w.put_u64(id);
    }
    w.put_bytes(pipe_.save());
    return w.finish();
  }

  void load(std::span<std::byte const> bytes) {
    wait_idle();
    std::lock_guard<std::mutex> lock(mu_);
    gradcomp::detail::byte_reader r(bytes, magic, version, "gradcomp DDP hook state");
    auto const iteration = static_cast<std::int64_t>(r.get_u64());
    std::uint64_t const next = r.get_u64();
    std::uint64_t const n = r.get_u64();
    std::map<key_t, std::uint64_t> ids;
    for (std::uint64_t i = 0; i < n; ++i) {
      key_t k{static_cast<std::int64_t>(r.get_u64()), static_cast<std::int64_t>(r.get_u64()),
              static_cast<std::int64_t>(r.get_u64()), static_cast<int>(r.get_u64())};
      std::uint64_t const id = r.get_u64();
      if (id >= next) r.fail("a tensor id is not below the next id");
      if (!ids.emplace(k, id).second) r.fail("a bucket key appears twice");
    }
    std::vector<std::byte> const p = r.get_bytes();
    r.expect_end();
    pipe_.load(p);  // format_error and no change on failure
    iteration_ = iteration;
    next_id_ = next;
    ids_ = std::move(ids);
  }

  [[nodiscard]] gradcomp::pipeline_stats last_stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }
  [[nodiscard]] engine_totals totals() {
    std::lock_guard<std::mutex> lock(mu_);
    return totals_;
  }
  [[nodiscard]] std::int64_t iteration() {
    std::lock_guard<std::mutex> lock(mu_);
    return iteration_;
  }
  [[nodiscard]] int rank() const noexcept { return comm_.rank(); }
  [[nodiscard]] int size() const noexcept { return comm_.size(); }
  [[nodiscard]] engine_options const& options() const noexcept { return opt_; }
  // The committed error-feedback state of a pipeline tensor (tests: mass conservation).
  [[nodiscard]] std::vector<float> feedback_state(std::uint64_t id) {
    wait_idle();
    auto s = pipe_.feedback_state(static_cast<gradcomp::tensor_id>(id));
    return {s.begin(), s.end()};
  }
  [[nodiscard]] std::vector<std::uint64_t> tensor_ids() {
    wait_idle();
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::uint64_t> out;
    for (auto const& [k, id] : ids_) out.push_back(id);
    return out;
  }
  [[nodiscard]] std::optional<double> controller_factor() {
    wait_idle();
    auto const* c = pipe_.controller();
    if (c == nullptr) return std::nullopt;
    return pipe_.last_stats().factor;
  }

  static constexpr char const* magic = "GCDH";
  static constexpr std::uint8_t version = 1;

 private:
  using clock = std::chrono::steady_clock;
  // (bucket index, position in bucket, elements, dtype)
  using key_t = std::tuple<std::int64_t, std::int64_t, std::int64_t, int>;

  struct task {
    std::int64_t index;
    at::Tensor buffer;
    std::vector<piece> pieces;
    bool is_last;
    future_ptr fut;
    clock::time_point queued;
  };

  void loop() {
    for (;;) {
      task t;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_) {
          // Destroyed with buckets still queued (or a step open): they fail, nothing is sent.
          auto const gone = std::make_exception_ptr(
              gradcomp::config_error("gradcomp: the DDP hook state was destroyed before this bucket was exchanged"));
          for (auto& q : queue_) q.fut->setError(gone);
          for (auto& q : step_) q.fut->setError(gone);
          queue_.clear();
          step_.clear();
          return;
        }
        t = std::move(queue_.front());
        queue_.pop_front();
        if (!open_) {
          open_ = true;
          step_started_ = t.queued;
        }
      }
      handle(std::move(t));
    }
  }

  void handle(task t) {
    bool const warm_up = iteration_ < opt_.start_iter || plain_;
    if (warm_up) {
      // DDP's default: sum, then divide by the world size.
      try {
        std::vector<at::Tensor> v{t.buffer};
        auto w = comm_.process_group()->allreduce(v);
        if (!w->wait(opt_.timeout)) throw std::runtime_error("all-reduce timed out");
        t.buffer.div_(comm_.size());
        bytes_ += static_cast<std::uint64_t>(t.buffer.numel() * t.buffer.element_size());
        if (t.is_last) end_iteration(std::nullopt);
        finish_future(t.fut, t.buffer);
      } catch (std::exception const& e) {
        if (t.is_last) end_iteration(std::nullopt);
        t.fut->setError(std::make_exception_ptr(
            gradcomp::comm_error(std::string("gradcomp: DDP hook all-reduce of bucket ") + std::to_string(t.index) +
                                 " failed: " + e.what())));
      }
      complete(1, t.is_last);
      return;
    }
    if (step_.empty()) {
      try {
        gradcomp::pipeline_step_info info;
        info.batch_size = opt_.batch_size;
        {
          std::lock_guard<std::mutex> lock(mu_);
          info.loss = loss_;
          loss_.reset();
        }
        pipe_.begin(comm_, info);
        begun_ = true;
      } catch (...) {
        failure_ = std::current_exception();
      }
    }
    if (!failure_) {
      try {
        for (std::size_t i = 0; i < t.pieces.size(); ++i) add_piece(t.index, static_cast<std::int64_t>(i), t.pieces[i]);
      } catch (...) {
        failure_ = std::current_exception();
      }
    }
    step_.push_back(std::move(t));
    if (!step_.back().is_last) return;
    // The last bucket: finish the step even after a local failure, so that the other ranks are
    // not left waiting in its agreement round (the pipeline fails the step on every rank when
    // the ranks' tensors disagree).
    std::optional<gradcomp::pipeline_stats> stats;
    std::exception_ptr failure = failure_;
    if (begun_) {
      try {
        auto s = pipe_.finish(comm_);
        if (!failure) stats = s;
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
    }
    begun_ = false;
    failure_ = nullptr;
    std::vector<task> step = std::move(step_);
    step_.clear();
    if (stats) bytes_ += stats->bytes_sent;
    end_iteration(stats);
    for (auto& s : step) {
      if (failure) s.fut->setError(failure);
      else finish_future(s.fut, s.buffer);
    }
    complete(static_cast<std::int64_t>(step.size()), true);
  }

  void finish_future(future_ptr const& f, at::Tensor const& t) {
    try {
      f->markCompleted(c10::IValue(t));
    } catch (...) {
      if (!f->completed()) f->setError(std::current_exception());
    }
  }

  template <class T>
  void submit_view(at::Tensor const& v, gradcomp::tensor_id id) {
    auto* p = reinterpret_cast<T*>(v.data_ptr());
    std::vector<gradcomp::tensor_view<T>> one{gradcomp::tensor_view<T>(std::span<T>(p, static_cast<std::size_t>(v.numel())), id)};
    pipe_.submit(one);
  }

  void add_piece(std::int64_t index, std::int64_t pos, piece const& p) {
    at::Tensor const& v = p.view;
    key_t const key = p.key >= 0 ? key_t{p.key, -1, v.numel(), static_cast<int>(v.scalar_type())}
                                 : key_t{index, pos, v.numel(), static_cast<int>(v.scalar_type())};
    std::uint64_t id = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = ids_.find(key);
      if (it == ids_.end()) {
        bool const relayout = std::any_of(ids_.begin(), ids_.end(), [&](auto const& kv) {
          return std::get<0>(kv.first) == std::get<0>(key) && std::get<1>(kv.first) == std::get<1>(key);
        });
        if (relayout) ++totals_.layout_changes;
        id = next_id_++;
        if (id > 0xffffffffu) throw gradcomp::config_error("gradcomp: DDP hook ran out of tensor ids");
        ids_.emplace(key, id);
      } else {
        id = it->second;
      }
    }
    auto const tid = static_cast<gradcomp::tensor_id>(id);
    if (p.rows > 0 && p.cols > 0) pipe_.set_shape(tid, static_cast<std::size_t>(p.rows), static_cast<std::size_t>(p.cols));
    switch (v.scalar_type()) {
      case at::kFloat: submit_view<float>(v, tid); break;
      case at::kHalf: submit_view<gradcomp::half>(v, tid); break;
      case at::kBFloat16: submit_view<gradcomp::bfloat16>(v, tid); break;
      default:
        throw gradcomp::config_error(std::string("gradcomp: DDP hook: gradients of dtype ") +
                                     std::string(c10::toString(v.scalar_type())) +
                                     " are not supported (float32, float16, bfloat16)");
    }
  }

  // `n` futures are done; `closes`: the iteration is over.
  void complete(std::int64_t n, bool closes) {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_ -= n;
    if (closes) open_ = false;
    if (in_flight_ == 0 && !open_) idle_cv_.notify_all();
  }

  void end_iteration(std::optional<gradcomp::pipeline_stats> const& stats) {
    auto const now = clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    ++iteration_;
    ++totals_.iterations;
    totals_.bytes_sent += bytes_;
    double const hook_s = std::chrono::duration<double>(now - step_started_).count();
    totals_.hook_s += hook_s;
    if (stats) last_ = *stats;
    else {
      last_ = gradcomp::pipeline_stats{};
      last_.step = static_cast<std::uint64_t>(iteration_ - 1);
      last_.bytes_sent = bytes_;
      last_.total_s = hook_s;
    }
    if (opt_.log_every > 0 && comm_.rank() == 0 && iteration_ % opt_.log_every == 0) {
      std::fprintf(stderr,
                   "gradcomp: iteration %lld: %s, %zu bytes sent, factor %.1f, gain %.3f, compress %.2f ms, "
                   "communicate %.2f ms, hook %.2f ms\n",
                   static_cast<long long>(iteration_ - 1), stats ? "compressed" : "all-reduce", last_.bytes_sent,
                   last_.factor, last_.gain, 1e3 * last_.compress_s, 1e3 * last_.communicate_s, 1e3 * hook_s);
    }
    bytes_ = 0;
  }

  engine_options opt_;
  std::optional<double> loss_;  // reported for the next iteration (the divergence guard)
  bool plain_ = false;
  gradcomp::c10d_communicator comm_;
  gradcomp::gradient_pipeline pipe_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<task> queue_;
  std::int64_t in_flight_ = 0;  // queued or held in an open step
  bool open_ = false;
  bool stop_ = false;

  // Worker-thread state.
  std::vector<task> step_;
  std::exception_ptr failure_;
  bool begun_ = false;
  clock::time_point step_started_{};
  std::uint64_t bytes_ = 0;

  // Shared (under mu_).
  std::int64_t iteration_ = 0;
  std::uint64_t next_id_ = 0;
  std::map<key_t, std::uint64_t> ids_;
  gradcomp::pipeline_stats last_{};
  engine_totals totals_{};

  std::thread worker_;
};

}  // namespace gradcomp_python
