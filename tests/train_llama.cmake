# model.arch: llama through the CLI (tests/train_llama.sh): training on `kiln prep` data with the
# document mask (the loss falls; checkpointing modes agree; precisions; consolidate + init_from),
# DP x TP ZeRO-3 with the mask vs one process (llama, and gpt2 with model.doc_mask), and bad
# configs refused naming the key.
if(KILN_HAVE_MPI)
  foreach(check train parallel gpt2_doc_mask refuse)
    add_test(NAME train_llama_${check}
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/train_llama.sh ${check} $<TARGET_FILE:kiln>
                     ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/train_llama ${MPIEXEC_EXECUTABLE})
    set_tests_properties(train_llama_${check} PROPERTIES LABELS "mpi;e2e" TIMEOUT 600)
  endforeach()
endif()
