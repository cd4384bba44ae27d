// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// The CUDA part of the Python package (python/src/cuda_codec.cuh: `gradcomp.Codec` on CUDA
// tensors) on a machine without a GPU: the same code the extension compiles for the GPU, built
// here with Thrust's CPP device system, so that "device" memory is host memory and the kernels
// run on the calling thread (as in host_backend.cu). Real: the spec reading, the choice of the
// CUDA codec and its parameters, the element-type dispatch, the device codecs' passes, headers
// and checks. Emulated: the GPU and its stream. What only a GPU run checks (scripts/gpu-check):
// the same packets from the real kernels on torch's current stream.
//
// Compared with the CPU codec of the same spec (make_codec), byte for byte: max_compressed_bytes,
// the packet of float32, float16 and bfloat16 inputs for several sizes, seeds, steps and tensor
// ids, the decoded tensor and decompress-add; and the errors: a bad spec (the CPU's message), a
// codec the CUDA part does not carry (a config_error naming the ones it does), an output too
// small, a NaN input, a truncated packet.

#if !defined(THRUST_DEVICE_SYSTEM) || THRUST_DEVICE_SYSTEM != THRUST_DEVICE_SYSTEM_CPP
#  error "python_codec_host.cu must be compiled with -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP"
#endif

#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include "cuda_codec.cuh"

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/tensor.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

static_assert(GRADCOMP_CUDA_ON_GPU == 0);

namespace {

namespace gc = gradcomp;
using gradcomp_python::device_call;
using gradcomp_python::device_codec;
using gradcomp_python::value_type;

// Every codec the CUDA part carries, with non-default options where it has them.
std::vector<std::string> const specs = {
    "identity",
    "fp16",
    "bf16",
    "int8",
    "int8:bucket=100,rounding=stochastic",
    "int4",
    "int4:bucket=17",
    "chunk_topk:chunk=64,k=5",
    "chunk_topk:chunk=16,k=3,values=int2",
    "onebit",
    "onebit:scaling=none",
    "qsgd:levels=15,bucket=256",
    "terngrad:bucket=64",
    "natural",
    "dithering:levels=3,partition=natural,norm=l2,bucket=128",
    "topk:ratio=0.1",
    "topk:k=7,values=f16",
    "threshold:value=0.5,values=bf16",
    "randomk:ratio=0.05",
    "random_k:k=9,scale=true",
};

template <class T>
constexpr value_type type_of() {
  if constexpr (std::is_same_v<T, gc::half>) return value_type::f16;
  else if constexpr (std::is_same_v<T, gc::bfloat16>) return value_type::bf16;
  else return value_type::f32;
}

template <class T>
std::vector<T> input(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<T> x(n);
  for (auto& v : x) v = gc::from_float<T>(d(rng));
  if (n > 3) x[3] = gc::from_float<T>(0.0f), x[n - 1] = gc::from_float<T>(-0.0f);
  return x;
}

template <class T>
bool same_bits(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

template <class T>
void check_spec(std::string const& spec) {
  gc::any_codec const cpu = gc::make_codec(spec);
  auto const dev = device_codec::make(spec);
  for (std::size_t n : {std::size_t{1}, std::size_t{100}, std::size_t{1000}, std::size_t{4099}}) {
    for (std::uint32_t step : {0u, 3u}) {
      INFO(spec << ", n = " << n << ", step = " << step);
      std::vector<T> const x = input<T>(n, static_cast<std::uint32_t>(n + step));
      REQUIRE(dev->max_compressed_bytes(n) == cpu.max_compressed_bytes(n));
      gc::codec_context ctx;
      ctx.seed = 0x1234567890abcdefull + step;
      ctx.step = step;
      gc::tensor_id const id{step + 5};
      std::vector<std::byte> ref(cpu.max_compressed_bytes(n));
      std::size_t const ref_n = cpu.compress(gc::tensor_view<T const>(std::span<T const>(x), id), ref, ctx);
      ref.resize(ref_n);

      device_call const call{ctx.seed, ctx.step, static_cast<std::uint32_t>(id), nullptr};
      std::vector<std::byte> got(dev->max_compressed_bytes(n), std::byte{0xa5});
      std::size_t const got_n = dev->compress(type_of<T>(), x.data(), n, got.data(), got.size(), call);
      got.resize(got_n);
      REQUIRE(got == ref);

      // Decoding: overwrite, then add half of it to a tensor holding x.
      std::vector<T> out_ref(n, gc::from_float<T>(7.0f)), out_got(n, gc::from_float<T>(-7.0f));
      cpu.decompress(std::span<std::byte const>(ref), std::span<T>(out_ref), ctx);
      dev->decompress(got.data(), got.size(), type_of<T>(), out_got.data(), n, false, 1.0f, call);
      CHECK(same_bits(out_got, out_ref));
      std::vector<T> add_ref = x, add_got = x;
      cpu.decompress_add(std::span<std::byte const>(ref), std::span<T>(add_ref), 0.5f, ctx);
      dev->decompress(got.data(), got.size(), type_of<T>(), add_got.data(), n, true, 0.5f, call);
      CHECK(same_bits(add_got, add_ref));
    }
  }
}

}  // namespace

TEST_CASE("python-cuda-cpp: the device codec of a spec writes the CPU codec's packets (float32)",
          "[python][cuda]") {
  for (auto const& s : specs) check_spec<float>(s);
}

TEST_CASE("python-cuda-cpp: the device codec of a spec writes the CPU codec's packets (float16, bfloat16)",
          "[python][cuda]") {
  for (auto const& s : specs) {
    check_spec<gc::half>(s);
    check_spec<gc::bfloat16>(s);
  }
}

TEST_CASE("python-cuda-cpp: specs the device codecs refuse", "[python][cuda]") {
  // A bad spec: the CPU's error and message.
  for (std::string const bad : {"bogus", "topk", "topk:k=3,ratio=0.1", "int8:rounding=up", "threshold", "fp16:x=1"}) {
    INFO(bad);
    std::string cpu_message;
    try {
      (void)gc::make_codec(bad);
    } catch (gc::config_error const& e) {
      cpu_message = e.what();
    }
    REQUIRE(!cpu_message.empty());
    CHECK_THROWS_MATCHES(device_codec::make(bad), gc::config_error, Catch::Message(cpu_message));
  }
  // Valid on the CPU, not carried by the CUDA part: a config_error naming what is.
  try {
    (void)device_codec::make("approx_topk:ratio=0.1");
    FAIL("approx_topk was accepted");
  } catch (gc::config_error const& e) {
    std::string const m = e.what();
    CHECK(m.find("approx_topk") != std::string::npos);
    CHECK(m.find(gradcomp_python::device_codec_names()) != std::string::npos);
  }
}

TEST_CASE("python-cuda-cpp: bad calls get the CPU codec's errors", "[python][cuda]") {
  device_call const call{};
  std::vector<float> x = input<float>(256, 1);
  for (std::string const spec : {"int8", "topk:ratio=0.1", "fp16"}) {
    INFO(spec);
    auto const dev = device_codec::make(spec);
    gc::any_codec const cpu = gc::make_codec(spec);
    std::vector<std::byte> out(dev->max_compressed_bytes(x.size()));
    // An output too small.
    CHECK_THROWS_AS(dev->compress(value_type::f32, x.data(), x.size(), out.data(), out.size() - 1, call),
                    gc::config_error);
    // A truncated packet: the CPU's format_error.
    std::size_t const n = dev->compress(value_type::f32, x.data(), x.size(), out.data(), out.size(), call);
    std::vector<float> y(x.size());
    CHECK_THROWS_AS(cpu.decompress(std::span<std::byte const>(out.data(), n - 1), std::span<float>(y)),
                    gc::format_error);
    CHECK_THROWS_AS(dev->decompress(out.data(), n - 1, value_type::f32, y.data(), y.size(), false, 1.0f, call),
                    gc::format_error);
  }
  // A NaN: numeric_error from both (fp16 casts NaN through, as the CPU does).
  x[17] = std::numeric_limits<float>::quiet_NaN();
  for (std::string const spec : {"int8", "topk:ratio=0.1", "onebit"}) {
    INFO(spec);
    auto const dev = device_codec::make(spec);
    gc::any_codec const cpu = gc::make_codec(spec);
    std::vector<std::byte> out(dev->max_compressed_bytes(x.size()));
    CHECK_THROWS_AS(cpu.compress(gc::tensor_view<float const>(std::span<float const>(x)), out),
                    gc::numeric_error);
    CHECK_THROWS_AS(dev->compress(value_type::f32, x.data(), x.size(), out.data(), out.size(), call),
                    gc::numeric_error);
  }
}
