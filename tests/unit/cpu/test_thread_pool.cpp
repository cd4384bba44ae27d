// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// cpu/thread_pool.hpp and cpu/parallel.hpp: every task runs once, exceptions propagate from the
// lowest failing task, nested runs do not deadlock, workers are joined; the default thread
// count honours GRADCOMP_NUM_THREADS; chunk boundaries depend only on the size and alignment.

#include <gradcomp/concepts/context.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/cpu/parallel.hpp>
#include <gradcomp/cpu/thread_pool.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace gc = gradcomp;
using gc::cpu::thread_pool;

namespace {

// Threads of this process, from /proc (Linux); nullopt where that is not available.
std::optional<std::size_t> process_thread_count() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/proc/self/task", ec);
  if (ec) return std::nullopt;
  std::size_t n = 0;
  for (auto const& entry : it) {
    (void)entry;
    ++n;
  }
  return n;
}

// Sets or unsets an environment variable for the lifetime of the object, then restores it.
class scoped_env {
 public:
  explicit scoped_env(char const* name) : name_(name) {
    if (char const* v = std::getenv(name)) saved_ = std::string(v);
  }
  scoped_env(scoped_env const&) = delete;
  scoped_env& operator=(scoped_env const&) = delete;
  ~scoped_env() {
    if (saved_) {
      ::setenv(name_, saved_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  void set(char const* value) const { ::setenv(name_, value, 1); }
  void unset() const { ::unsetenv(name_); }

 private:
  char const* name_;
  std::optional<std::string> saved_;
};

using chunk_record = std::tuple<std::size_t, std::size_t, std::size_t>;

std::vector<chunk_record> record_chunks(std::size_t n, std::size_t align,
                                        gc::codec_context const& ctx) {
  std::mutex m;
  std::vector<chunk_record> out;
  gc::cpu::for_each_chunk(n, align, ctx, [&](std::size_t c, std::size_t b, std::size_t e) {
    std::lock_guard lock(m);
    out.emplace_back(c, b, e);
  });
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("thread_pool: every task runs exactly once", "[cpu][thread_pool]") {
  for (unsigned threads = 1; threads <= 5; ++threads) {
    thread_pool pool(threads);
    CHECK(pool.size() == threads);
    for (std::size_t tasks : {0u, 1u, 2u, 3u, 4u, 5u, 6u, 7u, 16u, 63u, 1000u, 4099u}) {
      std::vector<std::atomic<int>> hits(tasks);
      for (auto& h : hits) h.store(0);
      pool.run(tasks, [&](std::size_t t) { hits.at(t).fetch_add(1); });
      std::size_t wrong = 0;
      for (auto& h : hits) wrong += h.load() != 1;
      INFO(threads << " threads, " << tasks << " tasks");
      CHECK(wrong == 0);
    }
    // Many small jobs back to back on the same pool.
    std::atomic<std::size_t> sum{0};
    for (int job = 0; job < 200; ++job) {
      pool.run(5, [&](std::size_t t) { sum.fetch_add(t + 1); });
    }
    CHECK(sum.load() == 200u * 15u);
  }
}

TEST_CASE("thread_pool: a pool of n threads runs n tasks concurrently", "[cpu][thread_pool]") {
  // Each task waits until all of them have started; that only finishes if the pool really runs
  // them on `threads` different threads. A deadline turns a failure into a failed check, not a
  // hang.
  for (unsigned threads : {2u, 3u, 5u}) {
    thread_pool pool(threads);
    std::atomic<unsigned> arrived{0};
    std::atomic<bool> timed_out{false};
    std::mutex m;
    std::set<std::thread::id> ids;
    pool.run(threads, [&](std::size_t) {
      {
        std::lock_guard lock(m);
        ids.insert(std::this_thread::get_id());
      }
      arrived.fetch_add(1);
      auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (arrived.load() < threads) {
        if (std::chrono::steady_clock::now() > deadline) {
          timed_out = true;
          return;
        }
        std::this_thread::yield();
      }
    });
    INFO(threads << " threads");
    CHECK_FALSE(timed_out.load());
    CHECK(ids.size() == threads);
    CHECK(ids.count(std::this_thread::get_id()) == 1);  // the caller takes part
  }
}

TEST_CASE("thread_pool: the lowest failing task's exception is rethrown", "[cpu][thread_pool]") {
  for (unsigned threads = 1; threads <= 5; ++threads) {
    thread_pool pool(threads);
    for (int rep = 0; rep < 20; ++rep) {
      std::size_t const tasks = 40;
      // Failing tasks: a few, the lowest varying with the repetition.
      std::set<std::size_t> const failing = {static_cast<std::size_t>(5 + rep), 30, 39};
      std::vector<std::atomic<int>> ran(tasks);
      for (auto& r : ran) r.store(0);
      std::string caught;
      try {
        pool.run(tasks, [&](std::size_t t) {
          ran[t].fetch_add(1);
          if (failing.count(t) != 0) {
            // Make a higher-numbered failure likely to happen first in time.
            if (t == *failing.begin()) std::this_thread::sleep_for(std::chrono::microseconds(200));
            throw std::runtime_error("task " + std::to_string(t));
          }
        });
      } catch (std::runtime_error const& e) {
        caught = e.what();
      }
      INFO(threads << " threads, repetition " << rep);
      REQUIRE(caught == "task " + std::to_string(*failing.begin()));
      // No task ran twice, and every task below the lowest failing one ran.
      for (std::size_t t = 0; t < tasks; ++t) {
        REQUIRE(ran[t].load() <= 1);
        if (t <= *failing.begin()) REQUIRE(ran[t].load() == 1);
      }
      // On more than one thread every task runs before the exception is rethrown ("after all
      // tasks ended"). With one thread the pool runs the tasks in a plain loop, which stops at
      // the first (= lowest) failure, so this is only checked for the threaded path.
      if (threads > 1) {
        for (std::size_t t = 0; t < tasks; ++t) REQUIRE(ran[t].load() == 1);
      }
    }
    // A gradcomp exception type survives the trip, and the pool is still usable afterwards.
    CHECK_THROWS_AS(pool.run(3,
                             [](std::size_t t) {
                               if (t == 1) throw gc::numeric_error("boom");
                             }),
                    gc::numeric_error);
    std::atomic<int> after{0};
    pool.run(10, [&](std::size_t) { after.fetch_add(1); });
    CHECK(after.load() == 10);
  }
}

TEST_CASE("thread_pool: nested run() executes serially without deadlock", "[cpu][thread_pool]") {
  for (unsigned threads = 1; threads <= 4; ++threads) {
    thread_pool pool(threads);
    thread_pool other(2);
    std::vector<std::atomic<int>> hits(8 * 16);
    for (auto& h : hits) h.store(0);
    std::atomic<int> not_serial{0};
    pool.run(8, [&](std::size_t outer) {
      auto const me = std::this_thread::get_id();
      // Same pool, nested: must run on this thread, in order.
      std::size_t expected_next = 0;
      pool.run(8, [&](std::size_t inner) {
        if (std::this_thread::get_id() != me || inner != expected_next) not_serial.fetch_add(1);
        ++expected_next;
        hits[outer * 16 + inner].fetch_add(1);
      });
      // Another pool from inside a task of a threaded pool: also serial. (A one-thread pool
      // runs its tasks as a plain loop on the caller, outside any pool task, so there the
      // other pool may use its workers; only completion is checked then.)
      other.run(8, [&](std::size_t inner) {
        if (threads > 1 && std::this_thread::get_id() != me) not_serial.fetch_add(1);
        hits[outer * 16 + 8 + inner].fetch_add(1);
      });
    });
    INFO(threads << " threads");
    CHECK(not_serial.load() == 0);
    for (auto& h : hits) REQUIRE(h.load() == 1);
  }
}

TEST_CASE("thread_pool: construction, size and joining", "[cpu][thread_pool]") {
  CHECK_THROWS_AS(thread_pool(0), gc::config_error);
  // ThreadSanitizer's runtime starts a background thread of its own at the first thread
  // creation; start (and join) one thread first so the count below is the baseline.
  std::thread([] {}).join();
  auto const before = process_thread_count();
  for (int round = 0; round < 20; ++round) {
    unsigned const threads = 1 + static_cast<unsigned>(round % 5);
    std::atomic<int> ran{0};
    {
      thread_pool pool(threads);
      if (before) {
        auto const during = process_thread_count();
        REQUIRE(during);
        CHECK(*during == *before + (threads - 1));  // threads - 1 workers, the caller is one
      }
      if (round % 2 == 0) pool.run(17, [&](std::size_t) { ran.fetch_add(1); });
    }  // destructor: stops and joins the workers
    CHECK(ran.load() == (round % 2 == 0 ? 17 : 0));
    if (before) {
      // A joined thread can linger in /proc for a moment after join returns.
      auto now = process_thread_count();
      for (int i = 0; i < 200 && now && *now != *before; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        now = process_thread_count();
      }
      CHECK(now == before);
    }
  }
}

TEST_CASE("default_thread_count honours GRADCOMP_NUM_THREADS", "[cpu][thread_pool]") {
  scoped_env env("GRADCOMP_NUM_THREADS");
  unsigned const hw = std::max(1u, std::thread::hardware_concurrency());
  env.unset();
  CHECK(gc::cpu::default_thread_count() == hw);
  env.set("3");
  CHECK(gc::cpu::default_thread_count() == 3);
  env.set("1");
  CHECK(gc::cpu::default_thread_count() == 1);
  env.set("4096");
  CHECK(gc::cpu::default_thread_count() == 4096);
  for (char const* bad :
       {"0", "-2", "4097", "", "abc", "4x", " ", "3 ", "1e3", "99999999999999999999"}) {
    env.set(bad);
    INFO("GRADCOMP_NUM_THREADS='" << bad << "'");
    CHECK(gc::cpu::default_thread_count() == hw);
  }
}

TEST_CASE("codec_context picks its pool", "[cpu][thread_pool]") {
  gc::codec_context ctx;
  CHECK(ctx.seed == 0);
  CHECK(ctx.step == 0);
  CHECK(ctx.pool == nullptr);
  CHECK(ctx.isa == gc::cpu::isa::best);
  CHECK(&ctx.threads() == &gc::cpu::default_thread_pool());
  CHECK(&gc::cpu::default_thread_pool() == &gc::cpu::default_thread_pool());
  CHECK(gc::cpu::default_thread_pool().size() >= 1);
  thread_pool mine(2);
  ctx.pool = &mine;
  CHECK(&ctx.threads() == &mine);
}

TEST_CASE("chunk_length and chunk_count", "[cpu][parallel]") {
  using gc::cpu::chunk_count;
  using gc::cpu::chunk_elements;
  using gc::cpu::chunk_length;
  STATIC_REQUIRE(chunk_length(0) == chunk_elements);
  STATIC_REQUIRE(chunk_length(1) == chunk_elements);
  STATIC_REQUIRE(chunk_length(128) == chunk_elements);
  for (std::size_t align : {1u, 3u, 16u, 100u, 128u, 384u, 1000u, 65535u, 65537u, 1u << 20}) {
    std::size_t const len = chunk_length(align);
    INFO("align " << align);
    CHECK(len % align == 0);
    CHECK(len >= chunk_elements);
    CHECK(len < chunk_elements + align);  // the smallest such multiple
    for (std::size_t n : {0u, 1u, 65535u, 65536u, 65537u, 1u << 20, 3000001u}) {
      std::size_t const c = chunk_count(n, align);
      CHECK(c * len >= n);
      if (n > 0) CHECK((c - 1) * len < n);
      if (n == 0) CHECK(c == 0);
    }
  }
}

TEST_CASE("for_each_chunk: boundaries depend only on size and alignment", "[cpu][parallel]") {
  thread_pool one(1);
  thread_pool three(3);
  gc::codec_context serial;
  serial.pool = &three;
  serial.parallel_threshold = SIZE_MAX;  // never parallel
  gc::codec_context par1;
  par1.pool = &one;
  par1.parallel_threshold = 0;
  gc::codec_context par3;
  par3.pool = &three;
  par3.parallel_threshold = 0;

  std::size_t const sizes[] = {0,     1,      15,     65535,         65536,
                               65537, 131072, 200003, 3 * 65536 + 5, 1000000};
  std::size_t const aligns[] = {0, 1, 16, 128, 384, 1000, 4096, 70000};
  for (std::size_t n : sizes) {
    for (std::size_t align : aligns) {
      INFO("n = " << n << ", align = " << align);
      auto const a = record_chunks(n, align, serial);
      auto const b = record_chunks(n, align, par1);
      auto const c = record_chunks(n, align, par3);
      REQUIRE(a == b);
      REQUIRE(a == c);
      // The chunks tile [0, n) in order, each starting at a multiple of the alignment.
      std::size_t const len = gc::cpu::chunk_length(align);
      REQUIRE(a.size() == gc::cpu::chunk_count(n, align));
      std::size_t pos = 0;
      for (std::size_t k = 0; k < a.size(); ++k) {
        auto const [chunk, begin, end] = a[k];
        REQUIRE(chunk == k);
        REQUIRE(begin == pos);
        REQUIRE(begin % (align == 0 ? 1 : align) == 0);
        REQUIRE(end > begin);
        REQUIRE(end - begin <= len);
        if (k + 1 < a.size()) REQUIRE(end - begin == len);
        pos = end;
      }
      REQUIRE(pos == n);
    }
  }
}

TEST_CASE("for_each_chunk: runs on the pool only at or above the threshold", "[cpu][parallel]") {
  thread_pool three(3);
  gc::codec_context ctx;
  ctx.pool = &three;
  std::size_t const n = 4 * gc::cpu::chunk_elements;
  auto threads_used = [&](std::size_t threshold, bool hold) {
    ctx.parallel_threshold = threshold;
    std::mutex m;
    std::set<std::thread::id> ids;
    std::atomic<unsigned> arrived{0};
    gc::cpu::for_each_chunk(n, 1, ctx, [&](std::size_t, std::size_t, std::size_t) {
      {
        std::lock_guard lock(m);
        ids.insert(std::this_thread::get_id());
      }
      // When holding, each chunk waits until two have started (or a deadline passed), so that
      // a pool run spreads over more than one thread.
      arrived.fetch_add(1);
      auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (hold && arrived.load() < 2 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
      }
    });
    return ids;
  };
  auto const below = threads_used(n + 1, false);
  CHECK(below.size() == 1);
  CHECK(below.count(std::this_thread::get_id()) == 1);
  auto const at = threads_used(n, true);
  CHECK(at.size() > 1);
}
