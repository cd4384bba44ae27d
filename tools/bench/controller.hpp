// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `gradcomp-bench --controller SPEC`: a compression controller over a sequence of steps. The
/// tensors of the input are the layers of one model, their steps its training steps (a capture
/// directory's steps, `--steps` fresh synthetic draws, or a file's gradient repeated). Each step
/// goes through the library's own `gradient_pipeline` with that controller (the pipeline's
/// controller specs: `make_controller`, e.g. `ef_window`, `gravac:...`, `accordion:...`,
/// `schedule:0=4,10=100`, `static:factor=100`) and the `--codec` sparsifier, on one rank of an
/// in-process world, so the controller sees exactly the statistics a real run would give it
/// on one rank, and the residual carries over from step to step as in training.
///
/// What the controller sees beyond the gradients: batch size 1, one worker, no learning rate
/// and no loss (so ef_window's loss check and Accordion's learning-rate rule stay inert), and,
/// unless `measured_timing`, the times of the previous step as `backprop_s` and zeros for
/// compression and communication (the pipeline's `measured_timing = false`): the run is then
/// reproducible bit for bit (GraVAC chooses by its gains; its throughput record, which ends its
/// search, stays empty while every time is zero). With `measured_timing` it sees the
/// pipeline's wall-clock times of this process.
/// The divergence guard is off.
///
/// Per step the report gives what was sent (`minimum`, `candidate` or `dense`), the factor and
/// the codec it amounts to (the sparsifier at ratio 1 / factor), the payload bytes this rank
/// sent (tensors below the pipeline's `min_compress_elements` go dense), the float32 bytes of
/// the step, and the gain ‖C(g_ef)‖² / ‖g_ef‖² of what was sent; then the totals.

#include "inputs.hpp"
#include "measure.hpp"
#include "report.hpp"

#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/gradcomp.hpp>
#include <gradcomp/pipeline/pipeline.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <vector>

namespace gradcomp_tool {

/// How controllers are run.
struct controller_settings {
  std::string feedback = "residual";  ///< the pipeline's error feedback
  bool measured_timing = false;       ///< report wall-clock times to the controller
  double backprop_s = 0.0;            ///< the backward time reported for every step
};

/// One step of a controller run.
struct controller_step {
  std::uint64_t step = 0;
  std::string sent;    ///< minimum, candidate or dense
  double factor = 1;   ///< compression factor of what was sent (1: dense)
  std::string codec;   ///< the codec that factor amounts to, or "dense"
  std::size_t bytes = 0;        ///< payload bytes sent by this rank
  std::size_t dense_bytes = 0;  ///< 4 × the step's elements
  double gain = std::numeric_limits<double>::quiet_NaN();
  std::size_t compressed_tensors = 0, tensors = 0;
};

/// A controller over all steps.
struct controller_run {
  std::string controller;
  std::string codec;
  std::vector<controller_step> steps;
  [[nodiscard]] std::size_t bytes() const {
    std::size_t b = 0;
    for (auto const& s : steps) b += s.bytes;
    return b;
  }
  [[nodiscard]] std::size_t dense_bytes() const {
    std::size_t b = 0;
    for (auto const& s : steps) b += s.dense_bytes;
    return b;
  }
};

/// The name of the codec of `spec` at ratio 1 / `factor` ("topk:ratio=0.0125"); "dense" for 1.
inline std::string codec_at_factor(std::string const& spec, double factor) {
  if (!(factor > 1.0)) return "dense";
  std::string const name = spec.substr(0, spec.find(':'));
  return name + ":ratio=" + num(1.0 / factor);
}

/// Runs controller `ctrl_spec` with sparsifier `codec_spec` over the steps of `tensors` (the
/// layers of one model; every one must have the same number of steps). `input_error` for a
/// spec or combination the pipeline refuses (naming `--controller` or `--codec`) and for
/// tensors with different step counts.
inline controller_run run_controller(std::string const& ctrl_spec, std::string const& codec_spec,
                                     std::vector<tensor_input> const& tensors, controller_settings const& cs) {
  namespace gc = gradcomp;
  for (tensor_input const& t : tensors) {
    if (t.steps.size() != tensors.front().steps.size()) {
      throw input_error("--controller: every tensor needs the same number of steps; '" + t.name + "' has " +
                        std::to_string(t.steps.size()) + ", '" + tensors.front().name + "' " +
                        std::to_string(tensors.front().steps.size()));
    }
  }
  gc::pipeline_options opt;
  opt.codec = codec_spec;
  opt.feedback = cs.feedback;
  opt.controller = ctrl_spec;
  opt.seed = measure_seed;
  opt.measure_gain = true;  // the gain of every step (decisions do not depend on it)
  opt.measured_timing = cs.measured_timing;
  opt.guard = "off";
  std::optional<gc::gradient_pipeline> pipe;
  try {
    (void)gc::make_controller(ctrl_spec);  // a bad controller spec names --controller
  } catch (gc::config_error const& e) {
    std::string msg = e.what();
    if (msg.rfind("gradcomp: ", 0) == 0) msg = msg.substr(10);
    throw input_error("--controller '" + ctrl_spec + "': " + msg);
  }
  try {
    pipe.emplace(opt);
  } catch (gc::config_error const& e) {
    std::string msg = e.what();
    if (msg.rfind("gradcomp: ", 0) == 0) msg = msg.substr(10);
    throw input_error("--controller '" + ctrl_spec + "' with --codec '" + codec_spec + "': " + msg);
  }
  gc::in_process_world world(1);
  gc::in_process_communicator comm = world.communicator(0);
  controller_run run;
  run.controller = ctrl_spec;
  run.codec = codec_spec;
  std::size_t const nsteps = tensors.empty() ? 0 : tensors.front().steps.size();
  std::vector<std::vector<float>> grads(tensors.size());
  for (std::size_t k = 0; k < nsteps; ++k) {
    std::vector<gc::tensor_view<float>> views;
    std::size_t elements = 0;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      grads[i] = tensors[i].steps[k];  // the pipeline writes the step's result into it
      views.emplace_back(std::span<float>(grads[i]), static_cast<gc::tensor_id>(i));
      elements += grads[i].size();
    }
    gc::pipeline_step_info info;
    info.backprop_s = cs.backprop_s;
    info.batch_size = 1;
    gc::pipeline_stats const st = pipe->step(comm, views, info);
    controller_step r;
    r.step = st.step;
    r.sent = gc::send_kind_name(st.sent);
    r.factor = st.factor;
    r.codec = st.sent == gc::send_kind::dense ? "dense" : codec_at_factor(codec_spec, st.factor);
    r.bytes = st.bytes_sent;
    r.dense_bytes = 4 * elements;
    r.gain = st.gain;
    r.compressed_tensors = st.compressed_tensors;
    r.tensors = st.tensors;
    run.steps.push_back(std::move(r));
  }
  return run;
}

/// The per-step tables of controller runs and their totals.
inline void write_controller_table(std::ostream& os, std::vector<controller_run> const& runs) {
  using detail::pad;
  for (controller_run const& run : runs) {
    os << "controller " << run.controller << " with " << run.codec << '\n';
    std::size_t wc = 5;
    for (auto const& s : run.steps) wc = std::max(wc, s.codec.size());
    os << pad("step", 6) << "  " << pad("sent", 9, true) << pad("factor", 10) << "  " << pad("codec", wc, true)
       << pad("bytes", 12) << pad("x<f32", 9) << pad("gain", 11) << pad("compressed", 11) << '\n';
    for (auto const& s : run.steps) {
      os << pad(std::to_string(s.step), 6) << "  " << pad(s.sent, 9, true) << pad(num(s.factor), 10) << "  "
         << pad(s.codec, wc, true) << pad(std::to_string(s.bytes), 12)
         << pad(num(static_cast<double>(s.dense_bytes) / static_cast<double>(s.bytes)), 9) << pad(num(s.gain), 11)
         << pad(std::to_string(s.compressed_tensors) + "/" + std::to_string(s.tensors), 11) << '\n';
    }
    os << "total: " << run.bytes() << " bytes over " << run.steps.size() << " steps, "
       << num(static_cast<double>(run.dense_bytes()) / static_cast<double>(run.bytes())) << "x smaller than float32 ("
       << run.dense_bytes() << " bytes)\n\n";
  }
}

/// Column names of the controller CSV file.
inline constexpr char const* controller_csv_header =
    "controller,codec_spec,step,sent,factor,codec,bytes,dense_bytes,gain,compressed_tensors,tensors";

/// The controller CSV file: one line per controller and step.
inline void write_controller_csv(std::ostream& os, std::vector<controller_run> const& runs) {
  os << controller_csv_header << '\n';
  for (controller_run const& run : runs) {
    for (auto const& s : run.steps) {
      os << detail::csv_field(run.controller) << ',' << detail::csv_field(run.codec) << ',' << s.step << ',' << s.sent
         << ',' << num(s.factor) << ',' << detail::csv_field(s.codec) << ',' << s.bytes << ',' << s.dense_bytes << ','
         << num(s.gain) << ',' << s.compressed_tensors << ',' << s.tensors << '\n';
    }
  }
}

/// The controller JSON document: `{"tool", "version", "controllers": [{"controller", "codec",
/// "bytes", "dense_bytes", "steps": [...]}]}`.
inline void write_controller_json(std::ostream& os, std::vector<controller_run> const& runs) {
  using detail::json_num;
  using detail::json_string;
  os << "{\n  \"tool\": \"gradcomp-bench\",\n  \"version\": \"" << GRADCOMP_VERSION_MAJOR << '.'
     << GRADCOMP_VERSION_MINOR << '.' << GRADCOMP_VERSION_PATCH << "\",\n  \"controllers\": [";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    controller_run const& run = runs[i];
    os << (i ? ",\n" : "\n") << "    {\"controller\": " << json_string(run.controller)
       << ", \"codec\": " << json_string(run.codec) << ", \"bytes\": " << run.bytes()
       << ", \"dense_bytes\": " << run.dense_bytes() << ", \"steps\": [";
    for (std::size_t k = 0; k < run.steps.size(); ++k) {
      auto const& s = run.steps[k];
      os << (k ? ",\n      " : "\n      ") << "{\"step\": " << s.step << ", \"sent\": " << json_string(s.sent)
         << ", \"factor\": " << json_num(s.factor) << ", \"codec\": " << json_string(s.codec)
         << ", \"bytes\": " << s.bytes << ", \"dense_bytes\": " << s.dense_bytes << ", \"gain\": " << json_num(s.gain)
         << ", \"compressed_tensors\": " << s.compressed_tensors << ", \"tensors\": " << s.tensors << "}";
    }
    os << "]}";
  }
  os << "\n  ]\n}\n";
}

}  // namespace gradcomp_tool
