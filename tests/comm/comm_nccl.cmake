# The NCCL backend on device memory (tests/comm/comm_nccl_gpu.cc) under `mpirun -np 2`: built with
# NCCL; its tests skip (with the reason) without 2 GPUs, so it runs everywhere, and ctest shows
# it as skipped there.
if(KILN_HAVE_NCCL AND KILN_HAVE_MPI)
  add_executable(comm_nccl_gpu ${CMAKE_CURRENT_LIST_DIR}/comm_nccl_gpu.cc)
  target_compile_options(comm_nccl_gpu PRIVATE ${KILN_WARNINGS})
  target_link_libraries(comm_nccl_gpu PRIVATE kiln_comm kiln_common CUDA::cudart GTest::gtest
                        GTest::gtest_main)
  add_test(NAME comm_nccl_np2
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
                   $<TARGET_FILE:comm_nccl_gpu>)
  set_tests_properties(comm_nccl_np2 PROPERTIES
    LABELS "mpi;gpu"
    TIMEOUT 120
    # Without two GPUs every case skips with this reason; ctest then shows the test as skipped
    # rather than passed (the output of a run on GPUs never contains it).
    SKIP_REGULAR_EXPRESSION "needs [0-9]+ GPUs \\(one per rank"
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
endif()
