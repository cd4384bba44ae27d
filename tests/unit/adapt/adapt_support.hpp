// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers shared by the controller tests: a scripted driver that plays the pipeline's part of
// the protocol (plan -> measured norms -> stats -> decide -> timed send) and a compact,
// exact text form of decision traces.

#include <gradcomp/adapt/protocol.hpp>
#include <gradcomp/concepts/controller.hpp>

#include <charconv>
#include <cstdint>
#include <string>
#include <vector>

namespace adapt_test {

namespace gc = gradcomp;

/// The message of the `E` that `f()` throws; "(nothing thrown)" or "(other exception)" if
/// it throws nothing or something else.
template <class E, class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (E const& e) {
    return e.what();
  } catch (...) {
    return "(other exception)";
  }
  return "(nothing thrown)";
}

/// Shortest text that reads back as exactly `v` ("20", "1.5", "1280").
inline std::string num(double v) {
  char buf[64];
  auto const r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

/// One decision as text: "c20" (candidate at 20), "m10" (minimum at 10), "d" (dense).
inline std::string code(gc::decision const& d) {
  switch (d.send) {
    case gc::send_kind::candidate: return "c" + num(d.factor);
    case gc::send_kind::minimum: return "m" + num(d.factor);
    case gc::send_kind::dense: return "d";
  }
  return "?";
}

/// A trace as space-separated codes.
inline std::string codes(std::vector<gc::decision> const& ds) {
  std::string out;
  for (auto const& d : ds) out += (out.empty() ? "" : " ") + code(d);
  return out;
}

/// A plan's measured factors as text: "10,20".
inline std::string factors(gc::step_plan const& p) {
  std::string out;
  for (double f : p.measure) out += (out.empty() ? "" : ",") + num(f);
  return out;
}

/// Plays the pipeline for `steps` steps. Each step reports ‖g_ef‖² = 1 and
/// ‖C‖² = gain(step, factor) for each measured factor; the step's timing (reported with the
/// next step, as the protocol says) is timing(step, decision).
template <gc::controller C, class Gain, class Timing>
std::vector<gc::decision> drive(C& c, std::uint64_t steps, Gain gain, Timing timing,
                                std::uint32_t workers = 1, std::uint64_t batch = 1) {
  std::vector<gc::decision> out;
  gc::step_timing last{};
  for (std::uint64_t i = 0; i < steps; ++i) {
    gc::step_plan const p = c.plan();
    gc::step_stats s;
    s.step = p.step;
    s.ef_norm_sq = 1.0;
    for (double f : p.measure) s.compressed_norm_sq.push_back(gain(p.step, f));
    s.last_step = last;
    s.workers = workers;
    s.batch_size = batch;
    gc::decision d = c.decide(s);
    last = timing(p.step, d);
    out.push_back(d);
  }
  return out;
}

/// Timing that gives a sent factor f the compression throughput target(f) at N = b = 1:
/// t_iter = gain / target, all of it reported as sync time.
template <class Target>
auto throughput_timing(Target target) {
  return [target](std::uint64_t, gc::decision const& d) {
    return gc::step_timing{0.0, 0.0, d.gain / target(d.factor)};
  };
}

}  // namespace adapt_test
