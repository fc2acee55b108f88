# tools/cuemu/cuemu.cmake - the CUDA emulator used by tests (never linked into the product).
# Included from the top CMakeLists.txt when STRATA_TESTS is on. Provides:
#   strata_cuemu            static library: CUDA runtime / cuBLAS / cuBLASLt on the CPU, plus the
#                           device-side executor; PUBLIC include dirs: the repo root and the CUDA headers
#   strata_cuemu_compile_cu(<file>...)   marks .cu files to be compiled by g++ as C++ with
#                           tools/cuemu/cuemu.h force-included (call it for each consumer's .cu files)
#   strata_cuemu_tests      the emulator's own Catch2 tests (ctest label cuda-emu)
#   strata_cuemu_tsan_race  a ThreadSanitizer build of the missing-__syncthreads reduction; its ctest
#                           passes when TSan reports the race, and a second one when TSan stays
#                           silent on the correct kernel (label cuda-emu)
#   strata_cuda_emu_tests_tsan  the emulated CUDA suite (kernels/cuda/cuda.cmake) under ThreadSanitizer,
#                           ctest "tsan: <case>" (label cuda-emu); see the end of this file
find_path(STRATA_CUDA_INCLUDE_DIR cuda_runtime_api.h
  PATHS /usr/local/cuda/include /usr/include NO_DEFAULT_PATH)
if(NOT STRATA_CUDA_INCLUDE_DIR OR NOT EXISTS ${STRATA_CUDA_INCLUDE_DIR}/cublasLt.h)
  message(STATUS "strata: CUDA emulator       skipped (no cuda_runtime_api.h / cublasLt.h found)")
  return()
endif()
message(STATUS "strata: CUDA emulator       on (headers ${STRATA_CUDA_INCLUDE_DIR})")

set(strata_cuemu_dir ${CMAKE_SOURCE_DIR}/tools/cuemu)
set(strata_cuemu_sources
  ${strata_cuemu_dir}/cuemu_exec.cpp
  ${strata_cuemu_dir}/cuemu_runtime.cpp
  ${strata_cuemu_dir}/cuemu_pinned.cpp
  ${strata_cuemu_dir}/cuemu_blas.cpp
  ${strata_cuemu_dir}/cuemu_nccl.cpp)  # NCCL, ranks as threads (src/comm/comm_nccl.cpp)

add_library(strata_cuemu STATIC ${strata_cuemu_sources})
target_include_directories(strata_cuemu PUBLIC ${CMAKE_SOURCE_DIR})
# The real CUDA declarations, as SYSTEM so their own warnings stay out of ours.
target_include_directories(strata_cuemu SYSTEM PUBLIC ${STRATA_CUDA_INCLUDE_DIR})
target_compile_options(strata_cuemu PRIVATE ${strata_flags})
target_link_libraries(strata_cuemu PUBLIC Threads::Threads)

function(strata_cuemu_compile_cu)
  set_source_files_properties(${ARGN} PROPERTIES LANGUAGE CXX
    COMPILE_OPTIONS "-xc++;-include;${CMAKE_SOURCE_DIR}/tools/cuemu/cuemu.h")
endfunction()

file(GLOB strata_cuemu_test_sources CONFIGURE_DEPENDS ${strata_cuemu_dir}/tests/*.cpp)
file(GLOB strata_cuemu_test_kernels CONFIGURE_DEPENDS ${strata_cuemu_dir}/tests/*.cu)
strata_cuemu_compile_cu(${strata_cuemu_test_kernels})
add_executable(strata_cuemu_tests ${strata_cuemu_test_sources} ${strata_cuemu_test_kernels})
target_compile_options(strata_cuemu_tests PRIVATE ${strata_flags})
target_link_libraries(strata_cuemu_tests PRIVATE strata_cuemu Catch2::Catch2)
catch_discover_tests(strata_cuemu_tests EXTRA_ARGS -w NoTests PROPERTIES LABELS cuda-emu ENVIRONMENT "CUEMU_SEED=1")

# Seeded bug for ThreadSanitizer: one OS thread per CUDA thread, a reduction without its barrier.
include(CheckCXXSourceCompiles)
set(CMAKE_REQUIRED_FLAGS -fsanitize=thread)
set(CMAKE_REQUIRED_LINK_OPTIONS -fsanitize=thread)
check_cxx_source_compiles("int main() { return 0; }" STRATA_HAVE_TSAN)
unset(CMAKE_REQUIRED_FLAGS)
unset(CMAKE_REQUIRED_LINK_OPTIONS)
if(STRATA_HAVE_TSAN AND NOT STRATA_SANITIZE)
  add_executable(strata_cuemu_tsan_race ${strata_cuemu_sources}
    ${strata_cuemu_dir}/tests/tsan/race_main.cpp ${strata_cuemu_dir}/tests/test_kernels.cu)
  target_include_directories(strata_cuemu_tsan_race PRIVATE ${CMAKE_SOURCE_DIR})
  target_include_directories(strata_cuemu_tsan_race SYSTEM PRIVATE ${STRATA_CUDA_INCLUDE_DIR})
  target_compile_options(strata_cuemu_tsan_race PRIVATE -O1 -g -fsanitize=thread)
  target_link_options(strata_cuemu_tsan_race PRIVATE -fsanitize=thread)
  target_link_libraries(strata_cuemu_tsan_race PRIVATE Threads::Threads)
  add_test(NAME cuemu_tsan_catches_missing_syncthreads COMMAND strata_cuemu_tsan_race)
  set_tests_properties(cuemu_tsan_catches_missing_syncthreads PROPERTIES LABELS cuda-emu
    ENVIRONMENT "CUEMU_THREADS=1;TSAN_OPTIONS=halt_on_error=0 exitcode=0 report_signal_unsafe=0"
    PASS_REGULAR_EXPRESSION "ThreadSanitizer: data race.*reduce_sum_missing_sync_kernel")
  add_test(NAME cuemu_tsan_silent_on_correct_kernel COMMAND strata_cuemu_tsan_race --correct)
  set_tests_properties(cuemu_tsan_silent_on_correct_kernel PROPERTIES LABELS cuda-emu
    ENVIRONMENT "CUEMU_THREADS=1" FAIL_REGULAR_EXPRESSION "ThreadSanitizer")
endif()

# ---- the emulated CUDA suite under ThreadSanitizer ----------------------------------------------
# strata_cuda_emu_tests_tsan: kernels/cuda/*.cu, cuda_device.cpp and tests/cuda (the sources of
# strata_cuda_emu_tests, kernels/cuda/cuda.cmake) with the emulator and a copy of strata_lib, all
# built with -fsanitize=thread, run with one OS thread per CUDA thread (CUEMU_THREADS=1) so that
# TSan sees every access of kernels, streams, copies, events and the host. ctest: "tsan: <case>",
# label cuda-emu; a TSan report fails the case (halt_on_error). OpenMP and oneDNN are not
# instrumented, so they run single-threaded here (OMP_NUM_THREADS=1).
# The cases (strata_cuda_tsan_cases): the device's streams, events, copies and timers, the
# streaming engine (bf16 and packed documents: every kernel of a layer and the loss head, all
# streams), AdamW and the small op suites. Left to the fiber runs: the fp64 attention sweep, the
# embedding and cross-entropy size sweeps and the four-model f32 engine case, which under TSan
# take 1-3 minutes each (one OS thread per CUDA thread and barrier); run them by hand with
#   CUEMU_THREADS=1 OMP_NUM_THREADS=1 build/strata_cuda_emu_tests_tsan "<case>"
option(STRATA_CUDA_EMU_TSAN "Build the emulated CUDA suite with ThreadSanitizer and run it in ctest" ON)
if(STRATA_CUDA_EMU_TSAN AND STRATA_HAVE_TSAN AND NOT STRATA_SANITIZE AND TARGET strata_cuda_emu_tests)
  set(strata_tsan_flags -O1 -g1 -fsanitize=thread)

  add_library(strata_lib_tsan STATIC ${strata_sources})
  target_include_directories(strata_lib_tsan PUBLIC ${CMAKE_SOURCE_DIR})
  target_compile_options(strata_lib_tsan PUBLIC ${strata_flags} ${strata_tsan_flags})
  target_link_options(strata_lib_tsan PUBLIC -fsanitize=thread)
  # strata_lib's dependencies and definitions, less the nvcc-built kernels (the emulated ones are
  # compiled into the test) and STRATA_HAVE_CUDA (device_create keeps to the CPU backend).
  get_target_property(strata_tsan_links strata_lib LINK_LIBRARIES)
  list(REMOVE_ITEM strata_tsan_links strata_cuda_kernels)
  target_link_libraries(strata_lib_tsan PUBLIC ${strata_tsan_links})
  get_target_property(strata_tsan_defs strata_lib COMPILE_DEFINITIONS)
  if(strata_tsan_defs)
    list(REMOVE_ITEM strata_tsan_defs STRATA_HAVE_CUDA=1)
    target_compile_definitions(strata_lib_tsan PUBLIC ${strata_tsan_defs})
  endif()

  add_library(strata_cuemu_tsan OBJECT ${strata_cuemu_sources})
  target_include_directories(strata_cuemu_tsan PUBLIC ${CMAKE_SOURCE_DIR})
  target_include_directories(strata_cuemu_tsan SYSTEM PUBLIC ${STRATA_CUDA_INCLUDE_DIR})
  target_compile_options(strata_cuemu_tsan PRIVATE ${strata_flags} ${strata_tsan_flags})

  add_executable(strata_cuda_emu_tests_tsan ${strata_cuda_emu_sources} ${strata_cuda_device_source}
    ${strata_cuda_test_sources} ${CMAKE_SOURCE_DIR}/tests/test_main.cpp)
  target_compile_options(strata_cuda_emu_tests_tsan PRIVATE -Wno-unknown-pragmas
    -include ${CMAKE_SOURCE_DIR}/tools/cuemu/cuemu.h)
  target_compile_definitions(strata_cuda_emu_tests_tsan PRIVATE
    STRATA_SOURCE_DIR="${CMAKE_SOURCE_DIR}" STRATA_BINARY_DIR="${CMAKE_BINARY_DIR}")
  target_link_libraries(strata_cuda_emu_tests_tsan PRIVATE strata_cuemu_tsan strata_lib_tsan
    Catch2::Catch2)
  # The environment comes from a launcher script: catch_discover_tests splits a list-valued
  # ENVIRONMENT property into separate arguments, so only its first variable would be set.
  set(strata_tsan_launcher ${CMAKE_BINARY_DIR}/strata_cuda_tsan_env.sh)
  file(WRITE ${strata_tsan_launcher} [=[#!/bin/sh
# Runs a command under the environment of the emulated CUDA suite's TSan tests (tools/cuemu/cuemu.cmake).
# OpenMP (libgomp) is not instrumented: its fork/join is invisible to TSan, so OpenMP is held to
# one thread (OMP_THREAD_LIMIT also caps omp_set_num_threads calls made by the code under test).
export CUEMU_THREADS=1 CUEMU_SEED=1 OMP_NUM_THREADS=1 OMP_THREAD_LIMIT=1
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS}"
exec "$@"
]=])
  file(CHMOD ${strata_tsan_launcher} PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE
    GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
  set_target_properties(strata_cuda_emu_tests_tsan PROPERTIES
    CROSSCOMPILING_EMULATOR ${strata_tsan_launcher})
  set(strata_cuda_tsan_cases "cuda device*,the streaming engine on the CUDA backend in bf16*,\
cuda adamw*,cuda rmsnorm*,cuda rope*,cuda swiglu*,cuda matmul*,cuda attention reports*,\
cuda attention rejects*")
  catch_discover_tests(strata_cuda_emu_tests_tsan EXTRA_ARGS -w NoTests TEST_SPEC ${strata_cuda_tsan_cases}
    TEST_PREFIX "tsan: " PROPERTIES LABELS cuda-emu)
  message(STATUS "strata: CUDA emulator TSan  strata_cuda_emu_tests_tsan (ctest \"tsan: *\", label cuda-emu)")
endif()
