// The ref provider's kernel table: each group of kernels registers itself here.
#include "runtime/ref/ref_kernels.h"

namespace slim {

const KernelRegistry& ref_kernel_registry() {
  static const KernelRegistry registry = [] {
    KernelRegistry r("ref");
    // One line per kernel group (src/runtime/ref/<group>.cc).
    ref::register_tensor_kernels(r);
    ref::register_tensor_index_kernels(r);
    ref::register_shape_kernels(r);
    ref::register_conv_kernels(r);
    ref::register_pool_kernels(r);
    ref::register_resize_kernels(r);
    ref::register_quant_kernels(r);
    return r;
  }();
  return registry;
}

}  // namespace slim
