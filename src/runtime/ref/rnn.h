// The attributes of the recurrent layers (RNN, GRU, LSTM), parsed and validated once: the
// ref kernels compute from them and the cpu provider's claim decides from them which
// nodes oneDNN's RNN primitives can run.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "slim/onnx/graph.h"

namespace slim::ref {

enum class RnnKind { rnn, gru, lstm };

// One of the ONNX recurrent activation functions with its alpha and beta.
struct RnnActivation {
  enum Kind {
    relu, tanh, sigmoid, affine, leaky_relu, thresholded_relu, scaled_tanh, hard_sigmoid, elu,
    softsign, softplus
  };
  Kind kind = tanh;
  float alpha = 0, beta = 0;
  double operator()(double x) const;
};

struct RnnAttrs {
  RnnKind kind = RnnKind::rnn;
  int gates = 1;               // weight blocks per direction: RNN 1, GRU 3 (zrh), LSTM 4 (iofc)
  int64_t hidden = 0;          // hidden_size; 0 when absent (taken from R's shape)
  int directions = 1;          // 2 for bidirectional
  bool reverse = false;        // direction "reverse" (one direction, run backwards)
  int64_t layout = 0;          // 1: batch first (opset 14)
  std::optional<float> clip;   // bound of every gate's pre-activation
  bool input_forget = false;   // LSTM: forget gate = 1 - input gate
  bool linear_before_reset = false;  // GRU (opset 3)
  // Per direction, in order: RNN f; GRU f, g; LSTM f, g, h.
  std::vector<RnnActivation> activations;

  int activations_per_direction() const { return kind == RnnKind::lstm ? 3 : kind == RnnKind::gru ? 2 : 1; }
  const RnnActivation& activation(int direction, int k) const {
    return activations[size_t(direction * activations_per_direction() + k)];
  }
};

// Parses the node's attributes for its opset; invalid_model naming the node and the
// attribute for values the spec does not allow, unsupported for ScaledTanh without its
// alpha and beta (the op it names has no defaults).
RnnAttrs parse_rnn_attrs(const Node& node, int64_t opset);

}  // namespace slim::ref
