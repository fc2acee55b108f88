# src/comm/comm.cmake - the comm layer's extra targets, included by the top CMakeLists.txt after
# the CUDA backend (kernels/cuda/cuda.cmake) and the emulator (tools/cuemu/cuemu.cmake).
# (comm.cpp and, with MPI, comm_mpi.cpp are in strata_lib through the top-level glob.)
#   NCCL      with the real CUDA backend and nccl.h + libnccl found: comm_nccl.cpp joins
#             strata_lib, STRATA_HAVE_NCCL defined, libnccl linked;
#   emulated  comm_nccl.cpp is compiled into the emulated CUDA suites (strata_cuda_emu_tests and
#             its TSan twin) against tools/cuemu's NCCL; tests/cuda/test_comm_nccl.cpp runs there
#             (label cuda-emu) with ranks as threads;
#   MPI       strata_comm_probe (tools/comm) and the ctest cases "comm mpi: ..." (label mpi), which
#             run it under `mpirun -np 2|3` via tests/comm/run_mpi.sh, and "train mpi: ..." (data-
#             parallel `strata train`, tests/train/run_train_mpi.sh); they report themselves
#             skipped (exit 77), never passed, when mpirun cannot start processes here.
set(strata_comm_nccl_source ${CMAKE_SOURCE_DIR}/src/comm/comm_nccl.cpp)

if(TARGET strata_cuda_kernels)
  find_path(STRATA_NCCL_INCLUDE nccl.h PATHS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(STRATA_NCCL_LIB nccl PATHS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib
    /usr/local/cuda/lib64)
  if(STRATA_NCCL_INCLUDE AND STRATA_NCCL_LIB)
    target_sources(strata_lib PRIVATE ${strata_comm_nccl_source})
    target_include_directories(strata_lib SYSTEM PUBLIC ${STRATA_NCCL_INCLUDE})
    target_link_libraries(strata_lib PUBLIC ${STRATA_NCCL_LIB})
    target_compile_definitions(strata_lib PUBLIC STRATA_HAVE_NCCL=1)
    if(TARGET strata_cuda_tests)
      target_compile_definitions(strata_cuda_tests PRIVATE STRATA_TEST_NCCL=1)
    endif()
  endif()
  message(STATUS "strata: NCCL                ${STRATA_NCCL_LIB} (STRATA_HAVE_NCCL)")
endif()

foreach(t strata_cuda_emu_tests strata_cuda_emu_tests_tsan)
  if(TARGET ${t})
    target_sources(${t} PRIVATE ${strata_comm_nccl_source})
    target_compile_definitions(${t} PRIVATE STRATA_TEST_NCCL=1)
  endif()
endforeach()

if(STRATA_TESTS AND MPI_CXX_FOUND)
  add_executable(strata_comm_probe ${CMAKE_SOURCE_DIR}/tools/comm/comm_probe.cpp)
  target_link_libraries(strata_comm_probe PRIVATE strata_lib)
  add_dependencies(strata_tests strata_comm_probe)
  set(strata_run_mpi sh ${CMAKE_SOURCE_DIR}/tests/comm/run_mpi.sh)
  add_test(NAME "comm mpi: np2 collectives" COMMAND ${strata_run_mpi} $<TARGET_FILE:strata_comm_probe> 2 collectives)
  add_test(NAME "comm mpi: np3 collectives" COMMAND ${strata_run_mpi} $<TARGET_FILE:strata_comm_probe> 3 collectives)
  # a rank that hangs / exits early: the others exit non-zero within the 3 s timeout, naming it
  add_test(NAME "comm mpi: np2 hung rank" COMMAND ${strata_run_mpi} --expect-fail
    "rank 0: .*got no answer from rank 1 within 3 s" $<TARGET_FILE:strata_comm_probe> 2 hang 1 3)
  add_test(NAME "comm mpi: np3 rank exits early" COMMAND ${strata_run_mpi} --expect-fail
    "(no answer from rank 2|rank 2 with PID|process rank 2)" $<TARGET_FILE:strata_comm_probe> 3 exit 2 3)
  set_tests_properties("comm mpi: np2 collectives" "comm mpi: np3 collectives"
    "comm mpi: np2 hung rank" "comm mpi: np3 rank exits early"
    PROPERTIES LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 200 RUN_SERIAL ON)
  # data-parallel training (tests/train/run_train_mpi.sh): bit-identity with one process (SFT, LoRA,
  # the new families, GRPO), resume across rank counts, a killed and a hung rank
  set(strata_run_train_mpi bash ${CMAKE_SOURCE_DIR}/tests/train/run_train_mpi.sh $<TARGET_FILE:strata>)
  foreach(scenario equal resume shared nodes killed hung injected lora qlora families grpo)
    add_test(NAME "train mpi: ${scenario}" COMMAND ${strata_run_train_mpi} ${scenario})
    set_tests_properties("train mpi: ${scenario}" PROPERTIES LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 600 RUN_SERIAL ON)
  endforeach()
  # zeroth-order parallel (distributed.zo): perturbation, data and 2d bit-identical to one process
  foreach(scenario zo-equal zo-resume)
    add_test(NAME "train mpi: ${scenario}" COMMAND ${strata_run_train_mpi} ${scenario})
    set_tests_properties("train mpi: ${scenario}" PROPERTIES LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 900 RUN_SERIAL ON)
  endforeach()
endif()
