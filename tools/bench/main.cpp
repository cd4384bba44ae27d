// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// gradcomp-bench: compressor microbenchmarks on the user's own gradients. For every codec and
// every gradient tensor: packet bytes, distortion, bias (unbiased codecs), error feedback's
// residual and delay (with --feedback residual), and compress / decompress / decompress_add
// speed next to the memory pass measured in the same run. docs/bench.md is the manual; the
// measurements are defined in tools/bench/measure.hpp, the inputs in tools/bench/inputs.hpp.
// With --controller it runs compression controllers over the steps instead
// (tools/bench/controller.hpp). --export-inputs and --import-rows are how
// python -m gradcomp.bench adds torch's own ops (and CUDA measurements) to the report.
//
// Exit status: 0 on success, 2 for a bad option or input (one line on stderr), 1 for a failure
// while measuring or writing.

#include "controller.hpp"
#include "inputs.hpp"
#include "measure.hpp"
#include "report.hpp"

#include <CLI/CLI.hpp>

#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace tool = gradcomp_tool;
namespace gc = gradcomp;
namespace fs = std::filesystem;

struct cli {
  std::vector<std::string> inputs;
  std::vector<std::string> synthetic;
  std::string size = "2^20";
  std::string dtype_name;
  std::size_t count = 0;
  std::vector<std::string> codecs;
  std::string feedback;  // none (codecs) or residual (controllers) when not given
  unsigned steps = 0;
  unsigned seeds = 8;
  std::string threads = "1,all";
  double min_time = 0.2;
  bool no_timing = false;
  bool flatten = false;
  bool quiet = false;
  std::string json, csv, plot;
  std::string export_inputs;
  std::vector<std::string> import_rows;
  bool imported_only = false;
  std::vector<std::string> controllers;
  bool measured_timing = false;
  double backprop_s = 0.0;
};

// "N" or "2^K": an element count of --size.
std::size_t parse_size(std::string const& s) {
  auto digits = [](std::string const& d) { return !d.empty() && d.find_first_not_of("0123456789") == std::string::npos && d.size() < 19; };
  if (s.rfind("2^", 0) == 0 && digits(s.substr(2))) {
    unsigned long long const k = std::stoull(s.substr(2));
    if (k <= 34) return std::size_t{1} << k;
  } else if (digits(s)) {
    unsigned long long const n = std::stoull(s);
    if (n > 0 && n <= (1ull << 34)) return static_cast<std::size_t>(n);
  }
  throw tool::input_error("--size '" + s + "' is not an element count (N or 2^K, at most 2^34)");
}

// "1,all,4": pool sizes of --threads.
std::vector<unsigned> parse_threads(std::string const& s) {
  std::vector<unsigned> out;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    std::size_t const comma = s.find(',', pos);
    std::string const item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    unsigned t = 0;
    if (item == "all") {
      t = gradcomp_bench::all_threads();
    } else if (!item.empty() && item.size() < 5 && item.find_first_not_of("0123456789") == std::string::npos) {
      t = static_cast<unsigned>(std::stoul(item));
    }
    if (t == 0) throw tool::input_error("--threads '" + s + "': expected positive counts or 'all', comma-separated");
    if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

// The values of one gradient file: .npy (by its magic) or raw with --dtype.
std::vector<float> read_gradient_file(fs::path const& path, cli const& c) {
  std::vector<std::byte> const head = tool::read_file(path);
  bool const is_npy = head.size() >= 6 && std::memcmp(head.data(), "\x93NUMPY", 6) == 0;
  if (is_npy || path.extension() == ".npy") {
    tool::npy_header const h = tool::parse_npy_header(head, path.string());
    if (!c.dtype_name.empty() && tool::parse_dtype(c.dtype_name) != h.type) {
      throw tool::input_error(path.string() + ": the file holds " + tool::dtype_name(h.type) + " values but --dtype says " +
                              tool::dtype_name(tool::parse_dtype(c.dtype_name)));
    }
    if (c.count != 0) throw tool::input_error("--count is for raw files; " + path.string() + " is a .npy file");
    return tool::read_npy(path);
  }
  if (c.dtype_name.empty()) {
    throw tool::input_error(path.string() + ": not a .npy file; give --dtype (f32, f16 or bf16) to read it as raw values");
  }
  return tool::read_raw(path, tool::parse_dtype(c.dtype_name), c.count);
}

// The tensors of a capture directory: one per name, its steps in step order (or, --flatten,
// one tensor "all" per step, the names concatenated in index order).
std::vector<tool::tensor_input> read_capture(fs::path const& dir, bool flatten) {
  std::vector<tool::capture_entry> entries = tool::read_capture_index(dir);
  std::stable_sort(entries.begin(), entries.end(), [](auto const& a, auto const& b) { return a.step < b.step; });
  std::vector<std::string> names;
  std::map<std::string, std::vector<std::pair<std::uint64_t, std::vector<float>>>> by_name;
  for (tool::capture_entry const& e : entries) {
    auto& steps = by_name[e.name];
    if (steps.empty()) names.push_back(e.name);
    if (!steps.empty() && steps.back().first == e.step) {
      throw tool::input_error((dir / tool::capture_index).string() + ": tensor '" + e.name + "' listed twice at step " +
                              std::to_string(e.step));
    }
    steps.emplace_back(e.step, tool::read_npy(e.file));
    if (steps.back().second.size() != steps.front().second.size()) {
      throw tool::input_error(e.file.string() + ": tensor '" + e.name + "' has " +
                              std::to_string(steps.back().second.size()) + " values at step " + std::to_string(e.step) +
                              " but " + std::to_string(steps.front().second.size()) + " at step " +
                              std::to_string(steps.front().first));
    }
  }
  std::vector<tool::tensor_input> out;
  if (!flatten) {
    for (std::string const& name : names) {
      tool::tensor_input t{name, {}};
      for (auto& [step, v] : by_name[name]) t.steps.push_back(std::move(v));
      out.push_back(std::move(t));
    }
    return out;
  }
  std::size_t const nsteps = by_name[names.front()].size();
  tool::tensor_input all{dir.filename().empty() ? "all" : dir.filename().string() + "/all", {}};
  for (std::size_t k = 0; k < nsteps; ++k) {
    std::vector<float> cat;
    for (std::string const& name : names) {
      auto& steps = by_name[name];
      if (steps.size() != nsteps) {
        throw tool::input_error(dir.string() + ": --flatten needs every tensor at every step; '" + name + "' has " +
                                std::to_string(steps.size()) + " steps, '" + names.front() + "' " + std::to_string(nsteps));
      }
      cat.insert(cat.end(), steps[k].second.begin(), steps[k].second.end());
    }
    all.steps.push_back(std::move(cat));
  }
  out.push_back(std::move(all));
  return out;
}

std::vector<tool::tensor_input> load_inputs(cli const& c, unsigned steps) {
  if (!c.dtype_name.empty()) (void)tool::parse_dtype(c.dtype_name);  // a bad --dtype fails first
  std::vector<tool::tensor_input> out;
  for (std::string const& in : c.inputs) {
    fs::path const p(in);
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      for (auto& t : read_capture(p, c.flatten)) out.push_back(std::move(t));
      continue;
    }
    std::vector<float> v = read_gradient_file(p, c);
    tool::tensor_input t{p.filename().string(), {}};
    for (unsigned k = 1; k < steps; ++k) t.steps.push_back(v);  // the same gradient at every step
    t.steps.push_back(std::move(v));
    out.push_back(std::move(t));
  }
  if (!c.synthetic.empty()) {
    std::size_t const n = parse_size(c.size);
    for (std::string const& spec : c.synthetic) {
      tool::synthetic const fam = tool::synthetic::parse(spec);
      tool::tensor_input t{spec, {}};
      for (unsigned k = 0; k < steps; ++k) t.steps.push_back(fam.draw(n, k));
      out.push_back(std::move(t));
    }
  }
  if (out.empty()) throw tool::input_error("no input: give gradient files, capture directories or --synthetic FAMILY");
  return out;
}

// --export-inputs DIR: the inputs as this program reads them, as a capture directory (every
// step of every tensor, float32), and the resolved settings in DIR/settings.tsv, one
// "key<TAB>value" per line (threads, min_time, timing, seeds, feedback, steps, then one codec
// line per spec). python -m gradcomp.bench measures torch's own ops on exactly these tensors.
void export_inputs(std::string const& dir_name, std::vector<tool::tensor_input> const& tensors,
                   tool::settings const& s, std::vector<std::string> const& specs) {
  fs::path const dir(dir_name);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec)) throw tool::input_error("--export-inputs " + dir_name + ": cannot create");
  std::vector<tool::capture_entry> entries;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    for (std::size_t k = 0; k < tensors[i].steps.size(); ++k) {
      fs::path const step_dir = dir / ("step_" + std::to_string(k));
      fs::create_directories(step_dir, ec);
      fs::path const file = step_dir / ("t" + std::to_string(i) + ".npy");
      tool::write_npy(file, tensors[i].steps[k]);
      entries.push_back({k, tensors[i].name, file});
    }
  }
  tool::write_capture_index(dir, entries);
  std::ofstream f(dir / "settings.tsv");
  f << "threads\t";
  for (std::size_t i = 0; i < s.threads.size(); ++i) f << (i ? "," : "") << s.threads[i];
  f << "\nmin_time\t" << tool::num(s.min_time) << "\ntiming\t" << (s.timing ? 1 : 0) << "\nseeds\t" << s.seeds
    << "\nfeedback\t" << (s.feedback ? 1 : 0) << "\nsteps\t" << (tensors.empty() ? 0 : tensors.front().steps.size())
    << '\n';
  for (std::string const& spec : specs) f << "codec\t" << spec << '\n';
  if (!f.flush()) throw std::runtime_error("--export-inputs " + dir_name + ": write failed");
}

// --controller: each controller over the steps of the inputs (tools/bench/controller.hpp).
int run_controllers(cli const& c) {
  if (c.codecs.size() > 1) {
    throw tool::input_error("--controller takes one --codec, the sparsifier whose budget it sets (got " +
                            std::to_string(c.codecs.size()) + ")");
  }
  if (!c.plot.empty()) throw tool::input_error("--plot draws codec reports; it does not take --controller");
  if (!c.import_rows.empty() || c.imported_only || !c.export_inputs.empty()) {
    throw tool::input_error("--controller does not take --import-rows, --imported-only or --export-inputs");
  }
  if (!(c.backprop_s >= 0.0) || !std::isfinite(c.backprop_s)) {
    throw tool::input_error("--backprop-s must be a finite number of seconds >= 0");
  }
  std::string const codec = c.codecs.empty() ? "topk:ratio=0.01" : c.codecs.front();
  tool::controller_settings cs;
  cs.feedback = c.feedback.empty() ? "residual" : c.feedback;
  cs.measured_timing = c.measured_timing;
  cs.backprop_s = c.backprop_s;
  try {
    (void)gc::make_codec(codec);
  } catch (gc::config_error const& e) {
    std::string msg = e.what();
    if (msg.rfind("gradcomp: ", 0) == 0) msg = msg.substr(10);
    throw tool::input_error("--codec '" + codec + "': " + msg);
  }
  for (std::string const& spec : c.controllers) {  // every spec checked before any input is read
    try {
      (void)gc::make_controller(spec);
    } catch (gc::config_error const& e) {
      std::string msg = e.what();
      if (msg.rfind("gradcomp: ", 0) == 0) msg = msg.substr(10);
      throw tool::input_error("--controller '" + spec + "': " + msg);
    }
  }
  std::vector<tool::tensor_input> const tensors = load_inputs(c, c.steps > 0 ? c.steps : 20);
  std::ofstream json_file, csv_file;
  auto open = [](std::string const& path, char const* opt) {
    std::ofstream f(path);
    if (!f) throw tool::input_error(std::string(opt) + " " + path + ": cannot write");
    return f;
  };
  if (!c.json.empty()) json_file = open(c.json, "--json");
  if (!c.csv.empty()) csv_file = open(c.csv, "--csv");
  std::vector<tool::controller_run> runs;
  for (std::string const& spec : c.controllers) runs.push_back(tool::run_controller(spec, codec, tensors, cs));
  if (!c.quiet) tool::write_controller_table(std::cout, runs);
  if (json_file.is_open()) {
    tool::write_controller_json(json_file, runs);
    if (!json_file.flush()) throw std::runtime_error("--json " + c.json + ": write failed");
  }
  if (csv_file.is_open()) {
    tool::write_controller_csv(csv_file, runs);
    if (!csv_file.flush()) throw std::runtime_error("--csv " + c.csv + ": write failed");
  }
  return 0;
}

int run(cli const& c) {
  if (!c.feedback.empty() && c.feedback != "none" && c.feedback != "residual") {
    throw tool::input_error("--feedback '" + c.feedback + "' is not a feedback (expected none or residual)");
  }
  if (!c.controllers.empty()) return run_controllers(c);
  tool::settings s;
  s.feedback = c.feedback == "residual";
  s.timing = !c.no_timing;
  s.min_time = c.min_time;
  s.seeds = c.seeds;
  s.threads = parse_threads(c.threads);
  unsigned const steps = c.steps > 0 ? c.steps : (s.feedback ? 8 : 1);

  // Codecs first (cheap), so that an unknown one fails before any file is read.
  std::vector<std::string> specs;
  for (std::string const& spec : c.codecs.empty() ? std::vector<std::string>{"all"} : c.codecs) {
    if (spec == "all") {
      for (auto const& a : tool::all_codec_specs()) specs.push_back(a);
    } else {
      specs.push_back(spec);
    }
  }
  if (c.imported_only) specs.clear();  // nothing measured here
  std::vector<gc::any_codec> codecs;
  for (std::string const& spec : specs) {
    try {
      codecs.push_back(gc::make_codec(spec));
    } catch (gc::config_error const& e) {
      std::string msg = e.what();
      if (msg.rfind("gradcomp: ", 0) == 0) msg = msg.substr(10);
      throw tool::input_error("--codec '" + spec + "': " + msg);
    }
  }
  // Rows measured elsewhere (python -m gradcomp.bench's torch rows, an earlier run): read
  // before anything is measured, so that a bad file fails at once.
  std::vector<tool::row> imported;
  for (std::string const& path : c.import_rows) {
    for (auto& r : tool::read_csv_rows(path)) imported.push_back(std::move(r));
  }
  if (c.imported_only && c.import_rows.empty()) {
    throw tool::input_error("--imported-only needs --import-rows FILE");
  }
  std::vector<tool::tensor_input> const tensors =
      c.imported_only ? std::vector<tool::tensor_input>{} : load_inputs(c, steps);
  if (!c.export_inputs.empty()) {
    export_inputs(c.export_inputs, tensors, s, specs);
    return 0;
  }

  // The output files are opened before measuring, so that a path that cannot be written fails
  // at once instead of after minutes of measurements.
  auto open = [](std::string const& path, char const* opt) {
    std::ofstream f(path);
    if (!f) throw tool::input_error(std::string(opt) + " " + path + ": cannot write");
    return f;
  };
  std::ofstream json_file, csv_file;
  if (!c.json.empty()) json_file = open(c.json, "--json");
  if (!c.csv.empty()) csv_file = open(c.csv, "--csv");
  if (!c.plot.empty()) {
    fs::path const dir = fs::absolute(fs::path(c.plot)).parent_path();
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) throw tool::input_error("--plot " + c.plot + ": no directory " + dir.string());
  }

  double const t0 = gradcomp_bench::now_seconds();
  std::vector<tool::row> rows;
  std::vector<bool> placed(imported.size(), false);
  for (tool::tensor_input const& t : tensors) {
    for (std::size_t i = 0; i < codecs.size(); ++i) rows.push_back(tool::measure(codecs[i], specs[i], t, s));
    for (std::size_t i = 0; i < imported.size(); ++i) {  // next to the rows of the same tensor
      if (!placed[i] && imported[i].tensor == t.name) {
        rows.push_back(imported[i]);
        placed[i] = true;
      }
    }
  }
  for (std::size_t i = 0; i < imported.size(); ++i) {
    if (!placed[i]) rows.push_back(imported[i]);
  }
  tool::run_info info;
  info.isa = gc::cpu::isa_name(gc::cpu::machine_isa());
  info.all_threads = gradcomp_bench::all_threads();
  info.seconds = gradcomp_bench::now_seconds() - t0;

  if (!c.quiet) tool::write_table(std::cout, rows, info);
  if (json_file.is_open()) {
    tool::write_json(json_file, rows, info);
    if (!json_file.flush()) throw std::runtime_error("--json " + c.json + ": write failed");
  }
  if (csv_file.is_open()) {
    tool::write_csv(csv_file, rows);
    if (!csv_file.flush()) throw std::runtime_error("--csv " + c.csv + ": write failed");
  }
  if (!c.plot.empty()) tool::write_plot(c.plot, rows);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gradcomp-bench: compressor microbenchmarks on your own gradients (docs/bench.md)", "gradcomp-bench"};
  cli c;
  app.add_option("inputs", c.inputs,
                 "gradient files (.npy float32/float16, or raw values with --dtype) and capture directories "
                 "(index.tsv + .npy files, as gradcomp.capture writes them)");
  app.add_option("--synthetic", c.synthetic, "synthetic gradient: gauss, laplace, lognormal or sparse:p=P (repeatable)");
  app.add_option("--size", c.size, "elements of each synthetic gradient: N or 2^K")->capture_default_str();
  app.add_option("--dtype", c.dtype_name, "element type of raw files (f32, f16, bf16); checked against .npy files");
  app.add_option("--count", c.count, "values to read from each raw file (default: the whole file)");
  app.add_option("--codec", c.codecs, "codec spec, e.g. topk:ratio=0.01 or qsgd:levels=15 (repeatable; default all)");
  app.add_option("--feedback", c.feedback,
                 "error feedback over the steps: none or residual (default none; residual with --controller)");
  app.add_option("--steps", c.steps,
                 "steps of each gradient (synthetic: fresh draws; a file: the same gradient again; default 1, 8 with "
                 "--feedback residual; a capture directory has its own)");
  app.add_option("--seeds", c.seeds, "random streams of the bias measurement of unbiased codecs")->capture_default_str();
  app.add_option("--threads", c.threads, "pool sizes of the speed measurement: counts or 'all'")->capture_default_str();
  app.add_option("--min-time", c.min_time, "seconds of calls per timed operation (at least)")->capture_default_str();
  app.add_flag("--no-timing", c.no_timing, "skip the speed measurement");
  app.add_flag("--flatten", c.flatten, "measure each step of a capture directory as one tensor (all names concatenated)");
  app.add_flag("-q,--quiet", c.quiet, "no table on stdout");
  app.add_option("--json", c.json, "write the report as JSON to this file");
  app.add_option("--csv", c.csv, "write the report as CSV to this file");
  app.add_option("--plot", c.plot, "draw the report with gnuplot into this PNG file");
  app.add_option("--import-rows", c.import_rows,
                 "add the rows of a CSV report (written by --csv, e.g. by python -m gradcomp.bench for torch's own "
                 "ops) to this report, next to the rows of the same tensor (repeatable)");
  app.add_option("--controller", c.controllers,
                 "run this controller spec (ef_window, gravac:..., accordion:..., schedule:..., static:factor=F) over "
                 "the steps with the --codec sparsifier (default topk:ratio=0.01) and report per step what it sends "
                 "(repeatable; default --steps 20)");
  app.add_flag("--measured-timing", c.measured_timing,
               "with --controller: report the pipeline's wall-clock times to the controller (default: zeros, "
               "reproducible)");
  app.add_option("--backprop-s", c.backprop_s, "with --controller: the backward time reported for every step (s)")
      ->capture_default_str();
  app.add_flag("--imported-only", c.imported_only, "measure nothing; report the --import-rows rows only");
  app.add_option("--export-inputs", c.export_inputs,
                 "write the inputs as read (a capture directory, float32) and the resolved settings into DIR, then "
                 "exit without measuring (what python -m gradcomp.bench measures torch's ops on)");
  try {
    app.parse(argc, argv);
  } catch (CLI::ParseError const& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "gradcomp-bench: " << e.what() << " (--help lists the options)\n";
    return 2;
  }
  try {
    return run(c);
  } catch (tool::input_error const& e) {
    std::cerr << "gradcomp-bench: " << e.what() << '\n';
    return 2;
  } catch (std::exception const& e) {
    std::cerr << "gradcomp-bench: error: " << e.what() << '\n';
    return 1;
  }
}
