// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// A small fork-join thread pool for the CPU kernels. Work is split into tasks whose boundaries
/// depend only on the problem size (never on the thread count), and every reduction is combined
/// in task order, so results are bit-identical for any number of threads.

#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace cpu {

/// A fixed set of worker threads that run `run(tasks, fn)` jobs, the caller taking part.
/// A `run` issued from inside a task runs serially on the calling thread (no nested deadlock).
class thread_pool {
 public:
  /// Creates a pool of `threads` threads in total, the calling thread included
  /// (`threads - 1` workers are started). `threads == 0` is a `config_error`.
  explicit thread_pool(unsigned threads) : size_(threads) {
    if (threads == 0) throw config_error("gradcomp: a thread pool needs at least one thread");
    workers_.reserve(threads - 1);
    for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  thread_pool(thread_pool const&) = delete;
  thread_pool& operator=(thread_pool const&) = delete;
  ~thread_pool() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }

  /// Number of threads, the caller included.
  [[nodiscard]] unsigned size() const noexcept { return size_; }

  /// Calls `fn(t)` once for every `t` in `[0, tasks)`, spread over the pool, and returns when
  /// all have finished. If any task throws, the exception of the lowest-numbered failing task
  /// is rethrown after all tasks ended.
  template <class Fn>
  void run(std::size_t tasks, Fn&& fn) {
    if (tasks == 0) return;
    if (tasks == 1 || size_ == 1 || in_task_) {
      bool const outer = !in_task_;
      in_task_ = true;
      std::exception_ptr first;
      for (std::size_t t = 0; t < tasks; ++t) {
        try {
          fn(t);
        } catch (...) {
          if (!first) first = std::current_exception();
        }
      }
      if (outer) in_task_ = false;
      if (first) std::rethrow_exception(first);
      return;
    }
    std::unique_lock job_lock(job_mutex_);  // one job at a time per pool
    job j;
    j.tasks = tasks;
    j.fn = [&fn](std::size_t t) { fn(t); };
    {
      std::lock_guard lock(mutex_);
      current_ = &j;
      ++generation_;
    }
    wake_.notify_all();
    work_on(j);
    {
      std::unique_lock lock(mutex_);
      done_.wait(lock, [&] { return j.active_workers == 0 && j.finished == j.tasks; });
      current_ = nullptr;
    }
    if (j.error) std::rethrow_exception(j.error);
  }

 private:
  struct job {
    std::size_t tasks = 0;
    std::function<void(std::size_t)> fn;
    std::atomic<std::size_t> next{0};
    std::size_t finished = 0;        // guarded by mutex_
    unsigned active_workers = 0;     // guarded by mutex_
    std::size_t error_task = SIZE_MAX;  // guarded by mutex_
    std::exception_ptr error;        // guarded by mutex_
  };

  void work_on(job& j) {
    in_task_ = true;
    std::size_t local_done = 0;
    for (;;) {
      std::size_t const t = j.next.fetch_add(1, std::memory_order_relaxed);
      if (t >= j.tasks) break;
      try {
        j.fn(t);
      } catch (...) {
        std::lock_guard lock(mutex_);
        if (t < j.error_task) {
          j.error_task = t;
          j.error = std::current_exception();
        }
      }
      ++local_done;
    }
    in_task_ = false;
    std::lock_guard lock(mutex_);
    j.finished += local_done;
  }

  void worker_loop() {
    std::uint64_t seen = 0;
    for (;;) {
      job* j = nullptr;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || (current_ != nullptr && generation_ != seen); });
        if (stop_) return;
        seen = generation_;
        j = current_;
        ++j->active_workers;
      }
      work_on(*j);
      {
        std::lock_guard lock(mutex_);
        --j->active_workers;
      }
      done_.notify_all();
    }
  }

  unsigned size_;
  std::vector<std::thread> workers_;
  std::mutex job_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  job* current_ = nullptr;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
  static inline thread_local bool in_task_ = false;
};

/// Threads the default pool uses: `GRADCOMP_NUM_THREADS` if set to a positive integer, else
/// `std::thread::hardware_concurrency()` (at least 1).
inline unsigned default_thread_count() {
  if (char const* env = std::getenv("GRADCOMP_NUM_THREADS")) {
    char* end = nullptr;
    long const v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v > 0 && v <= 4096) return static_cast<unsigned>(v);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

/// The process-wide pool used when a `cpu::execution` (or a `codec_context`) names none.
/// Created on first use.
inline thread_pool& default_thread_pool() {
  static thread_pool pool(default_thread_count());
  return pool;
}

}  // namespace cpu
GRADCOMP_NAMESPACE_END
