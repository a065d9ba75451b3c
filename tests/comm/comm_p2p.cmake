# Point-to-point messages and the pipeline layout under mpirun: tests/comm/comm_p2p_test.cc with 2,
# 4 and 8 ranks (alone it runs as the 1-rank unit test: messages to itself), and the watchdog
# naming the peer of a recv that never completes (tests/comm/comm_p2p_watchdog.sh).
if(KILN_HAVE_MPI AND TARGET comm_p2p_test)
  foreach(np 2 4 8)
    add_test(NAME comm_p2p_np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                     $<TARGET_FILE:comm_p2p_test>)
    set_tests_properties(comm_p2p_np${np} PROPERTIES LABELS "mpi" TIMEOUT 300)
  endforeach()
  foreach(np 2 3)
    add_test(NAME comm_p2p_watchdog_np${np}
             COMMAND ${CMAKE_CURRENT_LIST_DIR}/comm_p2p_watchdog.sh $<TARGET_FILE:comm_p2p_test>
                     ${MPIEXEC_EXECUTABLE} ${np})
    set_tests_properties(comm_p2p_watchdog_np${np} PROPERTIES LABELS "mpi" TIMEOUT 120)
  endforeach()
endif()
