// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// The bucketed collective (collective/bucket.hpp) with device codecs, checked on a machine
// without a GPU, against the CPU bucketed collective with the CPU codecs of the same formats.
//
// What is real and what is emulated (as in collective_host.cu): real are `bucketed_all_reduce`
// and its bucket engine with the device memory space (the fused buckets, packets, concatenated
// values and gathered packets in device buffers; copies and the averaging scale through
// `device_memory::copy` and `scale`), the device codecs' header code, checks and passes,
// `cuda::device_compressor`, and the CPU collective they are compared with. Emulated: this file
// is built with Thrust's CPP device system, so "device" memory is host memory that
// cuda/memory.cuh records as device allocations, kernels run on the calling thread and streams
// are ignored; the communicator is `emulated_nccl` (emulated_nccl.cuh), which records which
// operations carried device payloads and which host control messages.
//
// Compared byte for byte over several steps on 2, 3 and 4 ranks, per tensor and per bucket, sum
// and average, with the pipeline on and off: every rank's outputs, the bucket results, and with
// error feedback every residual; with bad inputs, the exception type each rank throws (the CPU
// collective's) and residuals that stay as they were.

#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include "../unit/support/rank_check.hpp"
#include "device_buffers.cuh"
#include "emulated_nccl.cuh"

#include <gradcomp/codec/cast.hpp>
#include <gradcomp/codec/dithering.hpp>
#include <gradcomp/codec/int8.hpp>
#include <gradcomp/codec/onebit.hpp>
#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/cuda/cast.cuh>
#include <gradcomp/cuda/collective.cuh>
#include <gradcomp/cuda/dithering.cuh>
#include <gradcomp/cuda/int8.cuh>
#include <gradcomp/cuda/memory.cuh>
#include <gradcomp/cuda/onebit.cuh>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/feedback/dgc.hpp>
#include <gradcomp/feedback/policies.hpp>

#include <cmath>
#include <cstdint>
#include <deque>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

using gc::cuda::memory_kind;
using gc::cuda::memory_kind_of;
using namespace gct;  // NOLINT(google-build-using-namespace): the test support

namespace {

// ---------------------------------------------------------------------------------------------
// The layout: eleven tensors of odd sizes. With min_compress_elements = 100 and buckets of 3000
// float32 elements, 0, 3, 17, 64 and 1 go dense (one bucket), and the compressed ones make
// three buckets: {1000, 1200}, {4099} (larger than a bucket: its own) and {513, 1531, 700}.

std::vector<std::size_t> const sizes = {3, 1000, 17, 1200, 0, 4099, 513, 64, 1531, 1, 700};
constexpr std::size_t expected_buckets = 4;
constexpr std::size_t compressed_tensors = 6;

gc::tensor_id id_of(std::size_t i) { return gc::tensor_id{static_cast<std::uint32_t>(10 + i)}; }

gc::bucket_options options(gc::bucket_compression mode, gc::reduction op, bool pipeline) {
  gc::bucket_options o;
  o.bucket_bytes = 4 * 3000;
  o.min_compress_elements = 100;
  o.mode = mode;
  o.op = op;
  o.pipeline = pipeline;
  return o;
}

// Gradient of tensor i on rank r at a step (device_buffers.cuh's inputs).
std::vector<float> gradient(std::size_t i, int r, std::uint32_t step) {
  return gradient_of(sizes[i],
                     1000u * static_cast<unsigned>(r) + 17u * step + 7919u * i + sizes[i]);
}

gc::codec_context rank_context(int r, std::uint32_t step, bool shared = false) {
  return rank_context_of(r, step, 0xb0c4e700u, shared);
}

// One rank after a step: every output, every residual (empty where a tensor has none: dense
// tensors, and per bucket all but a bucket's first), and what the collective reported.
struct rank_state {
  std::vector<std::vector<float>> out;
  std::vector<std::vector<float>> residual;
  gc::bucket_result res;
};

template <class Source>
std::vector<float> residual_of(Source& src, gc::tensor_id id) {
  if constexpr (requires { { src.state(id) } -> std::convertible_to<std::span<float const>>; }) {
    return to_host(src.state(id));  // cuda::device_compressor: device memory
  } else if constexpr (requires { src.state(id).values(); }) {
    auto const e = src.state(id).values();  // compressor<C, F>
    return {e.begin(), e.end()};
  } else {
    return {};  // no feedback
  }
}

template <class Source>
void read_residuals(Source& src, rank_state& st) {
  st.residual.clear();
  for (std::size_t i = 0; i < sizes.size(); ++i) st.residual.push_back(residual_of(src, id_of(i)));
}

template <class Source>
bool residuals_on_device(Source const& src) {
  if constexpr (requires { { src.state(gc::tensor_id{}) } -> std::convertible_to<std::span<float const>>; }) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      auto const e = src.state(id_of(i));
      if (!e.empty() && memory_kind_of(e.data()) != memory_kind::device) return false;
    }
  }
  return true;
}

// One step of rank r on the CPU: host tensors.
template <class Source, class Comm>
rank_state cpu_step(Comm& comm, gc::bucketed_all_reduce<Source>& b, int r, std::uint32_t step,
                    std::vector<std::vector<float>> const& grads) {
  std::vector<std::vector<float>> out;
  std::vector<gc::bucket_item> items;
  for (std::size_t i = 0; i < grads.size(); ++i) out.emplace_back(sizes[i], -7.0f);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    items.push_back({gc::tensor_view<float const>(std::span<float const>(grads[i]), id_of(i)),
                     std::span<float>(out[i])});
  }
  rank_state st;
  st.res = b.run(comm, std::span<gc::bucket_item const>(items),
                 rank_context(r, step, shared_support(b.source())));
  st.out = std::move(out);
  read_residuals(b.source(), st);
  return st;
}

// One step of rank r on the emulated device: device tensors.
template <class Source, class Comm>
rank_state device_step(Comm& comm, gc::bucketed_all_reduce<Source>& b, int r, std::uint32_t step,
                       std::vector<std::vector<float>> const& grads) {
  std::vector<gc::cuda::device_buffer> g, o;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    g.push_back(to_device(grads[i]));
    o.push_back(to_device(std::vector<float>(sizes[i], -7.0f)));
  }
  std::vector<gc::bucket_item> items;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    items.push_back({gc::tensor_view<float const>(
                         std::span<float const>(floats(g[i], grads[i].size())), id_of(i)),
                     floats(o[i], sizes[i])});
  }
  rank_state st;
  st.res = b.run(comm, std::span<gc::bucket_item const>(items),
                 rank_context(r, step, shared_support(b.source())));
  for (std::size_t i = 0; i < grads.size(); ++i) st.out.push_back(to_host(o[i], sizes[i]));
  read_residuals(b.source(), st);
  return st;
}

std::vector<std::vector<float>> gradients(int r, std::uint32_t step) {
  std::vector<std::vector<float>> g;
  for (std::size_t i = 0; i < sizes.size(); ++i) g.push_back(gradient(i, r, step));
  return g;
}

void expect_same(std::vector<rank_state> const& cpu, std::vector<rank_state> const& dev) {
  REQUIRE(cpu.size() == dev.size());
  for (std::size_t r = 0; r < cpu.size(); ++r) {
    INFO("rank " << r);
    REQUIRE(cpu[r].out.size() == dev[r].out.size());
    for (std::size_t i = 0; i < cpu[r].out.size(); ++i) {
      INFO("tensor " << i << " (" << sizes[i] << " elements)");
      CHECK(same_bits(cpu[r].out[i], dev[r].out[i]));
      CHECK(same_bits(cpu[r].residual[i], dev[r].residual[i]));
    }
    CHECK(cpu[r].res.buckets == dev[r].res.buckets);
    CHECK(cpu[r].res.dense_buckets == dev[r].res.dense_buckets);
    CHECK(cpu[r].res.packet_bytes == dev[r].res.packet_bytes);
    CHECK(cpu[r].res.wire_bytes == dev[r].res.wire_bytes);
  }
}

// Control messages of one bucketed call: the layout round, one agreement round per compressed
// bucket (a 32-byte report and one 8-byte size per tensor of the bucket, at most 3 here) and the
// outcome round; nothing larger goes through the host.
constexpr std::size_t control_bound = 32 + 8 * 3;

// What a step of the device run sent and kept: payloads on the device (one operation per
// bucket), control messages on the host (the layout round, one agreement round per compressed
// bucket, the outcome round), never mixed; `residuals` non-empty residuals on every rank.
void expect_traffic(std::vector<rank_state> const& got, traffic const& log, int w,
                    std::size_t residuals) {
  auto const uw = static_cast<std::size_t>(w);
  std::size_t const buckets = got[0].res.buckets;
  std::size_t const compressed = buckets - got[0].res.dense_buckets;
  CHECK(buckets == expected_buckets);
  CHECK(compressed == expected_buckets - 1);
  CHECK(log.device_ops == uw * buckets);
  CHECK(log.host_ops == uw * (2 + compressed));
  CHECK(log.host_max <= control_bound);
  CHECK(log.mixed == 0);
  for (auto const& st : got) {
    std::size_t kept = 0;
    for (auto const& e : st.residual) kept += e.empty() ? 0 : 1;
    CHECK(kept == residuals);
  }
}

// Runs `steps` steps of bucketed_all_reduce on w ranks with the CPU sources `make_cpu()` and
// the device sources `make_dev()` (one per rank), and compares every step. The sources live on
// across steps (error feedback); after each step every rank holds `residuals` non-empty
// residuals (none without feedback; with it one per compressed tensor, or per compressed bucket).
template <class MakeCpu, class MakeDev>
void compare_runs(MakeCpu&& make_cpu, MakeDev&& make_dev, int w, gc::bucket_options opt, int steps,
                  std::size_t residuals) {
  using cpu_source = decltype(make_cpu());
  using dev_source = decltype(make_dev());
  std::deque<gc::bucketed_all_reduce<cpu_source>> cpus;
  std::deque<gc::bucketed_all_reduce<dev_source>> devs;
  for (int r = 0; r < w; ++r) {
    cpus.emplace_back(make_cpu(), opt);
    devs.emplace_back(make_dev(), opt);
  }
  auto cpu = [&](gc::in_process_communicator& comm, int r, std::uint32_t s) {
    return cpu_step(comm, cpus[static_cast<std::size_t>(r)], r, s, gradients(r, s));
  };
  auto device = [&](emulated_nccl& comm, int r, std::uint32_t s) {
    rank_state st = device_step(comm, devs[static_cast<std::size_t>(r)], r, s, gradients(r, s));
    RANK_REQUIRE(residuals_on_device(devs[static_cast<std::size_t>(r)].source()));
    return st;
  };
  compare_steps<rank_state>(w, steps, cpu, device,
                            [&](auto const& want, auto const& got, traffic const& log) {
                              expect_same(want, got);
                              expect_traffic(got, log, w, residuals);
                            });
}

}  // namespace

TEST_CASE("cuda bucket: a bucketed_all_reduce of a device source keeps its payloads on the device",
          "[cuda][bucket]") {
  using dev = gc::cuda::stream_codec<gc::cuda::int8_codec>;
  static_assert(std::is_same_v<gc::bucketed_all_reduce<dev>::memory_type, gc::cuda::device_memory>);
  static_assert(
      std::is_same_v<
          gc::bucketed_all_reduce<gc::cuda::device_compressor<gc::cuda::int8_codec>>::memory_type,
          gc::cuda::device_memory>);
  static_assert(gc::bucketed_all_reduce<gc::int8_codec>::memory_type::on_host);
  static_assert(gc::memory_space<gc::cuda::device_memory> && gc::memory_space<gc::host_memory>);
  // copy and scale of the device space: the host space's bits, on device memory.
  std::vector<float> x = gradient(6, 0, 0);  // 4099 values
  x[5] = 1e-39f;                             // a subnormal stays one (no flush to zero)
  x[6] = -0.0f;
  gc::cuda::device_buffer a = to_device(x), b;
  b.resize(a.size());
  gc::cuda::device_memory const mem;
  mem.copy(b.span(), std::as_const(a).span());
  CHECK(same_bits(to_host(b, x.size()), x));
  for (float alpha : {0.5f, 1.0f / 3.0f, 0.25f}) {
    std::vector<float> want = x;
    gc::host_memory{}.scale(std::span<float>(want), alpha);
    mem.scale(floats(b, x.size()), alpha);
    CHECK(same_bits(to_host(b, x.size()), want));
    mem.copy(b.span(), std::as_const(a).span());
  }
}

TEST_CASE("cuda bucket: bucketed_all_reduce with device codecs equals the CPU bucketed collective",
          "[cuda][bucket]") {
  for_each_codec_pair([](char const* name, auto cpu, auto dev) {
    auto make_cpu = [&] { return cpu; };
    auto make_dev = [&] { return gc::cuda::stream_codec<decltype(dev)>(dev); };
    for (int w : {2, 3, 4}) {
      for (auto mode : {gc::bucket_compression::per_tensor, gc::bucket_compression::per_bucket}) {
        for (gc::reduction op : {gc::reduction::sum, gc::reduction::average}) {
          for (bool pipeline : {true, false}) {
            if (!pipeline && w != 2) continue;  // the serial order on 2 ranks only
            INFO(name << ", " << w << " ranks, "
                      << (mode == gc::bucket_compression::per_tensor ? "per tensor" : "per bucket")
                      << ", " << (op == gc::reduction::sum ? "sum" : "average")
                      << (pipeline ? "" : ", no pipeline"));
            compare_runs(make_cpu, make_dev, w, options(mode, op, pipeline), 2, 0);
          }
        }
      }
    }
  });
}

TEST_CASE(
    "cuda bucket: device error feedback through bucketed_all_reduce equals "
    "compressor<residual_feedback>",
    "[cuda][bucket][feedback]") {
  for_each_codec_pair([](char const* name, auto cpu, auto dev) {
    using cpu_type = gc::compressor<decltype(cpu), gc::residual_feedback>;
    using dev_type = gc::cuda::device_compressor<decltype(dev)>;
    for (int w : {2, 3, 4}) {
      for (auto mode : {gc::bucket_compression::per_tensor, gc::bucket_compression::per_bucket}) {
        gc::reduction const op = w == 3 ? gc::reduction::sum : gc::reduction::average;
        INFO(name << ", " << w << " ranks, "
                  << (mode == gc::bucket_compression::per_tensor ? "per tensor" : "per bucket"));
        compare_runs(
            [&] { return cpu_type(cpu); },
            [&] { return dev_type(gc::cuda::stream_codec<decltype(dev)>(dev)); }, w,
            options(mode, op, true), 3,
            mode == gc::bucket_compression::per_tensor ? compressed_tensors : expected_buckets - 1);
      }
    }
  });
}

TEST_CASE(
    "cuda bucket: device EF21 and DGC through bucketed_all_reduce equal compressor<ef21_feedback> and "
    "compressor<dgc_feedback>",
    "[cuda][bucket][feedback]") {
  for_each_codec_pair([](char const* name, auto cpu, auto dev) {
    using scodec = gc::cuda::stream_codec<decltype(dev)>;
    for (int w : {2, 3, 4}) {
      auto const uw = static_cast<std::uint32_t>(w);
      auto compare = [&](char const* rule, auto cpu_rule, auto dev_rule) {
        using cpu_type = gc::compressor<decltype(cpu), decltype(cpu_rule)>;
        using dev_type = gc::cuda::device_compressor<decltype(dev), decltype(dev_rule)>;
        for (auto mode : {gc::bucket_compression::per_tensor, gc::bucket_compression::per_bucket}) {
          gc::reduction const op = w == 3 ? gc::reduction::sum : gc::reduction::average;
          INFO(name << ", " << rule << ", " << w << " ranks, "
                    << (mode == gc::bucket_compression::per_tensor ? "per tensor" : "per bucket"));
          compare_runs([&] { return cpu_type(cpu, cpu_rule); }, [&] { return dev_type(scodec(dev), dev_rule); }, w,
                       options(mode, op, w != 3), 3,
                       mode == gc::bucket_compression::per_tensor ? compressed_tensors : expected_buckets - 1);
        }
      };
      compare("ef21", gc::ef21_feedback{}, gc::cuda::device_ef21_rule{});
      compare("dgc:momentum=0.9", gc::dgc_feedback(0.9f), gc::cuda::device_dgc_rule(0.9f));
      compare("dgc:momentum=0.5,clip=3", gc::dgc_feedback(0.5f, 3.0, uw), gc::cuda::device_dgc_rule(0.5f, 3.0, uw));
    }
  });
}

TEST_CASE("cuda bucket: bad inputs fail the device step as the CPU step, residuals kept",
          "[cuda][bucket][failure]") {
  // Residual feedback, EF21 and DGC with clipping (int8; DGC also with top-k, whose masking
  // reads the packet's support).
  auto check = [](char const* source, auto make_cpu, auto make_dev) {
  using cpu_source = decltype(make_cpu());
  using dev_source = decltype(make_dev());
  for (auto mode : {gc::bucket_compression::per_tensor, gc::bucket_compression::per_bucket}) {
    for (int w : {2, 3, 4}) {
      INFO(source << ", " << w << " ranks, "
             << (mode == gc::bucket_compression::per_tensor ? "per tensor" : "per bucket"));
      gc::bucket_options const opt = options(mode, gc::reduction::average, true);
      std::deque<gc::bucketed_all_reduce<cpu_source>> cpus;
      std::deque<gc::bucketed_all_reduce<dev_source>> devs;
      for (int r = 0; r < w; ++r) {
        cpus.emplace_back(make_cpu(), opt);
        devs.emplace_back(make_dev(), opt);
      }
      // One step of rank r on either backend, with the gradients `grads` (tensor i of
      // grads[i].size() elements, its output of sizes[i]).
      auto cpu = [&](auto& comm, int r, std::vector<std::vector<float>> const& grads) {
        (void)cpu_step(comm, cpus[static_cast<std::size_t>(r)], r, 1, grads);
      };
      auto dev = [&](auto& comm, int r, std::vector<std::vector<float>> const& grads) {
        (void)device_step(comm, devs[static_cast<std::size_t>(r)], r, 1, grads);
      };
      auto residuals = [&] {
        std::vector<rank_state> st(2 * static_cast<std::size_t>(w));
        for (int r = 0; r < w; ++r) {
          read_residuals(cpus[static_cast<std::size_t>(r)].source(),
                         st[static_cast<std::size_t>(r)]);
          read_residuals(devs[static_cast<std::size_t>(r)].source(),
                         st[static_cast<std::size_t>(w + r)]);
        }
        return st;
      };
      // A first step that succeeds everywhere: residuals to keep.
      for (thrown t : run_failing<false>(w, [&](auto&c, int r) { cpu(c, r, gradients(r, 0)); }))
        CHECK(t == thrown::nothing);
      for (thrown t : run_failing<true>(w, [&](auto&c, int r) { dev(c, r, gradients(r, 0)); }))
        CHECK(t == thrown::nothing);
      auto const before = residuals();
      for (std::size_t i = 0; i < before.size() / 2; ++i) {
        for (std::size_t t = 0; t < sizes.size(); ++t) {
          CHECK(same_bits(before[i].residual[t], before[i + before.size() / 2].residual[t]));
        }
      }

      // Each bad input: the CPU's exception on every rank, then every residual as it was.
      auto expect_failure = [&](char const* what, auto&& grads_of, std::vector<thrown> const& want,
                                auto&& skip) {
        INFO(what);
        auto const got_cpu = run_failing<false>(w, [&](auto& c, int r) {
          if (skip(r)) throw std::runtime_error("rank lost");
          cpu(c, r, grads_of(r));
        });
        auto const got_dev = run_failing<true>(w, [&](auto& c, int r) {
          if (skip(r)) throw std::runtime_error("rank lost");
          dev(c, r, grads_of(r));
        });
        CHECK(got_cpu == want);
        CHECK(got_dev == got_cpu);
        auto const after = residuals();
        for (std::size_t i = 0; i < after.size(); ++i) {
          for (std::size_t t = 0; t < sizes.size(); ++t) {
            CHECK(same_bits(before[i].residual[t], after[i].residual[t]));
          }
        }
      };
      auto none = [](int) { return false; };
      auto const uw = static_cast<std::size_t>(w);
      auto one_then_comm = [&](thrown first) {
        std::vector<thrown> v(uw, thrown::comm);
        v[1] = first;
        return v;
      };
      // Rank 1 passes a gradient of 999 elements for tensor 3's output of 1200: its own
      // config_error at the layout round, comm_error on the others.
      // Rank 1's gradients of step 1, edited by `edit`.
      auto rank1 = [&](auto edit) {
        return [=](int r) {
          auto g = gradients(r, 1);
          if (r == 1) edit(g);
          return g;
        };
      };
      expect_failure("mismatched sizes", rank1([](auto& g) { g[3].resize(999); }),
                     one_then_comm(thrown::config), none);
      // A NaN on rank 1 in the last compressed bucket (tensor 8, of the bucket {513, 1531,
      // 700}): two buckets have been decoded, their feedback staged, when the agreement round of
      // the third fails every rank; nothing is committed.
      expect_failure("NaN in the last bucket", rank1([](auto& g) { g[8][100] = std::nanf(""); }),
                     one_then_comm(thrown::numeric), none);
      // A NaN in the first compressed bucket.
      expect_failure("NaN in the first bucket", rank1([](auto& g) { g[1][0] = std::nanf(""); }),
                     one_then_comm(thrown::numeric), none);
      // The last rank disappears before the collective: comm_error on every other rank.
      std::vector<thrown> lost(uw, thrown::comm);
      lost[uw - 1] = thrown::other;
      expect_failure(
          "a vanished rank", [&](int r) { return gradients(r, 1); }, lost,
          [&](int r) { return r == w - 1; });

      // After the failures both backends take the next step alike.
      std::vector<rank_state> want(uw), got(uw);
      REQUIRE_NOTHROW(gc::run_in_process(w, [&](gc::in_process_communicator& comm) {
        int const r = comm.rank();
        want[static_cast<std::size_t>(r)] =
            cpu_step(comm, cpus[static_cast<std::size_t>(r)], r, 2, gradients(r, 2));
      }));
      traffic log;
      REQUIRE_NOTHROW(gc::run_in_process(w, [&](gc::in_process_communicator& inner) {
        emulated_nccl comm(inner, log);
        int const r = comm.rank();
        got[static_cast<std::size_t>(r)] =
            device_step(comm, devs[static_cast<std::size_t>(r)], r, 2, gradients(r, 2));
      }));
      expect_same(want, got);
    }
  }
  };
  using int8_dev = gc::cuda::stream_codec<gc::cuda::int8_codec>;
  check(
      "residual", [] { return gc::compressor<gc::int8_codec, gc::residual_feedback>(gc::int8_codec{}); },
      [] { return gc::cuda::device_compressor<gc::cuda::int8_codec>(int8_dev{}); });
  check(
      "ef21", [] { return gc::compressor<gc::int8_codec, gc::ef21_feedback>(gc::int8_codec{}); },
      [] { return gc::cuda::device_compressor<gc::cuda::int8_codec, gc::cuda::device_ef21_rule>(int8_dev{}); });
  check(
      "dgc:clip=3",
      [] { return gc::compressor<gc::int8_codec, gc::dgc_feedback>(gc::int8_codec{}, gc::dgc_feedback(0.9f, 3.0, 2)); },
      [] {
        return gc::cuda::device_compressor<gc::cuda::int8_codec, gc::cuda::device_dgc_rule>(
            int8_dev{}, gc::cuda::device_dgc_rule(0.9f, 3.0, 2));
      });
  check(
      "topk, dgc",
      [] { return gc::compressor<gc::topk_codec, gc::dgc_feedback>(gc::topk_codec::ratio(0.1)); },
      [] {
        return gc::cuda::device_compressor<gc::cuda::topk_codec, gc::cuda::device_dgc_rule>(
            gc::cuda::stream_codec<gc::cuda::topk_codec>(gc::cuda::topk_codec::ratio(0.1)));
      });
}

TEST_CASE("cuda bucket: options a device source does not take are errors on every rank",
          "[cuda][bucket][failure]") {
  using dev_source = gc::cuda::stream_codec<gc::cuda::int8_codec>;
  auto refused = [](gc::bucket_options const& opt) {
    return run_failing<true>(3, [&](emulated_nccl& comm, int r) {
      gc::bucketed_all_reduce<dev_source> b(dev_source{}, opt);
      (void)device_step(comm, b, r, 0, gradients(r, 0));
    });
  };
  // Refused whatever the layout (also where no tensor goes dense), so that a configuration
  // does not work or fail by the tensor sizes of the day.
  gc::bucket_options const base =
      options(gc::bucket_compression::per_tensor, gc::reduction::sum, true);
  std::vector<gc::bucket_options> bad(4, base);
  bad[0].checksum = true;
  bad[1].small_format = gc::dense_format::f16;
  bad[2].small_format = gc::dense_format::bf16;
  bad[3].small_format = gc::dense_format::f16;
  bad[3].min_compress_elements = 0;
  for (std::size_t k = 0; k < bad.size(); ++k) {
    INFO("options " << k);
    for (thrown t : refused(bad[k])) CHECK(t == thrown::config);
  }
}
