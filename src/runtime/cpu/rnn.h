// The cpu provider's recurrent layers: what the claim (dnnl_rnn.cc) settles about a node,
// and the two kernels built from it: oneDNN's RNN primitives (dnnl_rnn.cc) and the
// provider's own cells for small batches (rnn_cells.cc).
#pragma once

#include <memory>
#include <oneapi/dnnl/dnnl.hpp>

#include "runtime/ref/rnn.h"
#include "slim/runtime/kernel.h"

namespace slim::cpu {

struct RnnSetup {
  ref::RnnAttrs a;
  int64_t T = 0, N = 0, I = 0, H = 0, D = 1;
  bool has_b = false, has_h0 = false, has_c0 = false, has_p = false;
  bool weights_constant = true;  // else W, R, B and P are packed at every run
  bool lens_at_run = false;      // sequence_lens is a graph input: read at every run
  dnnl::algorithm activation = dnnl::algorithm::eltwise_tanh;  // vanilla RNN's
  float alpha = 0.f;                                             // its negative slope
};

// Whether the own cells run the node (constant weights, batches up to 8) rather than
// oneDNN's primitives.
bool rnn_cells_suit(const RnnSetup& s);
std::unique_ptr<OpKernel> make_rnn_cell_kernel(const KernelBuildInfo& info, const RnnSetup& s);

}  // namespace slim::cpu
