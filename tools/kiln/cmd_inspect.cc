#include "tools/kiln/command.h"

namespace kiln::cli {

RunFn add_inspect_command(CLI::App& root) {
  return add_unbuilt_command(root, "inspect", "summarise and verify a prepared dataset");
}

}  // namespace kiln::cli
