# How a program outside this tree finds tinyddp's headers and libraries: the include layout, the
# install rules, tinyddpConfig.cmake (find_package) and tinyddp.pc (pkg-config).
#
# Headers are installed under <prefix>/include/tinyddp/ (core/, kernels/, comm/, nn/), and a program
# includes them as <tinyddp/nn/train/trainer.h>, so that tinyddp's folder names never meet the user's
# own: a project with a core/ folder of its own keeps it. Inside this tree the same spelling works
# through <build>/include/tinyddp/<folder>, a link to each source folder.
#
# TINYDDP_SHORT_INCLUDES: OFF, because every header includes its siblings in the installed spelling
# ("tinyddp/core/tensor.h"; scripts/rewrite_includes.sh wrote them so and its --check keeps them so).
# ON would put <prefix>/include/tinyddp on the installed include path too, for headers still written
# "core/tensor.h", where a user's own core/tensor.h could be found instead.
set(TINYDDP_SHORT_INCLUDES OFF)

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TINYDDP_BUILD_INCLUDE_DIR ${PROJECT_BINARY_DIR}/include)
file(MAKE_DIRECTORY ${TINYDDP_BUILD_INCLUDE_DIR}/tinyddp)
foreach(folder core kernels comm nn)
  file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${folder} ${TINYDDP_BUILD_INCLUDE_DIR}/tinyddp/${folder} SYMBOLIC)
endforeach()

# The include directories of one tinyddp library, for this build and for the installed tree.
function(tinyddp_include_directories target)
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<BUILD_INTERFACE:${TINYDDP_BUILD_INCLUDE_DIR}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  if(TINYDDP_SHORT_INCLUDES)
    target_include_directories(${target} PUBLIC $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/tinyddp>)
  endif()
endfunction()

# Installed binaries find the shared libraries beside them (lib/ next to bin/), wherever the tree is moved.
if(TINYDDP_SHARED)
  file(RELATIVE_PATH lib_from_bin /${CMAKE_INSTALL_BINDIR} /${CMAKE_INSTALL_LIBDIR})
  set(CMAKE_INSTALL_RPATH "$ORIGIN/${lib_from_bin}")
endif()

# The link line pkg-config gives for the libraries' own dependencies: what a static library needs
# from the program that links it (a shared one carries them itself: Libs.private).
function(tinyddp_pkg_config_libs out)
  set(libs ${TINYDDP_OPENBLAS_LIB})
  if(TINYDDP_WITH_ONEDNN)
    list(APPEND libs -l${CMAKE_DL_LIBS})  # oneDNN itself is loaded at run time
  endif()
  list(APPEND libs -lz -pthread)
  if(TINYDDP_EXPORT_LINKS_CUDA)
    list(APPEND libs -L${CUDAToolkit_LIBRARY_DIR} -lcublas -lcudart)
  endif()
  if(TINYDDP_EXPORT_LINKS_NCCL)
    list(APPEND libs ${TINYDDP_NCCL_LIB})
  endif()
  list(JOIN libs " " libs)
  set(${out} "${libs}" PARENT_SCOPE)
endfunction()

# Install rules for the libraries and tools (tinyddp::<name> once installed), their headers, the
# CMake package files and the pkg-config file.
function(tinyddp_install)
  # Whether the libraries link the CUDA libraries (or NCCL) themselves, so that a program linking them
  # must too; not when CUDA is a part loaded on demand.
  set(TINYDDP_EXPORT_LINKS_CUDA OFF)
  set(TINYDDP_EXPORT_LINKS_NCCL OFF)
  foreach(target ${ARGN})
    get_target_property(links ${target} INTERFACE_LINK_LIBRARIES)
    if(links MATCHES "CUDA::")
      set(TINYDDP_EXPORT_LINKS_CUDA ON)
    endif()
    if(links MATCHES "tinyddp::nccl")
      set(TINYDDP_EXPORT_LINKS_NCCL ON)
    endif()
  endforeach()
  install(TARGETS ${ARGN} EXPORT tinyddpTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/core ${PROJECT_SOURCE_DIR}/kernels ${PROJECT_SOURCE_DIR}/comm
                    ${PROJECT_SOURCE_DIR}/nn
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tinyddp
          FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh" PATTERN "tools" EXCLUDE)

  set(config_dir ${CMAKE_INSTALL_LIBDIR}/cmake/tinyddp)
  install(EXPORT tinyddpTargets NAMESPACE tinyddp:: DESTINATION ${config_dir})
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tinyddpConfig.cmake.in
                                ${PROJECT_BINARY_DIR}/tinyddpConfig.cmake INSTALL_DESTINATION ${config_dir})
  # 0.x: a new minor version may change the API, so only the same minor version is compatible.
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/tinyddpConfigVersion.cmake COMPATIBILITY SameMinorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/tinyddpConfig.cmake ${PROJECT_BINARY_DIR}/tinyddpConfigVersion.cmake
          DESTINATION ${config_dir})

  # tinyddp.pc finds its prefix from where it lies (${pcfiledir}), so the tree can be moved.
  file(RELATIVE_PATH TINYDDP_PC_PREFIX_FROM_PCFILEDIR /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
  string(REGEX REPLACE "/$" "" TINYDDP_PC_PREFIX_FROM_PCFILEDIR "${TINYDDP_PC_PREFIX_FROM_PCFILEDIR}")
  tinyddp_pkg_config_libs(dependency_libs)
  if(TINYDDP_SHARED)
    set(TINYDDP_PC_LIBS "")
    set(TINYDDP_PC_LIBS_PRIVATE "${dependency_libs}")
  else()
    set(TINYDDP_PC_LIBS "${dependency_libs}")
    set(TINYDDP_PC_LIBS_PRIVATE "")
  endif()
  set(TINYDDP_PC_CFLAGS "-I\${includedir}")
  if(TINYDDP_SHORT_INCLUDES)
    string(APPEND TINYDDP_PC_CFLAGS " -I\${includedir}/tinyddp")
  endif()
  if(TINYDDP_WITH_CUDA)
    string(APPEND TINYDDP_PC_CFLAGS " -DTINYDDP_WITH_CUDA=1")
  endif()
  if(TINYDDP_EXPORT_LINKS_CUDA)
    string(APPEND TINYDDP_PC_CFLAGS " -I${CUDAToolkit_INCLUDE_DIRS}")
  endif()
  if(TINYDDP_WITH_NCCL)
    string(APPEND TINYDDP_PC_CFLAGS " -DTINYDDP_WITH_NCCL=1")
  endif()
  configure_file(${PROJECT_SOURCE_DIR}/cmake/tinyddp.pc.in ${PROJECT_BINARY_DIR}/tinyddp.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/tinyddp.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endfunction()
