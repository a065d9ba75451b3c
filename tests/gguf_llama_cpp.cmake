# Kiln models in llama.cpp (tests/gguf_llama_cpp.sh, issue 42): `kiln checkpoint export --format
# gguf` of a gpt2 and a llama (GQA, untied head, biases) trained on `kiln prep` data with the
# default (llama3) tokenizer, against llama.cpp itself (npm node-llama-cpp 3.21.1, installed by
# tools/setup through tools/llama_cpp/install): its tokenizer gives Kiln's ids on mixed text, its
# greedy tokens equal `kiln generate --temperature 0`'s for 32 tokens, the next-token
# distributions agree (f32 with an f32 KV cache: llama 1e-5, gpt2 1e-4; default f16 cache 5e-4;
# f16 2e-3, q8_0 2e-2); one export from a checkpoint, its
# consolidated file and its HF export; a kiln-v1 tokenizer refused. Skips (77) only without the
# peer.
# converter: llama.cpp's convert_hf_to_gguf.py (its source, from node-llama-cpp's bundle)
# recognises the tokenizer of a `--format hf` export of GPT-2's own tokenizer by its hash.
foreach(arch gpt2 llama converter)
  add_test(NAME gguf_llama_cpp_${arch}
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/gguf_llama_cpp.sh ${arch} $<TARGET_FILE:kiln>
                   ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/gguf_llama_cpp)
  set_tests_properties(gguf_llama_cpp_${arch} PROPERTIES LABELS "e2e;parity" TIMEOUT 600
                       SKIP_RETURN_CODE 77)
endforeach()
if(KILN_HAVE_MPI)  # a DP=2 x TP=2 ZeRO-3 checkpoint's GGUF equals its consolidated file's
  add_test(NAME gguf_llama_cpp_mpi
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/gguf_llama_cpp.sh mpi $<TARGET_FILE:kiln>
                   ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/gguf_llama_cpp ${MPIEXEC_EXECUTABLE})
  set_tests_properties(gguf_llama_cpp_mpi PROPERTIES LABELS "mpi;e2e" TIMEOUT 600)
endif()
