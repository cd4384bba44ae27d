// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// gradcomp-bench (tools/bench): the numbers the program prints agree with direct library calls
// on the same data (packet bytes exactly; errors, bias and error feedback's residual and delay
// to the 6 digits printed), the input formats round-trip (.npy float32/float16 in format 1.0
// and 2.0, raw float32/float16/bfloat16, capture directories), and every malformed input gives
// one line on stderr and exit status 2. The program is run as a child process
// (GRADCOMP_BENCH_TOOL is its path).

#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include "controller.hpp"
#include "inputs.hpp"
#include "measure.hpp"
#include "report.hpp"

#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;
namespace gc = gradcomp;
namespace tool = gradcomp_tool;

// A fresh directory under the temporary directory, removed at the end of the test.
struct scratch {
  fs::path dir;
  scratch() {
    static int counter = 0;
    dir = fs::temp_directory_path() /
          ("gradcomp-bench-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  [[nodiscard]] fs::path operator/(std::string const& name) const { return dir / name; }
};

struct result {
  int status = -1;
  std::string out, err;
};

std::string slurp(fs::path const& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs gradcomp-bench with `args` (shell words, already quoted where needed).
result run_tool(scratch const& s, std::string const& args) {
  std::string const cmd = std::string("'") + GRADCOMP_BENCH_TOOL + "' " + args + " >'" + (s / "stdout").string() +
                          "' 2>'" + (s / "stderr").string() + "'";
  int const raw = std::system(cmd.c_str());
  result r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  r.out = slurp(s / "stdout");
  r.err = slurp(s / "stderr");
  return r;
}

std::string q(fs::path const& p) { return "'" + p.string() + "'"; }

// The CSV of the program as one map per line (header names as keys).
std::vector<std::map<std::string, std::string>> read_csv(fs::path const& p) {
  std::ifstream f(p);
  std::string line;
  std::getline(f, line);
  REQUIRE(line == std::string(tool::csv_header));
  auto split = [](std::string const& l) {
    std::vector<std::string> out;
    std::string cur;
    bool quoted = false;
    for (char c : l) {
      if (c == '"') {
        quoted = !quoted;
      } else if (c == ',' && !quoted) {
        out.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    out.push_back(cur);
    return out;
  };
  std::vector<std::string> const names = split(line);
  std::vector<std::map<std::string, std::string>> rows;
  while (std::getline(f, line)) {
    std::vector<std::string> const v = split(line);
    REQUIRE(v.size() == names.size());
    std::map<std::string, std::string> m;
    for (std::size_t i = 0; i < v.size(); ++i) m[names[i]] = v[i];
    rows.push_back(std::move(m));
  }
  return rows;
}

double as_double(std::string const& s) { return s.empty() ? std::nan("") : std::stod(s); }

// Agreement with a value printed with 6 significant digits.
void check_printed(std::string const& printed, double exact) {
  INFO("printed " << printed << ", direct " << exact);
  double const v = as_double(printed);
  REQUIRE(std::abs(v - exact) <= 6e-6 * std::abs(exact) + 1e-300);
}

// A gradient with a ResNet-like profile: 60 % exact zeros, Laplace tails elsewhere.
std::vector<float> sparse_gradient(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::exponential_distribution<float> e(50.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng) < 0.6 ? 0.0f : (u(rng) < 0.5 ? -1.0f : 1.0f) * e(rng);
  return v;
}

// What the program computes, from direct library calls: packet bytes and distortion at step 0.
struct direct {
  std::size_t bytes = 0;
  double rel_l2 = 0, cosine = 0;
};

direct direct_round_trip(std::string const& spec, std::vector<float> const& x, std::uint32_t step = 0) {
  gc::any_codec const codec = gc::make_codec(spec);
  gc::codec_context ctx;
  ctx.seed = tool::measure_seed;
  ctx.step = step;
  std::vector<std::byte> packet(codec.max_compressed_bytes(x.size()));
  direct d;
  d.bytes = codec.compress(gc::tensor_view<float const>(std::span<float const>(x)), packet, ctx);
  std::vector<float> y(x.size());
  codec.decompress(std::span<std::byte const>(packet.data(), d.bytes), std::span<float>(y), ctx);
  double xx = 0, yy = 0, xy = 0, ee = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    xx += double(x[i]) * x[i];
    yy += double(y[i]) * y[i];
    xy += double(x[i]) * y[i];
    ee += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
  }
  d.rel_l2 = std::sqrt(ee / xx);
  d.cosine = xy / std::sqrt(xx * yy);
  return d;
}

void write_bytes(fs::path const& p, std::string const& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A .npy file with header dict `dict` (padded here) in format `major`, then `payload`.
std::string npy_bytes(std::string dict, std::string const& payload, int major = 1) {
  std::size_t const pre = major == 1 ? 10 : 12;
  std::size_t const total = pre + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  out.push_back(static_cast<char>(dict.size() & 0xff));
  out.push_back(static_cast<char>((dict.size() >> 8) & 0xff));
  if (major != 1) out.append(2, '\0');
  return out + dict + payload;
}

std::string le16(std::vector<std::uint16_t> const& v) {
  std::string out;
  for (std::uint16_t u : v) {
    out.push_back(static_cast<char>(u & 0xff));
    out.push_back(static_cast<char>(u >> 8));
  }
  return out;
}

std::string le32(std::vector<float> const& v) {
  std::string out;
  for (float x : v) {
    std::uint32_t u = 0;
    std::memcpy(&u, &x, 4);
    for (int k = 0; k < 4; ++k) out.push_back(static_cast<char>((u >> (8 * k)) & 0xff));
  }
  return out;
}

}  // namespace

TEST_CASE("gradcomp-bench: bytes exact, errors and bias to the digits printed, against direct calls") {
  scratch s;
  std::vector<float> const x = sparse_gradient(40000, 11);
  tool::write_npy(s / "g.npy", x);
  std::vector<std::string> const specs = {"identity", "fp16", "bf16", "int8:bucket=512,rounding=stochastic",
                                          "onebit:scaling=mean_abs", "qsgd:levels=7,bucket=512", "topk:ratio=0.01",
                                          "randomk:ratio=0.05,scale=true", "terngrad:bucket=512"};
  std::string args = q(s / "g.npy") + " --no-timing --seeds 6 -q --csv " + q(s / "r.csv");
  for (auto const& spec : specs) args += " --codec " + spec;
  result const r = run_tool(s, args);
  INFO(r.err);
  REQUIRE(r.status == 0);
  REQUIRE(r.out.empty());  // -q
  auto const rows = read_csv(s / "r.csv");
  REQUIRE(rows.size() == specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    INFO(specs[i]);
    auto const& row = rows[i];
    CHECK(row.at("tensor") == "g.npy");
    CHECK(row.at("codec") == specs[i]);
    CHECK(row.at("n") == "40000");
    direct const d = direct_round_trip(specs[i], x);
    CHECK(std::stoull(row.at("bytes")) == d.bytes);
    check_printed(row.at("smaller"), 160000.0 / static_cast<double>(d.bytes));
    check_printed(row.at("cosine"), d.cosine);
    if (specs[i] == "identity") {
      CHECK(row.at("rel_l2") == "0");
    } else {
      check_printed(row.at("rel_l2"), d.rel_l2);
    }
    CHECK(row.at("threads").empty());  // --no-timing
    gc::any_codec const codec = gc::make_codec(specs[i]);
    CHECK(row.at("unbiased") == (codec.unbiased() ? "1" : "0"));
    if (!codec.unbiased()) {
      CHECK(row.at("bias").empty());
      continue;
    }
    // Bias over 6 streams (steps 0..5), and the noise-only bound sqrt(mean error² / S).
    std::vector<double> mean(x.size(), 0.0);
    double sq = 0, xx = 0;
    for (float v : x) xx += double(v) * v;
    for (std::uint32_t k = 0; k < 6; ++k) {
      gc::codec_context ctx;
      ctx.seed = tool::measure_seed;
      ctx.step = k;
      std::vector<std::byte> packet(codec.max_compressed_bytes(x.size()));
      std::size_t const b = codec.compress(gc::tensor_view<float const>(std::span<float const>(x)), packet, ctx);
      std::vector<float> y(x.size());
      codec.decompress(std::span<std::byte const>(packet.data(), b), std::span<float>(y), ctx);
      for (std::size_t j = 0; j < x.size(); ++j) {
        mean[j] += y[j];
        sq += (double(y[j]) - x[j]) * (double(y[j]) - x[j]);
      }
    }
    double bias = 0;
    for (std::size_t j = 0; j < x.size(); ++j) bias += (mean[j] / 6 - x[j]) * (mean[j] / 6 - x[j]);
    CHECK(row.at("seeds") == "6");
    check_printed(row.at("bias"), std::sqrt(bias / xx));
    check_printed(row.at("bias_bound"), std::sqrt(sq / 36 / xx));
    // An unbiased codec's bias is noise: within a few times its bound (the bound is an RMS over
    // 40000 coordinates, so the measured value concentrates near it).
    CHECK(as_double(row.at("bias")) <= 2.0 * as_double(row.at("bias_bound")));
  }
}

TEST_CASE("gradcomp-bench: error feedback's residual and delay against p = g + e, e = p - D(C(p))") {
  scratch s;
  // --synthetic draws are defined in inputs.hpp; the direct computation redraws them.
  result const r = run_tool(s, "--synthetic laplace --size 5000 --steps 5 --feedback residual --codec topk:ratio=0.02 "
                               "--codec qsgd:levels=3,bucket=256 --no-timing -q --csv " + q(s / "ef.csv"));
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto const rows = read_csv(s / "ef.csv");
  REQUIRE(rows.size() == 2);
  tool::synthetic const fam = tool::synthetic::parse("laplace");
  for (auto const& row : rows) {
    INFO(row.at("codec"));
    gc::any_codec const codec = gc::make_codec(row.at("codec"));
    std::vector<float> e(5000, 0.0f), p(5000), d(5000), g;
    double res = 0, sent = 0;
    for (std::uint32_t k = 0; k < 5; ++k) {
      g = fam.draw(5000, k);
      for (std::size_t i = 0; i < g.size(); ++i) p[i] = e[i] + g[i];
      gc::codec_context ctx;
      ctx.seed = tool::measure_seed;
      ctx.step = k;
      std::vector<std::byte> packet(codec.max_compressed_bytes(p.size()));
      std::size_t const b = codec.compress(gc::tensor_view<float const>(std::span<float const>(p)), packet, ctx);
      codec.decompress(std::span<std::byte const>(packet.data(), b), std::span<float>(d), ctx);
      double rr = 0, dd = 0;
      for (std::size_t i = 0; i < p.size(); ++i) {
        e[i] = p[i] - d[i];
        rr += double(e[i]) * e[i];
        dd += double(d[i]) * d[i];
      }
      res += rr;
      sent += dd;
    }
    double ee = 0, gg = 0;
    for (std::size_t i = 0; i < e.size(); ++i) {
      ee += double(e[i]) * e[i];
      gg += double(g[i]) * g[i];
    }
    CHECK(row.at("ef_steps") == "5");
    check_printed(row.at("ef_residual"), std::sqrt(ee / gg));
    check_printed(row.at("ef_delay"), res / sent);
  }
}

TEST_CASE("gradcomp-bench: speeds, JSON and the table") {
  scratch s;
  result const r = run_tool(s, "--synthetic gauss --synthetic sparse:p=0.66 --size 2^14 --codec fp16 --codec "
                               "topk:ratio=0.01 --threads 1,2 --min-time 0.005 --json " + q(s / "r.json") +
                               " --csv " + q(s / "r.csv"));
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("sparse:p=0.66") != std::string::npos);
  CHECK(r.out.find("decompress_add") != std::string::npos);
  auto const rows = read_csv(s / "r.csv");
  REQUIRE(rows.size() == 2 * 2 * 2);  // tensors x codecs x thread counts
  for (auto const& row : rows) {
    for (char const* k : {"compress_gbps", "decompress_gbps", "decompress_add_gbps", "read_gbps", "write_gbps",
                          "update_gbps", "compress_ratio", "decompress_ratio", "decompress_add_ratio"}) {
      INFO(k);
      CHECK(as_double(row.at(k)) > 0.0);
    }
  }
  std::string const json = slurp(s / "r.json");
  CHECK(json.rfind("{\n  \"tool\": \"gradcomp-bench\"", 0) == 0);
  CHECK(json.find("\"codec\": \"topk:ratio=0.01\"") != std::string::npos);
  CHECK(json.find("\"threads\": 2") != std::string::npos);
}

TEST_CASE("gradcomp-bench inputs: .npy and raw files round-trip") {
  scratch s;
  std::vector<float> const x = {0.0f, -1.5f, 3.25e-7f, 65504.0f, -0.0f, 1e-30f, 7.0f};
  SECTION("float32 .npy written and read back bit for bit") {
    tool::write_npy(s / "a.npy", x);
    std::vector<float> const y = tool::read_npy(s / "a.npy");
    REQUIRE(y.size() == x.size());
    CHECK(std::memcmp(x.data(), y.data(), x.size() * 4) == 0);
  }
  SECTION("float16 .npy, format 2.0, shape (2, 3)") {
    std::vector<std::uint16_t> const h = {0x0000, 0x3c00, 0xc000, 0x7bff, 0x0001, 0x3555};
    write_bytes(s / "h.npy", npy_bytes("{'descr': '<f2', 'fortran_order': False, 'shape': (2, 3), }", le16(h), 2));
    std::vector<float> const y = tool::read_npy(s / "h.npy");
    REQUIRE(y.size() == 6);
    for (std::size_t i = 0; i < 6; ++i) CHECK(y[i] == gc::half_bits_to_float(h[i]));
    CHECK(y[1] == 1.0f);
    CHECK(y[2] == -2.0f);
    CHECK(y[3] == 65504.0f);
  }
  SECTION("raw bfloat16, float16 and float32 with --count") {
    std::vector<std::uint16_t> const b = {0x3f80, 0xc040, 0x0000, 0x7f7f};
    write_bytes(s / "b.raw", le16(b));
    std::vector<float> const y = tool::read_raw(s / "b.raw", tool::dtype::bf16, 0);
    REQUIRE(y.size() == 4);
    CHECK(y[0] == 1.0f);
    CHECK(y[1] == -3.0f);
    for (std::size_t i = 0; i < 4; ++i) CHECK(y[i] == gc::bfloat16_bits_to_float(b[i]));
    CHECK(tool::read_raw(s / "b.raw", tool::dtype::f16, 3).size() == 3);
    write_bytes(s / "f.raw", le32(x));
    std::vector<float> const z = tool::read_raw(s / "f.raw", tool::dtype::f32, 0);
    CHECK(std::memcmp(z.data(), x.data(), x.size() * 4) == 0);
  }
  SECTION("the program reads them: identity codec on a raw bf16 file is exact") {
    std::vector<std::uint16_t> const b = {0x3f80, 0xc040, 0x4000, 0x3e80};
    write_bytes(s / "b.raw", le16(b));
    result const r = run_tool(s, q(s / "b.raw") + " --dtype bf16 --codec identity --no-timing -q --csv " + q(s / "o.csv"));
    INFO(r.err);
    REQUIRE(r.status == 0);
    auto const rows = read_csv(s / "o.csv");
    REQUIRE(rows.size() == 1);
    CHECK(rows[0].at("n") == "4");
    CHECK(rows[0].at("rel_l2") == "0");
    CHECK(rows[0].at("cosine") == "1");
  }
}

TEST_CASE("gradcomp-bench inputs: a capture directory, per tensor and flattened") {
  scratch s;
  fs::create_directories(s / "cap");
  std::vector<tool::capture_entry> entries;
  std::map<std::string, std::vector<std::vector<float>>> values;
  for (std::uint64_t step : {10u, 20u, 30u}) {
    for (auto const& [name, n] : std::vector<std::pair<std::string, std::size_t>>{{"conv1.weight", 3000}, {"fc.bias", 100}}) {
      std::vector<float> v = sparse_gradient(n, step * 7 + n);
      fs::path const file = s / "cap" / ("step_" + std::to_string(step)) / (name + ".npy");
      fs::create_directories(file.parent_path());
      tool::write_npy(file, v);
      entries.push_back({step, name, file});
      values[name].push_back(std::move(v));
    }
  }
  tool::write_capture_index(s / "cap", entries);
  std::vector<tool::capture_entry> const back = tool::read_capture_index(s / "cap");
  REQUIRE(back.size() == entries.size());
  CHECK(back[1].name == "fc.bias");
  CHECK(back[1].file == s / "cap" / "step_10" / "fc.bias.npy");

  result const r = run_tool(s, q(s / "cap") + " --codec topk:ratio=0.1 --feedback residual --no-timing -q --csv " +
                                   q(s / "c.csv"));
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto rows = read_csv(s / "c.csv");
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].at("tensor") == "conv1.weight");
  CHECK(rows[0].at("n") == "3000");
  CHECK(rows[0].at("ef_steps") == "3");
  // Size and distortion are those of the last step.
  direct const d = direct_round_trip("topk:ratio=0.1", values["fc.bias"].back());
  CHECK(std::stoull(rows[1].at("bytes")) == d.bytes);
  check_printed(rows[1].at("rel_l2"), d.rel_l2);

  result const f = run_tool(s, q(s / "cap") + " --flatten --codec fp16 --no-timing -q --csv " + q(s / "f.csv"));
  INFO(f.err);
  REQUIRE(f.status == 0);
  rows = read_csv(s / "f.csv");
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].at("n") == "3100");
  std::vector<float> cat = values["conv1.weight"].back();
  cat.insert(cat.end(), values["fc.bias"].back().begin(), values["fc.bias"].back().end());
  direct const df = direct_round_trip("fp16", cat);
  CHECK(std::stoull(rows[0].at("bytes")) == df.bytes);
  check_printed(rows[0].at("rel_l2"), df.rel_l2);
}

TEST_CASE("gradcomp-bench: every malformed input gives one line and exit status 2") {
  scratch s;
  std::vector<float> const x = {1.0f, 2.0f, 3.0f, 4.0f};
  std::string const good_f4 = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", le32(x));
  write_bytes(s / "good.npy", good_f4);
  write_bytes(s / "truncated.npy", good_f4.substr(0, good_f4.size() - 3));
  write_bytes(s / "long.npy", good_f4 + "xx");
  write_bytes(s / "magic.npy", "NUMPY not really");
  write_bytes(s / "f8.npy", npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", std::string(16, '\0')));
  write_bytes(s / "big.npy", npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", std::string(4, '\0')));
  write_bytes(s / "fortran.npy", npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", le32(x)));
  write_bytes(s / "shape.npy", npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (a,), }", le32(x)));
  write_bytes(s / "noshape.npy", npy_bytes("{'descr': '<f4', 'fortran_order': False, }", le32(x)));
  write_bytes(s / "empty.npy", npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (0,), }", ""));
  write_bytes(s / "header.npy", std::string("\x93NUMPY\x01\x00\xff\x00{'descr'", 17));
  write_bytes(s / "odd.raw", "abcde");
  write_bytes(s / "short.raw", "abcdefgh");
  fs::create_directories(s / "emptydir");
  fs::create_directories(s / "noindex");
  write_bytes(s / "noindex" / "x.npy", good_f4);
  fs::create_directories(s / "badmagic");
  write_bytes(s / "badmagic" / "index.tsv", "step\tname\tfile\n");
  fs::create_directories(s / "badline");
  write_bytes(s / "badline" / "index.tsv", "# gradcomp capture v1\nstep\tname\tfile\nten\tw\tw.npy\n");
  fs::create_directories(s / "missing");
  write_bytes(s / "missing" / "index.tsv", "# gradcomp capture v1\nstep\tname\tfile\n0\tw\tstep_0/w.npy\n");
  fs::create_directories(s / "nolines");
  write_bytes(s / "nolines" / "index.tsv", "# gradcomp capture v1\nstep\tname\tfile\n");
  write_bytes(s / "rows_header.csv", "tensor,codec\n");
  std::string const head = std::string(tool::csv_header) + "\n";
  write_bytes(s / "rows_fields.csv", head + "g,torch.half,4,8,2,0,1\n");
  write_bytes(s / "rows_number.csv", head + "g,torch.half,4,8,2,zero,1,0,0,,,0,,,,,,,,,,,,\n");
  write_bytes(s / "rows_quote.csv", head + "\"g,torch.half,4,8,2,0,1,0,0,,,0,,,,,,,,,,,,\n");

  struct bad {
    std::string args, expect;
  };
  std::string const nt = " --no-timing -q";
  std::vector<bad> const cases = {
      {q(s / "truncated.npy") + nt, "truncated"},
      {q(s / "long.npy") + nt, "bytes after the data"},
      {q(s / "magic.npy") + nt, "not a .npy file"},
      {q(s / "f8.npy") + nt, "dtype '<f8' is not supported"},
      {q(s / "big.npy") + nt, "dtype '>f4' is not supported"},
      {q(s / "fortran.npy") + nt, "Fortran-order"},
      {q(s / "shape.npy") + nt, "malformed .npy header (shape"},
      {q(s / "noshape.npy") + nt, "no 'shape'"},
      {q(s / "empty.npy") + nt, "the array is empty"},
      {q(s / "header.npy") + nt, "truncated .npy header"},
      {q(s / "good.npy") + " --dtype f16" + nt, "holds f32 values but --dtype says f16"},
      {q(s / "good.npy") + " --dtype f64" + nt, "--dtype 'f64' is not a dtype"},
      {q(s / "odd.raw") + " --dtype f32" + nt, "not a whole number of f32 values (wrong --dtype?)"},
      {q(s / "short.raw") + " --dtype f32 --count 3" + nt, "--count 3 f32 values need 12 bytes"},
      {q(s / "odd.raw") + nt, "not a .npy file; give --dtype"},
      {q(s / "nothere.npy") + nt, "no such file"},
      {q(s / "good.npy") + " --codec zstd" + nt, "--codec 'zstd': unknown codec 'zstd'"},
      {q(s / "good.npy") + " --codec topk:ratio=0.1,k=3" + nt, "--codec 'topk:ratio=0.1,k=3'"},
      {q(s / "good.npy") + " --codec qsgd:levls=3" + nt, "--codec 'qsgd:levls=3'"},
      {q(s / "emptydir") + nt, "empty directory"},
      {q(s / "noindex") + nt, "no index.tsv"},
      {q(s / "badmagic") + nt, "first line is not '# gradcomp capture v1'"},
      {q(s / "badline") + nt, "index.tsv:3: expected 'step<TAB>name<TAB>file'"},
      {q(s / "missing") + nt, "w.npy: no such file"},
      {q(s / "nolines") + nt, "lists no tensors"},
      {"--synthetic cauchy" + nt, "--synthetic 'cauchy' is not a family"},
      {"--synthetic sparse:p=1.5" + nt, "p must be a number in [0, 1)"},
      {"--synthetic gauss --size 2^40" + nt, "--size '2^40' is not an element count"},
      {"--synthetic gauss --size 3x" + nt, "--size '3x'"},
      {"--synthetic gauss --threads 0", "--threads '0'"},
      {"--synthetic gauss --feedback momentum" + nt, "--feedback 'momentum' is not a feedback"},
      {nt, "no input"},
      {"--synthetic gauss --bogus", "--bogus"},
      {q(s / "good.npy") + " --csv " + q(s / "nodir" / "x.csv") + nt, "--csv"},
      {q(s / "good.npy") + " --json " + q(s / "nodir" / "x.json") + nt, "--json"},
      {q(s / "good.npy") + " --plot " + q(s / "nodir" / "x.png") + nt, "--plot"},
      {q(s / "good.npy") + " --import-rows " + q(s / "nothere.csv") + nt, "--import-rows"},
      {q(s / "good.npy") + " --import-rows " + q(s / "rows_header.csv") + nt, "first line is not gradcomp-bench's CSV header"},
      {q(s / "good.npy") + " --import-rows " + q(s / "rows_fields.csv") + nt, "rows_fields.csv:2: 7 fields"},
      {q(s / "good.npy") + " --import-rows " + q(s / "rows_number.csv") + nt, "field 6 'zero' is not a number"},
      {q(s / "good.npy") + " --import-rows " + q(s / "rows_quote.csv") + nt, "unterminated quoted field"},
      {q(s / "good.npy") + " --imported-only" + nt, "--imported-only needs --import-rows"},
  };
  for (bad const& c : cases) {
    INFO("gradcomp-bench " << c.args);
    result const r = run_tool(s, c.args);
    INFO("stderr: " << r.err);
    CHECK(r.status == 2);
    CHECK(r.err.rfind("gradcomp-bench: ", 0) == 0);
    CHECK(r.err.find(c.expect) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
}

TEST_CASE("gradcomp-bench: --export-inputs writes the tensors as read and the settings, --import-rows reads reports back") {
  scratch s;
  result const e = run_tool(s, "--synthetic laplace --size 3000 --steps 3 --feedback residual --codec fp16 --codec "
                               "topk:ratio=0.02 --threads 1,2 --min-time 0.05 --seeds 4 --export-inputs " +
                               q(s / "exp"));
  INFO(e.err);
  REQUIRE(e.status == 0);
  CHECK(e.out.empty());  // nothing measured
  auto const entries = tool::read_capture_index(s / "exp");
  REQUIRE(entries.size() == 3);
  tool::synthetic const fam = tool::synthetic::parse("laplace");
  for (std::size_t k = 0; k < 3; ++k) {
    CHECK(entries[k].name == "laplace");
    CHECK(entries[k].step == k);
    CHECK(tool::read_npy(entries[k].file) == fam.draw(3000, k));  // bit for bit
  }
  CHECK(slurp(s / "exp" / "settings.tsv") ==
        "threads\t1,2\nmin_time\t0.05\ntiming\t1\nseeds\t4\nfeedback\t1\nsteps\t3\ncodec\tfp16\n"
        "codec\ttopk:ratio=0.02\n");

  // A report's CSV imported into a run that measures nothing reproduces it: the same fields,
  // the speeds recovered from the printed GB/s and ratios.
  result const a = run_tool(s, "--synthetic gauss --synthetic sparse:p=0.5 --size 4096 --codec fp16 --codec "
                               "qsgd:levels=7 --threads 1,2 --min-time 0.002 -q --csv " + q(s / "a.csv"));
  INFO(a.err);
  REQUIRE(a.status == 0);
  result const b = run_tool(s, "--imported-only --import-rows " + q(s / "a.csv") + " -q --csv " + q(s / "b.csv") +
                               " --json " + q(s / "b.json"));
  INFO(b.err);
  REQUIRE(b.status == 0);
  auto const ra = read_csv(s / "a.csv");
  auto const rb = read_csv(s / "b.csv");
  REQUIRE(ra.size() == 8);
  REQUIRE(rb.size() == ra.size());
  for (std::size_t i = 0; i < ra.size(); ++i) {
    for (auto const& [k, v] : ra[i]) {
      INFO(i << " " << k << " " << v << " " << rb[i].at(k));
      if (k.find("gbps") != std::string::npos || k.find("ratio") != std::string::npos) {
        // seconds recovered from 6 printed digits and printed again: the last digit may move by one
        CHECK(std::abs(as_double(rb[i].at(k)) - as_double(v)) <= 2e-5 * std::abs(as_double(v)));
      } else {
        CHECK(rb[i].at(k) == v);
      }
    }
  }
  CHECK(slurp(s / "b.json").find("\"codec\": \"qsgd:levels=7\"") != std::string::npos);

  // Imported rows go next to the measured rows of the same tensor, the others at the end.
  std::string const head = std::string(tool::csv_header) + "\n";
  write_bytes(s / "extra.csv", head + "gauss,torch.half,4096,8192,2,0.001,1,0,0,,,0,,,,,,,,,,,,\n" +
                                   "other,torch.sign,10,14,2.85714,0.5,0.9,0,0,,,0,,,,,,,,,,,,\n");
  result const c = run_tool(s, "--synthetic gauss --synthetic laplace --size 4096 --codec fp16 --no-timing -q --csv " +
                               q(s / "c.csv") + " --import-rows " + q(s / "extra.csv"));
  INFO(c.err);
  REQUIRE(c.status == 0);
  auto const rc = read_csv(s / "c.csv");
  REQUIRE(rc.size() == 4);
  CHECK((rc[0].at("tensor") == "gauss" && rc[0].at("codec") == "fp16"));
  CHECK((rc[1].at("tensor") == "gauss" && rc[1].at("codec") == "torch.half" && rc[1].at("bytes") == "8192"));
  CHECK((rc[2].at("tensor") == "laplace" && rc[2].at("codec") == "fp16"));
  CHECK((rc[3].at("tensor") == "other" && rc[3].at("codec") == "torch.sign"));
}

namespace {

// The layers of a small model over `steps` steps: two compressed tensors and one below the
// pipeline's min_compress_elements (sent dense), heavy-tailed and correlated in time.
std::vector<std::vector<std::vector<float>>> model_steps(std::size_t steps) {
  std::vector<std::size_t> const sizes = {6000, 300, 20000};
  std::vector<std::vector<std::vector<float>>> out(sizes.size());
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    for (std::size_t k = 0; k < steps; ++k) {
      std::vector<float> g(sizes[t]);
      for (std::size_t i = 0; i < g.size(); ++i) {
        double const x = std::sin(0.013 * double(i) + 0.7 * double(t) + 0.05 * double(k) * double(k));
        double const spike = (i * 2654435761u + t * 97u + k * 31u) % 61u == 0 ? 8.0 : 1.0;
        g[i] = static_cast<float>(spike * x * x * x * (1.0 + 0.1 * double(k)) + 0.01 * std::cos(0.3 * double(i)));
      }
      out[t].push_back(std::move(g));
    }
  }
  return out;
}

double norm_sq(std::span<float const> v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return s;
}

struct direct_step {
  std::string sent;
  double factor = 1;
  std::size_t bytes = 0;
};

// Controller `spec` driven directly: the statistics of the pipeline's step protocol (one rank)
// computed here from the layers: g_ef = g + residual per compressed tensor, its packet at the
// plan's first factor and re-compressed at each further one, their squared norms summed over
// the tensors; then `decide`, and the residual updated as the decision says.
std::vector<direct_step> drive_directly(std::string const& spec, std::string const& codec_spec,
                                        std::vector<std::vector<std::vector<float>>> const& layers) {
  gc::any_controller ctrl = gc::make_controller(spec);
  gc::any_codec const base = gc::make_codec(codec_spec);
  std::vector<std::vector<float>> residual(layers.size());
  std::vector<direct_step> out;
  for (std::size_t k = 0; k < layers.front().size(); ++k) {
    gc::step_plan const plan = ctrl.plan();
    std::size_t const levels = plan.measure.size();
    gc::step_stats s;
    s.step = plan.step;
    s.batch_size = 1;
    s.workers = 1;
    s.compressed_norm_sq.assign(levels, 0.0);
    gc::codec_context ctx;
    ctx.seed = tool::measure_seed;
    ctx.step = static_cast<std::uint32_t>(k);
    std::vector<std::vector<float>> gef(layers.size());
    std::vector<std::vector<std::vector<std::byte>>> packets(layers.size());
    for (std::size_t t = 0; t < layers.size(); ++t) {
      std::vector<float> const& g = layers[t][k];
      if (g.size() < 4096) continue;  // min_compress_elements: dense, no feedback
      if (residual[t].empty()) residual[t].assign(g.size(), 0.0f);
      gef[t].resize(g.size());
      for (std::size_t i = 0; i < g.size(); ++i) gef[t][i] = residual[t][i] + g[i];
      s.ef_norm_sq += norm_sq(gef[t]);
      for (std::size_t l = 0; l < levels; ++l) {
        std::vector<std::byte> p;
        if (l == 0) {
          gc::any_codec const c0 = base.with_budget(gc::sparse_budget::factor(plan.measure[0]));
          p.resize(c0.max_compressed_bytes(g.size()));
          p.resize(c0.compress(gc::tensor_view<float const>(std::span<float const>(gef[t])), p, ctx));
        } else {
          std::uint64_t const kept = gc::sparse_budget::factor(plan.measure[l]).kept(g.size());
          p.resize(gc::max_recompressed_bytes(packets[t].back(), kept));
          p.resize(gc::recompress_sparse(packets[t].back(), kept, p, ctx));
        }
        std::vector<float> d(g.size(), 0.0f);
        gc::decompress_any(std::span<std::byte const>(p), std::span<float>(d), 1.0f, true, ctx);
        s.compressed_norm_sq[l] += norm_sq(d);
        packets[t].push_back(std::move(p));
      }
    }
    gc::decision const d = ctrl.decide(s);
    std::size_t const at = d.packet(levels);
    direct_step r;
    r.sent = gc::send_kind_name(d.send);
    r.factor = d.factor;
    for (std::size_t t = 0; t < layers.size(); ++t) {
      std::size_t const n = layers[t][k].size();
      if (gef[t].empty()) {
        r.bytes += 4 * n;
        continue;
      }
      if (at == gc::decision::npos) {
        r.bytes += 4 * n;
        if (d.residual == gc::residual_rule::zero) std::fill(residual[t].begin(), residual[t].end(), 0.0f);
        continue;
      }
      r.bytes += packets[t][at].size();
      std::vector<float> dec(n, 0.0f);
      gc::decompress_any(std::span<std::byte const>(packets[t][at]), std::span<float>(dec), 1.0f, true, ctx);
      for (std::size_t i = 0; i < n; ++i) residual[t][i] = gef[t][i] - dec[i];
    }
    out.push_back(r);
  }
  return out;
}

}  // namespace

TEST_CASE("gradcomp-bench --controller: the sequence equals the controller driven directly") {
  scratch s;
  auto const layers = model_steps(16);
  std::vector<tool::capture_entry> entries;
  char const* names[] = {"conv.weight", "conv.bias", "fc.weight"};
  for (std::size_t t = 0; t < layers.size(); ++t) {
    for (std::size_t k = 0; k < layers[t].size(); ++k) {
      fs::path const dir = s / "cap" / ("step_" + std::to_string(k));
      fs::create_directories(dir);
      tool::write_npy(dir / (std::string(names[t]) + ".npy"), layers[t][k]);
      entries.push_back({k, names[t], dir / (std::string(names[t]) + ".npy")});
    }
  }
  tool::write_capture_index(s / "cap", entries);

  std::vector<std::string> const specs = {"schedule:0=10,4=50,9=1,12=200",
                                          "ef_window:min=10,max=400,window=3,max_delay=2",
                                          "gravac:theta_min=10,theta_max=400,window=3,epsilon=0.1",
                                          "static:factor=100"};
  std::string args = q(s / "cap") + " --codec topk:ratio=0.01 -q --csv " + q(s / "ctl.csv") + " --json " + q(s / "ctl.json");
  for (auto const& spec : specs) args += " --controller " + spec;
  result const r = run_tool(s, args);
  INFO(r.err);
  REQUIRE(r.status == 0);
  // the controller CSV, one line per controller and step
  std::ifstream f(s / "ctl.csv");
  std::string line;
  std::getline(f, line);
  REQUIRE(line == tool::controller_csv_header);
  std::map<std::string, std::vector<std::vector<std::string>>> by_ctrl;
  while (std::getline(f, line)) {
    std::vector<std::string> const v = tool::csv_split(line, "ctl.csv");
    REQUIRE(v.size() == 11);
    by_ctrl[v[0]].push_back(v);
  }
  for (auto const& spec : specs) {
    INFO(spec);
    bool moved = false;
    auto const want = drive_directly(spec, "topk:ratio=0.01", layers);
    auto const& got = by_ctrl[spec];
    REQUIRE(got.size() == want.size());
    for (std::size_t k = 0; k < want.size(); ++k) {
      INFO("step " << k);
      CHECK(got[k][2] == std::to_string(k));
      CHECK(got[k][3] == want[k].sent);
      check_printed(got[k][4], want[k].factor);
      CHECK(got[k][5] == tool::codec_at_factor("topk:ratio=0.01", want[k].factor));
      CHECK(std::stoull(got[k][6]) == want[k].bytes);
      CHECK(got[k][7] == std::to_string(4 * (6000 + 300 + 20000)));
      CHECK(got[k][9] == (want[k].sent == "dense" ? "0" : "2"));
      if (k > 0 && got[k][4] != got[k - 1][4]) moved = true;
    }
    // every controller but the static one changes its factor on these inputs
    CHECK(moved == (spec.rfind("static", 0) != 0));
  }
  CHECK(slurp(s / "ctl.json").find("\"controller\": \"ef_window:min=10,max=400,window=3,max_delay=2\"") !=
        std::string::npos);

  // the table on stdout
  result const t = run_tool(s, q(s / "cap") + " --controller static:factor=100 --steps 3");
  INFO(t.err);
  REQUIRE(t.status == 0);
  CHECK(t.out.find("controller static:factor=100 with topk:ratio=0.01") != std::string::npos);
  CHECK(t.out.find("total: ") != std::string::npos);

  // bad combinations: one line, status 2
  for (auto const& [a, expect] : std::vector<std::pair<std::string, std::string>>{
           {"--controller gravac:bogus=1", "--controller 'gravac:bogus=1'"},
           {"--controller static:factor=10 --codec qsgd:levels=7", "with --codec 'qsgd:levels=7'"},
           {"--controller static:factor=10 --codec topk:ratio=0.1 --codec fp16", "takes one --codec"},
           {"--controller static:factor=10 --plot x.png", "--plot"},
       }) {
    result const b = run_tool(s, q(s / "cap") + " " + a);
    INFO(a << ": " << b.err);
    CHECK(b.status == 2);
    CHECK(b.err.find(expect) != std::string::npos);
    CHECK(std::count(b.err.begin(), b.err.end(), '\n') == 1);
  }
}
