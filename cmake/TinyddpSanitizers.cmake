# Sanitizer builds (make test-asan, make test-tsan, and the ASan+UBSan pass of make test).
# TINYDDP_SANITIZE is what -fsanitize= takes: "address,undefined" or "thread" ("" builds without).
#
# UndefinedBehaviorSanitizer only prints and carries on by default, so a test would pass over the
# very bug it found: -fno-sanitize-recover makes every report fatal, and the test fails.
if(TINYDDP_SANITIZE)
  if(TINYDDP_SANITIZE MATCHES "thread" AND TINYDDP_SANITIZE MATCHES "address")
    message(FATAL_ERROR "TINYDDP_SANITIZE=${TINYDDP_SANITIZE}: ThreadSanitizer and AddressSanitizer cannot be combined; hint: build them in two folders (make test-asan, make test-tsan)")
  endif()
  if(TINYDDP_WITH_CUDA)
    message(WARNING "TINYDDP_SANITIZE with CUDA on: the sanitizers do not see inside the CUDA runtime and often fail to start with it; configure with -DTINYDDP_CUDA=OFF")
  endif()
  foreach(flag -fsanitize=${TINYDDP_SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer)
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:${flag}>)
  endforeach()
  add_link_options(-fsanitize=${TINYDDP_SANITIZE})
endif()

# ThreadSanitizer and gcc's target_clones do not mix: the clone is picked by an ifunc resolver that
# the dynamic loader runs before the TSan runtime is initialised, and the instrumented resolver
# crashes every program at load (a segfault before main). The two files with clones are built
# without TSan instrumentation until their sources skip the clones under __SANITIZE_THREAD__; they
# hold pure element loops (no locks, no threads), so the races TSan looks for are still seen in
# every caller.
if(TINYDDP_SANITIZE MATCHES "thread")
  # <source with clones>:<file whose #if decides on them>
  foreach(pair kernels/optimizers.cpp:kernels/cpu_vector_clones.h comm/reduce_op.cpp:comm/reduce_op.cpp)
    string(REPLACE ":" ";" pair ${pair})
    list(GET pair 0 source)
    list(GET pair 1 condition)
    if(EXISTS ${PROJECT_SOURCE_DIR}/${condition})
      file(READ ${PROJECT_SOURCE_DIR}/${condition} text)
      if(text MATCHES "target_clones" AND NOT text MATCHES "__SANITIZE_THREAD__")
        set_source_files_properties(${PROJECT_SOURCE_DIR}/${source} PROPERTIES COMPILE_OPTIONS -fno-sanitize=thread)
      endif()
    endif()
  endforeach()
endif()
