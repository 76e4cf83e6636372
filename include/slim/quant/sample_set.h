// Calibration and evaluation data for `slim quantize`: a folder of NAME.npy files (one
// per model input, samples stacked along the first axis), an .npz archive with those
// keys, one .npy file for a one-input model, or a folder of images (PNG, JPEG) with a preprocessing spec. Each source is
// checked against the model's inputs before anything runs.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "slim/core/tensor.h"
#include "slim/onnx/graph.h"

namespace slim::quant {

// How an image becomes a model input: decoded to RGB (or gray), resized to height x width
// (bilinear, pixel centres aligned; `fit` keeps the aspect ratio and pads the right and
// bottom with `pad`), then per channel x = (pixel · scale − mean) / std, laid out NCHW or
// NHWC. Read from JSON: {"input": "x", "size": [H, W], "resize": "stretch"|"fit",
// "pad": 0, "scale": 0.00392156862745098, "mean": [...], "std": [...], "layout":
// "nchw"|"nhwc", "color": "rgb"|"bgr"|"gray"}; every key is optional (the size comes
// from the model input's fixed dims).
struct ImagePreprocess {
  std::string input;  // "" = the model's only input
  int64_t height = 0, width = 0;
  bool fit = false;
  float pad = 0;
  float scale = 1.0f / 255.0f;
  std::vector<float> mean = {0}, std = {1};
  bool nhwc = false;
  std::string color = "rgb";

  static ImagePreprocess from_json_file(const std::string& path);
  std::string describe() const;  // canonical text, part of the data digest
};

class SampleSet {
 public:
  // `path`: a folder of .npy files, an .npz file, an .npy file (one-input models), or a
  // folder of images; for images the spec is `preprocess_file` or, when that is "",
  // PATH/preprocess.json (else defaults).
  // Errors (invalid_argument, naming the file and input): no such path, an empty folder,
  // a name that is not a model input, a missing input, a dtype or shape that differs from
  // the model's, inputs with different sample counts, an image that does not decode.
  static SampleSet open(const std::string& path, const std::vector<ValueInfo>& model_inputs,
                        const std::string& preprocess_file = "");

  int64_t size() const { return samples_; }
  // The samples [begin, end) of every input, stacked along the first axis (an input of
  // rank 0 is the same at every batch).
  std::map<std::string, Tensor> batch(int64_t begin, int64_t end) const;
  // SHA-256 of the data (file contents in order, the preprocessing spec), hex.
  const std::string& digest() const { return digest_; }
  const std::string& description() const { return description_; }  // "64 samples (npy folder DIR)"

 private:
  int64_t samples_ = 0;
  std::map<std::string, Tensor> arrays_;  // npy / npz: each input's samples
  std::vector<std::string> images_;       // image folder: files in name order
  ImagePreprocess pre_;
  std::string image_input_;
  std::string digest_, description_;
};

// Decodes a PNG or JPEG file to 8-bit RGB, row-major [height, width, 3]. Errors name the file.
Tensor decode_image(const std::string& path);
// The preprocessing of one decoded image ([H, W, 3] u8) into [C, H, W] or [H, W, C] f32.
Tensor preprocess_image(const Tensor& rgb, const ImagePreprocess& pre);

}  // namespace slim::quant
