// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// The driver of the fault matrix (test_fault_matrix.cpp): faults × collectives on in-process
// ranks, every fault at every operation of the step of a faulty rank.
//
// A *subject* is one collective (or phase sequence) with its state: `model` runs one step of it
// on one rank and serializes the state the step touches. For each subject the driver computes a
// reference once — a warm-up step 0 (so residuals and factors are not trivial), the state A
// before step 1, step 1's outputs O and the state B after it, and the number of operations
// each rank posts in step 1 — and then for each fault kind and each operation index k of the
// faulty rank it runs a *cell*: fresh models, a clean step 0, step 1 on a world where the fault
// fires at operation k, and checks:
//   - no rank takes longer than the stall plus twice the timeout (never a hang);
//   - either every rank failed, each with comm_error or format_error (the dropped rank's own
//     `rank_dropped` is a comm_error), every rank's state is A byte for byte, and a retry of
//     step 1 on a fresh world gives O and B bit for bit;
//   - or every rank succeeded with O and B bit for bit (a fault with no effect, a delay, a
//     duplicate nobody matched, a flipped bit the protocol ignores) — never a split outcome,
//     never a different result;
//   - drop, stall and truncate that took effect must fail the step; delay must not.
// The one documented exception (docs/reliability-faults.md): a corruption of the step-outcome
// round itself delivered to one rank makes that rank alone fail; the others commit.
// Corruption and duplication run with the `checksum` option on; the other faults with it off
// (the default).

#include <gradcomp/comm/fault.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/core/error.hpp>

#include "../support/rank_check.hpp"

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace fault_matrix {

namespace gc = gradcomp;
using namespace std::chrono_literals;
using fcomm = gc::fault_injecting_communicator<gc::in_process_communicator>;
using bytes = std::vector<std::byte>;

inline constexpr std::chrono::milliseconds timeout = 200ms;  // of every in-process world here
inline constexpr std::chrono::milliseconds stall = 300ms;    // longer than the timeout
inline constexpr std::chrono::milliseconds delay = 20ms;     // well within it

template <class T>
void append(bytes& b, std::span<T const> v) {
  auto const s = std::as_bytes(v);
  b.insert(b.end(), s.begin(), s.end());
}
template <class T>
bytes to_bytes(std::vector<T> const& v) {
  bytes b;
  append(b, std::span<T const>(v));
  return b;
}

/// Deterministic heavy-tailed gradient of (rank, step, tensor).
inline std::vector<float> gradient(int rank, int step, std::size_t n, std::uint32_t tensor = 0) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    double const x =
        std::sin(0.017 * static_cast<double>(i) + 0.9 * tensor + 0.31 * rank + 0.23 * step);
    double const spike = (i * 2654435761u + tensor * 97u + static_cast<std::size_t>(rank) * 13u +
                          static_cast<std::size_t>(step) * 7u) %
                                     37u ==
                                 0
                             ? 6.0
                             : 1.0;
    g[i] = static_cast<float>(spike * x * x * x + 0.01 * std::cos(0.3 * static_cast<double>(i)));
  }
  return g;
}

/// One rank's side of a subject.
class model {
 public:
  virtual ~model() = default;
  /// The state a step touches, serialized.
  [[nodiscard]] virtual bytes state() const = 0;
  /// One step on `c`; returns this rank's output bytes.
  virtual bytes step(fcomm& c, int step) = 0;
};

struct subject {
  std::string name;
  int ranks = 3;
  std::vector<int> faulty = {1};
  std::function<std::unique_ptr<model>(int rank, bool checksum)> make;
};

/// The fault kinds of the matrix (corruption on both sides).
enum class kind { drop, stall, truncate, corrupt_send, corrupt_receive, duplicate, delay };
inline constexpr kind all_kinds[] = {kind::drop,         kind::stall,           kind::truncate,
                                     kind::corrupt_send, kind::corrupt_receive, kind::duplicate,
                                     kind::delay};
inline char const* kind_name(kind k) {
  switch (k) {
    case kind::drop: return "drop";
    case kind::stall: return "stall";
    case kind::truncate: return "truncate";
    case kind::corrupt_send: return "corrupt(send)";
    case kind::corrupt_receive: return "corrupt(receive)";
    case kind::duplicate: return "duplicate";
    case kind::delay: return "delay";
  }
  return "?";
}
inline bool is_corrupt(kind k) { return k == kind::corrupt_send || k == kind::corrupt_receive; }
/// The faults the integrity checks are for run with the `checksum` option on, the others off.
inline bool with_checksum(kind k) { return is_corrupt(k) || k == kind::duplicate; }

inline gc::fault make_fault(kind k, int rank, std::uint64_t index) {
  gc::fault f;
  f.rank = rank;
  f.index = index;
  switch (k) {
    case kind::drop: f.kind = gc::fault_kind::drop; break;
    case kind::stall:
      f.kind = gc::fault_kind::stall;
      f.duration = stall;
      break;
    case kind::truncate: f.kind = gc::fault_kind::truncate; break;
    case kind::corrupt_send:
    case kind::corrupt_receive:
      f.kind = gc::fault_kind::corrupt;
      f.side = k == kind::corrupt_send ? gc::fault_side::send : gc::fault_side::receive;
      // Four consecutive bytes, bit 6 of each: in any float32 or 16-bit word that is a bit of
      // the exponent or the top of the mantissa, a change far above rounding.
      f.flips = 4;
      f.mask = 0x40;
      f.byte = 977 * index + 13;  // wraps around the message's bytes
      f.seed = 1234 + index;
      break;
    case kind::duplicate: f.kind = gc::fault_kind::duplicate; break;
    case kind::delay:
      f.kind = gc::fault_kind::delay;
      f.duration = delay;
      break;
  }
  return f;
}

enum class end { ok, comm, format, config, numeric, other };
inline char const* end_name(end e) {
  switch (e) {
    case end::ok: return "ok";
    case end::comm: return "comm_error";
    case end::format: return "format_error";
    case end::config: return "config_error";
    case end::numeric: return "numeric_error";
    case end::other: return "other exception";
  }
  return "?";
}

struct rank_outcome {
  end how = end::ok;
  std::string what;
  bytes output;
  double seconds = 0.0;
  bool dropped = false;
  bool effective = false;
  std::uint64_t ops = 0;
};

/// One step of every rank on a fresh world of `timeout`, with `plan`.
inline std::vector<rank_outcome> run_world(std::vector<std::unique_ptr<model>>& models,
                                           gc::fault_plan plan, int step) {
  int const w = static_cast<int>(models.size());
  gc::in_process_world world(w, timeout);
  plan.on_drop = [&world](int r) { world.leave(r); };
  std::vector<rank_outcome> out(static_cast<std::size_t>(w));
  auto body = [&](int r) {
    rank_outcome& o = out[static_cast<std::size_t>(r)];
    auto c = std::make_unique<fcomm>(world.communicator(r), plan);
    auto const t0 = std::chrono::steady_clock::now();
    try {
      o.output = models[static_cast<std::size_t>(r)]->step(*c, step);
    } catch (gc::format_error const& e) {
      o.how = end::format;
      o.what = e.what();
    } catch (gc::comm_error const& e) {
      o.how = end::comm;
      o.what = e.what();
    } catch (gc::config_error const& e) {
      o.how = end::config;
      o.what = e.what();
    } catch (gc::numeric_error const& e) {
      o.how = end::numeric;
      o.what = e.what();
    } catch (std::exception const& e) {
      o.how = end::other;
      o.what = e.what();
    }
    o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    o.dropped = c->dropped();
    o.effective = c->faulted();
    o.ops = c->operations();
    world.leave(r);
    c.reset();  // waits for the copies of duplicated messages
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < w; ++r) threads.emplace_back(body, r);
  body(0);
  for (auto& t : threads) t.join();
  return out;
}

inline std::vector<std::unique_ptr<model>> make_models(subject const& s, bool checksum) {
  std::vector<std::unique_ptr<model>> m;
  for (int r = 0; r < s.ranks; ++r) m.push_back(s.make(r, checksum));
  return m;
}

inline std::vector<bytes> states(std::vector<std::unique_ptr<model>> const& m) {
  std::vector<bytes> s;
  for (auto const& x : m) s.push_back(x->state());
  return s;
}

struct reference {
  std::vector<bytes> before, output, after;
  std::vector<std::uint64_t> ops;
};

inline std::string describe(std::vector<rank_outcome> const& got) {
  std::string d;
  for (std::size_t r = 0; r < got.size(); ++r) {
    d += "\n    rank " + std::to_string(r) + ": " + end_name(got[r].how) +
         (got[r].dropped ? " (dropped)" : "") + " after " +
         std::to_string(static_cast<int>(got[r].seconds * 1000)) + " ms" +
         (got[r].what.empty() ? "" : ": " + got[r].what);
  }
  return d;
}

/// Step 0 then step 1 on clean worlds; empty `error` unless a clean run failed.
inline reference make_reference(subject const& s, bool checksum, std::string& error) {
  reference ref;
  auto m = make_models(s, checksum);
  auto const warm = run_world(m, {}, 0);
  ref.before = states(m);
  auto const got = run_world(m, {}, 1);
  for (std::size_t r = 0; r < got.size(); ++r) {
    if (warm[r].how != end::ok || got[r].how != end::ok) {
      error = s.name + ": a clean step failed:" + describe(warm) + describe(got);
      return ref;
    }
    ref.output.push_back(got[r].output);
    ref.ops.push_back(got[r].ops);
  }
  ref.after = states(m);
  return ref;
}

struct tally {
  std::size_t cells = 0, failed = 0, succeeded = 0, harmless = 0, split = 0;
  std::vector<std::string> problems;
};

/// Runs one cell and records what is wrong with it in `t`.
inline void run_cell(subject const& s, reference const& ref, kind k, int faulty,
                     std::uint64_t index, tally& t) {
  std::string const name = s.name + " × " + kind_name(k) + " at operation " +
                           std::to_string(index) + " of rank " + std::to_string(faulty);
  ++t.cells;
  bool const checksum = with_checksum(k);
  auto m = make_models(s, checksum);
  auto const warm = run_world(m, {}, 0);
  for (auto const& o : warm) {
    if (o.how != end::ok) {
      t.problems.push_back(name + ": the clean warm-up step failed" + describe(warm));
      return;
    }
  }
  gc::fault_plan plan;
  plan.faults.push_back(make_fault(k, faulty, index));
  auto const got = run_world(m, plan, 1);
  auto const st = states(m);
  bool effective = false, any_failed = false, all_failed = true;
  double const limit =
      std::chrono::duration<double>((k == kind::stall ? stall : 0ms) + 2 * timeout).count() +
      1.5;  // slack: a loaded machine
  for (std::size_t r = 0; r < got.size(); ++r) {
    effective = effective || got[r].effective;
    any_failed = any_failed || got[r].how != end::ok;
    all_failed = all_failed && got[r].how != end::ok;
    if (got[r].seconds > limit) {
      t.problems.push_back(name + ": rank " + std::to_string(r) + " took " +
                           std::to_string(got[r].seconds) + " s" + describe(got));
      return;
    }
  }
  auto same_as = [&](std::vector<bytes> const& a, std::vector<bytes> const& b) { return a == b; };
  if (!any_failed) {
    std::vector<bytes> outs;
    for (auto const& o : got) outs.push_back(o.output);
    if (!same_as(outs, ref.output) || !same_as(st, ref.after)) {
      t.problems.push_back(
          name +
          ": every rank succeeded, but with a result or state that differs from a clean step's "
          "(a wrong result accepted silently)");
      return;
    }
    if (effective && (k == kind::drop || k == kind::stall || k == kind::truncate)) {
      t.problems.push_back(name + ": the fault took effect but the step succeeded");
      return;
    }
    if (effective && k != kind::delay) ++t.harmless;
    ++t.succeeded;
    return;
  }
  if (k == kind::delay) {
    t.problems.push_back(name + ": a delay within the timeout made the step fail" + describe(got));
    return;
  }
  if (!all_failed) {
    // The documented limit: the outcome round (the last operation) corrupted on one rank only.
    bool const outcome_round =
        k == kind::corrupt_receive && index + 1 == ref.ops[static_cast<std::size_t>(faulty)];
    bool only_faulty = true;
    for (std::size_t r = 0; r < got.size(); ++r) {
      bool const failed = got[r].how != end::ok;
      if (failed != (static_cast<int>(r) == faulty)) only_faulty = false;
      if (!failed && (got[r].output != ref.output[r] || st[r] != ref.after[r])) only_faulty = false;
    }
    if (outcome_round && only_faulty &&
        st[static_cast<std::size_t>(faulty)] == ref.before[static_cast<std::size_t>(faulty)]) {
      ++t.split;
      return;
    }
    t.problems.push_back(name + ": some ranks failed and others succeeded (a split outcome)" +
                         describe(got));
    return;
  }
  for (std::size_t r = 0; r < got.size(); ++r) {
    if (got[r].how != end::comm && got[r].how != end::format) {
      t.problems.push_back(name + ": rank " + std::to_string(r) + " ended in " +
                           end_name(got[r].how) + ", expected comm_error or format_error" +
                           describe(got));
      return;
    }
  }
  for (std::size_t r = 0; r < got.size(); ++r) {
    if (st[r] != ref.before[r]) {
      t.problems.push_back(name + ": the step failed but rank " + std::to_string(r) +
                           "'s state is not what it was before the step" + describe(got));
      return;
    }
  }
  auto const retry = run_world(m, {}, 1);
  for (std::size_t r = 0; r < retry.size(); ++r) {
    if (retry[r].how != end::ok || retry[r].output != ref.output[r]) {
      t.problems.push_back(
          name + ": the retry on a fresh world did not reproduce the clean step's result" +
          describe(retry));
      return;
    }
  }
  if (states(m) != ref.after) {
    t.problems.push_back(name +
                         ": the retry on a fresh world did not reproduce the clean step's state");
    return;
  }
  ++t.failed;
}

/// Every fault kind at every operation of every faulty rank of `s`.
inline tally run_matrix(subject const& s) {
  tally t;
  std::map<bool, reference> refs;
  for (bool checksum : {false, true}) {
    std::string error;
    refs[checksum] = make_reference(s, checksum, error);
    if (!error.empty()) {
      t.problems.push_back(error);
      return t;
    }
  }
  for (int f : s.faulty) {
    for (kind k : all_kinds) {
      reference const& ref = refs[with_checksum(k)];
      for (std::uint64_t i = 0; i < ref.ops[static_cast<std::size_t>(f)]; ++i)
        run_cell(s, ref, k, f, i, t);
    }
  }
  return t;
}

}  // namespace fault_matrix
