#include "tools/kiln/command.h"

namespace kiln::cli {

RunFn add_tokenizer_command(CLI::App& root) {
  return add_unbuilt_command(root, "tokenizer", "train a BPE tokenizer, encode and decode text");
}

}  // namespace kiln::cli
