#include "tools/kiln/command.h"

namespace kiln::cli {

RunFn add_stream_command(CLI::App& root) {
  return add_unbuilt_command(root, "stream", "run the loader alone and print what each rank sees");
}

}  // namespace kiln::cli
