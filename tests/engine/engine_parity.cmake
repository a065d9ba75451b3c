# PyTorch parity of the engine (tests/python/engine_parity.py): the same weights and batch give the
# same loss and gradients, and ten AdamW steps the same losses, in fp32, bf16 and fp16.
# Needs Debian's python3-torch (tools/setup installs it); the test FAILS without it.
add_executable(engine_parity_dump ${CMAKE_CURRENT_LIST_DIR}/engine_parity_dump.cc)
target_compile_options(engine_parity_dump PRIVATE ${KILN_WARNINGS})
target_link_libraries(engine_parity_dump PRIVATE kiln_engine kiln_loader kiln_kernels kiln_comm kiln_common)
add_test(NAME engine_parity
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/python/engine_parity.py
                 --dump $<TARGET_FILE:engine_parity_dump>
                 --work ${CMAKE_CURRENT_BINARY_DIR}/engine_parity)
set_tests_properties(engine_parity PROPERTIES LABELS "parity" TIMEOUT 600)
# GPT-2 with model.doc_mask: a packed batch whose learned positions and attention restart at each
# document start, and its packed rows against each document computed alone.
add_test(NAME engine_parity_doc_mask
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/python/engine_parity.py
                 --dump $<TARGET_FILE:engine_parity_dump> --arch gpt2-doc_mask
                 --work ${CMAKE_CURRENT_BINARY_DIR}/engine_parity_doc_mask)
set_tests_properties(engine_parity_doc_mask PROPERTIES LABELS "parity" TIMEOUT 600)
# The same for model.arch: llama (grouped-query attention, untied embeddings, no biases, packed
# documents with model.doc_mask), and the packed rows against each document computed alone.
add_test(NAME llama_parity
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/python/llama_parity.py
                 --dump $<TARGET_FILE:engine_parity_dump>
                 --work ${CMAKE_CURRENT_BINARY_DIR}/llama_parity)
set_tests_properties(llama_parity PROPERTIES LABELS "parity" TIMEOUT 600)
