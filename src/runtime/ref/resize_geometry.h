// The geometry of Resize (opsets 10-19) and Upsample (7-10), shared by the ref kernel and
// the cpu provider's: a node's attributes parsed once, and for an input shape and the
// values of its roi/scales/sizes inputs, the output shape and per axis the (input index,
// weight) taps of every output coordinate. Both providers take their taps from here, so
// they pick the same input pixels in every mode.
#pragma once

#include <functional>
#include <vector>

#include "slim/runtime/kernel.h"

namespace slim::ref {

struct ResizeTap {
  int64_t index;
  double weight;
};

struct ResizeAxis {
  std::vector<std::vector<ResizeTap>> taps;  // per output coordinate
  std::vector<bool> outside;                 // tf_crop_and_resize: coordinate maps outside the input
};

struct ResizeGeometry {
  Shape out;
  std::vector<ResizeAxis> axes;  // one per input axis
  std::vector<double> scale;     // per input axis: the scale the coordinates are computed with
  // Where the scales came from: the scales input (or attribute), or the sizes input: each
  // size / input length, or with keep_aspect_ratio_policy one scale for all axes.
  bool from_sizes = false, aspect_kept = false;
};

class ResizeSpec {
 public:
  enum class Mode { nearest, linear, cubic };
  enum class Coord {
    half_pixel,
    half_pixel_symmetric,
    pytorch_half_pixel,
    align_corners,
    asymmetric,
    tf_half_pixel_for_nn,
    tf_crop_and_resize,
  };
  // `legacy` is the Upsample / Resize-10 rule: truncate when upsampling, ceil when downsampling.
  enum class Nearest { round_prefer_floor, round_prefer_ceil, floor, ceil, legacy };
  enum class AspectPolicy { stretch, not_larger, not_smaller };

  // `upsample`: the Upsample op. Bad attributes are invalid_model errors naming the node.
  ResizeSpec(const Node& node, int64_t opset, bool upsample);

  // The node's inputs that hold roi, scales and sizes (-1: none for this op and opset).
  int roi_input() const { return legacy_ ? -1 : 1; }
  int scales_input() const { return upsample_ && opset_ < 9 ? -1 : (legacy_ ? 1 : 2); }
  int sizes_input() const { return legacy_ ? -1 : 3; }

  // Output shape and taps for input shape `in`; `input(i)` gives input i's value (nullptr
  // when absent). Problems with the values are Errors (invalid_argument,
  // resource_exhausted) whose message does not name the node.
  ResizeGeometry geometry(const Shape& in, const std::function<const Tensor*(int)>& input) const;

  Mode mode() const { return mode_; }
  Coord coord() const { return coord_; }
  bool antialias() const { return antialias_; }
  double extrapolation() const { return extrapolation_; }

 private:
  double source_coord(int64_t o, int64_t in_len, int64_t out_len, double scale, double roi0, double roi1) const;
  double cubic(double t) const;
  void antialias_taps(double xo, int64_t in_len, double scale, std::vector<ResizeTap>& taps) const;
  ResizeAxis axis_taps(int64_t in_len, int64_t out_len, double scale, double roi0, double roi1) const;

  int64_t opset_;
  bool upsample_;
  bool legacy_ = false;
  Mode mode_ = Mode::nearest;
  Coord coord_ = Coord::half_pixel;
  Nearest nearest_ = Nearest::round_prefer_floor;
  AspectPolicy policy_ = AspectPolicy::stretch;
  double cubic_a_ = -0.75;
  bool exclude_outside_ = false;
  bool antialias_ = false;
  double extrapolation_ = 0;
  std::vector<int64_t> axes_;
  std::vector<double> attr_scales_;
};

}  // namespace slim::ref
