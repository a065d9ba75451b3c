# `kiln tokenizer` through the CLI (tests/python/tokenizer_cli.py): exact GPT-2 ids on the fixed
# sample against the independent JS encoder's (tests/data/gpt2), round trips, training, exit codes.
add_test(NAME tokenizer_cli
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/python/tokenizer_cli.py
                 $<TARGET_FILE:kiln> ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/tokenizer_cli_work)
set_tests_properties(tokenizer_cli PROPERTIES LABELS "python;cli" TIMEOUT 120)
