// Registration functions of the ref provider's kernel groups, one per source file.
#pragma once

#include "slim/runtime/kernel.h"

namespace slim::ref {
void register_tensor_kernels(KernelRegistry& r);              // tensor.cc
void register_tensor_index_kernels(KernelRegistry& r);        // tensor_index.cc
void register_shape_kernels(KernelRegistry& r);               // shape.cc
void register_conv_kernels(KernelRegistry& r);                // conv.cc
void register_pool_kernels(KernelRegistry& r);                // pool.cc
void register_resize_kernels(KernelRegistry& r);              // resize.cc
void register_quant_kernels(KernelRegistry& r);               // quant.cc

}  // namespace slim::ref
