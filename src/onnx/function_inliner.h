// Expands calls of model-local functions (ModelProto.functions, IR version 8) into the
// nodes of their bodies, so that the rest of slim only meets ordinary operators.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <map>
#include <string>

namespace slim {

// Rewrites every graph of `model` (subgraphs included) in place. Body values get fresh
// names, attribute references take the caller's attributes, and the opsets the functions
// import join `opsets` (normalized domains). Errors name `file`, the call and the function.
void inline_local_functions(onnx::ModelProto& model, std::map<std::string, int64_t>& opsets,
                            const std::string& file);

}  // namespace slim
