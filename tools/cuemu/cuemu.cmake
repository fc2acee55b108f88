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
  ${strata_cuemu_dir}/cuemu_blas.cpp)

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
catch_discover_tests(strata_cuemu_tests PROPERTIES LABELS cuda-emu ENVIRONMENT "CUEMU_SEED=1")

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
