# spaCy's own English tokenizer tests (read from an unpacked spaCy source tree) against Kiln's C++
# tokenizer, served by filter_spacy_test (tests/dataprep/filter_spacy_tests.py); skipped (77)
# where spaCy's sources or python3-pytest are missing.
add_test(NAME filter_spacy_own_tests
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/filter_spacy_tests.py
                 $<TARGET_FILE:filter_spacy_test>)
set_tests_properties(filter_spacy_own_tests PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS unit)
