// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// The CUDA codecs' real kernels on a GPU, compared byte for byte with the CPU codecs: every
// case of codec_checks.cuh, plus the stream behaviour only a GPU has. Exits with code 77
// (reported by CTest as skipped) when the machine has no usable CUDA device.

#define CATCH_CONFIG_RUNNER
#define GCT_BACKEND "cuda/gpu"
#include "codec_checks.cuh"

#include <cstdio>

static_assert(GRADCOMP_CUDA_ON_GPU == 1, "gpu_codecs.cu must use Thrust's CUDA device system");

namespace {

// RAII stream for the tests below.
class stream_guard {
 public:
  stream_guard() { GRADCOMP_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  stream_guard(stream_guard const&) = delete;
  stream_guard& operator=(stream_guard const&) = delete;
  ~stream_guard() { (void)cudaStreamDestroy(s_); }
  [[nodiscard]] cudaStream_t get() const noexcept { return s_; }

 private:
  cudaStream_t s_{};
};

}  // namespace

TEST_CASE("cuda/gpu: codecs on a non-blocking stream", "[cuda][gpu]") {
  // Large enough for many thread blocks per pass; a key that exercises the Philox counter's
  // high words.
  stream_guard const stream;
  std::size_t const n = (std::size_t{1} << 22) + 5;
  gc::random_stream const rs{0x0123456789abcdefull, 99, 7};
  std::vector<float> const x = gct::make_input(n, 21, gct::finite_specials());
  auto same = [&](auto const& cpu, auto const& gpu) {
    GCT_REQUIRE_SAME_PACKET(gct::cpu_compress(cpu, x, rs),
                            gct::cuda_compress(gpu, x, rs, stream.get()));
  };
  gct::for_each_cast([&](char const* name, auto const& cpu, auto const& gpu) {
    INFO(name);
    same(cpu, gpu);
  });
  gct::for_each_quantizer([&](char const* name, auto const& cpu, auto const& gpu) {
    INFO(name);
    same(cpu, gpu);
  });
  // The sparsifiers: CUB's histograms, compactions, scans and sorts over many thread blocks,
  // also on heavy ties.
  std::vector<float> const tied = gct::tied_input(n, 22, 5);
  auto sparse = [&](char const* name, auto const& cpu, auto const& gpu) {
    INFO(name);
    same(cpu, gpu);
    GCT_REQUIRE_SAME_PACKET(gct::cpu_compress(cpu, tied, rs),
                            gct::cuda_compress(gpu, tied, rs, stream.get()));
  };
  gct::for_each_topk(sparse);
  gct::for_each_threshold(sparse);
  gct::for_each_randomk(sparse);
}

TEST_CASE("cuda/gpu: compress then decode stays stream-ordered", "[cuda][gpu]") {
  // Compress and decode back to back on one stream with no host synchronization in between
  // (fp16's compress does not wait; int8's code pass is enqueued after its one wait), then
  // compare with the CPU round trip.
  stream_guard const stream;
  std::size_t const n = (std::size_t{1} << 20) + 7;
  std::vector<float> const x = gct::make_input(n, 23, gct::finite_specials());
  auto round_trip = [&](auto const& cpu, auto const& gpu) {
    gct::buffer<float> const in(x);
    gct::buffer<std::byte> packet(gpu.max_compressed_bytes(n));
    gct::buffer<float> out(std::vector<float>(n, 1.0f));
    std::size_t const size = gpu.compress(in.get(), n, packet.get(), stream.get());
    gpu.decompress_add(packet.get(), size, out.get(), n, 0.5f, stream.get());
    GRADCOMP_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    std::vector<float> expected(n, 1.0f);
    std::vector<std::byte> const cpu_packet = gct::cpu_compress(cpu, x);
    cpu.decompress_add(std::span<std::byte const>(cpu_packet), std::span<float>(expected), 0.5f);
    CHECK(gct::same_elements(expected, out.download(), false));
  };
  round_trip(gc::fp16_codec{}, gc::cuda::fp16_codec{});
  round_trip(gc::int8_codec{}, gc::cuda::int8_codec{});
  round_trip(gc::qsgd_codec{}, gc::cuda::qsgd_codec{});
  round_trip(gc::topk_codec{}, gc::cuda::topk_codec{});
  round_trip(gc::threshold_codec{1e-3f}, gc::cuda::threshold_codec{1e-3f});
}

TEST_CASE("cuda/gpu: CUDA failures surface as gradcomp errors", "[cuda][gpu]") {
  std::string const what = gct::thrown_by([] { GRADCOMP_CUDA_CHECK(cudaSetDevice(1 << 20)); });
  CHECK(what.rfind("error: gradcomp: CUDA call cudaSetDevice", 0) == 0);
  CHECK(cudaGetLastError() == cudaSuccess);
}

int main(int argc, char* argv[]) {
  int devices = 0;
  cudaError_t const status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no usable CUDA device (%s)\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "device count is 0");
    return 77;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    std::printf("running on %s (compute capability %d.%d)\n", prop.name, prop.major, prop.minor);
  }
  return Catch::Session().run(argc, argv);
}
