// Registration functions of the ref provider's kernel groups, one per source file.
#pragma once

#include "slim/runtime/kernel.h"

namespace slim::ref {
void register_elementwise_unary_kernels(KernelRegistry& r);   // elementwise_unary.cc
void register_elementwise_binary_kernels(KernelRegistry& r);  // elementwise_binary.cc
void register_elementwise_misc_kernels(KernelRegistry& r);    // elementwise_misc.cc
void register_reduce_kernels(KernelRegistry& r);              // reduce.cc
void register_reduce_arg_kernels(KernelRegistry& r);          // reduce_arg.cc
void register_math_softmax_kernels(KernelRegistry& r);        // math_softmax.cc
void register_math_det_kernels(KernelRegistry& r);            // math_det.cc
void register_matmul_kernels(KernelRegistry& r);              // matmul.cc
void register_matmul_einsum_kernels(KernelRegistry& r);       // matmul_einsum.cc
void register_norm_kernels(KernelRegistry& r);                // norm.cc
void register_loss_kernels(KernelRegistry& r);                // loss.cc
void register_tensor_kernels(KernelRegistry& r);              // tensor.cc
void register_tensor_index_kernels(KernelRegistry& r);        // tensor_index.cc
void register_shape_kernels(KernelRegistry& r);               // shape.cc
void register_signal_kernels(KernelRegistry& r);              // signal.cc
void register_random_kernels(KernelRegistry& r);              // random.cc
void register_ngram_kernels(KernelRegistry& r);               // ngram.cc
void register_conv_kernels(KernelRegistry& r);                // conv.cc
void register_pool_kernels(KernelRegistry& r);                // pool.cc
void register_resize_kernels(KernelRegistry& r);              // resize.cc
void register_quant_kernels(KernelRegistry& r);               // quant.cc
void register_fused_kernels(KernelRegistry& r);               // fused.cc
void register_control_flow_kernels(KernelRegistry& r);        // control_flow.cc
void register_sequence_kernels(KernelRegistry& r);            // sequence.cc
void register_rnn_kernels(KernelRegistry& r);                 // rnn.cc
void register_contrib_kernels(KernelRegistry& r);             // contrib.cc
void register_contrib_attention_kernels(KernelRegistry& r);   // contrib_attention.cc

}  // namespace slim::ref
