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

#include "inputs.hpp"
#include "measure.hpp"
#include "report.hpp"

#include <gradcomp/gradcomp.hpp>

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
