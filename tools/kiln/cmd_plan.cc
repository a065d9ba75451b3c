#include "tools/kiln/command.h"

namespace kiln::cli {

RunFn add_plan_command(CLI::App& root) {
  return add_unbuilt_command(root, "plan", "estimate memory and communication for a training config");
}

}  // namespace kiln::cli
