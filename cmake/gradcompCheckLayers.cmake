# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# Checks that every include in a gradcomp header tree points down the layers of a layer list
# (cmake/layers.txt). Run as a script:
#
#   cmake -DLAYERS=<layers.txt> -DINCLUDE_DIR=<dir holding gradcomp/> [-DSTAMP=<file>]
#         -P gradcompCheckLayers.cmake
#
# For every .hpp, .cuh and .h file under INCLUDE_DIR/gradcomp, each `#include <gradcomp/X/...>`
# (or "gradcomp/X/...") must name X equal to the header's own top-level folder, or a folder on
# a lower line of LAYERS. A quoted include of any other path is refused too (it would escape
# the check). Every violation is printed as `path:line: from -> to`, then the script fails; on
# success it writes STAMP, if given. The build runs it as target gradcomp_layer_check.

cmake_minimum_required(VERSION 3.23)

foreach(var IN ITEMS LAYERS INCLUDE_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "gradcompCheckLayers: -D${var}=... is required")
  endif()
endforeach()
get_filename_component(LAYERS "${LAYERS}" ABSOLUTE)
if(NOT EXISTS "${LAYERS}")
  message(FATAL_ERROR "gradcompCheckLayers: no layer list at ${LAYERS}")
endif()
if(NOT IS_DIRECTORY "${INCLUDE_DIR}/gradcomp")
  message(FATAL_ERROR "gradcompCheckLayers: ${INCLUDE_DIR}/gradcomp is not a directory")
endif()

# Rank of each entry: its line number among the non-comment lines, from 0.
file(STRINGS "${LAYERS}" layer_lines REGEX "^[ \t]*[^# \t]")
set(rank 0)
set(entries "")
foreach(line IN LISTS layer_lines)
  string(REGEX REPLACE "#.*$" "" line "${line}")
  string(REGEX MATCHALL "[^ \t]+" names "${line}")
  foreach(name IN LISTS names)
    if(DEFINED layer_rank_${name})
      message(FATAL_ERROR "gradcompCheckLayers: ${name} is named twice in ${LAYERS}")
    endif()
    set(layer_rank_${name} ${rank})
    list(APPEND entries "${name}")
  endforeach()
  math(EXPR rank "${rank} + 1")
endforeach()

get_filename_component(root "${INCLUDE_DIR}/gradcomp" ABSOLUTE)
file(GLOB_RECURSE headers RELATIVE "${root}" "${root}/*.hpp" "${root}/*.cuh" "${root}/*.h")
if(NOT headers)
  message(FATAL_ERROR "gradcompCheckLayers: no headers under ${root}")
endif()
list(SORT headers)
set(violations "")
set(unknown "")
foreach(header IN LISTS headers)
  string(REGEX REPLACE "/.*$" "" from "${header}")
  if(NOT DEFINED layer_rank_${from})
    list(APPEND unknown "${from}")
    continue()
  endif()
  file(READ "${root}/${header}" text)
  # One list element per line. Backslashes, semicolons and brackets, which mean something to
  # CMake's lists, never occur in an include's path: replace them.
  string(REPLACE "\\" "/" text "${text}")
  string(REPLACE ";" "," text "${text}")
  string(REPLACE "[" "(" text "${text}")
  string(REPLACE "]" ")" text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  set(number 0)
  foreach(line IN LISTS lines)
    math(EXPR number "${number} + 1")
    if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]*([<\"])([^>\"]*)")
      continue()
    endif()
    set(quote "${CMAKE_MATCH_1}")
    set(path "${CMAKE_MATCH_2}")
    if(NOT path MATCHES "^gradcomp/([^/]+)")
      if(quote STREQUAL "\"")
        list(APPEND violations
             "${INCLUDE_DIR}/gradcomp/${header}:${number}: \"${path}\" (spell it <gradcomp/...>)")
      endif()
      continue()
    endif()
    set(to "${CMAKE_MATCH_1}")
    if(to STREQUAL from)
      continue()
    endif()
    if(NOT DEFINED layer_rank_${to})
      list(APPEND unknown "${to}")
      continue()
    endif()
    if(NOT layer_rank_${to} LESS layer_rank_${from})
      if(layer_rank_${to} EQUAL layer_rank_${from})
        set(how "a peer on the same layer")
      else()
        set(how "a higher layer")
      endif()
      list(APPEND violations
           "${INCLUDE_DIR}/gradcomp/${header}:${number}: ${from} -> ${to} (${how})")
    endif()
  endforeach()
endforeach()

if(unknown)
  list(REMOVE_DUPLICATES unknown)
  list(JOIN unknown ", " unknown)
  message(FATAL_ERROR "gradcomp: include/gradcomp/ holds or names ${unknown}, which "
                      "${LAYERS} does not list; add each to the layer it belongs to")
endif()
if(violations)
  list(LENGTH violations count)
  list(JOIN violations "\n  " violations)
  message(FATAL_ERROR "gradcomp: ${count} include(s) do not point down the layers of "
                      "${LAYERS} (a header includes its own folder and lower layers only):\n"
                      "  ${violations}")
endif()
if(DEFINED STAMP)
  file(WRITE "${STAMP}" "layers checked\n")
endif()
message(STATUS "gradcomp: the includes of ${INCLUDE_DIR}/gradcomp point down the layers")
