# `kiln tokenizer` through the CLI (tests/python/tokenizer_cli.py): exact GPT-2 ids on the fixed
# sample against the independent JS encoder's (tests/data/gpt2), round trips, training, exit codes.
add_test(NAME tokenizer_cli
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/python/tokenizer_cli.py
                 $<TARGET_FILE:kiln> ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/tokenizer_cli_work)
set_tests_properties(tokenizer_cli PROPERTIES LABELS "python;cli" TIMEOUT 120)

# End to end (tests/python/prep_domains_e2e.py): `kiln prep` on a mixed corpus (English, code,
# Chinese, licences; JSONL + a text folder) with the default rules and a trained tokenizer; every
# document in its expected domain; shards read with tarfile + numpy.load grouped by key the
# WebDataset way agree with manifest.json and stats.json; tokens == `kiln tokenizer encode`;
# `kiln inspect --verify` passes (and fails on a damaged shard); a rerun is byte-identical.
add_test(NAME prep_domains_e2e
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/python/prep_domains_e2e.py
                 $<TARGET_FILE:kiln> ${CMAKE_CURRENT_BINARY_DIR}/prep_domains_e2e_work)
set_tests_properties(prep_domains_e2e PROPERTIES LABELS "python;e2e" TIMEOUT 300)
