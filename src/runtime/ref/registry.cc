// The ref provider's kernel table: each group of kernels registers itself here.
#include "runtime/ref/ref_kernels.h"

namespace slim {

const KernelRegistry& ref_kernel_registry() {
  static const KernelRegistry registry = [] {
    KernelRegistry r("ref");
    // One line per kernel group (src/runtime/ref/<group>.cc).
    ref::register_elementwise_unary_kernels(r);
    ref::register_elementwise_binary_kernels(r);
    ref::register_elementwise_misc_kernels(r);
    ref::register_reduce_kernels(r);
    ref::register_reduce_arg_kernels(r);
    ref::register_math_softmax_kernels(r);
    ref::register_math_det_kernels(r);
    ref::register_matmul_kernels(r);
    ref::register_matmul_einsum_kernels(r);
    ref::register_norm_kernels(r);
    ref::register_loss_kernels(r);
    ref::register_tensor_kernels(r);
    ref::register_tensor_index_kernels(r);
    ref::register_shape_kernels(r);
    ref::register_signal_kernels(r);
    ref::register_random_kernels(r);
    ref::register_ngram_kernels(r);
    ref::register_conv_kernels(r);
    ref::register_pool_kernels(r);
    ref::register_resize_kernels(r);
    ref::register_quant_kernels(r);
    ref::register_fused_kernels(r);
    ref::register_control_flow_kernels(r);
    ref::register_sequence_kernels(r);
    ref::register_rnn_kernels(r);
    ref::register_contrib_kernels(r);
    ref::register_contrib_attention_kernels(r);
    return r;
  }();
  return registry;
}

}  // namespace slim
