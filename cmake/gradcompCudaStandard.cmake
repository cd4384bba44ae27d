# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# gradcomp_require_cuda_std_20(<target>)
#
# Makes CUDA sources that use <target> compile as C++20. Used by the source tree and by the
# installed package config alike.
#
# The compile feature cuda_std_20 is the right tool, but only CMake releases that know the C++20
# flag of the CUDA compiler in use accept it (CMake 3.25, for one, knows none for nvcc and stops
# at generate time). Where CUDA is already enabled we can ask; where the feature is missing, or
# CUDA is not enabled yet, the flag is passed to CUDA sources directly. nvcc takes the last
# -std it is given, and target compile options come after CMake's own standard flag.

function(gradcomp_require_cuda_std_20 target)
  if(CMAKE_CUDA_COMPILER_LOADED AND "cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES)
    target_compile_features(${target} INTERFACE cuda_std_20)
  else()
    target_compile_options(${target} INTERFACE "$<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>")
  endif()
endfunction()
