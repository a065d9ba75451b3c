# Quality filters under mpirun (-np 2 and 3) and with --append: the same decisions and kept texts
# as one process over all the input (tests/dataprep/prep_filters_mpi.sh).
set(_kiln_filters_mpiexec "")
if(KILN_HAVE_MPI)
  set(_kiln_filters_mpiexec ${MPIEXEC_EXECUTABLE})
endif()
add_test(NAME prep_filters_mpi_and_append
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/prep_filters_mpi.sh $<TARGET_FILE:kiln>
                 ${CMAKE_SOURCE_DIR} ${_kiln_filters_mpiexec})
set_tests_properties(prep_filters_mpi_and_append PROPERTIES
  LABELS "mpi"
  TIMEOUT 600
  ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
