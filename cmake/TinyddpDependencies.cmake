# The Debian packages the build needs (make deps installs them): every find below says which
# package to install when it fails, instead of CMake's generic "could not find".
find_package(Threads REQUIRED)

# CBLAS: OpenBLAS (libopenblas-dev), the CPU GEMM every build has (kernels/cpu_gemm_openblas.cpp calls
# cblas_sgemm and openblas_set_num_threads).
find_path(TINYDDP_CBLAS_INCLUDE cblas.h PATH_SUFFIXES openblas x86_64-linux-gnu/openblas-pthread aarch64-linux-gnu/openblas-pthread)
find_library(TINYDDP_OPENBLAS_LIB NAMES openblas PATH_SUFFIXES openblas-pthread)
if(NOT TINYDDP_CBLAS_INCLUDE OR NOT TINYDDP_OPENBLAS_LIB)
  message(FATAL_ERROR "OpenBLAS was not found (cblas.h / libopenblas). Install it: apt-get install libopenblas-dev  (or run: make deps)")
endif()
add_library(tinyddp::blas INTERFACE IMPORTED)
target_include_directories(tinyddp::blas INTERFACE ${TINYDDP_CBLAS_INCLUDE})
target_link_libraries(tinyddp::blas INTERFACE ${TINYDDP_OPENBLAS_LIB})

# oneDNN (libdnnl-dev), the faster CPU GEMM on AVX-512 cores (kernels/cpu_gemm.h). The kernels use its
# header and load the library when they first choose it (dlopen), so it is not linked: tinyddp::onednn
# is the header and libdl. Programs that call oneDNN themselves (bench/gemm_bench) link
# tinyddp::onednn_linked, with the OpenMP runtime it threads with. TINYDDP_ONEDNN=AUTO uses it when
# found, ON requires it, OFF builds with OpenBLAS alone.
set(TINYDDP_WITH_ONEDNN OFF)
set(TINYDDP_ONEDNN_WHY "TINYDDP_ONEDNN=OFF")
if(NOT TINYDDP_ONEDNN STREQUAL "OFF")
  # The header and the library, not dnnl-config.cmake: that one also demands the OpenCL headers (for
  # oneDNN's GPU half, which tinyddp does not use).
  find_path(TINYDDP_ONEDNN_INCLUDE oneapi/dnnl/dnnl.h)
  find_library(TINYDDP_ONEDNN_LIB NAMES dnnl)
  if(TINYDDP_ONEDNN_INCLUDE AND TINYDDP_ONEDNN_LIB)
    set(TINYDDP_WITH_ONEDNN ON)
    file(STRINGS ${TINYDDP_ONEDNN_INCLUDE}/oneapi/dnnl/dnnl_version.h onednn_version_lines REGEX "define DNNL_VERSION_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE "[^0-9;]" "" onednn_version "${onednn_version_lines}")
    string(REPLACE ";" "." onednn_version "${onednn_version}")
    set(TINYDDP_ONEDNN_WHY "oneDNN ${onednn_version} (${TINYDDP_ONEDNN_LIB}), loaded when first chosen")
    add_library(tinyddp::onednn INTERFACE IMPORTED)
    target_include_directories(tinyddp::onednn INTERFACE ${TINYDDP_ONEDNN_INCLUDE})
    target_link_libraries(tinyddp::onednn INTERFACE ${CMAKE_DL_LIBS})
    find_package(OpenMP QUIET COMPONENTS CXX)
    if(OpenMP_CXX_FOUND)
      add_library(tinyddp::onednn_linked INTERFACE IMPORTED)
      target_link_libraries(tinyddp::onednn_linked INTERFACE tinyddp::onednn ${TINYDDP_ONEDNN_LIB} OpenMP::OpenMP_CXX)
    endif()
  elseif(TINYDDP_ONEDNN STREQUAL "ON")
    message(FATAL_ERROR "TINYDDP_ONEDNN=ON but oneDNN (oneapi/dnnl/dnnl.h, libdnnl) was not found. Install it: apt-get install libdnnl-dev  (or run: make deps), or configure with -DTINYDDP_ONEDNN=AUTO")
  else()
    set(TINYDDP_ONEDNN_WHY "not found (apt-get install libdnnl-dev, or make deps)")
  endif()
endif()

# Asio, standalone and header-only (libasio-dev).
find_path(TINYDDP_ASIO_INCLUDE asio.hpp)
if(NOT TINYDDP_ASIO_INCLUDE)
  message(FATAL_ERROR "Asio was not found (asio.hpp). Install it: apt-get install libasio-dev  (or run: make deps)")
endif()
add_library(tinyddp::asio INTERFACE IMPORTED)
target_include_directories(tinyddp::asio INTERFACE ${TINYDDP_ASIO_INCLUDE})
target_compile_definitions(tinyddp::asio INTERFACE ASIO_STANDALONE ASIO_NO_DEPRECATED)

find_package(nlohmann_json 3 QUIET)
if(NOT nlohmann_json_FOUND)
  message(FATAL_ERROR "nlohmann_json was not found. Install it: apt-get install nlohmann-json3-dev  (or run: make deps)")
endif()

find_path(TINYDDP_CLI11_INCLUDE CLI/CLI.hpp)
if(NOT TINYDDP_CLI11_INCLUDE)
  message(FATAL_ERROR "CLI11 was not found (CLI/CLI.hpp). Install it: apt-get install libcli11-dev  (or run: make deps)")
endif()
add_library(tinyddp::cli INTERFACE IMPORTED)
target_include_directories(tinyddp::cli INTERFACE ${TINYDDP_CLI11_INCLUDE})

# zlib (zlib1g-dev): the CSV reader opens .csv.gz files.
find_package(ZLIB QUIET)
if(NOT ZLIB_FOUND)
  message(FATAL_ERROR "zlib was not found (zlib.h / libz). Install it: apt-get install zlib1g-dev  (or run: make deps)")
endif()

if(TINYDDP_TESTS)
  find_path(TINYDDP_DOCTEST_INCLUDE doctest/doctest.h)
  if(NOT TINYDDP_DOCTEST_INCLUDE)
    message(FATAL_ERROR "doctest was not found. Install it: apt-get install doctest-dev  (or run: make deps), or configure with -DTINYDDP_TESTS=OFF")
  endif()
endif()
