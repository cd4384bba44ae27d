# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# cmake -DDOXYGEN=<doxygen> -DSOURCE_DIR=<repo> -DOUT=<dir> -P doxygen.cmake
#
# package.doxygen: docs/Doxyfile, the one command users run (`doxygen docs/Doxyfile` from the
# repository root), run unchanged the way a fresh clone runs it: in OUT/clone, a copy of the
# repository's docs/ and include/ with no build folder, so a Doxyfile that needs a folder the
# clone lacks fails here. The Doxyfile makes every warning an error; this also fails when
# doxygen printed a warning at all, wrote no index.html, or left out a public header: every
# header outside a detail/ folder, the CUDA ones (.cuh) included, must have its file page.

cmake_policy(VERSION 3.23)
foreach(var IN ITEMS DOXYGEN SOURCE_DIR OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "doxygen.cmake: -D${var}=... is required")
  endif()
endforeach()
set(clone "${OUT}/clone")
file(REMOVE_RECURSE "${OUT}")
file(MAKE_DIRECTORY "${clone}")
file(COPY "${SOURCE_DIR}/docs" "${SOURCE_DIR}/include" DESTINATION "${clone}")
if(EXISTS "${clone}/build" OR EXISTS "${clone}/build-docs")
  message(FATAL_ERROR "doxygen.cmake: the copy in ${clone} is not clean")
endif()
execute_process(COMMAND "${DOXYGEN}" docs/Doxyfile
  WORKING_DIRECTORY "${clone}"
  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT result EQUAL 0 OR err MATCHES "warning|error")
  message(FATAL_ERROR "doxygen reported problems (exit status ${result})")
endif()

# Where the Doxyfile sends the HTML (OUTPUT_DIRECTORY, relative to the repository root).
file(STRINGS "${SOURCE_DIR}/docs/Doxyfile" output_line REGEX "^OUTPUT_DIRECTORY[ ]*=")
string(REGEX REPLACE "^OUTPUT_DIRECTORY[ ]*=[ ]*\"?([^\"]*)\"?[ ]*$" "\\1" output_dir "${output_line}")
set(html "${clone}/${output_dir}/html")
if(NOT EXISTS "${html}/index.html")
  message(FATAL_ERROR "doxygen wrote no ${html}/index.html")
endif()

# Every public header has its page. Doxygen names a file's page after the file's name, with
# "_" written "__", "." written "_8" and "/" written "_2" (config.cuh -> config_8cuh.html);
# headers that share a name are told apart by as much of their path as it takes
# (core/crc32c.hpp -> core_2crc32c_8hpp.html).
file(GLOB_RECURSE headers RELATIVE "${clone}/include"
     "${clone}/include/*.hpp" "${clone}/include/*.cuh")
set(missing "")
set(cuda_pages 0)
foreach(header IN LISTS headers)
  if(header MATCHES "/detail/")
    continue()
  endif()
  get_filename_component(name "${header}" NAME)
  string(REPLACE "_" "__" page "${name}")
  string(REPLACE "." "_8" page "${page}")
  file(GLOB with_path "${html}/*_2${page}.html")
  if(NOT EXISTS "${html}/${page}.html" AND NOT with_path)
    list(APPEND missing "${header}")
  elseif(name MATCHES "\\.cuh$")
    math(EXPR cuda_pages "${cuda_pages} + 1")
  endif()
endforeach()
if(missing)
  list(JOIN missing "\n  " missing)
  message(FATAL_ERROR "the API reference has no page for these headers:\n  ${missing}")
endif()
if(cuda_pages EQUAL 0)
  message(FATAL_ERROR "the API reference holds no CUDA header (.cuh)")
endif()
message(STATUS "API reference: ${html}/index.html (${cuda_pages} CUDA headers among them)")
