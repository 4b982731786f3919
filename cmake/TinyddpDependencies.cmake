# The Debian packages the build needs (make deps installs them): every find below says which
# package to install when it fails, instead of CMake's generic "could not find".
find_package(Threads REQUIRED)

# CBLAS: OpenBLAS (libopenblas-dev). We call cblas_sgemm and openblas_set_num_threads.
find_path(TINYDDP_CBLAS_INCLUDE cblas.h PATH_SUFFIXES openblas x86_64-linux-gnu/openblas-pthread aarch64-linux-gnu/openblas-pthread)
find_library(TINYDDP_OPENBLAS_LIB NAMES openblas PATH_SUFFIXES openblas-pthread)
if(NOT TINYDDP_CBLAS_INCLUDE OR NOT TINYDDP_OPENBLAS_LIB)
  message(FATAL_ERROR "OpenBLAS was not found (cblas.h / libopenblas). Install it: apt-get install libopenblas-dev  (or run: make deps)")
endif()
add_library(tinyddp::blas INTERFACE IMPORTED)
target_include_directories(tinyddp::blas INTERFACE ${TINYDDP_CBLAS_INCLUDE})
target_link_libraries(tinyddp::blas INTERFACE ${TINYDDP_OPENBLAS_LIB})

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
