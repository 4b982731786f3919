# CUDA, cuBLAS and NCCL detection, and the CUDA half: the shared libraries loaded on demand.
#
# Sets TINYDDP_WITH_CUDA / TINYDDP_WITH_NCCL and, for the summary, TINYDDP_CUDA_WHY / TINYDDP_NCCL_WHY
# (what was found, or why it was left out) and TINYDDP_CUDA_ARCH_WHY.
#
# No tinyddp library or program links a CUDA library. What needs CUDA's headers and libraries is built
# into two modules, loaded with dlopen the first time they are needed (core/cuda_plugin.h says why):
#   libtinyddp_cuda.so   core/cuda/ and kernels/cuda/   -> libcudart, libcublas, libcublasLt
#   libtinyddp_nccl.so   comm/nccl/plugin/              -> libnccl, libcudart
# tinyddp_add_cuda_halves() (called once the libraries exist) defines them.
include(GNUInstallDirs)
set(TINYDDP_WITH_CUDA OFF)
set(TINYDDP_WITH_NCCL OFF)
set(TINYDDP_CUDA_WHY "TINYDDP_CUDA=OFF")
set(TINYDDP_NCCL_WHY "needs CUDA")
set(TINYDDP_CUDA_ARCH_WHY "")
set(TINYDDP_ROOT ${CMAKE_CURRENT_LIST_DIR}/..)

if(NOT TINYDDP_CUDA STREQUAL "OFF")
  # nvcc on PATH, or the usual install location when it is not.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(TINYDDP_NVCC nvcc PATHS /usr/local/cuda/bin NO_CACHE)
    if(TINYDDP_NVCC)
      set(CMAKE_CUDA_COMPILER ${TINYDDP_NVCC})
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Machine code for the GPUs people own -- T4 and RTX 20 (7.5), A100 (8.0), RTX 30 and A10/A40
      # (8.6), L4/L40 and RTX 40 (8.9), H100/H200 (9.0) -- and PTX for 9.0, which the driver compiles
      # at load time for anything newer (Blackwell). CUDA 13 dropped Volta (V100, 7.0); an older
      # toolkit gets it back. Override with -DCMAKE_CUDA_ARCHITECTURES="...".
      set(CMAKE_CUDA_ARCHITECTURES 75-real 80-real 86-real 89-real 90)
      set(TINYDDP_CUDA_ARCH_WHY "the default")
      if(CMAKE_CUDA_COMPILER_VERSION AND CMAKE_CUDA_COMPILER_VERSION VERSION_LESS 13.0)
        list(PREPEND CMAKE_CUDA_ARCHITECTURES 70-real)
      endif()
    else()
      set(TINYDDP_CUDA_ARCH_WHY "from CMAKE_CUDA_ARCHITECTURES")
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)  # nvcc C++20 support is not known to CMake 3.25; .cu files use C++17
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(TINYDDP_WITH_CUDA ON)
    set(TINYDDP_CUDA_WHY "nvcc ${CMAKE_CUDA_COMPILER_VERSION} at ${CMAKE_CUDA_COMPILER}; runtime and cuBLAS loaded on first use")
  elseif(TINYDDP_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TINYDDP_CUDA=ON but no CUDA compiler was found: put nvcc on PATH (or set CUDACXX), or configure with -DTINYDDP_CUDA=AUTO")
  else()
    set(TINYDDP_CUDA_WHY "no nvcc on PATH or in /usr/local/cuda/bin (the CPU build is complete without it)")
  endif()
endif()

if(TINYDDP_WITH_CUDA AND NOT TINYDDP_NCCL STREQUAL "OFF")
  # Probe, do not guess: the header and the library must both exist, and a program calling
  # ncclGetVersion must compile and link against them.
  find_path(TINYDDP_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME PATH_SUFFIXES include)
  find_library(TINYDDP_NCCL_LIB nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_HOME PATH_SUFFIXES lib lib64)
  if(TINYDDP_NCCL_INCLUDE AND TINYDDP_NCCL_LIB)
    include(CheckCXXSourceCompiles)
    set(CMAKE_REQUIRED_INCLUDES ${TINYDDP_NCCL_INCLUDE} ${CUDAToolkit_INCLUDE_DIRS})
    set(CMAKE_REQUIRED_LIBRARIES ${TINYDDP_NCCL_LIB} CUDA::cudart)
    check_cxx_source_compiles("#include <nccl.h>\nint main() { int v = 0; return ncclGetVersion(&v) == ncclSuccess ? 0 : 1; }" TINYDDP_NCCL_LINKS)
    unset(CMAKE_REQUIRED_INCLUDES)
    unset(CMAKE_REQUIRED_LIBRARIES)
  endif()
  if(TINYDDP_NCCL_LINKS)
    set(TINYDDP_WITH_NCCL ON)
    add_library(tinyddp::nccl INTERFACE IMPORTED)
    target_include_directories(tinyddp::nccl INTERFACE ${TINYDDP_NCCL_INCLUDE})
    target_link_libraries(tinyddp::nccl INTERFACE ${TINYDDP_NCCL_LIB} CUDA::cudart)
    set(TINYDDP_NCCL_WHY "${TINYDDP_NCCL_LIB}, loaded with the first nccl process group")
  elseif(TINYDDP_NCCL STREQUAL "ON")
    message(FATAL_ERROR "TINYDDP_NCCL=ON but nccl.h and libnccl were not found or do not link: set NCCL_HOME, or configure with -DTINYDDP_NCCL=AUTO")
  else()
    set(TINYDDP_NCCL_WHY "nccl.h / libnccl not found or not linkable (set NCCL_HOME to point at them)")
  endif()
elseif(TINYDDP_NCCL STREQUAL "OFF")
  set(TINYDDP_NCCL_WHY "TINYDDP_NCCL=OFF")
endif()

# One loadable module of the CUDA half. `sources` need CUDA headers; core/error.cpp gives them the same
# tinyddp::Error the rest of tinyddp throws (the module links nothing else of tinyddp: what crosses the
# seam is plain pointers and numbers). Hidden symbols except the entry points, so that two copies of
# anything never meet.
function(tinyddp_cuda_half target)
  add_library(${target} MODULE ${ARGN} ${TINYDDP_ROOT}/core/error.cpp)
  target_include_directories(${target} PRIVATE ${TINYDDP_ROOT} ${TINYDDP_BUILD_INCLUDE_DIR})
  set_target_properties(${target} PROPERTIES
    LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/lib
    CUDA_RUNTIME_LIBRARY Shared          # one CUDA runtime for both modules: streams and events are shared
    CXX_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
    POSITION_INDEPENDENT_CODE ON)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall> $<$<COMPILE_LANGUAGE:CXX>:-Wextra>)
  # No fused multiply-add that the source does not write: nvcc's default (--fmad=true) turns a * b + c
  # into one fma.rn.f32, one rounding where the CPU build rounds twice, so the same __host__ __device__
  # function would give other bits on the GPU than the CPU tests checked. (g++ does not fuse either: it
  # keeps -ffp-contract=off in ISO mode, which CMAKE_CXX_EXTENSIONS OFF selects.) test/cuda_contraction.sh
  # checks the built module's PTX.
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--fmad=false>)
  target_link_options(${target} PRIVATE -Wl,--no-undefined)
  # The RUNPATH is written here, the same in the build and the install: the CUDA toolkit's library
  # folder (libcudart, libcublas). CMake's own build RPATH ended in an empty entry
  # ("/usr/local/cuda/lib:"), which the loader reads as the current folder: a libcudart.so.13 or
  # libnccl.so.2 in whatever folder a job starts from would have been loaded. libnccl.so.2 is found
  # at run time (comm/nccl/nccl_library_search.h), also where no RUNPATH could point.
  set_target_properties(${target} PROPERTIES BUILD_WITH_INSTALL_RPATH ON INSTALL_RPATH_USE_LINK_PATH OFF
                                             INSTALL_RPATH "${CUDAToolkit_LIBRARY_DIR}")
  install(TARGETS ${target} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endfunction()

# The CUDA half's modules, and what the libraries must know to find them. Programs are made to depend
# on the modules (they are loaded, not linked, so nothing else would build them first).
function(tinyddp_add_cuda_halves)
  if(NOT TINYDDP_WITH_CUDA)
    return()
  endif()
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS ${TINYDDP_ROOT}/core/cuda/*.cpp ${TINYDDP_ROOT}/core/cuda/*.cu
       ${TINYDDP_ROOT}/kernels/cuda/*.cpp ${TINYDDP_ROOT}/kernels/cuda/*.cu)
  tinyddp_cuda_half(tinyddp_cuda ${sources})
  target_link_libraries(tinyddp_cuda PRIVATE CUDA::cudart CUDA::cublas)
  add_dependencies(tinyddp_core tinyddp_cuda)

  string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" _ "${CMAKE_CUDA_COMPILER_VERSION}")
  math(EXPR toolkit "${CMAKE_MATCH_1} * 1000 + ${CMAKE_MATCH_2} * 10")
  target_compile_definitions(tinyddp_core PUBLIC TINYDDP_WITH_CUDA=1 PRIVATE TINYDDP_CUDA_TOOLKIT_VERSION=${toolkit}
    TINYDDP_PLUGIN_BUILD_DIR="${PROJECT_BINARY_DIR}/lib" TINYDDP_PLUGIN_INSTALL_DIR="${CMAKE_INSTALL_FULL_LIBDIR}")

  if(TINYDDP_WITH_NCCL)
    file(GLOB_RECURSE sources CONFIGURE_DEPENDS ${TINYDDP_ROOT}/comm/nccl/plugin/*.cpp)
    tinyddp_cuda_half(tinyddp_nccl ${sources})
    target_link_libraries(tinyddp_nccl PRIVATE tinyddp::nccl CUDA::cudart)
    add_dependencies(tinyddp_comm tinyddp_nccl)
    target_compile_definitions(tinyddp_comm PUBLIC TINYDDP_WITH_NCCL=1)
    get_filename_component(nccl_dir "${TINYDDP_NCCL_LIB}" DIRECTORY)
    target_compile_definitions(tinyddp_comm PRIVATE TINYDDP_NCCL_BUILD_LIBRARY_DIR="${nccl_dir}")
  endif()
endfunction()
