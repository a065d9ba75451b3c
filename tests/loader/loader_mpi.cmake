# Multi-rank loader tests under mpirun (tests/loader/loader_mpi_check.cc): disjoint, complete epochs and
# equal step counts for W in {2, 3, 4, 7, 8} ranks on a dataset whose shard count no W divides
# (W = 1 and the same checks in-process: tests/loader/loader_test.cc), and `kiln stream` under mpirun.
if(KILN_HAVE_MPI)
  add_executable(loader_mpi_check ${CMAKE_CURRENT_LIST_DIR}/loader_mpi_check.cc)
  target_compile_options(loader_mpi_check PRIVATE ${KILN_WARNINGS})
  target_link_libraries(loader_mpi_check PRIVATE kiln_loader kiln_format kiln_common MPI::MPI_CXX)

  set(_loader_mpi_dir ${CMAKE_CURRENT_BINARY_DIR}/loader_mpi_data)
  set(_loader_mpi_env
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
      OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none)
  add_test(NAME loader_mpi_dataset COMMAND loader_mpi_check make ${_loader_mpi_dir})
  set_tests_properties(loader_mpi_dataset PROPERTIES FIXTURES_SETUP loader_mpi_data LABELS mpi)

  foreach(np 2 3 4 7 8)
    add_test(NAME loader_mpi_partition_np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} -np ${np} --oversubscribe
                     $<TARGET_FILE:loader_mpi_check> partition ${_loader_mpi_dir})
    set_tests_properties(loader_mpi_partition_np${np} PROPERTIES
                         ENVIRONMENT "${_loader_mpi_env}" FIXTURES_REQUIRED loader_mpi_data
                         LABELS mpi TIMEOUT 300)
  endforeach()

  add_test(NAME loader_mpi_stream
           COMMAND sh -c "set -e; ${MPIEXEC_EXECUTABLE} -np 3 --oversubscribe $<TARGET_FILE:kiln> stream ${_loader_mpi_dir} --steps 4 --seq-len 7 --micro-batch 4 --seed 9 --weights alpha=3,beta=1 > ${_loader_mpi_dir}.stream.jsonl; $<TARGET_FILE:loader_mpi_check> check-stream ${_loader_mpi_dir} 3 4 4 < ${_loader_mpi_dir}.stream.jsonl")
  set_tests_properties(loader_mpi_stream PROPERTIES
                       ENVIRONMENT "${_loader_mpi_env}" FIXTURES_REQUIRED loader_mpi_data
                       LABELS "mpi;cli" TIMEOUT 300)
endif()
