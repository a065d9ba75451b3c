# Data-parallel `kiln train` under mpirun (tests/train_mpi.sh): equivalence with one process,
# bytes vs `kiln plan`, ZeRO-2/3 vs ZeRO-0, resume across world sizes and ZeRO stages, kill -9
# of a rank during checkpoint writes.
if(KILN_HAVE_MPI)
  foreach(check equivalence resume zero kill signal hang startup rollback)
    add_test(NAME train_mpi_${check}
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/train_mpi.sh ${check} $<TARGET_FILE:kiln>
                     ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/train_mpi ${MPIEXEC_EXECUTABLE})
    set_tests_properties(train_mpi_${check} PROPERTIES LABELS "mpi;e2e" TIMEOUT 300)
  endforeach()
  # ZeRO-3 vs ZeRO-0, DP vs one process and resume across layouts for model.arch: llama.
  foreach(check equivalence resume zero)
    add_test(NAME train_mpi_llama_${check}
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/train_mpi.sh ${check} $<TARGET_FILE:kiln>
                     ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/train_mpi ${MPIEXEC_EXECUTABLE}
                     llama)
    set_tests_properties(train_mpi_llama_${check} PROPERTIES LABELS "mpi;e2e" TIMEOUT 300)
  endforeach()
endif()
# Tensor-parallel `kiln train` (tests/train_tp.sh): TP=2 and DP=2 x TP=2 (ZeRO 0-3) against one
# process and DP=2, bytes vs `kiln plan`, checkpoints across tensor-parallel sizes.
if(KILN_HAVE_MPI)
  foreach(check equivalence zero resume)
    add_test(NAME train_tp_${check}
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/train_tp.sh ${check} $<TARGET_FILE:kiln>
                     ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/train_tp ${MPIEXEC_EXECUTABLE})
    set_tests_properties(train_tp_${check} PROPERTIES LABELS "mpi;e2e" TIMEOUT 300)
    # The same checks for model.arch: llama (grouped-query heads split across the TP ranks).
    add_test(NAME train_tp_llama_${check}
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/train_tp.sh ${check} $<TARGET_FILE:kiln>
                     ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/train_tp ${MPIEXEC_EXECUTABLE}
                     llama)
    set_tests_properties(train_tp_llama_${check} PROPERTIES LABELS "mpi;e2e" TIMEOUT 300)
  endforeach()
endif()
# Data parallelism and ZeRO on `device: cuda` over NCCL (tests/train_gpu_dist.sh): `refuse` runs
# everywhere; `nccl` needs 2 GPUs and skips (exit 77, the reason printed) elsewhere.
if(KILN_HAVE_MPI)
  foreach(check refuse nccl)
    add_test(NAME train_gpu_dist_${check}
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/train_gpu_dist.sh ${check} $<TARGET_FILE:kiln>
                     ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/train_gpu_dist
                     ${MPIEXEC_EXECUTABLE})
    set_tests_properties(train_gpu_dist_${check} PROPERTIES LABELS "mpi;e2e;gpu" TIMEOUT 300
                         SKIP_RETURN_CODE 77)
  endforeach()
endif()
# The same global batch at any data-parallel size on `kiln prep` data (tests/train_global_batch.sh):
# DP 1/2/4, accumulation and DP x TP ZeRO-3 against one process; resume 2 -> 4 and 4 -> 1 ranks;
# resume 2 -> 4 with a `kiln mix set` in between (mixset; mixset_pp: saved on PP=2, resumed on
# PP=2 x DP=2) and across an epoch end (epoch).
if(KILN_HAVE_MPI)
  foreach(check equivalence resume mixset mixset_pp epoch)
    add_test(NAME train_global_batch_${check}
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/train_global_batch.sh ${check} $<TARGET_FILE:kiln>
                     ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/train_global_batch
                     ${MPIEXEC_EXECUTABLE})
    set_tests_properties(train_global_batch_${check} PROPERTIES LABELS "mpi;e2e" TIMEOUT 600)
  endforeach()
endif()
# Pipeline-parallel `kiln train` (tests/train_pp.sh): PP=2/4, GPipe, PP x TP, PP x DP ZeRO-1 and
# PP x TP x DP against one process; llama with doc_mask; spike rollback; the refusals; a stage that
# dies or stalls; the first stage's measured memory against kiln plan.
if(KILN_HAVE_MPI)
  foreach(check equivalence llama rollback refuse fail memory)
    add_test(NAME train_pp_${check}
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/train_pp.sh ${check} $<TARGET_FILE:kiln>
                     ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/train_pp ${MPIEXEC_EXECUTABLE})
    set_tests_properties(train_pp_${check} PROPERTIES LABELS "mpi;e2e" TIMEOUT 600)
  endforeach()
endif()
