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
// The one documented exception (docs/reliability.md, "Faults injected into collectives"): a corruption of the step-outcome
// round itself delivered to one rank makes that rank alone fail; the others commit.
// Corruption and duplication run with the `checksum` option on; the other faults with it off
// (the default).

#include <gradcomp/comm/fault.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/core/error.hpp>

#include "../support/rank_check.hpp"
#include "fault_steps.hpp"

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

/// The times of a cell's worlds: the timeout of every in-process world, a stall longer than it
/// and a delay well within it. Short, so that the ~700 cells run in seconds.
struct times {
  std::chrono::milliseconds timeout, stall, delay;
};
inline constexpr times fast = {200ms, 300ms, 20ms};
/// A loaded machine (ctest -j2 on 2 cores beside other jobs) can deschedule a rank for longer
/// than 200 ms, so a clean step times out or a waiting rank starts late enough to sit out a
/// stall. `run_cell` then runs the cell once more with every time 5 times longer; a cell counts
/// as a problem only if it fails both ways. What the matrix checks does not depend on the
/// times (outcomes, states and results are compared bit for bit), so a real defect fails both.
inline constexpr times slow = {1000ms, 1500ms, 100ms};

using fault_steps::append;
using fault_steps::gradient;
using fault_steps::to_bytes;

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
  /// Steps 0, 1 and 2 run on one world (an exchange stays outstanding between steps).
  bool same_world = false;
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

inline gc::fault make_fault(kind k, int rank, std::uint64_t index, times const& tm) {
  gc::fault f;
  f.rank = rank;
  f.index = index;
  switch (k) {
    case kind::drop: f.kind = gc::fault_kind::drop; break;
    case kind::stall:
      f.kind = gc::fault_kind::stall;
      f.duration = tm.stall;
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
      f.duration = tm.delay;
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

/// What a run of some steps on one world gave: per step, each rank's outcome (a rank stops at
/// its first failure: its later steps stay `ran == false`) and state after it.
struct world_run {
  std::vector<std::vector<rank_outcome>> steps;
  std::vector<std::vector<bytes>> states;
  std::vector<std::vector<bool>> ran;
};

/// `steps` of every rank, in order, on one fresh world with `plan` and the timeout of `tm`.
inline world_run run_world(std::vector<std::unique_ptr<model>>& models, gc::fault_plan plan,
                           std::vector<int> const& steps, times const& tm = fast) {
  int const w = static_cast<int>(models.size());
  gc::in_process_world world(w, tm.timeout);
  plan.on_drop = [&world](int r) { world.leave(r); };
  world_run run;
  run.steps.assign(steps.size(), std::vector<rank_outcome>(static_cast<std::size_t>(w)));
  run.states.assign(steps.size(), std::vector<bytes>(static_cast<std::size_t>(w)));
  run.ran.assign(steps.size(), std::vector<bool>(static_cast<std::size_t>(w), false));
  auto body = [&](int r) {
    auto const ri = static_cast<std::size_t>(r);
    auto c = std::make_unique<fcomm>(world.communicator(r), plan);
    std::uint64_t ops_before = 0;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      rank_outcome& o = run.steps[i][ri];
      run.ran[i][ri] = true;
      auto const t0 = std::chrono::steady_clock::now();
      try {
        o.output = models[ri]->step(*c, steps[i]);
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
      o.ops = c->operations() - ops_before;
      ops_before = c->operations();
      run.states[i][ri] = models[ri]->state();
      if (o.how != end::ok) break;
    }
    world.leave(r);
    c.reset();  // waits for the copies of duplicated messages
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < w; ++r) threads.emplace_back(body, r);
  body(0);
  for (auto& t : threads) t.join();
  return run;
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

inline std::vector<bytes> outputs(std::vector<rank_outcome> const& o) {
  std::vector<bytes> b;
  for (auto const& x : o) b.push_back(x.output);
  return b;
}

inline bool all_ok(std::vector<rank_outcome> const& o) {
  for (auto const& x : o) {
    if (x.how != end::ok) return false;
  }
  return true;
}

/// A clean run: the state before step 1, step 1's outputs, state and operations per rank (and
/// the operations before it), and for same-world subjects the same of step 2.
struct reference {
  std::vector<bytes> before, output, after, output2, after2;
  std::vector<std::uint64_t> ops, ops_before;
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

/// The steps of a cell's run: a warm-up step 0 on its own world, then step 1; a same-world
/// subject (overlapped gossip, whose exchange stays outstanding between steps) runs 0, 1 and 2
/// on one world.
inline std::vector<int> cell_steps(subject const& s) {
  return s.same_world ? std::vector<int>{0, 1, 2} : std::vector<int>{1};
}

inline reference make_reference(subject const& s, bool checksum, std::string& error) {
  reference ref;
  auto m = make_models(s, checksum);
  if (!s.same_world) {
    // No faults here, so the `slow` times cost nothing, and a loaded machine is far less
    // likely to fail the reference.
    auto const warm = run_world(m, {}, {0}, slow);
    ref.before = states(m);
    ref.ops_before.assign(static_cast<std::size_t>(s.ranks), 0);
    auto const got = run_world(m, {}, {1}, slow);
    if (!all_ok(warm.steps[0]) || !all_ok(got.steps[0])) {
      error = s.name + ": a clean step failed:" + describe(warm.steps[0]) + describe(got.steps[0]);
      return ref;
    }
    ref.output = outputs(got.steps[0]);
    for (auto const& o : got.steps[0]) ref.ops.push_back(o.ops);
    ref.after = states(m);
    return ref;
  }
  auto const got = run_world(m, {}, {0, 1, 2}, slow);
  for (auto const& st : got.steps) {
    if (!all_ok(st)) {
      error = s.name + ": a clean step failed:" + describe(st);
      return ref;
    }
  }
  ref.before = got.states[0];
  ref.output = outputs(got.steps[1]);
  ref.after = got.states[1];
  ref.output2 = outputs(got.steps[2]);
  ref.after2 = got.states[2];
  for (auto const& o : got.steps[0]) ref.ops_before.push_back(o.ops);
  for (auto const& o : got.steps[1]) ref.ops.push_back(o.ops);
  return ref;
}

struct tally {
  std::size_t cells = 0, failed = 0, succeeded = 0, harmless = 0, split = 0, deferred = 0;
  std::size_t slow_reruns = 0;  // cells that needed the `slow` times (see there)
  std::vector<std::string> problems;
};

/// Checks a failed step: every rank failed with comm_error or format_error, within the time
/// bound, with its state `before`; then a retry of `step` on a fresh world must give `output`
/// and `after`. Empty: all good.
inline std::string check_failed_step(subject const& s, std::vector<std::unique_ptr<model>>& m,
                                     std::vector<rank_outcome> const& got,
                                     std::vector<bytes> const& st, std::vector<bytes> const& before,
                                     int step, std::vector<bytes> const& output,
                                     std::vector<bytes> const& after, times const& tm) {
  for (std::size_t r = 0; r < got.size(); ++r) {
    if (got[r].how != end::comm && got[r].how != end::format) {
      return "rank " + std::to_string(r) + " ended in " + end_name(got[r].how) +
             ", expected comm_error or format_error" + describe(got);
    }
  }
  for (std::size_t r = 0; r < got.size(); ++r) {
    if (st[r] != before[r]) {
      return "the step failed but rank " + std::to_string(r) +
             "'s state is not what it was before the step" + describe(got);
    }
  }
  (void)s;
  auto const retry = run_world(m, {}, {step}, tm);
  if (!all_ok(retry.steps[0]) || outputs(retry.steps[0]) != output) {
    return "the retry on a fresh world did not reproduce the clean step's result" +
           describe(retry.steps[0]);
  }
  if (states(m) != after)
    return "the retry on a fresh world did not reproduce the clean step's state";
  return {};
}

/// Runs one cell with the times `tm` and records what is wrong with it in `t`.
inline void run_cell_with(subject const& s, reference const& ref, kind k, int faulty,
                          std::uint64_t index, times const& tm, tally& t) {
  std::string const name = s.name + " × " + kind_name(k) + " at operation " +
                           std::to_string(index) + " of rank " + std::to_string(faulty);
  ++t.cells;
  auto const fi = static_cast<std::size_t>(faulty);
  auto m = make_models(s, with_checksum(k));
  if (!s.same_world) {
    auto const warm = run_world(m, {}, {0}, tm);
    if (!all_ok(warm.steps[0])) {
      t.problems.push_back(name + ": the clean warm-up step failed" + describe(warm.steps[0]));
      return;
    }
  }
  gc::fault_plan plan;
  plan.faults.push_back(make_fault(k, faulty, ref.ops_before[fi] + index, tm));
  world_run const run = run_world(m, plan, cell_steps(s), tm);
  std::size_t const at = s.same_world ? 1 : 0;  // the faulty step's place in the run
  if (s.same_world && !all_ok(run.steps[0])) {
    t.problems.push_back(name + ": the clean step 0 failed" + describe(run.steps[0]));
    return;
  }
  auto const& got = run.steps[at];
  std::vector<bytes> const& st = run.states[at];
  bool effective = false, any_failed = false, all_failed = true;
  double const limit =
      std::chrono::duration<double>((k == kind::stall ? tm.stall : 0ms) + 2 * tm.timeout).count() +
      1.5;  // slack: a loaded machine
  for (auto const& step : run.steps) {
    for (std::size_t r = 0; r < step.size(); ++r) {
      if (step[r].seconds > limit) {
        t.problems.push_back(name + ": rank " + std::to_string(r) + " took " +
                             std::to_string(step[r].seconds) + " s" + describe(step));
        return;
      }
    }
  }
  for (std::size_t r = 0; r < got.size(); ++r) {
    effective = effective || got[r].effective;
    any_failed = any_failed || got[r].how != end::ok;
    all_failed = all_failed && got[r].how != end::ok;
  }
  bool const must_fail = k == kind::drop || k == kind::stall || k == kind::truncate;
  if (!any_failed) {
    if (outputs(got) != ref.output || st != ref.after) {
      t.problems.push_back(
          name +
          ": every rank succeeded, but with a result or state that differs from a clean step's "
          "(a wrong result accepted silently)");
      return;
    }
    if (s.same_world && effective) {
      // Overlapped gossip: the exchange launched at the end of step 1 belongs to step 2.
      auto const& got2 = run.steps[2];
      bool ok2 = true;
      for (std::size_t r = 0; r < got2.size(); ++r)
        ok2 = ok2 && run.ran[2][r] && got2[r].how == end::ok;
      if (ok2) {
        if (outputs(got2) != ref.output2 || run.states[2] != ref.after2) {
          t.problems.push_back(
              name + ": step 2 succeeded everywhere with a result that differs from a clean one's");
          return;
        }
        if (must_fail) {
          t.problems.push_back(name +
                               ": the fault took effect but neither step 1 nor step 2 failed");
          return;
        }
        ++t.harmless;
        ++t.succeeded;
        return;
      }
      std::string const why =
          check_failed_step(s, m, got2, run.states[2], ref.after, 2, ref.output2, ref.after2, tm);
      if (!why.empty()) {
        t.problems.push_back(name + " (its effect, in step 2): " + why);
        return;
      }
      ++t.deferred;
      ++t.failed;
      return;
    }
    if (effective && must_fail) {
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
    // The documented limit: the outcome round itself corrupted on one rank only (that rank's
    // error comes from the outcome round, whose messages end "no rank commits this step").
    bool const outcome_round = k == kind::corrupt_receive &&
                               got[fi].what.find("no rank commits this step") != std::string::npos;
    bool only_faulty = true;
    for (std::size_t r = 0; r < got.size(); ++r) {
      bool const failed = got[r].how != end::ok;
      if (failed != (r == fi)) only_faulty = false;
      if (!failed && (got[r].output != ref.output[r] || st[r] != ref.after[r])) only_faulty = false;
    }
    if (outcome_round && only_faulty && st[fi] == ref.before[fi]) {
      ++t.split;
      return;
    }
    t.problems.push_back(name + ": some ranks failed and others succeeded (a split outcome)" +
                         describe(got));
    return;
  }
  std::string const why =
      check_failed_step(s, m, got, st, ref.before, 1, ref.output, ref.after, tm);
  if (!why.empty()) {
    t.problems.push_back(name + ": " + why);
    return;
  }
  ++t.failed;
}

/// Runs one cell with the `fast` times and, if anything is wrong with it, once more with the
/// `slow` ones; records the second run's verdict in `t`.
inline void run_cell(subject const& s, reference const& ref, kind k, int faulty,
                     std::uint64_t index, tally& t) {
  tally one;
  run_cell_with(s, ref, k, faulty, index, fast, one);
  if (!one.problems.empty()) {
    one = tally{};
    run_cell_with(s, ref, k, faulty, index, slow, one);
    ++t.slow_reruns;
  }
  t.cells += one.cells;
  t.failed += one.failed;
  t.succeeded += one.succeeded;
  t.harmless += one.harmless;
  t.split += one.split;
  t.deferred += one.deferred;
  t.problems.insert(t.problems.end(), one.problems.begin(), one.problems.end());
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
