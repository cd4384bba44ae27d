# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# cmake -DSTATIC=<program> -DSHARED=<program> -P check_runtime.cmake
#
# The program built with CUDA_RUNTIME_LIBRARY Static must not load libcudart.so (the static
# runtime is linked in; gradcomp::cuda adding the shared one would put both on the link line),
# the one built with Shared must load it.

find_program(LDD ldd REQUIRED)
foreach(kind IN ITEMS STATIC SHARED)
  execute_process(COMMAND "${LDD}" "${${kind}}" OUTPUT_VARIABLE libs RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "ldd ${${kind}} failed (${result})")
  endif()
  if(libs MATCHES "libcudart\\.so")
    set(loads TRUE)
  else()
    set(loads FALSE)
  endif()
  if(kind STREQUAL "STATIC" AND loads)
    message(FATAL_ERROR "${${kind}} (CUDA_RUNTIME_LIBRARY Static) loads the shared CUDA "
                        "runtime:\n${libs}")
  elseif(kind STREQUAL "SHARED" AND NOT loads)
    message(FATAL_ERROR "${${kind}} (CUDA_RUNTIME_LIBRARY Shared) does not load "
                        "libcudart.so:\n${libs}")
  endif()
  message(STATUS "${kind}: libcudart.so loaded: ${loads}")
endforeach()
