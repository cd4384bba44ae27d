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

#include <gradcomp/cpu/kernels/bytecode.hpp>
#include <gradcomp/cpu/kernels/dither.hpp>
#include <gradcomp/cpu/kernels/onebit.hpp>

#include <thrust/system/cpp/execution_policy.h>
#include <algorithm>

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
      ops::onebit_pack_half_block(gradcomp::cuda::detail::plain_input<float>{x.data()}, n, item,
                                  bits.data(), lanes.data());
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

TEST_CASE("cuda/thrust-cpp: the draw cache gives every element its own draw, in any order",
          "[cuda][ops]") {
  // The cache is tagged by Philox block, so any visiting order and any cache size gives the
  // draws of random_stream::draw16; the codecs rely on it only for speed.
  gradcomp::random_stream const rs{0x9e3779b97f4a7c15ull, 12, 77};
  std::mt19937_64 rng(3);
  std::vector<std::uint64_t> order;
  for (std::uint64_t i = 0; i < 4096; ++i) order.push_back(i);
  for (std::uint64_t i = 0; i < 64; ++i) order.push_back((std::uint64_t{1} << 40) + 17 * i);
  std::shuffle(order.begin(), order.end(), rng);
  gradcomp::cuda::detail::draw_cache<1> one(rs);
  gradcomp::cuda::detail::draw_cache<4> four(rs);
  gradcomp::cuda::detail::draw_cache<8> eight(rs);
  std::size_t bad = 0;
  for (std::uint64_t i : order) {
    std::uint32_t const want = rs.draw16(i);
    bad += one(i) != want;
    bad += four(i) != want;
    bad += eight(i) != want;
  }
  CHECK(bad == 0);
}

TEST_CASE("cuda/thrust-cpp: bucket statistics follow the CPU's order to the last bit",
          "[cuda][ops]") {
  namespace d = gradcomp::cuda::detail;
  namespace kn = gradcomp::cpu::kernels;
  // Magnitudes over 16 binades, so that a double sum in another order differs in its bits.
  for (std::uint32_t bucket : {0u, 7u, 512u, 5000u, 9000u}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{4097}, std::size_t{20000}}) {
      INFO("bucket " << bucket << ", n = " << n);
      std::vector<float> x = gct::make_input(n, 5 + n, gct::finite_specials());
      d::bucket_geometry const geo = d::bucket_geometry::of(bucket, n);
      d::plain_input<float> const in{x.data()};
      std::vector<std::byte> mem(4096 + 64 * (geo.lane_items() + geo.block_items()));

      d::arena a(mem.data());
      auto const ws = d::stats_workspace<d::sumsq_stat>::carve(a, geo);
      std::vector<double> sums(geo.buckets, -1.0);
      struct keep_sum {
        double* out;
        GRADCOMP_HOST_DEVICE void operator()(std::uint64_t k, double s) const { out[k] = s; }
      };
      d::bucket_stats<d::sumsq_stat>(thrust::cpp::par, geo, in, ws, keep_sum{sums.data()});

      d::arena b(mem.data());
      auto const rws = d::stats_workspace<d::range_stat>::carve(b, geo);
      std::vector<d::range_stat::partial> ranges(geo.buckets);
      struct keep_range {
        d::range_stat::partial* out;
        GRADCOMP_HOST_DEVICE void operator()(std::uint64_t k,
                                             d::range_stat::partial const& p) const {
          out[k] = p;
        }
      };
      d::bucket_stats<d::range_stat>(thrust::cpp::par, geo, in, rws, keep_range{ranges.data()});

      for (std::uint64_t k = 0; k < geo.buckets; ++k) {
        double want = 0.0;  // codec/dithering.hpp: canonical blocks, added in order
        for (std::uint64_t s = geo.begin(k); s < geo.end(k); s += kn::norm_block) {
          std::size_t const len = std::min<std::uint64_t>(kn::norm_block, geo.end(k) - s);
          want += kn::scalar::block_sumsq(gradcomp::cpu::scalar_tag{}, x.data() + s, len);
        }
        CHECK(std::bit_cast<std::uint64_t>(sums[k]) == std::bit_cast<std::uint64_t>(want));
        float lo = x[geo.begin(k)], hi = lo;
        kn::scalar::block_minmax(gradcomp::cpu::scalar_tag{}, x.data() + geo.begin(k),
                                 geo.end(k) - geo.begin(k), lo, hi);
        float glo = ranges[k].lo, ghi = ranges[k].hi;
        gradcomp::cuda::ops::int8_settle_range(glo, ghi,
                                               x[ranges[k].zero < n ? ranges[k].zero : 0]);
        CHECK(std::bit_cast<std::uint32_t>(glo) == std::bit_cast<std::uint32_t>(lo));
        CHECK(std::bit_cast<std::uint32_t>(ghi) == std::bit_cast<std::uint32_t>(hi));
      }
    }
  }
}

TEST_CASE("cuda/thrust-cpp: onebit's flush-to-zero-proof helpers agree with plain C++",
          "[cuda][onebit][ops]") {
  namespace ops = gradcomp::quant;
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
