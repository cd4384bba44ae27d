# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# What gradcomp::cuda carries besides gradcomp::gradcomp, shared by the source tree and the
# installed package config:
#
# gradcomp_require_cuda_std_20(<target>)
#
# Makes CUDA sources that use <target> compile as C++20.
#
# The compile feature cuda_std_20 is the right tool, but only CMake releases that know the C++20
# flag of the CUDA compiler in use accept it (CMake 3.25, for one, knows none for nvcc and stops
# at generate time). Where CUDA is already enabled we can ask; where the feature is missing, or
# CUDA is not enabled yet, the flag is passed to CUDA sources directly. nvcc takes the last
# -std it is given, and target compile options come after CMake's own standard flag.
#
# gradcomp_link_cuda_runtime(<target>)
#
# Links the CUDA runtime that the consuming target's CUDA_RUNTIME_LIBRARY property names (it is
# initialized from CMAKE_CUDA_RUNTIME_LIBRARY): CUDA::cudart for Shared, CUDA::cudart_static for
# Static and for an unset property (CMake's default for nvcc is Static), nothing for None. A
# fixed CUDA::cudart would put the shared runtime on a link line that already carries the static
# one, as cuDF's CUDA_STATIC_RUNTIME choice avoids too. The choice is made per consuming target,
# so a target that sets the property differently from its directory gets its own runtime.

function(gradcomp_require_cuda_std_20 target)
  if(CMAKE_CUDA_COMPILER_LOADED AND "cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES)
    target_compile_features(${target} INTERFACE cuda_std_20)
  else()
    target_compile_options(${target} INTERFACE "$<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>")
  endif()
endfunction()

function(gradcomp_link_cuda_runtime target)
  set(runtime "$<UPPER_CASE:$<TARGET_PROPERTY:CUDA_RUNTIME_LIBRARY>>")
  target_link_libraries(${target} INTERFACE
    "$<$<STREQUAL:${runtime},SHARED>:CUDA::cudart>"
    "$<$<OR:$<STREQUAL:${runtime},STATIC>,$<STREQUAL:${runtime},>>:CUDA::cudart_static>")
endfunction()
