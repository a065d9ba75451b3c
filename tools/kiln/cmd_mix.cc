#include "tools/kiln/command.h"

namespace kiln::cli {

RunFn add_mix_command(CLI::App& root) {
  return add_unbuilt_command(root, "mix", "show or set the live domain mixture of a run");
}

}  // namespace kiln::cli
