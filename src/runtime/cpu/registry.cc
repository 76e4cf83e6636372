// The cpu provider's kernel table: each group of kernels registers itself here.
#include "runtime/cpu/cpu_common.h"
#include "slim/runtime/provider.h"

namespace slim {

const KernelRegistry& cpu_kernel_registry() {
  static const KernelRegistry registry = [] {
    KernelRegistry r("cpu");
    cpu::register_dnnl_conv_kernels(r);
    cpu::register_dnnl_matmul_kernels(r);
    cpu::register_dnnl_pool_kernels(r);
    cpu::register_dnnl_rnn_kernels(r);
    cpu::register_elementwise_kernels(r);
    cpu::register_resize_kernels(r);
    cpu::register_tensor_kernels(r);
    cpu::register_matmul_nbits_kernels(r);
    cpu::register_contrib_kernels(r);
    cpu::register_quantize_kernels(r);
    cpu::register_dnnl_int8_kernels(r);
    return r;
  }();
  return registry;
}

}  // namespace slim
