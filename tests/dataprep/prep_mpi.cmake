# Multi-rank prep and collectives: tests/dataprep/prep_mpi_test.cc run under mpirun with 1, 2 and 3 ranks
# (the kept set must equal the single-process run exactly).
if(KILN_HAVE_MPI AND TARGET prep_mpi_test)
  foreach(np 1 2 3)
    add_test(NAME prep_mpi_np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                     $<TARGET_FILE:prep_mpi_test>)
    set_tests_properties(prep_mpi_np${np} PROPERTIES
      LABELS "mpi"
      TIMEOUT 300
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
  endforeach()
endif()
