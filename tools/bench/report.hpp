// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The outputs of `gradcomp-bench`: a table for the terminal, a JSON document, a CSV file (one
/// line per codec, tensor and thread count) and a gnuplot picture. Numbers are written with 6
/// significant digits (`%.6g`) everywhere; an absent measurement is empty in the table and CSV
/// and `null` in JSON.

#include "inputs.hpp"
#include "measure.hpp"

#include <gradcomp/version.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace gradcomp_tool {

/// What the report says about the run itself.
struct run_info {
  std::string isa;
  unsigned all_threads = 1;
  double seconds = 0;  ///< wall time of the measurements
};

/// `%.6g` of `v`, or `absent` when v is NaN.
inline std::string num(double v, char const* absent = "") {
  if (std::isnan(v)) return absent;
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

namespace detail {

inline std::string json_string(std::string const& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

inline std::string json_num(double v) {
  if (std::isnan(v) || std::isinf(v)) return "null";
  return num(v);
}

inline std::string csv_field(std::string const& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

// `s` padded to width `w`: on the right when `left`, else on the left after a separating space.
inline std::string pad(std::string s, std::size_t w, bool left = false) {
  if (s.size() < w) s = left ? s + std::string(w - s.size(), ' ') : std::string(w - s.size(), ' ') + s;
  return left ? s : " " + s;
}

}  // namespace detail

/// The table on stdout: one line per codec and tensor with the size and distortion figures,
/// then the speeds per thread count (GB/s and, in parentheses, the ratio to the memory pass).
inline void write_table(std::ostream& os, std::vector<row> const& rows, run_info const& info) {
  bool any_bias = false, any_ef = false, any_speed = false;
  std::size_t wt = 6, wc = 5;
  for (row const& r : rows) {
    any_bias |= r.seeds > 0;
    any_ef |= r.ef_steps > 0;
    any_speed |= !r.speeds.empty();
    wt = std::max(wt, r.tensor.size());
    wc = std::max(wc, r.codec.size());
  }
  using detail::pad;
  os << pad("tensor", wt, true) << "  " << pad("codec", wc, true) << "  " << pad("n", 10) << pad("bytes", 12)
     << pad("x<f32", 9) << pad("rel_L2", 12) << pad("cosine", 10);
  if (any_bias) os << pad("bias", 12) << pad("bound", 12);
  if (any_ef) os << pad("ef_resid", 11) << pad("ef_delay", 10);
  os << '\n';
  for (row const& r : rows) {
    os << pad(r.tensor, wt, true) << "  " << pad(r.codec, wc, true) << "  " << pad(std::to_string(r.n), 10)
       << pad(std::to_string(r.bytes), 12) << pad(num(r.smaller), 9) << pad(num(r.rel_l2), 12)
       << pad(num(r.cosine), 10);
    if (any_bias) os << pad(num(r.bias), 12) << pad(num(r.bias_bound), 12);
    if (any_ef) os << pad(num(r.ef_residual), 11) << pad(num(r.ef_delay), 10);
    os << '\n';
  }
  if (any_speed) {
    os << "\nthroughput in GB/s of float32 input (ratio to the memory pass of the same run: read for "
          "compress, write for decompress, update for decompress_add)\n";
    bool any_torch = false;
    for (row const& r : rows) any_torch |= r.codec.rfind("torch.", 0) == 0;
    if (any_torch) {
      os << "torch.* rows (python -m gradcomp.bench): torch's own ops against torch's own passes of the same run "
            "(x.sum(), out.fill_(c), acc.add_(c))\n";
    }
    os << pad("tensor", wt, true) << "  " << pad("codec", wc, true) << "  " << pad("thr", 4) << pad("compress", 21)
       << pad("decompress", 21) << pad("decompress_add", 21) << '\n';
    for (row const& r : rows) {
      for (speed const& s : r.speeds) {
        auto cell = [&](double t, double base) {
          return pad(num(gbps(r.n, t)) + " (" + num(t > 0 ? base / t : 0.0) + ")", 21);
        };
        os << pad(r.tensor, wt, true) << "  " << pad(r.codec, wc, true) << "  " << pad(std::to_string(s.threads), 4)
           << cell(s.compress_s, s.read_s) << cell(s.decompress_s, s.write_s)
           << cell(s.decompress_add_s, s.update_s) << '\n';
      }
    }
  }
  os << "\nisa " << info.isa << ", all threads = " << info.all_threads << ", measured in " << num(info.seconds)
     << " s\n";
}

/// Column names of the CSV file, in order.
inline constexpr char const* csv_header =
    "tensor,codec,n,bytes,smaller,rel_l2,cosine,unbiased,seeds,bias,bias_bound,ef_steps,ef_residual,"
    "ef_delay,threads,compress_gbps,decompress_gbps,decompress_add_gbps,read_gbps,write_gbps,update_gbps,"
    "compress_ratio,decompress_ratio,decompress_add_ratio";

/// The CSV file: a header line, then one line per row and thread count (one line with empty
/// speed fields for a row without speeds).
inline void write_csv(std::ostream& os, std::vector<row> const& rows) {
  os << csv_header << '\n';
  for (row const& r : rows) {
    std::string const head = detail::csv_field(r.tensor) + "," + detail::csv_field(r.codec) + "," +
                             std::to_string(r.n) + "," + std::to_string(r.bytes) + "," + num(r.smaller) + "," +
                             num(r.rel_l2) + "," + num(r.cosine) + "," + (r.unbiased ? "1" : "0") + "," +
                             std::to_string(r.seeds) + "," + num(r.bias) + "," + num(r.bias_bound) + "," +
                             std::to_string(r.ef_steps) + "," + num(r.ef_residual) + "," + num(r.ef_delay);
    if (r.speeds.empty()) {
      os << head << ",,,,,,,,,,\n";
      continue;
    }
    for (speed const& s : r.speeds) {
      auto ratio = [](double t, double base) { return num(t > 0 ? base / t : 0.0); };
      os << head << "," << s.threads << "," << num(gbps(r.n, s.compress_s)) << "," << num(gbps(r.n, s.decompress_s))
         << "," << num(gbps(r.n, s.decompress_add_s)) << "," << num(gbps(r.n, s.read_s)) << ","
         << num(gbps(r.n, s.write_s)) << "," << num(gbps(r.n, s.update_s)) << "," << ratio(s.compress_s, s.read_s)
         << "," << ratio(s.decompress_s, s.write_s) << "," << ratio(s.decompress_add_s, s.update_s) << '\n';
    }
  }
}

/// Splits one line of a CSV file written by `write_csv` into its fields (a field in double
/// quotes may hold commas and doubled quotes). `input_error` naming `where` for an unterminated
/// quote.
inline std::vector<std::string> csv_split(std::string const& line, std::string const& where) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    char const c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        out.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        out.back() += c;
      }
    } else if (c == '"' && out.back().empty()) {
      quoted = true;
    } else if (c == ',') {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  if (quoted) throw input_error(where + ": unterminated quoted field");
  return out;
}

/// Reads the rows of a CSV report written by `write_csv` (`--import-rows`: rows measured
/// elsewhere, e.g. torch's own ops by `python -m gradcomp.bench`, or an earlier run). Lines of
/// the same tensor and codec that follow each other are one row with one speed per line; the
/// seconds are recovered from the printed GB/s and ratios (6 digits). `input_error` naming the
/// file and line for anything that is not such a report.
inline std::vector<row> read_csv_rows(std::filesystem::path const& path) {
  std::ifstream f(path);
  std::string const name = path.string();
  if (!f) throw input_error("--import-rows " + name + ": cannot open");
  std::string line;
  if (!std::getline(f, line) || line != csv_header) {
    throw input_error("--import-rows " + name + ": first line is not gradcomp-bench's CSV header");
  }
  std::vector<row> out;
  std::size_t lineno = 1;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.empty()) continue;
    std::string const where = "--import-rows " + name + ":" + std::to_string(lineno);
    std::vector<std::string> const v = csv_split(line, where);
    if (v.size() != 24) {
      throw input_error(where + ": " + std::to_string(v.size()) + " fields; the header has 24");
    }
    auto number = [&](std::size_t i, bool required) {
      std::string const& s = v[i];
      if (s.empty()) {
        if (required) throw input_error(where + ": field " + std::to_string(i + 1) + " is empty");
        return std::numeric_limits<double>::quiet_NaN();
      }
      char* end = nullptr;
      double const d = std::strtod(s.c_str(), &end);
      if (end != s.c_str() + s.size()) {
        throw input_error(where + ": field " + std::to_string(i + 1) + " '" + s + "' is not a number");
      }
      return d;
    };
    auto count = [&](std::size_t i) {
      double const d = number(i, true);
      if (!(d >= 0) || d != std::floor(d) || d > 1e18) {
        throw input_error(where + ": field " + std::to_string(i + 1) + " '" + v[i] + "' is not a count");
      }
      return static_cast<std::size_t>(d);
    };
    row r;
    r.tensor = v[0];
    r.codec = v[1];
    r.n = count(2);
    r.bytes = count(3);
    if (r.n == 0 || r.bytes == 0) throw input_error(where + ": n and bytes must be positive");
    r.smaller = number(4, true);
    r.rel_l2 = number(5, true);
    r.cosine = number(6, true);
    r.unbiased = v[7] == "1";
    r.seeds = static_cast<unsigned>(count(8));
    r.bias = number(9, false);
    r.bias_bound = number(10, false);
    r.ef_steps = static_cast<unsigned>(count(11));
    r.ef_residual = number(12, false);
    r.ef_delay = number(13, false);
    bool const same = !out.empty() && out.back().tensor == r.tensor && out.back().codec == r.codec &&
                      out.back().n == r.n && !v[14].empty() && !out.back().speeds.empty();
    if (!v[14].empty()) {
      speed s;
      s.threads = static_cast<unsigned>(count(14));
      double const bytes_in = 4.0 * static_cast<double>(r.n);
      auto seconds = [&](std::size_t i) {
        double const g = number(i, true);
        return g > 0 ? bytes_in / (g * 1e9) : 0.0;
      };
      s.compress_s = seconds(15);
      s.decompress_s = seconds(16);
      s.decompress_add_s = seconds(17);
      s.read_s = s.compress_s * number(21, true);
      s.write_s = s.decompress_s * number(22, true);
      s.update_s = s.decompress_add_s * number(23, true);
      if (same) {
        out.back().speeds.push_back(s);
        continue;
      }
      r.speeds.push_back(s);
    }
    out.push_back(std::move(r));
  }
  return out;
}

/// The JSON document: `{"tool", "version", "isa", "all_threads", "seconds", "rows": [...]}`,
/// each row with the fields of `row` and its `speeds` (seconds and GB/s per operation).
inline void write_json(std::ostream& os, std::vector<row> const& rows, run_info const& info) {
  using detail::json_num;
  using detail::json_string;
  os << "{\n  \"tool\": \"gradcomp-bench\",\n  \"version\": \"" << GRADCOMP_VERSION_MAJOR << '.'
     << GRADCOMP_VERSION_MINOR << '.' << GRADCOMP_VERSION_PATCH << "\",\n  \"isa\": " << json_string(info.isa)
     << ",\n  \"all_threads\": " << info.all_threads << ",\n  \"seconds\": " << json_num(info.seconds)
     << ",\n  \"rows\": [";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    row const& r = rows[i];
    os << (i ? ",\n" : "\n") << "    {\"tensor\": " << json_string(r.tensor) << ", \"codec\": " << json_string(r.codec)
       << ", \"n\": " << r.n << ", \"bytes\": " << r.bytes << ", \"smaller\": " << json_num(r.smaller)
       << ", \"rel_l2\": " << json_num(r.rel_l2) << ", \"cosine\": " << json_num(r.cosine)
       << ", \"unbiased\": " << (r.unbiased ? "true" : "false") << ", \"seeds\": " << r.seeds
       << ", \"bias\": " << json_num(r.bias) << ", \"bias_bound\": " << json_num(r.bias_bound)
       << ", \"ef_steps\": " << r.ef_steps << ", \"ef_residual\": " << json_num(r.ef_residual)
       << ", \"ef_delay\": " << json_num(r.ef_delay) << ", \"speeds\": [";
    for (std::size_t k = 0; k < r.speeds.size(); ++k) {
      speed const& s = r.speeds[k];
      os << (k ? ", " : "") << "{\"threads\": " << s.threads << ", \"compress_s\": " << json_num(s.compress_s)
         << ", \"decompress_s\": " << json_num(s.decompress_s)
         << ", \"decompress_add_s\": " << json_num(s.decompress_add_s) << ", \"read_s\": " << json_num(s.read_s)
         << ", \"write_s\": " << json_num(s.write_s) << ", \"update_s\": " << json_num(s.update_s)
         << ", \"compress_gbps\": " << json_num(gbps(r.n, s.compress_s))
         << ", \"decompress_gbps\": " << json_num(gbps(r.n, s.decompress_s))
         << ", \"decompress_add_gbps\": " << json_num(gbps(r.n, s.decompress_add_s))
         << ", \"read_gbps\": " << json_num(gbps(r.n, s.read_s)) << "}";
    }
    os << "]}";
  }
  os << "\n  ]\n}\n";
}

/// Draws `png` with gnuplot: on the left the relative L2 error against bits per element (one
/// point per codec and tensor, log-log; torch's own ops, rows `torch.*`, as open circles), on
/// the right the compress, decompress and decompress_add throughput of each codec as a ratio to
/// the memory pass (first thread count measured, first tensor; log scale), with the line 1.0 =
/// the memory pass. `input_error` when gnuplot is missing or fails.
inline void write_plot(std::filesystem::path const& png, std::vector<row> const& rows) {
  namespace fs = std::filesystem;
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    throw input_error("--plot: gnuplot is not installed (Debian: apt-get install gnuplot-nox)");
  }
  fs::path const dir = fs::temp_directory_path() / ("gradcomp-bench-plot-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  bool any_torch = false;
  {
    // torch's own ops (rows torch.*, python -m gradcomp.bench) in a second set of points
    std::ofstream err(dir / "error.dat"), err_torch(dir / "error_torch.dat");
    for (row const& r : rows) {
      if (r.rel_l2 > 0 && std::isfinite(r.rel_l2)) {
        bool const torch = r.codec.rfind("torch.", 0) == 0;
        any_torch |= torch;
        (torch ? err_torch : err) << "\"" << r.codec << "\" "
                                  << num(8.0 * static_cast<double>(r.bytes) / static_cast<double>(r.n)) << ' '
                                  << num(r.rel_l2) << '\n';
      }
    }
    std::ofstream spd(dir / "speed.dat");
    std::string const first = rows.empty() ? "" : rows.front().tensor;
    for (row const& r : rows) {
      if (r.tensor != first || r.speeds.empty()) continue;
      speed const& s = r.speeds.front();
      auto ratio = [](double t, double base) { return num(t > 0 ? base / t : 0.0); };
      spd << "\"" << r.codec << "\" " << ratio(s.compress_s, s.read_s) << ' ' << ratio(s.decompress_s, s.write_s)
          << ' ' << ratio(s.decompress_add_s, s.update_s) << '\n';
    }
  }
  bool const has_speed = fs::file_size(dir / "speed.dat") > 0;
  {
    std::ofstream gp(dir / "report.gp");
    gp << "set terminal pngcairo size " << (has_speed ? 1800 : 900) << ",700 noenhanced\n"
       << "set output '" << png.string() << "'\n"
       << "set datafile separator whitespace\n";
    if (has_speed) gp << "set multiplot layout 1,2\n";
    gp << "set title 'error against size'\nset xlabel 'bits per element'\nset ylabel 'relative L2 error'\n"
          "set logscale xy\nset grid\n"
       << (any_torch ? "set key bottom left\n" : "unset key\n")
       << "plot '" << (dir / "error.dat").string() << "' using 2:3 with points pt 7 ps 1.2 lc rgb '#7030a0' title "
          "'gradcomp', '' using 2:3:1 with labels offset 0.5,0.5 left font ',8' notitle";
    if (any_torch) {
      gp << ", '" << (dir / "error_torch.dat").string() << "' using 2:3 with points pt 6 ps 1.6 lc rgb '#e07000' "
            "title 'torch', '' using 2:3:1 with labels offset 0.5,-0.7 left font ',8' tc rgb '#e07000' notitle";
    }
    gp << '\n';
    if (has_speed) {
      gp << "unset logscale\nset logscale y\nset title 'speed / memory pass (1.0 = memory pass)'\nset xlabel ''\n"
            "set ylabel 'ratio to the memory pass (log)'\nset style data histograms\nset style histogram clustered\n"
            "set style fill solid 0.8\nset boxwidth 0.9\nset xtics rotate by -45 font ',8'\nset key top left\n"
            "set arrow from graph 0, first 1 to graph 1, first 1 nohead lw 2 dt 2\n"
            "plot '" << (dir / "speed.dat").string() << "' using 2:xtic(1) title 'compress', '' using 3 title "
            "'decompress', '' using 4 title 'decompress_add'\nunset multiplot\n";
    }
  }
  std::string const cmd = "gnuplot '" + (dir / "report.gp").string() + "' 2>'" + (dir / "gnuplot.log").string() + "'";
  int const rc = std::system(cmd.c_str());
  std::error_code ec;
  if (rc != 0) {
    std::ifstream log(dir / "gnuplot.log");
    std::string first_line;
    std::getline(log, first_line);
    fs::remove_all(dir, ec);
    throw input_error("--plot " + png.string() + ": gnuplot failed: " + first_line);
  }
  fs::remove_all(dir, ec);
}

}  // namespace gradcomp_tool
