// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Device codecs through all_reduce_compressed over the NCCL adapter, on real GPUs: the device
// result, and with error feedback the residuals, must equal the CPU collective's (in-process
// ranks, the same inputs) byte for byte. Runs 1 rank on device 0, and 2 ranks (one per device)
// where the machine has two GPUs: NCCL does not allow two ranks of one communicator on one
// device. Two-way compression (all_reduce_two_way with the device residual feedback of
// `two_way_compressor<stream_codec<C>>`) runs the same way: results, worker and server
// residuals byte for byte the CPU two-way collective's. The bucketed collective
// (bucketed_all_reduce of `device_compressor<C>` over device tensors, per tensor and per bucket)
// too: every output and residual byte for byte the CPU bucketed collective's; and the pipeline
// with a device source (`gradient_pipeline` over `device_compressor<C>`): outputs, residuals,
// save() and the measured gain byte for byte the CPU pipeline's. Then, with 2 GPUs, a
// rank that never joins
// must give comm_error at the timeout on its peer, not a hang. Exits 77 (ctest: skipped) without a
// usable CUDA device. Own harness, like nccl_comm.cu: Catch2's assertions are not thread-safe.

#include <gradcomp/comm/nccl.cuh>

#include <gradcomp/codec/cast.hpp>
#include <gradcomp/codec/dithering.hpp>
#include <gradcomp/codec/int8.hpp>
#include <gradcomp/codec/onebit.hpp>
#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/collective/hierarchical.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/cuda/cast.cuh>
#include <gradcomp/cuda/collective.cuh>
#include <gradcomp/cuda/dithering.cuh>
#include <gradcomp/cuda/int8.cuh>
#include <gradcomp/cuda/onebit.cuh>
#include <gradcomp/cuda/powersgd.cuh>
#include <gradcomp/cuda/topk.cuh>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/pipeline/pipeline.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu_harness.hpp"

namespace gct_gpu {

// Inside this named namespace only: a global (or unnamed-namespace) using-directive would make
// `cuda` ambiguous (with libcu++'s ::cuda) in the code nvcc generates for the kernels.
using namespace gradcomp;
namespace gcu = gradcomp::cuda;

using gpu_harness::cuda_ok;
using gpu_harness::device_count_or_skip;
using gpu_harness::expect;
using gpu_harness::failures;

std::vector<float> gradient(std::size_t n, int r, std::uint32_t step) {
  std::mt19937_64 rng(1000u * static_cast<unsigned>(r) + 17u * step + n);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(n);
  for (auto& v : g) v = normal(rng);
  return g;
}

codec_context rank_context(int r, std::uint32_t step) {
  codec_context ctx;
  ctx.seed = 0x5eed0000u + static_cast<std::uint64_t>(r);
  ctx.step = step;
  return ctx;
}

constexpr std::size_t elements = (1u << 20) + 3;
constexpr std::uint32_t steps = 3;

// Runs `body(comm)` on w ranks, one thread and one GPU each, with an NCCL communicator on a
// non-blocking stream of that GPU; an exception fails the rank's check named `what`.
template <class Body>
void on_ranks(int w, std::string const& what, Body&& body) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) throw std::runtime_error("ncclGetUniqueId failed");
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r) {
    threads.emplace_back([&, r] {
      try {
        cuda_ok(cudaSetDevice(r), "cudaSetDevice");
        cudaStream_t stream = nullptr;
        cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
        {
          nccl_communicator comm =
              nccl_communicator::init_rank(w, id, r, stream, {std::chrono::seconds(60)});
          body(comm);
        }
        (void)cudaStreamDestroy(stream);
      } catch (std::exception const& e) {
        expect(false, r, w, what + ": exception: " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
}

// `steps` steps of `fn(comm, r, s)` on w in-process ranks: what each returns (a flat float
// vector), per step and rank.
template <class Fn>
std::vector<std::vector<std::vector<float>>> reference_steps(int w, Fn&& fn) {
  std::vector<std::vector<std::vector<float>>> want(
      steps, std::vector<std::vector<float>>(static_cast<std::size_t>(w)));
  for (std::uint32_t s = 0; s < steps; ++s) {
    run_in_process(w, [&](in_process_communicator& comm) {
      int const r = comm.rank();
      want[s][static_cast<std::size_t>(r)] = fn(comm, r, s);
    });
  }
  return want;
}

// The CPU collective with error feedback, `steps` steps: per step and rank, the output and
// then the residual, flattened.
template <class CpuCodec>
std::vector<std::vector<std::vector<float>>> cpu_reference(CpuCodec const& codec, int w) {
  using comp = compressor<CpuCodec, residual_feedback>;
  std::vector<comp> comps(static_cast<std::size_t>(w), comp(codec));
  return reference_steps(w, [&](in_process_communicator& comm, int r, std::uint32_t s) {
    auto const ur = static_cast<std::size_t>(r);
    std::vector<float> const g = gradient(elements, r, s);
    std::vector<float> o(elements);
    all_reduce_compressed(comm, comps[ur],
                          tensor_view<float const>(std::span<float const>(g), tensor_id{3}),
                          std::span<float>(o), rank_context(r, s), {.op = reduction::average});
    auto const e = comps[ur].state(tensor_id{3}).values();
    o.insert(o.end(), e.begin(), e.end());
    return o;
  });
}

// A rank's gradient and output of `elements` floats in device memory on the communicator's
// stream: `upload` copies the gradient of a step in, `output` copies the result out.
struct device_tensors {
  cudaStream_t stream;
  gcu::device_buffer g, o;
  explicit device_tensors(cudaStream_t s) : stream(s), g(s), o(s) {
    g.resize(elements * sizeof(float));
    o.resize(elements * sizeof(float));
  }
  void upload(int r, std::uint32_t s) {
    std::vector<float> const hg = gradient(elements, r, s);
    cuda_ok(cudaMemcpyAsync(g.data(), hg.data(), g.size(), cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
  }
  [[nodiscard]] tensor_view<float const> grad() const {
    return {std::span<float const>(reinterpret_cast<float const*>(g.data()), elements), tensor_id{3}};
  }
  [[nodiscard]] std::span<float> out() { return {reinterpret_cast<float*>(o.data()), elements}; }
  [[nodiscard]] std::vector<float> output() {
    std::vector<float> got(elements);
    cuda_ok(cudaMemcpyAsync(got.data(), o.data(), o.size(), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return got;
  }
};

// One rank of the device run: `steps` steps through NCCL, compared with the reference.
template <class CudaCodec>
void device_rank(nccl_communicator& comm, CudaCodec const& codec, char const* name,
                 std::vector<std::vector<std::vector<float>>> const& want) {
  int const r = comm.rank();
  int const w = comm.size();
  auto const ur = static_cast<std::size_t>(r);
  gcu::device_compressor<CudaCodec> comp(gcu::stream_codec<CudaCodec>(codec, comm.stream()));
  device_tensors io(comm.stream());
  for (std::uint32_t s = 0; s < steps; ++s) {
    io.upload(r, s);
    all_reduce_compressed(comm, comp, io.grad(), io.out(), rank_context(r, s), {.op = reduction::average});
    std::vector<float> const got = io.output();
    std::vector<float> e(elements);
    auto const res = comp.residual(tensor_id{3});
    cuda_ok(cudaMemcpyAsync(e.data(), res.data(), res.size_bytes(), cudaMemcpyDeviceToHost,
                            comm.stream()),
            "cudaMemcpyAsync");
    cuda_ok(cudaStreamSynchronize(comm.stream()), "cudaStreamSynchronize");
    std::string const what = std::string(name) + ", step " + std::to_string(s);
    expect(std::memcmp(got.data(), want[s][ur].data(), elements * sizeof(float)) == 0, r, w,
           what + ": output");
    expect(std::memcmp(e.data(), want[s][ur].data() + elements, elements * sizeof(float)) == 0, r,
           w, what + ": residual");
  }
}

template <class CpuCodec, class CudaCodec>
void check_codec(char const* name, CpuCodec const& cpu, CudaCodec const& dev, int w) {
  auto const want = cpu_reference(cpu, w);
  on_ranks(w, name, [&](nccl_communicator& comm) { device_rank(comm, dev, name, want); });
  std::printf("%s on %d rank(s): %s\n", name, w,
              failures.load() == 0 ? "identical to the CPU" : "FAILED");
}

// Two-way compression: the CPU collective's result, worker residuals (every shard) and server
// residual (the rank's shard), per step and rank, flattened in that order.
template <class CpuCodec>
std::vector<std::vector<std::vector<float>>> cpu_two_way_reference(CpuCodec const& codec, int w) {
  std::vector<two_way_compressor<CpuCodec>> tws(static_cast<std::size_t>(w),
                                                two_way_compressor<CpuCodec>(codec));
  return reference_steps(w, [&](in_process_communicator& comm, int r, std::uint32_t s) {
    auto const ur = static_cast<std::size_t>(r);
    std::vector<float> const g = gradient(elements, r, s);
    std::vector<float> o(elements);
    all_reduce_two_way(comm, tws[ur],
                       tensor_view<float const>(std::span<float const>(g), tensor_id{4}),
                       std::span<float>(o), rank_context(r, s), {.op = reduction::average});
    for (int k = 0; k < w; ++k) {
      auto const e = tws[ur].worker_residual(
          shard_key{tensor_id{4}, static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(w)});
      o.insert(o.end(), e.begin(), e.end());
    }
    auto const e = tws[ur].server_residual(
        shard_key{tensor_id{4}, static_cast<std::uint32_t>(r), static_cast<std::uint32_t>(w)});
    o.insert(o.end(), e.begin(), e.end());
    return o;
  });
}

template <class CudaCodec>
void device_two_way_rank(nccl_communicator& comm, CudaCodec const& codec, char const* name,
                         std::vector<std::vector<std::vector<float>>> const& want) {
  int const r = comm.rank();
  int const w = comm.size();
  auto const ur = static_cast<std::size_t>(r);
  two_way_compressor<gcu::stream_codec<CudaCodec>> tw(
      gcu::stream_codec<CudaCodec>(codec, comm.stream()));
  gcu::device_buffer g(comm.stream()), o(comm.stream());
  g.resize(elements * sizeof(float));
  o.resize(elements * sizeof(float));
  for (std::uint32_t s = 0; s < steps; ++s) {
    std::vector<float> const hg = gradient(elements, r, s);
    cuda_ok(cudaMemcpyAsync(g.data(), hg.data(), g.size(), cudaMemcpyHostToDevice, comm.stream()),
            "cudaMemcpyAsync");
    all_reduce_two_way(
        comm, tw,
        tensor_view<float const>(
            std::span<float const>(reinterpret_cast<float const*>(g.data()), elements),
            tensor_id{4}),
        std::span<float>(reinterpret_cast<float*>(o.data()), elements), rank_context(r, s),
        {.op = reduction::average});
    std::vector<float> got(elements);
    cuda_ok(cudaMemcpyAsync(got.data(), o.data(), o.size(), cudaMemcpyDeviceToHost, comm.stream()),
            "cudaMemcpyAsync");
    auto append = [&](std::span<float const> e) {
      std::size_t const at = got.size();
      got.resize(at + e.size());
      cuda_ok(cudaMemcpyAsync(got.data() + at, e.data(), e.size_bytes(), cudaMemcpyDeviceToHost,
                              comm.stream()),
              "cudaMemcpyAsync");
    };
    // The residual spans stay valid until the next step; copy each one in order.
    for (int k = 0; k < w; ++k) {
      append(tw.worker_residual(
          shard_key{tensor_id{4}, static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(w)}));
      cuda_ok(cudaStreamSynchronize(comm.stream()), "cudaStreamSynchronize");
    }
    append(tw.server_residual(
        shard_key{tensor_id{4}, static_cast<std::uint32_t>(r), static_cast<std::uint32_t>(w)}));
    cuda_ok(cudaStreamSynchronize(comm.stream()), "cudaStreamSynchronize");
    std::string const what = std::string(name) + " two-way, step " + std::to_string(s);
    expect(got.size() == want[s][ur].size() &&
               std::memcmp(got.data(), want[s][ur].data(), got.size() * sizeof(float)) == 0,
           r, w, what + ": output and residuals");
  }
}

template <class CpuCodec, class CudaCodec>
void check_two_way(char const* name, CpuCodec const& cpu, CudaCodec const& dev, int w) {
  auto const want = cpu_two_way_reference(cpu, w);
  on_ranks(w, std::string(name) + " two-way",
           [&](nccl_communicator& comm) { device_two_way_rank(comm, dev, name, want); });
  std::printf("%s two-way on %d rank(s): %s\n", name, w,
              failures.load() == 0 ? "identical to the CPU" : "FAILED");
}

// The bucketed collective: tensors of these sizes (ids 20, 21, ...); with the options below the
// small ones go dense (one bucket) and the others fill three compressed buckets, one of them the
// 2^20 + 3 tensor alone.
std::vector<std::size_t> const bucket_sizes = {3, 70001, 17, 65537, elements, 0, 4099, 131071, 1};

bucket_options bucket_opts(bucket_compression mode) {
  bucket_options o;
  o.bucket_bytes = 4 * 200000;
  o.min_compress_elements = 4096;
  o.mode = mode;
  o.op = reduction::average;
  return o;
}

std::vector<float> bucket_gradient(std::size_t i, int r, std::uint32_t s) {
  return gradient(bucket_sizes[i], r + 16 * static_cast<int>(i), s);
}

// The CPU bucketed collective with error feedback, `steps` steps: per step and rank, every
// output and then every tensor's residual (empty where it has none), flattened in that order.
template <class CpuCodec>
std::vector<std::vector<std::vector<float>>> cpu_bucket_reference(CpuCodec const& codec, int w,
                                                                  bucket_compression mode) {
  using comp = compressor<CpuCodec, residual_feedback>;
  std::deque<bucketed_all_reduce<comp>> bs;
  for (int r = 0; r < w; ++r) bs.emplace_back(comp(codec), bucket_opts(mode));
  return reference_steps(w, [&](in_process_communicator& comm, int r, std::uint32_t s) {
    auto const ur = static_cast<std::size_t>(r);
    std::vector<std::vector<float>> g, o;
    std::vector<bucket_item> items;
    for (std::size_t i = 0; i < bucket_sizes.size(); ++i) {
      g.push_back(bucket_gradient(i, r, s));
      o.emplace_back(bucket_sizes[i]);
    }
    for (std::size_t i = 0; i < bucket_sizes.size(); ++i) {
      items.push_back({tensor_view<float const>(std::span<float const>(g[i]),
                                                tensor_id{static_cast<std::uint32_t>(20 + i)}),
                       std::span<float>(o[i])});
    }
    bs[ur].run(comm, std::span<bucket_item const>(items), rank_context(r, s));
    std::vector<float> flat;
    for (auto const& x : o) flat.insert(flat.end(), x.begin(), x.end());
    for (std::size_t i = 0; i < bucket_sizes.size(); ++i) {
      auto const e = bs[ur].source().state(tensor_id{static_cast<std::uint32_t>(20 + i)}).values();
      flat.insert(flat.end(), e.begin(), e.end());
    }
    return flat;
  });
}

template <class CudaCodec>
void device_bucket_rank(nccl_communicator& comm, CudaCodec const& codec, char const* name,
                        bucket_compression mode,
                        std::vector<std::vector<std::vector<float>>> const& want) {
  int const r = comm.rank();
  int const w = comm.size();
  auto const ur = static_cast<std::size_t>(r);
  bucketed_all_reduce<gcu::device_compressor<CudaCodec>> b(
      gcu::device_compressor<CudaCodec>(gcu::stream_codec<CudaCodec>(codec, comm.stream())),
      bucket_opts(mode));
  std::vector<gcu::device_buffer> g, o;
  for (std::size_t i = 0; i < bucket_sizes.size(); ++i) {
    g.emplace_back(comm.stream());
    o.emplace_back(comm.stream());
    g.back().resize(bucket_sizes[i] * sizeof(float));
    o.back().resize(bucket_sizes[i] * sizeof(float));
  }
  std::vector<bucket_item> items;
  for (std::size_t i = 0; i < bucket_sizes.size(); ++i) {
    items.push_back(
        {tensor_view<float const>(
             std::span<float const>(reinterpret_cast<float const*>(g[i].data()), bucket_sizes[i]),
             tensor_id{static_cast<std::uint32_t>(20 + i)}),
         std::span<float>(reinterpret_cast<float*>(o[i].data()), bucket_sizes[i])});
  }
  for (std::uint32_t s = 0; s < steps; ++s) {
    std::vector<std::vector<float>> hg;
    for (std::size_t i = 0; i < bucket_sizes.size(); ++i) {
      hg.push_back(bucket_gradient(i, r, s));
      cuda_ok(cudaMemcpyAsync(g[i].data(), hg[i].data(), g[i].size(), cudaMemcpyHostToDevice,
                              comm.stream()),
              "cudaMemcpyAsync");
    }
    b.run(comm, std::span<bucket_item const>(items), rank_context(r, s));
    std::vector<float> got;
    auto append = [&](void const* p, std::size_t n) {
      std::size_t const at = got.size();
      got.resize(at + n);
      cuda_ok(cudaMemcpyAsync(got.data() + at, p, n * sizeof(float), cudaMemcpyDeviceToHost,
                              comm.stream()),
              "cudaMemcpyAsync");
      cuda_ok(cudaStreamSynchronize(comm.stream()), "cudaStreamSynchronize");
    };
    for (std::size_t i = 0; i < bucket_sizes.size(); ++i) append(o[i].data(), bucket_sizes[i]);
    for (std::size_t i = 0; i < bucket_sizes.size(); ++i) {
      auto const e = b.source().residual(tensor_id{static_cast<std::uint32_t>(20 + i)});
      append(e.data(), e.size());
    }
    std::string const what =
        std::string(name) +
        (mode == bucket_compression::per_tensor ? " bucketed per tensor" : " bucketed per bucket") +
        ", step " + std::to_string(s);
    expect(got.size() == want[s][ur].size() &&
               std::memcmp(got.data(), want[s][ur].data(), got.size() * sizeof(float)) == 0,
           r, w, what + ": outputs and residuals");
  }
}

template <class CpuCodec, class CudaCodec>
void check_bucketed(char const* name, CpuCodec const& cpu, CudaCodec const& dev, int w) {
  for (bucket_compression mode : {bucket_compression::per_tensor, bucket_compression::per_bucket}) {
    auto const want = cpu_bucket_reference(cpu, w, mode);
    on_ranks(w, std::string(name) + " bucketed",
             [&](nccl_communicator& comm) { device_bucket_rank(comm, dev, name, mode, want); });
  }
  std::printf("%s bucketed on %d rank(s): %s\n", name, w,
              failures.load() == 0 ? "identical to the CPU" : "FAILED");
}

// The pipeline with a device source: bucket_sizes' tensors, feedback "residual",
// `steps` steps, `measure_gain` on. The CPU pipeline's outputs, residuals, save() and the
// step's gain per step and rank, flattened (save() and the gain as floats of their bytes,
// zero-padded).
// `two_way`: two-way compression per tensor. A "powersgd" spec: PowerSGD's sessions, the
// source `stream_codec<identity_codec>`. `controller`: a controller spec (a sparsifier's spec).
pipeline_options pipeline_opts(std::string const& spec, bool two_way = false, int per_node = 0,
                               std::string const& controller = "") {
  pipeline_options o;
  o.controller = controller;
  if (per_node > 0) {  // the hierarchical all-reduce, bfloat16 inside a node
    o.hierarchical.nodes = node_grouping::uniform(per_node);
    o.hierarchical.intra = dense_format::bf16;
  }
  o.codec = spec;
  o.two_way = two_way;
  o.measure_gain = true;
  o.feedback = "residual";
  o.guard = "off";
  o.measured_timing = false;
  o.seed = 0x5eed0000u;
  o.buckets = bucket_opts(bucket_compression::per_tensor);
  return o;
}

// What the loop tells each step (GraVAC needs the batch size; a constant backward time keeps
// its decisions reproducible).
pipeline_step_info step_info() {
  pipeline_step_info info;
  info.batch_size = 32;
  info.backprop_s = 0.01;
  return info;
}

void append_bytes(std::vector<float>& flat, std::vector<std::byte> const& b) {
  std::size_t const at = flat.size();
  flat.resize(at + (b.size() + 3) / 4, 0.0f);
  std::memcpy(flat.data() + at, b.data(), b.size());
}

// The bits of a step's gain (NaN where it is not measured), as floats.
void append_gain(std::vector<float>& flat, double gain) {
  std::vector<std::byte> b(sizeof gain);
  std::memcpy(b.data(), &gain, sizeof gain);
  append_bytes(flat, b);
}

std::vector<std::vector<std::vector<float>>> cpu_pipeline_reference(std::string const& spec, int w,
                                                                    bool two_way, int per_node,
                                                                    std::string const& controller) {
  std::deque<gradient_pipeline> ps;
  for (int r = 0; r < w; ++r) ps.emplace_back(pipeline_opts(spec, two_way, per_node, controller));
  return reference_steps(w, [&](in_process_communicator& comm, int r, std::uint32_t s) {
    auto& p = ps[static_cast<std::size_t>(r)];
    std::vector<std::vector<float>> g;
    std::vector<tensor_view<float>> views;
    for (std::size_t i = 0; i < bucket_sizes.size(); ++i) g.push_back(bucket_gradient(i, r, s));
    for (std::size_t i = 0; i < bucket_sizes.size(); ++i) {
      views.emplace_back(std::span<float>(g[i]), tensor_id{static_cast<std::uint32_t>(20 + i)});
    }
    pipeline_stats const st = p.step(comm, views, step_info());
    std::vector<float> flat;
    for (auto const& x : g) flat.insert(flat.end(), x.begin(), x.end());
    for (std::size_t i = 0; i < bucket_sizes.size(); ++i) {
      auto const e = p.feedback_state(tensor_id{static_cast<std::uint32_t>(20 + i)});
      flat.insert(flat.end(), e.begin(), e.end());
    }
    append_bytes(flat, p.save());
    append_gain(flat, st.gain);
    return flat;
  });
}

template <class CudaCodec>
gradient_pipeline device_pipeline(pipeline_options const& o, CudaCodec const& codec, cudaStream_t stream) {
  if (o.codec.starts_with("powersgd")) {
    return gradient_pipeline(o, gcu::stream_codec<gcu::identity_codec>(gcu::identity_codec{}, stream));
  }
  return gradient_pipeline(o, gcu::device_compressor<CudaCodec>(gcu::stream_codec<CudaCodec>(codec, stream)));
}

template <class CudaCodec>
void device_pipeline_rank(nccl_communicator& comm, std::string const& spec, CudaCodec const& codec, bool two_way,
                          int per_node, std::string const& controller,
                          std::vector<std::vector<std::vector<float>>> const& want) {
  int const r = comm.rank();
  int const w = comm.size();
  auto const ur = static_cast<std::size_t>(r);
  pipeline_options const o = pipeline_opts(spec, two_way, per_node, controller);
  gradient_pipeline p = device_pipeline(o, codec, comm.stream());
  std::optional<nccl_communicator> node, lane;
  if (per_node > 0) {  // the node and lane communicators, split off once
    node_layout const layout = o.hierarchical.nodes.layout(w);
    int const local = layout.local_rank(r);
    node = comm.split(layout.node_of(r), local);
    lane = comm.split(local < layout.min_node_size() ? local : -1, layout.node_of(r));
    std::optional<any_communicator> l;
    if (lane) l.emplace(any_communicator::borrow(*lane));
    p.set_hierarchical_groups(any_communicator::borrow(*node), std::move(l));
  }
  std::vector<gcu::device_buffer> g;
  std::vector<tensor_view<float>> views;
  for (std::size_t i = 0; i < bucket_sizes.size(); ++i) {
    g.emplace_back(comm.stream());
    g.back().resize(bucket_sizes[i] * sizeof(float));
    views.emplace_back(std::span<float>(reinterpret_cast<float*>(g.back().data()), bucket_sizes[i]),
                       tensor_id{static_cast<std::uint32_t>(20 + i)});
  }
  for (std::uint32_t s = 0; s < steps; ++s) {
    std::vector<std::vector<float>> hg;
    for (std::size_t i = 0; i < bucket_sizes.size(); ++i) {
      hg.push_back(bucket_gradient(i, r, s));
      cuda_ok(cudaMemcpyAsync(g[i].data(), hg[i].data(), g[i].size(), cudaMemcpyHostToDevice,
                              comm.stream()),
              "cudaMemcpyAsync");
    }
    pipeline_stats const st = p.step(comm, views, step_info());
    std::vector<float> got;
    auto append = [&](void const* d, std::size_t n) {
      std::size_t const at = got.size();
      got.resize(at + n);
      cuda_ok(cudaMemcpyAsync(got.data() + at, d, n * sizeof(float), cudaMemcpyDeviceToHost,
                              comm.stream()),
              "cudaMemcpyAsync");
      cuda_ok(cudaStreamSynchronize(comm.stream()), "cudaStreamSynchronize");
    };
    for (std::size_t i = 0; i < bucket_sizes.size(); ++i) append(g[i].data(), bucket_sizes[i]);
    for (std::size_t i = 0; i < bucket_sizes.size(); ++i) {
      auto const e = p.feedback_state(tensor_id{static_cast<std::uint32_t>(20 + i)});
      append(e.data(), e.size());
    }
    append_bytes(got, p.save());
    append_gain(got, st.gain);
    expect(got.size() == want[s][ur].size() &&
               std::memcmp(got.data(), want[s][ur].data(), got.size() * sizeof(float)) == 0,
           r, w, spec + " pipeline, step " + std::to_string(s) + ": outputs, residuals, save() and gain");
  }
}

template <class CudaCodec>
void check_pipeline(std::string const& spec, CudaCodec const& dev, int w, bool two_way = false, int per_node = 0,
                    std::string const& controller = "") {
  auto const want = cpu_pipeline_reference(spec, w, two_way, per_node, controller);
  std::string const what = spec + (two_way ? " two-way" : "") + (per_node > 0 ? " hierarchical" : "") +
                           (controller.empty() ? "" : " " + controller) + " pipeline";
  on_ranks(w, what, [&](nccl_communicator& comm) {
    device_pipeline_rank(comm, spec, dev, two_way, per_node, controller, want);
  });
  std::printf("%s on %d rank(s): %s\n", what.c_str(), w, failures.load() == 0 ? "identical to the CPU" : "FAILED");
}

// Rank 1 never calls the collective: rank 0 must fail with comm_error near the timeout.
// The hierarchical all-reduce over node and lane communicators split off NCCL
// (`nccl_communicator::split`), `per_node` ranks per node, bfloat16 inside a node, residual
// feedback on the shard owners: every output, per step and rank, the CPU hierarchical
// all-reduce's (in-process ranks, point-to-point groups).
template <class CpuCodec, class CudaCodec>
void check_hierarchical(char const* name, CpuCodec const& cpu, CudaCodec const& dev, int w, int per_node) {
  hierarchical_options opt;
  opt.nodes = node_grouping::uniform(per_node);
  opt.intra = dense_format::bf16;
  opt.op = reduction::average;
  node_layout const layout = opt.nodes.layout(w);
  int const lanes = layout.min_node_size();
  using comp = compressor<CpuCodec, residual_feedback>;
  std::vector<comp> comps(static_cast<std::size_t>(w), comp(cpu));
  auto const want = reference_steps(w, [&](in_process_communicator& comm, int r, std::uint32_t s) {
    std::vector<float> const g = gradient(elements, r, s);
    std::vector<float> o(elements);
    all_reduce_hierarchical(comm, comps[static_cast<std::size_t>(r)],
                            tensor_view<float const>(std::span<float const>(g), tensor_id{3}),
                            std::span<float>(o), rank_context(r, s), opt);
    return o;
  });
  std::string const what = std::string("hierarchical ") + name + ", " + std::to_string(per_node) + " per node";
  on_ranks(w, what, [&](nccl_communicator& comm) {
    int const r = comm.rank();
    int const local = layout.local_rank(r);
    std::optional<nccl_communicator> node = comm.split(layout.node_of(r), local);
    std::optional<nccl_communicator> lane = comm.split(local < lanes ? local : -1, layout.node_of(r));
    expect(node.has_value() && node->size() == per_node && node->rank() == local, r, w, what + ": node split");
    expect(lane.has_value() == (local < lanes), r, w, what + ": lane split");
    hierarchical_groups<nccl_communicator> const groups{&*node, lane ? &*lane : nullptr};
    gcu::device_compressor<CudaCodec> src(gcu::stream_codec<CudaCodec>(dev, comm.stream()));
    device_tensors io(comm.stream());
    for (std::uint32_t s = 0; s < steps; ++s) {
      io.upload(r, s);
      all_reduce_hierarchical(comm, groups, src, io.grad(), io.out(), rank_context(r, s), opt);
      std::vector<float> const got = io.output();
      expect(std::memcmp(got.data(), want[s][static_cast<std::size_t>(r)].data(), elements * sizeof(float)) == 0,
             r, w, what + ", step " + std::to_string(s) + ": output");
    }
  });
  std::printf("%s on %d rank(s): %s\n", what.c_str(), w,
              failures.load() == 0 ? "identical to the CPU" : "FAILED");
}

void absent_peer_times_out() {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) throw std::runtime_error("ncclGetUniqueId failed");
  std::atomic<bool> done{false};
  std::thread other([&] {
    cuda_ok(cudaSetDevice(1), "cudaSetDevice");
    cudaStream_t stream = nullptr;
    cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    nccl_communicator comm =
        nccl_communicator::init_rank(2, id, 1, stream, {std::chrono::seconds(2)});
    while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  });
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  bool thrown = false;
  auto const t0 = std::chrono::steady_clock::now();
  try {
    nccl_communicator comm =
        nccl_communicator::init_rank(2, id, 0, stream, {std::chrono::seconds(2)});
    gcu::stream_codec<gcu::int8_codec> const codec(gcu::int8_codec{}, stream);
    gcu::device_buffer g(stream), o(stream);
    g.resize(4096 * sizeof(float));
    o.resize(4096 * sizeof(float));
    cuda_ok(cudaMemsetAsync(g.data(), 0, g.size(), stream), "cudaMemsetAsync");
    all_reduce_compressed(comm, codec,
                          tensor_view<float const>(std::span<float const>(
                              reinterpret_cast<float const*>(g.data()), 4096)),
                          std::span<float>(reinterpret_cast<float*>(o.data()), 4096));
  } catch (comm_error const&) {
    thrown = true;
  }
  done = true;
  other.join();
  auto const waited = std::chrono::steady_clock::now() - t0;
  expect(thrown, 0, 2, "a peer that never joins the collective gives comm_error");
  expect(waited < std::chrono::seconds(30), 0, 2, "the timeout is honoured");
  std::printf("absent peer: %s\n",
              failures.load() == 0 ? "comm_error after the timeout" : "FAILED");
}

int run_all() {
  int const devices = device_count_or_skip();
  if (devices == 0) return 77;
  try {
    for (int w = 1; w <= (devices >= 2 ? 2 : 1); ++w) {
      check_codec("fp16", fp16_codec{}, gcu::fp16_codec{}, w);
      check_codec("int8:rounding=stochastic", int8_codec{512, int8_rounding::stochastic},
                  gcu::int8_codec{512, int8_rounding::stochastic}, w);
      check_codec("onebit", onebit_codec{}, gcu::onebit_codec{}, w);
      check_codec("qsgd", qsgd_codec{}, gcu::qsgd_codec{}, w);
      check_two_way("fp16", fp16_codec{}, gcu::fp16_codec{}, w);
      check_two_way("int8:rounding=stochastic", int8_codec{512, int8_rounding::stochastic},
                    gcu::int8_codec{512, int8_rounding::stochastic}, w);
      check_two_way("onebit", onebit_codec{}, gcu::onebit_codec{}, w);
      check_two_way("qsgd", qsgd_codec{}, gcu::qsgd_codec{}, w);
      check_bucketed("fp16", fp16_codec{}, gcu::fp16_codec{}, w);
      check_bucketed("int8:rounding=stochastic", int8_codec{512, int8_rounding::stochastic},
                     gcu::int8_codec{512, int8_rounding::stochastic}, w);
      check_bucketed("onebit", onebit_codec{}, gcu::onebit_codec{}, w);
      check_pipeline("fp16", gcu::fp16_codec{}, w);
      check_pipeline("int8:rounding=stochastic", gcu::int8_codec{512, int8_rounding::stochastic}, w);
      check_pipeline("onebit", gcu::onebit_codec{}, w);
      check_pipeline("int8:rounding=stochastic", gcu::int8_codec{512, int8_rounding::stochastic}, w, true);
      check_pipeline("onebit", gcu::onebit_codec{}, w, true);
      check_pipeline("powersgd:rank=2,min_elements=100,backend=builtin", gcu::identity_codec{}, w);
      // controllers: GraVAC's levels (the candidate re-compressed from the θmin packet) and
      // Accordion's layer accumulators in device memory
      check_pipeline("topk:ratio=0.01", gcu::topk_codec::ratio(0.01), w, false, 0,
                     "gravac:theta_min=4,theta_max=64,window=2");
      check_pipeline("topk:ratio=0.01", gcu::topk_codec::ratio(0.01), w, false, 0,
                     "accordion:low=2,high=8,interval=2,accumulation=2");
      check_hierarchical("int8:rounding=stochastic", int8_codec{512, int8_rounding::stochastic},
                         gcu::int8_codec{512, int8_rounding::stochastic}, w, 1);
      check_hierarchical("onebit", onebit_codec{}, gcu::onebit_codec{}, w, w);
      check_pipeline("int8:rounding=stochastic", gcu::int8_codec{512, int8_rounding::stochastic}, w, false, 1);
    }
    if (devices >= 2) {
      absent_peer_times_out();
    } else {
      std::printf(
          "2 ranks and the absent peer: not run (one GPU; NCCL needs one device per rank)\n");
    }
  } catch (std::exception const& e) {
    std::fprintf(stderr, "FAILED: %s\n", e.what());
    return 1;
  }
  return failures.load() == 0 ? 0 : 1;
}

}  // namespace gct_gpu

int main() { return gct_gpu::run_all(); }
