#include "tests/test_paths.h"

namespace kiln::test {

const char* source_dir() { return KILN_SOURCE_DIR; }
const char* kiln_binary() { return KILN_BINARY; }

}  // namespace kiln::test
