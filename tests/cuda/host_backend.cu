// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's algorithms run on the host through Thrust's CPP device system, compared
// byte for byte with the CPU codecs. Needs nvcc, but no GPU. Build with
// -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP (tests/cuda/CMakeLists.txt does).

#if !defined(THRUST_DEVICE_SYSTEM) || THRUST_DEVICE_SYSTEM != THRUST_DEVICE_SYSTEM_CPP
#  error "host_backend.cu must be compiled with -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP"
#endif

#define CATCH_CONFIG_MAIN
#define GCT_BACKEND "cuda/thrust-cpp"
#include "codec_checks.cuh"

#include <gradcomp/cpu/kernels/onebit.hpp>

static_assert(GRADCOMP_CUDA_ON_GPU == 0);

// The element functions themselves, called directly on the host, against the CPU kernels.
TEST_CASE("cuda/thrust-cpp: onebit element functions match the CPU block kernel",
          "[cuda][onebit][ops]") {
  namespace ops = gradcomp::cuda::ops;
  for (std::size_t n : {std::size_t{1}, std::size_t{15}, std::size_t{17}, std::size_t{4095},
                        std::size_t{4096}, std::size_t{3 * 4096 + 9}}) {
    INFO("n = " << n);
    std::vector<float> const x = gct::make_input(n, 15, gct::onebit_specials());
    std::size_t const blocks = ops::onebit_blocks(n);
    std::vector<std::byte> bits((n + 7) / 8, std::byte{0xee});
    std::vector<double> lanes(16 * blocks, -1.0);
    for (std::size_t item = 0; item < 2 * blocks; ++item) {
      ops::onebit_pack_half_block(x.data(), n, item, bits.data(), lanes.data());
    }
    std::vector<std::byte> ref_bits((n + 7) / 8);
    std::vector<double> block_sums(blocks);
    for (std::size_t b = 0; b < blocks; ++b) {
      std::size_t const len = n - 4096 * b < 4096 ? n - 4096 * b : 4096;
      double const ref = gradcomp::cpu::kernels::scalar::onebit_pack_block(
          gradcomp::cpu::scalar_tag{}, x.data() + 4096 * b, len, ref_bits.data() + 512 * b);
      block_sums[b] = ops::onebit_block_sum(lanes.data(), b);
      CHECK(std::bit_cast<std::uint64_t>(block_sums[b]) == std::bit_cast<std::uint64_t>(ref));
    }
    CHECK(bits == ref_bits);
    double total = 0.0;
    for (double s : block_sums) total += s;
    CHECK(std::bit_cast<std::uint64_t>(ops::onebit_total(block_sums.data(), blocks)) ==
          std::bit_cast<std::uint64_t>(total));
  }
}

TEST_CASE("cuda/thrust-cpp: fp16 element functions round like float_to_half_bits",
          "[cuda][fp16][ops]") {
  // Every 257th float bit pattern (all classes and binades), through the element function.
  std::vector<float> x;
  for (std::uint64_t b = 0; b <= 0xffffffffu; b += 257)
    x.push_back(gct::from_bits(static_cast<std::uint32_t>(b)));
  std::vector<std::byte> payload(2 * x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    gradcomp::cuda::ops::fp16_encode_element(x.data(), payload.data(), i);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::uint16_t const got = static_cast<std::uint16_t>(
        static_cast<unsigned>(payload[2 * i]) | (static_cast<unsigned>(payload[2 * i + 1]) << 8));
    bad += got != gradcomp::float_to_half_bits(x[i]);
  }
  CHECK(bad == 0);
}

TEST_CASE("cuda/thrust-cpp: onebit's flush-to-zero-proof helpers agree with plain C++",
          "[cuda][onebit][ops]") {
  namespace ops = gradcomp::cuda::ops;
  std::size_t bad_sign = 0, bad_abs = 0;
  for (std::uint64_t b = 0; b <= 0xffffffffu; b += 251) {
    float const v = gct::from_bits(static_cast<std::uint32_t>(b));
    bad_sign += ops::is_negative(v) != (v < 0.0f);
    if (!std::isnan(v)) {
      bad_abs += std::bit_cast<std::uint64_t>(ops::abs_as_double(v)) !=
                 std::bit_cast<std::uint64_t>(static_cast<double>(std::fabs(v)));
    }
  }
  CHECK(bad_sign == 0);
  CHECK(bad_abs == 0);

  // Doubles around and below the float subnormal range, ties included.
  std::mt19937_64 rng(16);
  std::size_t bad_round = 0;
  for (int i = 0; i < 200000; ++i) {
    double q = std::ldexp(std::uniform_real_distribution<double>(0.5, 1.0)(rng),
                          std::uniform_int_distribution<int>(-160, -110)(rng));
    if (i % 4 == 0) q = std::ldexp(std::round(std::ldexp(q, 150)), -150);  // k 2^-150: ties
    bad_round += std::bit_cast<std::uint32_t>(ops::to_float_nearest(q)) !=
                 std::bit_cast<std::uint32_t>(static_cast<float>(q));
  }
  for (double q : {0.0, 0x1p-149, 0x1p-150, 0x1.8p-150, 0x1p-126, 0x1.fffffffp-127, 1.0, 0x1p200}) {
    bad_round += std::bit_cast<std::uint32_t>(ops::to_float_nearest(q)) !=
                 std::bit_cast<std::uint32_t>(static_cast<float>(q));
  }
  CHECK(bad_round == 0);
}
