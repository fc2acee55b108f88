# kernels/cuda/cuda.cmake - the CUDA backend (issue 5), included by the top CMakeLists.txt.
#
# STRATA_CUDA=AUTO|ON|OFF. With nvcc found and AUTO or ON:
#   strata_cuda_kernels   static library of kernels/cuda/*.cu built by nvcc for
#                         CMAKE_CUDA_ARCHITECTURES (default 80;86;89;90), warnings as errors,
#                         `-Xptxas -v` for every kernel captured into <build>/cuda_ptxas.log (not
#                         printed: the build shows only errors);
#                         linked into strata_lib together with cuBLAS and the CUDA runtime;
#   src/device/cuda_device.cpp is compiled into strata_lib and STRATA_HAVE_CUDA defined, so
#                         device_create() can make the "cuda" backend;
#   strata_cuda_tests     tests/cuda/*.cpp against the real backend (ctest label `cuda`); on a
#                         machine without a GPU every case exits 77 and ctest reports it skipped.
# Whenever the CUDA headers and the emulator (tools/cuemu) are there, with or without nvcc:
#   strata_cuda_emu_tests the same .cu files and cuda_device.cpp compiled by g++ with
#                         tools/cuemu/cuemu.h force-included, plus tests/cuda/*.cpp, linked to
#                         strata_cuemu (label `cuda-emu`): the CUDA backend verified without a GPU.
# tests/cuda/*.cpp and cuda_device.cpp are taken out of the top-level globs' targets, which
# must not build them without CUDA.

set(strata_cuda_dir ${CMAKE_SOURCE_DIR}/kernels/cuda)
file(GLOB strata_cuda_kernels CONFIGURE_DEPENDS ${strata_cuda_dir}/*.cu)
set(strata_cuda_device_source ${CMAKE_SOURCE_DIR}/src/device/cuda_device.cpp)
file(GLOB strata_cuda_test_sources CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/cuda/*.cpp)

# ---- the decision -------------------------------------------------------------------------------
set(strata_cuda_build OFF)
if(STRATA_CUDA STREQUAL "ON" OR (STRATA_CUDA STREQUAL "AUTO" AND STRATA_NVCC))
  set(strata_cuda_build ON)
elseif(NOT STRATA_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "STRATA_CUDA must be AUTO, ON or OFF (got '${STRATA_CUDA}')")
endif()

function(strata_cuda_remove_sources target)
  if(TARGET ${target})
    get_target_property(srcs ${target} SOURCES)
    list(REMOVE_ITEM srcs ${ARGN})
    set_property(TARGET ${target} PROPERTY SOURCES ${srcs})
  endif()
endfunction()
strata_cuda_remove_sources(strata_tests ${strata_cuda_test_sources})
strata_cuda_remove_sources(strata_lib ${strata_cuda_device_source})  # added back below when built

# ---- the real backend, built by nvcc ------------------------------------------------------------
if(strata_cuda_build)
  if(NOT CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_COMPILER ${STRATA_NVCC})
  endif()
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80 86 89 90)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # C++20 like the rest (CUDA_STANDARD follows CMAKE_CXX_STANDARD); CMake 3.25 does not know
  # nvcc's flag for it yet (nvcc >= 12 takes -std=c++20).
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()

  # A compiler launcher that copies nvcc's stderr (the ptxas -v report) next to each object.
  set(strata_ptxas_launcher ${CMAKE_BINARY_DIR}/strata_ptxas_log.sh)
  file(WRITE ${strata_ptxas_launcher} [=[#!/bin/sh
# Runs the CUDA compile given as arguments; its stderr (the ptxas -v report) goes to
# <object>.ptxas.log and is shown only when the compile fails (then it holds the errors).
obj=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && obj="$a"; prev="$a"; done
log="${obj:-ptxas}.ptxas.log"
"$@" 2>"$log"; rc=$?
[ $rc -eq 0 ] || cat "$log" >&2
exit $rc
]=])
  file(CHMOD ${strata_ptxas_launcher} PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE
    GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)

  add_library(strata_cuda_kernels STATIC ${strata_cuda_kernels})
  # The ZO perturbation and LoRA dropout must give the CPU's bits: no multiply-add contraction in them.
  set_source_files_properties(${strata_cuda_dir}/zo.cu ${strata_cuda_dir}/dropout.cu PROPERTIES COMPILE_OPTIONS "-fmad=false")
  target_include_directories(strata_cuda_kernels PUBLIC ${CMAKE_SOURCE_DIR})
  target_compile_options(strata_cuda_kernels PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xptxas=-v
      -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter,-Werror>)
  set_target_properties(strata_cuda_kernels PROPERTIES
    CUDA_COMPILER_LAUNCHER ${strata_ptxas_launcher} POSITION_INDEPENDENT_CODE ON)
  target_link_libraries(strata_cuda_kernels PUBLIC CUDA::cudart CUDA::cublas)
  add_custom_command(TARGET strata_cuda_kernels POST_BUILD
    COMMAND sh -c "cat $(find . -name '*.cu.o.ptxas.log' | sort) > ${CMAKE_BINARY_DIR}/cuda_ptxas.log"
    WORKING_DIRECTORY ${CMAKE_BINARY_DIR}/CMakeFiles/strata_cuda_kernels.dir
    COMMENT "ptxas registers and spills of every kernel -> cuda_ptxas.log" VERBATIM)

  target_sources(strata_lib PRIVATE ${strata_cuda_device_source})
  target_link_libraries(strata_lib PUBLIC strata_cuda_kernels)
  target_compile_definitions(strata_lib PUBLIC STRATA_HAVE_CUDA=1)
  message(STATUS "strata: CUDA kernels        nvcc ${CMAKE_CUDA_COMPILER_VERSION}, sm ${CMAKE_CUDA_ARCHITECTURES}, warnings as errors, ptxas report in cuda_ptxas.log")

  if(STRATA_TESTS)
    add_executable(strata_cuda_tests ${strata_cuda_test_sources} ${CMAKE_SOURCE_DIR}/tests/test_main.cpp)
    target_link_libraries(strata_cuda_tests PRIVATE strata_lib Catch2::Catch2)
    target_compile_definitions(strata_cuda_tests PRIVATE STRATA_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
      STRATA_BINARY_DIR="${CMAKE_BINARY_DIR}")
    # A case that needs a GPU on a machine without one exits 77 (tests/cuda/cuda_testing.h):
    # ctest reports it skipped, one entry per case.
    catch_discover_tests(strata_cuda_tests EXTRA_ARGS -w NoTests TEST_PREFIX "gpu: " PROPERTIES LABELS cuda
      ENVIRONMENT "OMP_NUM_THREADS=2" SKIP_RETURN_CODE 77)
  endif()
endif()
message(STATUS "strata: CUDA backend        ${strata_cuda_build} (kernels/cuda/cuda.cmake decides for STRATA_CUDA=${STRATA_CUDA})")

# ---- the same sources under the CPU emulator ----------------------------------------------------
find_path(strata_cuda_emu_include cuda_runtime_api.h PATHS /usr/local/cuda/include /usr/include
  NO_DEFAULT_PATH)
if(STRATA_TESTS AND strata_cuda_emu_include AND EXISTS ${CMAKE_SOURCE_DIR}/tools/cuemu/cuemu.cmake)
  # Each .cu is compiled through a generated .cpp that includes it: source properties are per
  # directory, and the nvcc target above compiles the same files as CUDA.
  set(strata_cuda_emu_sources)
  foreach(cu ${strata_cuda_kernels})
    get_filename_component(name ${cu} NAME_WE)
    set(wrapper ${CMAKE_BINARY_DIR}/cuda_emu/${name}.cu.cpp)
    set(text "// Generated: ${cu} compiled by g++ under the CUDA emulator.\n#include \"${cu}\"\n")
    if(EXISTS ${wrapper})
      file(READ ${wrapper} old)
    else()
      set(old "")
    endif()
    if(NOT old STREQUAL text)
      file(WRITE ${wrapper} "${text}")
    endif()
    list(APPEND strata_cuda_emu_sources ${wrapper})
  endforeach()
  add_executable(strata_cuda_emu_tests ${strata_cuda_emu_sources} ${strata_cuda_device_source}
    ${strata_cuda_test_sources} ${CMAKE_SOURCE_DIR}/tests/test_main.cpp)
  target_compile_options(strata_cuda_emu_tests PRIVATE ${strata_flags}
    -Wno-unknown-pragmas -include ${CMAKE_SOURCE_DIR}/tools/cuemu/cuemu.h)  # `#pragma unroll` is nvcc's
  target_compile_definitions(strata_cuda_emu_tests PRIVATE STRATA_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
    STRATA_BINARY_DIR="${CMAKE_BINARY_DIR}")
  # strata_cuemu first: its runtime and cuBLAS resolve every CUDA call of the objects above, so
  # neither the real backend's archive members nor the real CUDA libraries are linked in.
  target_link_libraries(strata_cuda_emu_tests PRIVATE strata_cuemu strata_lib Catch2::Catch2)
  target_link_options(strata_cuda_emu_tests PRIVATE -Wl,--as-needed)
  catch_discover_tests(strata_cuda_emu_tests EXTRA_ARGS -w NoTests TEST_PREFIX "emu: " PROPERTIES LABELS cuda-emu
    ENVIRONMENT "CUEMU_SEED=1;OMP_NUM_THREADS=2")
endif()
