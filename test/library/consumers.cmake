# A program outside tinyddp's tree, built the three ways a user builds one, each run on 2 workers:
#   1. against the installed tree with find_package (examples/sine_fit/CMakeLists.txt as it is),
#   2. against the installed tree with pkg-config and a plain compiler line (README's command),
#   3. with tinyddp's sources inside its own build (add_subdirectory, what FetchContent does).
# And the README shows examples/sine_fit/main.cpp and its CMakeLists.txt as they are. Once tinyddp's
# headers include each other as "tinyddp/core/..." (SHORT_INCLUDES=OFF: scripts/rewrite_includes.sh),
# the installed builds also put a folder of the user's own first on the include path, with a core/,
# kernels/, comm/ and nn/ whose headers stop the compiler: tinyddp must never pick one up.
#
#   cmake -DSOURCE_DIR=... -DBUILD_DIR=... -DWORK_DIR=... -DCXX=... [-DLAUNCHER=ccache] [-DCUDA_LAUNCHER=ccache]
#         -DBUILD_TYPE=Release -DGENERATOR="Unix Makefiles" -DCONFIGURE_ARGS="-DTINYDDP_CUDA=ON|..."
#         [-DCUDA_ARCHITECTURES=80,90] [-DSHORT_INCLUDES=OFF]
#         -P test/library/consumers.cmake
#
# The third way compiles tinyddp again. Through the main build's compiler cache (LAUNCHER) that takes
# seconds when its tinyddp build folder lies beside BUILD_DIR, at the same depth: the cache then sees
# the same relative paths and flags as in the main build (ccache's base_dir). That folder,
# <BUILD_DIR>-subproject, is kept between runs. Without a cache it is a whole build of the libraries.
cmake_minimum_required(VERSION 3.25)

foreach(required SOURCE_DIR BUILD_DIR WORK_DIR CXX)
  if(NOT ${required})
    message(FATAL_ERROR "consumers.cmake: -D${required}=... is required")
  endif()
endforeach()
set(example ${SOURCE_DIR}/examples/sine_fit)
set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

# Runs a command; on failure prints what it printed and stops the test.
function(run what)
  string(TIMESTAMP start "%s")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE out)
  string(TIMESTAMP end "%s")
  math(EXPR seconds "${end} - ${start}")
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${what} failed (${status}) after ${seconds} s:\n${ARGN}\n${out}")
  endif()
  message(STATUS "${what}: ${seconds} s")
  set(output "${out}" PARENT_SCOPE)
endfunction()

# The program trains on 2 CPU workers and predicts sin(0.5); the spawner reports the job's size.
function(check_sine_fit how program)
  run("${how}: sine_fit on 2 workers" ${program})
  if(NOT output MATCHES "^2 workers, final loss ([0-9.]+); sin\\(0\\.5\\) = 0\\.4794, the model says (-?[0-9.]+)")
    message(FATAL_ERROR "${how}: sine_fit printed something unexpected:\n${output}")
  endif()
  set(loss ${CMAKE_MATCH_1})
  set(guess ${CMAKE_MATCH_2})
  # A 1-64-1 GELU MLP fits sine on [-3, 3] to a mean squared error of about 1e-4; the prediction
  # must be close to sin(0.5), which a wrong build (weights not carried back, no training) is not.
  if(loss GREATER 0.005 OR guess LESS 0.43 OR guess GREATER 0.53)
    message(FATAL_ERROR "${how}: sine_fit trained badly (loss ${loss}, sin(0.5) predicted as ${guess}):\n${output}")
  endif()
  message(STATUS "${how}: ${output}")
endfunction()

# The README's program and CMakeLists are these files, word for word.
file(READ ${SOURCE_DIR}/README.md readme)
foreach(shown main.cpp CMakeLists.txt)
  file(READ ${example}/${shown} text)
  string(FIND "${readme}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "README.md does not show examples/sine_fit/${shown} as it is; copy the file into it again")
  endif()
endforeach()

string(REPLACE "|" ";" CONFIGURE_ARGS "${CONFIGURE_ARGS}")  # the main build's options, so the libraries match
set(common_args -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DCMAKE_CXX_COMPILER=${CXX} ${CONFIGURE_ARGS})
if(CUDA_ARCHITECTURES)  # "80,90": one argument, its list separators escaped
  string(REPLACE "," "\\;" CUDA_ARCHITECTURES "${CUDA_ARCHITECTURES}")
  list(APPEND common_args "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}")
endif()
set(user_include_args "")
set(user_cxx_flags "")
if(DEFINED SHORT_INCLUDES AND NOT SHORT_INCLUDES)
  set(user_headers ${WORK_DIR}/user_headers)
  foreach(header core/tensor.h core/error.h kernels/ops.h comm/process_group.h nn/module.h nn/train/trainer.h)
    file(WRITE ${user_headers}/${header} "#error \"the user's own ${header} was included in place of tinyddp's\"\n")
  endforeach()
  set(user_include_args -iquote ${user_headers})  # searched before every -I for "..." includes
  set(user_cxx_flags "-iquote ${user_headers}")
endif()
if(LAUNCHER)
  set(ENV{CCACHE_BASEDIR} ${SOURCE_DIR})  # as the main build keys its cache
  list(APPEND common_args -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()
if(CUDA_LAUNCHER)
  list(APPEND common_args -DCMAKE_CUDA_COMPILER_LAUNCHER=${CUDA_LAUNCHER})
endif()

# 1. Installed, found with find_package.
run("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
run("find_package: configure" ${CMAKE_COMMAND} -S ${example} -B ${WORK_DIR}/installed ${common_args}
    -DCMAKE_PREFIX_PATH=${prefix} "-DCMAKE_CXX_FLAGS=${user_cxx_flags}")
run("find_package: build" ${CMAKE_COMMAND} --build ${WORK_DIR}/installed)
check_sine_fit("find_package" ${WORK_DIR}/installed/sine_fit)
# The test fakes (test/support/) are in none of the installed libraries, nor in the program.
file(GLOB installed_libraries ${prefix}/lib*/libtinyddp_*)
foreach(file ${WORK_DIR}/installed/sine_fit ${installed_libraries})
  if(IS_SYMLINK ${file})
    continue()
  endif()
  run("nm ${file}" nm -C ${file})
  if(NOT output MATCHES "tinyddp::")
    message(FATAL_ERROR "nm found no tinyddp symbol in ${file}: it cannot tell whether the test fakes are there")
  endif()
  if(output MATCHES "tinyddp::(FakeCuda|comm::FakeNccl|active_fake_cuda|comm::fake_nccl)")
    message(FATAL_ERROR "${file} holds a test fake (${CMAKE_MATCH_0}); they belong in test/support only")
  endif()
endforeach()

# 2. Installed, with pkg-config.
find_program(PKG_CONFIG pkg-config)
if(PKG_CONFIG)
  set(ENV{PKG_CONFIG_PATH} ${prefix}/lib/pkgconfig)
  run("pkg-config" ${PKG_CONFIG} --cflags --libs tinyddp)
  separate_arguments(flags UNIX_COMMAND "${output}")
  if("-DTINYDDP_SHARED=ON" IN_LIST CONFIGURE_ARGS)
    list(APPEND flags -Wl,-rpath,${prefix}/lib)  # where the program finds libtinyddp_*.so when it runs
  endif()
  run("pkg-config: compile" ${LAUNCHER} ${CXX} -std=c++20 -O2 ${user_include_args} ${example}/main.cpp ${flags}
    -o ${WORK_DIR}/sine_fit_pc)
  check_sine_fit("pkg-config" ${WORK_DIR}/sine_fit_pc)
else()
  message(STATUS "pkg-config: skipped, no pkg-config program (apt-get install pkg-config)")
endif()

# 3. The sources inside the user's build.
set(consumer ${WORK_DIR}/subproject)
file(MAKE_DIRECTORY ${consumer})
file(WRITE ${consumer}/CMakeLists.txt "cmake_minimum_required(VERSION 3.25)
project(sine_fit_with_tinyddp_inside LANGUAGES CXX)
add_subdirectory(${SOURCE_DIR} ${BUILD_DIR}-subproject)
add_executable(sine_fit ${example}/main.cpp)
target_link_libraries(sine_fit PRIVATE tinyddp::tinyddp)
")
run("add_subdirectory: configure" ${CMAKE_COMMAND} -S ${consumer} -B ${consumer}/build ${common_args})
run("add_subdirectory: build" ${CMAKE_COMMAND} --build ${consumer}/build --target sine_fit -j 2)
check_sine_fit("add_subdirectory" ${consumer}/build/sine_fit)
file(REMOVE_RECURSE ${WORK_DIR})
