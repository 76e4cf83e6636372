// Providers and partitioning: a provider is a named KernelRegistry whose kernels claim
// the nodes they can run; compile gives each node to the first provider in priority
// order that claims it and records why the others declined.
#pragma once

#include <string>
#include <vector>

#include "slim/runtime/kernel.h"

namespace slim {

// The fast CPU provider: oneDNN for convolutions, matrix products and pooling (weights
// packed at compile time, bias/activation/residual fused), vectorized kernels of its own
// for elementwise ops, normalizations, reductions and data movement. f32 only; it
// declines what it does not cover and ref runs it instead.
const KernelRegistry& cpu_kernel_registry();

// Where one node went and why the providers before it declined.
struct NodeAssignment {
  std::string node;      // node name
  std::string op;        // "Conv" or "slim:FusedConv"
  std::string provider;  // empty when nobody claimed it
  // "<provider>: <reason>" for each provider ahead of the chosen one that declined it
  // (no kernel for the op/opset, or its claim function's reason).
  std::vector<std::string> declined;
};

// The outcome of asking providers in priority order for a node.
struct ProviderChoice {
  const KernelDef* def = nullptr;  // nullptr: no provider claimed the node
  std::string provider;
  std::vector<std::string> declined;
};

// Asks each provider in order; the first whose kernel for (op, domain, opset) claims the
// node wins.
ProviderChoice choose_provider(const std::vector<const KernelRegistry*>& providers,
                               const KernelBuildInfo& info);

// Builds the kernel of a claimed node: KernelDef::build when set, else the factory.
std::unique_ptr<OpKernel> build_kernel(const KernelDef& def, const KernelBuildInfo& info);

}  // namespace slim
