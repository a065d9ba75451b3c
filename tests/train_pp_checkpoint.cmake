# Checkpoints of pipeline-parallel `kiln train` under mpirun (tests/train_pp_checkpoint.sh):
# resume PP=2 on PP=2 / one process / PP=4 and PP=2 x DP=2 ZeRO-1 on PP=1 x TP=2 and PP=4;
# consolidate and export of a PP checkpoint against the same weights without pipelining.
if(KILN_HAVE_MPI)
  foreach(arch gpt2 llama)
    foreach(check resume consolidate)
      add_test(NAME train_pp_checkpoint_${arch}_${check}
               COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/train_pp_checkpoint.sh ${check}
                       $<TARGET_FILE:kiln> ${CMAKE_SOURCE_DIR}
                       ${CMAKE_CURRENT_BINARY_DIR}/train_pp_checkpoint ${MPIEXEC_EXECUTABLE} ${arch})
      set_tests_properties(train_pp_checkpoint_${arch}_${check} PROPERTIES LABELS "mpi;e2e"
                           TIMEOUT 300)
    endforeach()
  endforeach()
endif()
