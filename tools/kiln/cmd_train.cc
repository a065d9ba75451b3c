#include "tools/kiln/command.h"

namespace kiln::cli {

RunFn add_train_command(CLI::App& root) {
  return add_unbuilt_command(root, "train", "train a GPT-style model");
}

}  // namespace kiln::cli
