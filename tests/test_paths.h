// Where a test finds the source tree and the `kiln` binary under test. Both are set in one object
// (tests/test_paths.cc, compiled with the paths by tests/CMakeLists.txt), so no other test object
// depends on the build's location and ccache shares them between checkouts.
#pragma once

namespace kiln::test {

const char* source_dir();   // the repository root
const char* kiln_binary();  // the `kiln` executable built with the tests

}  // namespace kiln::test
