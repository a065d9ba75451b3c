#include "tools/kiln/command.h"

namespace kiln::cli {

RunFn add_tagger_command(CLI::App& root) {
  return add_unbuilt_command(root, "tagger", "train a fastText domain classifier");
}

}  // namespace kiln::cli
