// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// The CUDA translation unit of gradcomp._C (built when GRADCOMP_PYTHON_CUDA is on,
// python/CMakeLists.txt): the device codecs of cuda_codec.hpp, compiled once, for the GPU. It
// includes neither torch nor pybind11, so nvcc compiles the library's CUDA headers only.

#include "cuda_codec.cuh"
