#include "tools/kiln/command.h"

namespace kiln::cli {

RunFn add_prep_command(CLI::App& root) {
  return add_unbuilt_command(root, "prep", "deduplicate, tag, tokenize and shard a corpus");
}

}  // namespace kiln::cli
