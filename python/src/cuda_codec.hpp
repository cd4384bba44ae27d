// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CUDA part of gradcomp._C, as seen from the rest of the extension: a codec of the library's
// CUDA backend (include/gradcomp/cuda) built from the same spec as the CPU `Codec`, that
// compresses and decodes tensors in device memory on a given CUDA stream (the Python side passes
// torch's current stream of the tensor's device). Its packets are byte for byte those of the CPU
// codec of the same spec, for the same input, seed, step and tensor id.
//
// This header names no CUDA or torch type, so module.cpp (a C++ translation unit) includes it
// whether or not the CUDA part was compiled; the definitions live in cuda_codec.cu (built when
// GRADCOMP_PYTHON_CUDA is on: python/CMakeLists.txt), which the extension defines
// GRADCOMP_PYTHON_CUDA=1 for. The same code built with Thrust's CPP device system (where
// "device" memory is host memory) is tested against the CPU codecs in
// tests/cuda/python_codec_host.cu.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace gradcomp_python {

// The element types the codec API takes.
enum class value_type { f32, f16, bf16 };

// What a call needs besides the data: the random stream's key (seed, step, tensor id: as the
// CPU codec's codec_context and tensor_view) and the CUDA stream (a cudaStream_t; null: the
// legacy default stream).
struct device_call {
  std::uint64_t seed = 0;
  std::uint32_t step = 0;
  std::uint32_t tensor = 0;
  void* stream = nullptr;
};

// A codec of the CUDA backend. Every pointer is device memory. Errors are the CPU codec's
// (gradcomp::config_error, numeric_error, format_error) or gradcomp::cuda::cuda_error.
class device_codec {
 public:
  virtual ~device_codec() = default;

  // The device codec of `spec` (a make_codec spec). A spec make_codec refuses gets its error; a
  // codec the CUDA part does not carry gets a config_error naming the ones it does
  // (`device_codec_names`).
  static std::unique_ptr<device_codec> make(std::string const& spec);

  // The largest packet of `n` elements (the CPU codec's bound).
  [[nodiscard]] virtual std::size_t max_compressed_bytes(std::size_t n) const = 0;

  // Writes the packet of `in[0, n)` (elements of `type`) into `out` (`capacity` bytes, at least
  // max_compressed_bytes(n), else config_error) and returns its size. The size is known on
  // return; the packet's bytes are complete once the work enqueued on `call.stream` is.
  virtual std::size_t compress(value_type type, void const* in, std::size_t n, std::byte* out, std::size_t capacity,
                               device_call const& call) const = 0;

  // Decodes the `bytes`-byte packet at `packet` into `out[0, n)` (elements of `type`), or with
  // `add` adds alpha times the decoded values. random-k needs the sender's seed and step.
  virtual void decompress(std::byte const* packet, std::size_t bytes, value_type type, void* out, std::size_t n,
                          bool add, float alpha, device_call const& call) const = 0;
};

// The codec names the CUDA part carries, comma-separated (for messages and docs).
std::string device_codec_names();

}  // namespace gradcomp_python
