// THROWAWAY STAND-IN (issue 19, packaging half): the lead's launcher replaces this file
// at merge. It exists so that the build of the native library can be written and tested:
// it includes what the real launcher includes (torch's stable ABI, the CUDA driver API)
// and exports the one symbol the runtime's ABI check looks up.
#include <torch/csrc/stable/library.h>
#include <cuda.h>

extern "C" __attribute__((visibility("default"))) int cudal2_native_abi(void) { return 1; }
