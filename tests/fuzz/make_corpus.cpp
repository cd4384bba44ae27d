// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// make_corpus: writes the seed corpora of the fuzz targets, valid inputs of every kind (packets
// of every codec, variant and dtype; saved states and checkpoints; specs; peer exchanges; IDX
// files), each with the control bytes its target reads first (see the targets' comments).
//
//   make_corpus OUT_DIR [--small]
//
// writes OUT_DIR/<target>/<name> for every target. --small writes the few tiny inputs that are
// checked in under tests/fuzz/corpus/ (a few KB per target); without it, more sizes and
// variants for a campaign. Built with the normal compiler (no sanitizer, no libFuzzer).

#include "configs.hpp"
#include "fuzz.hpp"
#include "scenarios.hpp"
#include "scripted_peer.hpp"

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/codec/powersgd.hpp>
#include <gradcomp/codec/recompress.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/feedback/dgc.hpp>
#include <gradcomp/feedback/policies.hpp>
#include <gradcomp/pipeline/pipeline.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace {

namespace gc = gradcomp;
namespace fs = std::filesystem;
using namespace gradcomp_fuzz;
using bytes = std::vector<std::byte>;

struct writer {
  fs::path root;
  std::size_t files = 0;
  std::size_t total = 0;

  void put(std::string const& target, std::string const& name, std::span<std::byte const> data) {
    fs::path const dir = root / target;
    fs::create_directories(dir);
    std::ofstream out(dir / name, std::ios::binary);
    out.write(reinterpret_cast<char const*>(data.data()),
              static_cast<std::streamsize>(data.size()));
    if (!out) throw std::runtime_error("make_corpus: cannot write " + (dir / name).string());
    ++files;
    total += data.size();
  }
  void put(std::string const& target, std::string const& name, std::string_view text) {
    put(target, name, std::as_bytes(std::span<char const>(text.data(), text.size())));
  }
};

bytes with_prefix(std::initializer_list<std::uint8_t> control, std::span<std::byte const> body) {
  bytes b;
  for (std::uint8_t c : control) b.push_back(std::byte{c});
  b.insert(b.end(), body.begin(), body.end());
  return b;
}

std::string safe_name(std::string s) {
  for (char& c : s) {
    if (c == ':' || c == ',' || c == '=' || c == '.') c = '_';
  }
  return s;
}

template <gc::element T>
bytes compress_as(gc::any_codec const& c, std::vector<float> const& x) {
  std::vector<T> v(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) v[i] = gc::from_float<T>(x[i]);
  bytes p(c.max_compressed_bytes(x.size()));
  std::size_t const n =
      c.compress(gc::tensor_view<T const>(std::span<T const>(v), gc::tensor_id{0}),
                 std::span<std::byte>(p), context());
  p.resize(n);
  return p;
}

void packets(writer& w, bool small) {
  std::vector<std::size_t> const sizes =
      small ? std::vector<std::size_t>{8} : std::vector<std::size_t>{1, 8, 37, 300};
  for (std::string_view const spec : codec_specs) {
    gc::any_codec const c = gc::make_codec(spec);
    for (std::size_t n : sizes) {
      std::vector<float> const x = sample_tensor(n, static_cast<std::uint32_t>(n));
      for (int t = 0; t < (small ? 1 : 3); ++t) {
        bytes const p = t == 0   ? compress_as<float>(c, x)
                        : t == 1 ? compress_as<gc::half>(c, x)
                                 : compress_as<gc::bfloat16>(c, x);
        std::string const name =
            safe_name(std::string(spec)) + "_n" + std::to_string(n) + "_t" + std::to_string(t);
        // decode: f32 / f16 / bf16 outputs, matching size, alpha index t.
        w.put("decode", name, with_prefix({static_cast<std::uint8_t>(t | (t << 4))}, p));
        if (!small)
          w.put("decode", name + "_mismatch", with_prefix({static_cast<std::uint8_t>(8 | t)}, p));
        if (c.has_budget() || c.id() == gc::codec_id::threshold) {
          // recompress: k (u16), output-size choice, packet.
          w.put("recompress", name, with_prefix({2, 0, 0}, p));
          if (!small) w.put("recompress", name + "_k1", with_prefix({1, 0, 1}, p));
        }
      }
    }
  }
  // PowerSGD: a low-rank and a dense packet.
  for (auto const& [rows, cols] : {std::pair<std::size_t, std::size_t>{8, 6}, {2, 2}}) {
    gc::powersgd_options o;
    o.rank = 2;
    o.min_elements = 16;
    gc::powersgd psgd(o);
    std::vector<float> const x = sample_tensor(rows * cols, 7);
    bytes p(psgd.max_compressed_bytes(rows, cols));
    p.resize(
        psgd.compress(std::span<float const>(x), rows, cols, std::span<std::byte>(p), context()));
    w.put("decode", "powersgd_" + std::to_string(rows) + "x" + std::to_string(cols),
          with_prefix({0}, p));
    w.put("decode", "powersgd_" + std::to_string(rows) + "x" + std::to_string(cols) + "_f16",
          with_prefix({1}, p));
  }
}

/// Runs `fn(scripted_peer&)` on both ranks of a two-rank in-process world and returns what
/// rank 0 received from rank 1 (a script that replays the exchange). A gradcomp error is
/// reported and the bytes recorded up to it are returned.
template <class Fn>
std::vector<std::byte> recorded(Fn&& fn) {
  std::vector<std::byte> record;
  try {
    gc::run_in_process(2, [&](gc::in_process_communicator& real) {
      scripted_peer comm(real, record);
      fn(comm);
    });
  } catch (gc::error const& e) {
    std::fprintf(stderr, "make_corpus: note: %s\n", e.what());
  }
  return record;
}

template <class Compressor>
bytes feedback_state(Compressor c) {
  for (std::uint32_t id : {0u, 3u}) {
    std::vector<float> const x = sample_tensor(6 + id, id);
    bytes p(c.codec().max_compressed_bytes(x.size()));
    for (int step = 0; step < 2; ++step) {
      std::size_t const n =
          c.compress(gc::tensor_view<float const>(std::span<float const>(x), gc::tensor_id{id}),
                     std::span<std::byte>(p), context());
      std::vector<float> out(x.size());
      gc::decompress_any(std::span<std::byte const>(p).first(n), std::span<float>(out), 1.0f, false,
                         context());
      c.receive(gc::tensor_id{id}, std::span<float>(out));
    }
  }
  return c.save();
}

// feedback_state case 6: codec byte, policy byte, then 16 floats per step: a spike beyond
// binary16's range, then an ordinary step.
void half_feedback(writer& w) {
  for (std::uint8_t codec : {0, 1, 5}) {
    for (std::uint8_t policy = 0; policy < 4; ++policy) {
      bytes b{std::byte{6}, std::byte{codec}, std::byte{policy}};
      for (int step = 0; step < 2; ++step) {
        std::vector<float> x = sample_tensor(16, static_cast<std::uint32_t>(step));
        if (step == 0) {
          x[3] = 1e5f;
          x[9] = -3e38f;
        }
        for (float v : x) {
          auto const u = std::bit_cast<std::uint32_t>(v);
          for (int k = 0; k < 4; ++k) b.push_back(static_cast<std::byte>((u >> (8 * k)) & 0xffu));
        }
      }
      w.put("feedback_state",
            "half_codec" + std::to_string(codec) + "_policy" + std::to_string(policy), b);
    }
  }
}

void states(writer& w) {
  gc::any_codec const topk = gc::make_codec("topk:k=2");
  w.put("feedback_state", "none",
        with_prefix({0}, feedback_state(gc::compressor<gc::any_codec, gc::no_feedback>(topk))));
  w.put(
      "feedback_state", "residual",
      with_prefix({1}, feedback_state(gc::compressor<gc::any_codec, gc::residual_feedback>(topk))));
  w.put("feedback_state", "ef21",
        with_prefix({2}, feedback_state(gc::compressor<gc::any_codec, gc::ef21_feedback>(topk))));
  w.put("feedback_state", "dgc",
        with_prefix({3}, feedback_state(gc::compressor<gc::any_codec, gc::dgc_feedback>(
                             topk, gc::dgc_feedback(0.9f, 0.0)))));
  {
    // Two-way: worker and server states from one mirrored two-way step.
    bytes saved;
    (void)recorded([&](scripted_peer& comm) {
      gc::two_way_compressor<gc::any_codec, gc::residual_feedback, gc::residual_feedback> tw(topk);
      std::vector<float> const x = sample_tensor(9, 1);
      std::vector<float> out(x.size());
      gc::all_reduce_two_way(
          comm, tw, gc::tensor_view<float const>(std::span<float const>(x), gc::tensor_id{2}),
          std::span<float>(out), context());
      if (comm.rank() == 0) saved = tw.save();
    });
    w.put("feedback_state", "two_way_residual", with_prefix({5}, saved));
    gc::two_way_compressor<gc::any_codec, gc::no_feedback, gc::no_feedback> none(topk);
    w.put("feedback_state", "two_way_none", with_prefix({4}, none.save()));
  }
  // PowerSGD: rank 2, min_elements 16 (option byte 1 | 2 << 2): a low-rank and a dense tensor.
  {
    std::uint8_t const b = 1 | (2 << 2);
    gc::powersgd p(powersgd_options_of<gc::powersgd_options>(b));
    for (auto const& [rows, cols] : {std::pair<std::size_t, std::size_t>{8, 6}, {2, 3}}) {
      std::vector<float> const x = sample_tensor(rows * cols, 9);
      bytes out(p.max_compressed_bytes(rows, cols));
      (void)p.compress(
          gc::tensor_view<float const>(std::span<float const>(x),
                                       gc::tensor_id{static_cast<std::uint32_t>(rows)}),
          rows, cols, std::span<std::byte>(out), context());
    }
    w.put("powersgd_state", "rank2", with_prefix({b}, p.save(context())));
    gc::powersgd empty(powersgd_options_of<gc::powersgd_options>(0));
    w.put("powersgd_state", "empty", with_prefix({0}, empty.save()));
  }
  // Controllers, each after a few decisions.
  for (unsigned i = 0; i < std::size(controller_specs); ++i) {
    gc::any_controller c = gc::make_controller(controller_specs[i]);
    drive_controller(c, 5);
    w.put("controller_state", "controller" + std::to_string(i),
          with_prefix({static_cast<std::uint8_t>(i)}, c.save()));
  }
  // Pipeline checkpoints, each after three mirrored steps.
  for (unsigned i = 0; i < std::size(pipeline_setups); ++i) {
    bytes saved;
    (void)recorded([&](scripted_peer& comm) {
      gc::gradient_pipeline p(pipeline_options_of(pipeline_setups[i]));
      pipeline_model model;
      for (int s = 0; s < 3; ++s) (void)p.step(comm, model.views(), pipeline_model::info);
      if (comm.rank() == 0) saved = p.save();
    });
    w.put("checkpoint", "setup" + std::to_string(i),
          with_prefix({static_cast<std::uint8_t>(i)}, saved));
  }
}

void specs(writer& w) {
  auto put = [&](std::uint8_t which, std::string const& name, std::string_view text) {
    w.put("spec", name,
          with_prefix({which}, std::as_bytes(std::span<char const>(text.data(), text.size()))));
  };
  for (std::string_view s : codec_specs) put(0, "codec_" + safe_name(std::string(s)), s);
  for (std::string_view s : controller_specs)
    put(1, "controller_" + safe_name(std::string(s)).substr(0, 60), s);
  // The runtime model (bit 7): ranks, ranks per node, 15 doubles, the topology name.
  for (auto const& [ranks, per_node, name] :
       {std::tuple<std::uint32_t, std::uint32_t, char const*>{16, 4, "aer"},
        {8, 8, "ring"},
        {6, 1, "static-ring"},
        {32, 4, "exp"},
        {12, 3, "complete"}}) {
    bytes b{std::byte{0x80}};
    auto u32 = [&](std::uint32_t v) {
      for (int i = 0; i < 4; ++i) b.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xffu));
    };
    u32(ranks);
    u32(per_node);
    for (double d : {1e-6, 100e9, 10e-6, 3e9, 12e9, 0.1, 0.01, 2.0 / 3.0, 0.005, 32.0, 4e9, 8e9,
                     2.0, 20e9, 4e8}) {
      auto const v = std::bit_cast<std::uint64_t>(d);
      u32(static_cast<std::uint32_t>(v));
      u32(static_cast<std::uint32_t>(v >> 32));
    }
    for (char const* c = name; *c != 0; ++c) b.push_back(static_cast<std::byte>(*c));
    w.put("spec", std::string("model_") + name, b);
  }
  put(2, "powersgd", "powersgd");
  put(2, "powersgd_all", "powersgd:rank=2,min_elements=16,backend=builtin");
  for (unsigned i = 0; i < std::size(pipeline_setups); ++i) {
    pipeline_setup const& s = pipeline_setups[i];
    std::string const text =
        std::string(s.codec) + "\n" + std::string(s.feedback) + "\n" + std::string(s.controller);
    put(static_cast<std::uint8_t>(s.two_way ? 7 : 3), "pipeline" + std::to_string(i), text);
  }
}

void exchanges(writer& w, bool small) {
  std::vector<unsigned> const sizes =
      small ? std::vector<unsigned>{16} : std::vector<unsigned>{4, 16, 40};
  for (unsigned scenario = 0; scenario < peer_scenarios; ++scenario) {
    unsigned variants = std::size(codec_specs);
    if (scenario == 0) variants = 1;
    if (scenario == 4) variants = 4;
    if (scenario == 8) variants = std::size(pipeline_setups);
    for (unsigned v = 0; v < variants; v += (small && scenario != 8 && scenario != 4) ? 7 : 1) {
      for (unsigned n : sizes) {
        std::vector<std::byte> const record =
            recorded([&](scripted_peer& comm) { run_peer(comm, scenario, v, n); });
        w.put("peer",
              "s" + std::to_string(scenario) + "_v" + std::to_string(v) + "_n" + std::to_string(n),
              with_prefix({static_cast<std::uint8_t>(scenario), static_cast<std::uint8_t>(v),
                           static_cast<std::uint8_t>(n)},
                          record));
      }
    }
  }
}

bytes idx_file(std::vector<std::uint32_t> const& dims, std::uint8_t salt) {
  bytes b{std::byte{0}, std::byte{0}, std::byte{8}, static_cast<std::byte>(dims.size())};
  std::size_t count = 1;
  for (std::uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<std::byte>(d >> s));
    count *= d;
  }
  for (std::size_t i = 0; i < count; ++i)
    b.push_back(static_cast<std::byte>((i * 37 + salt) % (salt == 0 ? 10 : 256)));
  return b;
}

void idx(writer& w) {
  bytes const images = idx_file({3, 2, 2}, 1), labels = idx_file({3}, 0);
  w.put("idx", "images", with_prefix({3}, images));
  w.put("idx", "labels", with_prefix({1}, labels));
  bytes pair = with_prefix({0x80, static_cast<std::uint8_t>(images.size()), 0}, images);
  pair.insert(pair.end(), labels.begin(), labels.end());
  w.put("idx", "dataset", pair);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: make_corpus OUT_DIR [--small]\n");
    return 2;
  }
  bool const small = argc > 2 && std::string_view(argv[2]) == "--small";
  try {
    writer w{argv[1]};
    packets(w, small);
    states(w);
    half_feedback(w);
    specs(w);
    exchanges(w, small);
    idx(w);
    std::printf("make_corpus: %zu files, %zu bytes under %s\n", w.files, w.total, argv[1]);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "make_corpus: %s\n", e.what());
    return 1;
  }
  return 0;
}
