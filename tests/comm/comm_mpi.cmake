# Collectives, process groups, hierarchical all-reduce and byte counters under mpirun:
# tests/comm/comm_mpi_test.cc with 2, 3 and 4 ranks (alone it runs as the 1-rank unit test).
if(KILN_HAVE_MPI AND TARGET comm_mpi_test)
  foreach(np 2 3 4)
    add_test(NAME comm_mpi_np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                     $<TARGET_FILE:comm_mpi_test>)
    set_tests_properties(comm_mpi_np${np} PROPERTIES
      LABELS "mpi"
      TIMEOUT 120
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
  endforeach()
endif()
