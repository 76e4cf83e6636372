// The ref provider's kernel table: each group of kernels registers itself here.
#include "runtime/ref/ref_kernels.h"

namespace slim {

const KernelRegistry& ref_kernel_registry() {
  static const KernelRegistry registry = [] {
    KernelRegistry r("ref");
    // One line per kernel group (src/runtime/ref/<group>.cc).
    return r;
  }();
  return registry;
}

}  // namespace slim
