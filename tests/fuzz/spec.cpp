// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Fuzz target: the spec parsers, `make_codec`, `make_controller`, `make_powersgd`, the
// gradient pipeline's options (codec, feedback and controller specs together), and the runtime
// model's inputs with the topologies' `from_name`.
//
// Input: one byte choosing the parser (modulo 4: codec, controller, powersgd, pipeline), then
// the spec text; for the pipeline, three lines (codec, feedback, controller), and bit 2 of the
// first byte sets two_way. With bit 7 of the first byte set: the runtime model, from
// `model_input` below (rank count, ranks per node, 15 raw doubles, then the topology name).
//
// Oracles, for a spec that parses:
// - the same spec with its options in reverse order parses to the same thing (option order
//   carries no meaning, except the start steps of a schedule);
// - codec: both compress a fixed tensor to the same bytes, within max_compressed_bytes, and the
//   packet decodes with decompress_any;
// - controller: both save the same state, and still do after two decisions each; a controller
//   rebuilt from its name() saves the same state;
// - pipeline: its (empty) checkpoint loads back;
// - model: parameters that validate give finite, non-negative predictions from every
//   predict_* function; a topology that builds has rows and groups of ranks in [0, n), its
//   groups partition the ranks, and the runtime model's gossip over it is finite.

#include "controller_steps.hpp"
#include "fuzz.hpp"

#include <gradcomp/adapt/any_controller.hpp>
#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/codec/powersgd.hpp>
#include <gradcomp/core/spec.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/model/runtime.hpp>
#include <gradcomp/pipeline/pipeline.hpp>
#include <gradcomp/topology/topology.hpp>

#include <bit>
#include <cmath>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace gc = gradcomp;
using namespace gradcomp_fuzz;

/// `spec` with its options in reverse order, or nothing when it does not parse.
std::optional<std::string> reversed(std::string_view spec) {
  std::optional<std::string> out;
  (void)accepted([&] {
    gc::spec_options o(spec, "fuzz");
    auto const all = o.take_all();
    std::string s = o.name();
    for (std::size_t i = all.size(); i-- > 0;) {
      s += (i + 1 == all.size() ? ":" : ",") + all[i].first + "=" + all[i].second;
    }
    out = s;
  });
  return out;
}

std::vector<std::byte> compressed(gc::any_codec const& c) {
  std::vector<float> const x = sample_tensor(16, 5);
  std::vector<std::byte> p(c.max_compressed_bytes(x.size()));
  std::size_t bytes = 0;
  if (!accepted([&] {
        bytes = c.compress(gc::tensor_view<float const>(std::span<float const>(x)),
                           std::span<std::byte>(p), context());
      })) {
    return {};
  }
  GRADCOMP_FUZZ_CHECK(bytes <= p.size(), "a packet larger than max_compressed_bytes");
  p.resize(bytes);
  std::vector<float> out(x.size());
  GRADCOMP_FUZZ_CHECK(accepted([&] {
                        gc::decompress_any(std::span<std::byte const>(p), std::span<float>(out),
                                           1.0f, false, context());
                      }),
                      "decompress_any rejects the packet of a codec make_codec built");
  return p;
}

void codec(std::string_view spec) {
  std::optional<gc::any_codec> c;
  if (!accepted([&] { c = gc::make_codec(spec); })) return;
  std::vector<std::byte> const p = compressed(*c);
  std::optional<std::string> const r = reversed(spec);
  GRADCOMP_FUZZ_CHECK(r.has_value(), "a codec spec that spec_options cannot split");
  std::optional<gc::any_codec> d;
  GRADCOMP_FUZZ_CHECK(accepted([&] { d = gc::make_codec(*r); }),
                      "the spec with its options reordered does not parse");
  GRADCOMP_FUZZ_CHECK(d->id() == c->id() &&
                          d->max_compressed_bytes(100) == c->max_compressed_bytes(100) &&
                          same_value(static_cast<float>(d->bits_per_element()),
                                     static_cast<float>(c->bits_per_element())),
                      "the spec with its options reordered is another codec");
  GRADCOMP_FUZZ_CHECK(compressed(*d) == p,
                      "the spec with its options reordered compresses differently");
}

void controller(std::string_view spec) {
  std::optional<gc::any_controller> c;
  if (!accepted([&] { c = gc::make_controller(spec); })) return;
  std::vector<std::byte> const s = c->save();
  std::optional<gc::any_controller> byname;
  GRADCOMP_FUZZ_CHECK(
      accepted([&] { byname = gc::make_controller(c->name()); }) && byname->save() == s,
      "a controller rebuilt from its name() differs");
  if (c->name().starts_with("schedule")) return;  // its option order is its schedule
  std::optional<std::string> const r = reversed(spec);
  std::optional<gc::any_controller> d;
  GRADCOMP_FUZZ_CHECK(r && accepted([&] { d = gc::make_controller(*r); }),
                      "the spec with its options reordered does not parse");
  GRADCOMP_FUZZ_CHECK(d->save() == s && d->plan() == c->plan(),
                      "the spec with its options reordered is another controller");
  bool const ok = accepted([&] { drive_controller(*c, 2); });
  GRADCOMP_FUZZ_CHECK(ok == accepted([&] { drive_controller(*d, 2); }),
                      "reordered controllers disagree on a step");
  if (ok) GRADCOMP_FUZZ_CHECK(d->save() == c->save(), "reordered controllers diverge");
}

void powersgd(std::string_view spec) {
  std::optional<gc::powersgd> p;
  if (!accepted([&] { p = gc::make_powersgd(spec); })) return;
  std::optional<std::string> const r = reversed(spec);
  std::optional<gc::powersgd> q;
  GRADCOMP_FUZZ_CHECK(r && accepted([&] { q = gc::make_powersgd(*r); }),
                      "the spec with its options reordered does not parse");
  auto const& a = p->options();
  auto const& b = q->options();
  GRADCOMP_FUZZ_CHECK(
      a.rank == b.rank && a.min_elements == b.min_elements && a.backend == b.backend,
      "the spec with its options reordered is another PowerSGD");
}

void pipeline(std::string_view text, bool two_way) {
  gc::pipeline_options o;
  std::string_view lines[3];
  for (auto& l : lines) {
    std::size_t const nl = text.find('\n');
    l = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
  }
  o.codec = std::string(lines[0]);
  o.feedback = std::string(lines[1]);
  o.controller = std::string(lines[2]);
  o.two_way = two_way;
  std::optional<gc::gradient_pipeline> p;
  if (!accepted([&] { p.emplace(o); })) return;
  std::vector<std::byte> const s = p->save();
  gc::gradient_pipeline q(o);
  GRADCOMP_FUZZ_CHECK(accepted([&] { q.load(std::span<std::byte const>(s)); }) && q.save() == s,
                      "a new pipeline's checkpoint does not load back");
}

bool finite_time(gc::iteration_time const& t) {
  for (double v :
       {t.compute, t.codec, t.communication, t.exposed, t.optimizer, t.bytes_sent, t.total()}) {
    if (!(std::isfinite(v) && v >= 0.0)) return false;
  }
  return true;
}

// Model inputs: u32 ranks, u32 ranks per node, 15 doubles (intra latency and bandwidth, inter
// latency and bandwidth, fabric bandwidth, compute mean, stddev, backward fraction, optimizer,
// codec ratio, compress and decompress bandwidth, hierarchical intra ratio and conversion
// bandwidth, message bytes), then the topology name.
void model(input& in) {
  gc::cluster_params cl;
  cl.ranks = static_cast<int>(in.u32());
  cl.ranks_per_node = static_cast<int>(in.u32());
  auto f64 = [&] {
    return std::bit_cast<double>(static_cast<std::uint64_t>(in.u32()) |
                                 static_cast<std::uint64_t>(in.u32()) << 32);
  };
  cl.intra = {f64(), f64()};
  cl.inter = {f64(), f64()};
  cl.fabric_bandwidth = f64();
  gc::compute_params c;
  c.mean = f64();
  c.stddev = f64();
  c.backward_fraction = f64();
  c.optimizer = f64();
  gc::codec_params k;
  k.ratio = f64();
  k.compress_bandwidth = f64();
  k.decompress_bandwidth = f64();
  gc::hierarchical_params h;
  h.intra_ratio = f64();
  h.intra_convert_bandwidth = f64();
  double const bytes = f64();
  auto const rest = in.rest();
  std::string_view const name(reinterpret_cast<char const*>(rest.data()), rest.size());

  auto check = [](auto&& predict) {
    gc::iteration_time t;
    if (accepted_only<gc::config_error>([&] { t = predict(); }, "runtime model"))
      GRADCOMP_FUZZ_CHECK(finite_time(t), "validated model inputs gave a non-finite prediction");
  };
  check([&] { return gc::predict_allreduce(bytes, cl, c); });
  check([&] { return gc::predict_compressed_allreduce(bytes, cl, c, k); });
  check([&] { return gc::predict_two_way(bytes, cl, c, k); });
  check([&] { return gc::predict_hierarchical_allreduce(bytes, cl, c, k, h); });

  std::optional<gc::topology> topo;
  if (!accepted_only<gc::config_error>(
          [&] { topo.emplace(gc::topology::from_name(name, cl.ranks, cl.ranks_per_node)); },
          "topology"))
    return;
  int const n = topo->size();
  GRADCOMP_FUZZ_CHECK(n >= 1 && n <= gc::topology::max_ranks,
                      "a topology accepted a rank count it cannot index");
  auto in_range = [&](gc::mixing_row const& row) {
    for (auto const& e : row.entries)
      GRADCOMP_FUZZ_CHECK(e.rank >= 0 && e.rank < n, "a mixing row names a rank outside [0, n)");
  };
  // A complete topology's row lists all n ranks: at 2^24 ranks five rows take seconds, which
  // libFuzzer reports as a timeout; its rows are checked up to 4096 ranks.
  bool const small_rows = topo->kind() != gc::topology_kind::complete || n <= 4096;
  for (std::uint64_t s = 0; s < std::min<std::uint64_t>(topo->period(), 64); ++s) {
    for (int r : {0, 1, n / 2, n - 2, n - 1}) {
      if (small_rows && r >= 0 && r < n) in_range(topo->row(s, r));
    }
    if (n <= 256 && topo->group_based()) gc::check_partition(topo->groups(s), n);
  }
  if (n <= 256) check([&] { return gc::predict_gossip(bytes, cl, c, *topo, &k); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  input in(data, size);
  std::uint8_t const which = in.u8();
  if ((which & 0x80u) != 0) {
    model(in);
    return 0;
  }
  auto const rest = in.rest();
  std::string_view const text(reinterpret_cast<char const*>(rest.data()), rest.size());
  switch (which % 4) {
    case 0: codec(text); break;
    case 1: controller(text); break;
    case 2: powersgd(text); break;
    default: pipeline(text, (which & 4u) != 0); break;
  }
  return 0;
}
