#include "slim/quant/sample_set.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "slim/core/error.h"
#include "slim/core/npy.h"
#include "slim/trust/digest.h"

namespace slim::quant {

namespace fs = std::filesystem;

namespace {

std::string q(const std::string& s) {
  return "'" + s + "'";
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool is_image_file(const fs::path& p) {
  const std::string e = lower(p.extension().string());
  return e == ".png" || e == ".jpg" || e == ".jpeg";
}

// The file name `slim run --output-dir` gives a value: characters a file name cannot
// safely hold become '_'.
std::string file_safe(const std::string& name) {
  std::string out;
  for (char c : name)
    out +=
        (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.') ? c : '_';
  return out;
}

std::string input_list(const std::vector<ValueInfo>& inputs) {
  std::string s;
  for (const auto& v : inputs) s += (s.empty() ? "" : ", ") + v.name;
  return s;
}

// Checks one input's array against the model input: dtype, rank, fixed dims past the
// sample axis. Returns its sample count (-1 for a rank-0 input, which every batch shares).
int64_t check_array(const Tensor& t, const ValueInfo& in, const std::string& where) {
  if (in.dtype)
    check(t.dtype() == *in.dtype, ErrorCode::invalid_argument,
          where + ": " + std::string(dtype_name(t.dtype())) + " values, but the model's input " +
              q(in.name) + " is " + std::string(dtype_name(*in.dtype)));
  if (!in.shape) return t.rank() == 0 ? -1 : t.shape()[0];
  const auto& dims = *in.shape;
  if (dims.empty()) {
    check(t.rank() == 0, ErrorCode::invalid_argument,
          where + ": shape " + shape_str(t.shape()) + ", but the model's input " + q(in.name) +
              " is a scalar (give a 0-d array, used for every sample)");
    return -1;
  }
  check(t.rank() == int(dims.size()), ErrorCode::invalid_argument,
        where + ": shape " + shape_str(t.shape()) + " has rank " + std::to_string(t.rank()) +
            ", the model's input " + q(in.name) + " is " + in.describe() +
            " (samples stack along the first axis)");
  for (size_t d = 1; d < dims.size(); ++d)
    check(!dims[d].is_fixed() || dims[d].value == t.shape()[d], ErrorCode::invalid_argument,
          where + ": shape " + shape_str(t.shape()) + " does not fit the model's input " +
              q(in.name) + " " + in.describe() + " (dim " + std::to_string(d) + ")");
  check(t.shape()[0] > 0, ErrorCode::invalid_argument, where + ": no samples (first dim 0)");
  return t.shape()[0];
}

float clamp_index(float v, int64_t n) {
  return std::clamp(v, 0.0f, float(n - 1));
}

}  // namespace

ImagePreprocess ImagePreprocess::from_json_file(const std::string& path) {
  std::ifstream f(path);
  check(bool(f), ErrorCode::not_found, path + ": cannot open");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw Error(ErrorCode::invalid_argument, path + ": not JSON: " + e.what());
  }
  check(j.is_object(), ErrorCode::invalid_argument, path + ": expected a JSON object");
  static const std::set<std::string> kKeys = {"input", "size", "resize", "pad",  "scale",
                                              "mean",  "std",  "layout", "color"};
  ImagePreprocess p;
  try {
    for (const auto& [key, v] : j.items()) {
      check(kKeys.count(key) != 0, ErrorCode::invalid_argument,
            path + ": unknown key " + q(key) +
                " (input, size, resize, pad, scale, mean, std, layout, color)");
      if (key == "input") p.input = v.get<std::string>();
      if (key == "size") {
        const auto s = v.get<std::vector<int64_t>>();
        check(s.size() == 2 && s[0] > 0 && s[1] > 0, ErrorCode::invalid_argument,
              path + ": \"size\" must be [height, width] with positive values");
        p.height = s[0];
        p.width = s[1];
      }
      if (key == "resize") {
        const std::string r = v.get<std::string>();
        check(r == "stretch" || r == "fit", ErrorCode::invalid_argument,
              path + ": \"resize\" is " + q(r) + ", expected stretch or fit");
        p.fit = r == "fit";
      }
      if (key == "pad") p.pad = v.get<float>();
      if (key == "scale") p.scale = v.get<float>();
      if (key == "mean") p.mean = v.get<std::vector<float>>();
      if (key == "std") p.std = v.get<std::vector<float>>();
      if (key == "layout") {
        const std::string l = lower(v.get<std::string>());
        check(l == "nchw" || l == "nhwc", ErrorCode::invalid_argument,
              path + ": \"layout\" is " + q(l) + ", expected nchw or nhwc");
        p.nhwc = l == "nhwc";
      }
      if (key == "color") {
        p.color = lower(v.get<std::string>());
        check(p.color == "rgb" || p.color == "bgr" || p.color == "gray",
              ErrorCode::invalid_argument,
              path + ": \"color\" is " + q(p.color) + ", expected rgb, bgr or gray");
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::invalid_argument, path + ": " + e.what());
  }
  const size_t channels = p.color == "gray" ? 1 : 3;
  for (const auto* v : {&p.mean, &p.std})
    check(v->size() == 1 || v->size() == channels, ErrorCode::invalid_argument,
          path + ": \"mean\" and \"std\" need 1 or " + std::to_string(channels) + " values");
  for (float s : p.std) check(s != 0, ErrorCode::invalid_argument, path + ": \"std\" has a zero");
  return p;
}

std::string ImagePreprocess::describe() const {
  std::ostringstream s;
  s.precision(9);
  s << "input=" << input << " size=" << height << "x" << width
    << " resize=" << (fit ? "fit" : "stretch") << " pad=" << pad << " scale=" << scale << " mean=";
  for (float v : mean) s << v << ",";
  s << " std=";
  for (float v : std) s << v << ",";
  s << " layout=" << (nhwc ? "nhwc" : "nchw") << " color=" << color;
  return s.str();
}

Tensor preprocess_image(const Tensor& rgb, const ImagePreprocess& pre) {
  const int64_t h = rgb.shape()[0], w = rgb.shape()[1];
  const int64_t H = pre.height, W = pre.width;
  const int64_t C = pre.color == "gray" ? 1 : 3;
  int64_t nh = H, nw = W;  // the resized image; the rest (fit) is padding
  if (pre.fit) {
    const double s = std::min(double(H) / double(h), double(W) / double(w));
    nh = std::clamp<int64_t>(int64_t(std::lround(double(h) * s)), 1, H);
    nw = std::clamp<int64_t>(int64_t(std::lround(double(w) * s)), 1, W);
  }
  const uint8_t* src = rgb.data<uint8_t>();
  Tensor out(DType::f32, pre.nhwc ? Shape{H, W, C} : Shape{C, H, W});
  float* o = out.data<float>();
  auto at = [&](int64_t y, int64_t x, int64_t c) -> float& {
    return pre.nhwc ? o[(y * W + x) * C + c] : o[(c * H + y) * W + x];
  };
  std::fill(o, o + out.numel(), pre.pad);
  const float sy = float(h) / float(nh), sx = float(w) / float(nw);
  for (int64_t y = 0; y < nh; ++y) {
    const float fy = clamp_index((float(y) + 0.5f) * sy - 0.5f, h);
    const int64_t y0 = int64_t(fy), y1 = std::min(y0 + 1, h - 1);
    const float wy = fy - float(y0);
    for (int64_t x = 0; x < nw; ++x) {
      const float fx = clamp_index((float(x) + 0.5f) * sx - 0.5f, w);
      const int64_t x0 = int64_t(fx), x1 = std::min(x0 + 1, w - 1);
      const float wx = fx - float(x0);
      float px[3];
      for (int c = 0; c < 3; ++c) {
        auto p = [&](int64_t yy, int64_t xx) { return float(src[(yy * w + xx) * 3 + c]); };
        const float top = p(y0, x0) + (p(y0, x1) - p(y0, x0)) * wx;
        const float bottom = p(y1, x0) + (p(y1, x1) - p(y1, x0)) * wx;
        px[c] = top + (bottom - top) * wy;
      }
      float v[3];
      if (C == 1)
        v[0] = 0.299f * px[0] + 0.587f * px[1] + 0.114f * px[2];
      else if (pre.color == "bgr")
        v[0] = px[2], v[1] = px[1], v[2] = px[0];
      else
        v[0] = px[0], v[1] = px[1], v[2] = px[2];
      for (int64_t c = 0; c < C; ++c) {
        const float mean = pre.mean.size() == 1 ? pre.mean[0] : pre.mean[size_t(c)];
        const float std = pre.std.size() == 1 ? pre.std[0] : pre.std[size_t(c)];
        at(y, x, c) = (v[c] * pre.scale - mean) / std;
      }
    }
  }
  return out;
}

SampleSet SampleSet::open(const std::string& path, const std::vector<ValueInfo>& inputs,
                          const std::string& preprocess_file) {
  check(fs::exists(path), ErrorCode::not_found, path + ": no such file or folder");
  check(!inputs.empty(), ErrorCode::invalid_argument, path + ": the model has no inputs to feed");
  SampleSet set;
  trust::Hasher hash(trust::HashAlg::sha256);
  std::vector<std::pair<std::string, Tensor>> arrays;  // (where, tensor) by input name below
  std::map<std::string, std::string> where;
  std::string kind;
  if (fs::is_directory(path)) {
    std::vector<fs::path> npys, images;
    for (const auto& e : fs::directory_iterator(path)) {
      if (!e.is_regular_file()) continue;
      if (lower(e.path().extension().string()) == ".npy")
        npys.push_back(e.path());
      else if (is_image_file(e.path()))
        images.push_back(e.path());
    }
    std::sort(npys.begin(), npys.end());
    std::sort(images.begin(), images.end());
    check(!npys.empty() || !images.empty(), ErrorCode::invalid_argument,
          path + ": empty (no .npy files, no PNG or JPEG images)");
    check(npys.empty() || images.empty(), ErrorCode::invalid_argument,
          path + ": holds both .npy files and images; use one kind of data per folder");
    if (!npys.empty()) {
      kind = "npy folder";
      for (const auto& p : npys) {
        const std::string stem = p.stem().string();
        std::string name;
        for (const auto& in : inputs)
          if (in.name == stem || file_safe(in.name) == stem) name = in.name;
        check(!name.empty(), ErrorCode::invalid_argument,
              p.string() + ": " + q(stem) +
                  " is not an input of the model (inputs: " + input_list(inputs) + ")");
        if (where.count(name))
          throw Error(
              ErrorCode::invalid_argument,
              p.string() + ": input " + q(name) + " is given twice (also " + where.at(name) + ")");
        const trust::Digest d = trust::hash_file(trust::HashAlg::sha256, p.string());
        hash.update(name);
        hash.update(d.data(), d.size());
        where[name] = p.string();
        arrays.emplace_back(name, read_npy(p.string()));
      }
    } else {
      kind = "image folder";
      std::string spec = preprocess_file;
      if (spec.empty() && fs::exists(fs::path(path) / "preprocess.json"))
        spec = (fs::path(path) / "preprocess.json").string();
      set.pre_ = spec.empty() ? ImagePreprocess{} : ImagePreprocess::from_json_file(spec);
      const ValueInfo* in = nullptr;
      for (const auto& v : inputs)
        if (v.name == set.pre_.input || (set.pre_.input.empty() && inputs.size() == 1)) in = &v;
      check(in != nullptr, ErrorCode::invalid_argument,
            path + ": images feed one input; " +
                (set.pre_.input.empty() ? "the model has " + std::to_string(inputs.size()) +
                                              " (name it in the preprocessing spec's \"input\")"
                                        : q(set.pre_.input) + " is not one of them") +
                " (inputs: " + input_list(inputs) + ")");
      check(inputs.size() == 1, ErrorCode::invalid_argument,
            path + ": images feed only " + q(in->name) + ", and the model has other inputs (" +
                input_list(inputs) + ")");
      check(
          in->shape && in->shape->size() == 4, ErrorCode::invalid_argument,
          path + ": images need a 4-D input, the model's " + q(in->name) + " is " + in->describe());
      check(!in->dtype || *in->dtype == DType::f32, ErrorCode::invalid_argument,
            path + ": images become f32, the model's " + q(in->name) + " is " + in->describe());
      const auto& dims = *in->shape;
      const int hd = set.pre_.nhwc ? 1 : 2, wd = set.pre_.nhwc ? 2 : 3, cd = set.pre_.nhwc ? 3 : 1;
      if (!set.pre_.height) set.pre_.height = dims[size_t(hd)].value;
      if (!set.pre_.width) set.pre_.width = dims[size_t(wd)].value;
      check(set.pre_.height > 0 && set.pre_.width > 0, ErrorCode::invalid_argument,
            path + ": the model's " + q(in->name) + " " + in->describe() +
                " has no fixed height and width; give \"size\" in the preprocessing spec");
      const int64_t c = set.pre_.color == "gray" ? 1 : 3;
      for (auto [d, v] :
           {std::pair{hd, set.pre_.height}, std::pair{wd, set.pre_.width}, std::pair{cd, c}})
        check(!dims[size_t(d)].is_fixed() || dims[size_t(d)].value == v,
              ErrorCode::invalid_argument,
              path + ": preprocessed images are " + std::to_string(set.pre_.height) + "x" +
                  std::to_string(set.pre_.width) + "x" + std::to_string(c) + " (" +
                  (set.pre_.nhwc ? "nhwc" : "nchw") + "), the model's " + q(in->name) + " is " +
                  in->describe());
      set.pre_.input = in->name;
      set.image_input_ = in->name;
      hash.update(set.pre_.describe());
      for (const auto& p : images) {
        const trust::Digest d = trust::hash_file(trust::HashAlg::sha256, p.string());
        hash.update(p.filename().string());
        hash.update(d.data(), d.size());
        set.images_.push_back(p.string());
      }
      set.samples_ = int64_t(images.size());
    }
  } else if (lower(fs::path(path).extension().string()) == ".npy") {
    kind = "npy";
    check(inputs.size() == 1, ErrorCode::invalid_argument,
          path + ": one .npy file feeds a one-input model; this one has " + std::to_string(inputs.size()) +
              " (" + input_list(inputs) + "): give a folder of INPUT.npy or an .npz");
    const trust::Digest d = trust::hash_file(trust::HashAlg::sha256, path);
    hash.update(inputs[0].name);
    hash.update(d.data(), d.size());
    where[inputs[0].name] = path;
    arrays.emplace_back(inputs[0].name, read_npy(path));
  } else {
    kind = "npz";
    const trust::Digest d = trust::hash_file(trust::HashAlg::sha256, path);
    hash.update(d.data(), d.size());
    auto members = read_npz(path);
    check(!members.empty(), ErrorCode::invalid_argument, path + ": empty archive");
    for (auto& [key, t] : members) {
      bool known = false;
      for (const auto& in : inputs) known |= in.name == key;
      check(known, ErrorCode::invalid_argument,
            path + ": member " + q(key) +
                " is not an input of the model (inputs: " + input_list(inputs) + ")");
      where[key] = path + " member " + q(key);
      arrays.emplace_back(key, std::move(t));
    }
  }
  if (set.images_.empty()) {
    int64_t n = -1;
    std::string first;
    for (const auto& in : inputs) {
      auto it = std::find_if(arrays.begin(), arrays.end(),
                             [&](const auto& a) { return a.first == in.name; });
      check(it != arrays.end(), ErrorCode::invalid_argument,
            path + ": no data for the model's input " + q(in.name) + " " + in.describe() +
                (kind == "npz" ? " (an .npz member named so)"
                               : " (a file " + file_safe(in.name) + ".npy)"));
      const int64_t count = check_array(it->second, in, where.at(in.name));
      if (count >= 0) {
        if (n >= 0 && n != count)
          throw Error(ErrorCode::invalid_argument,
                      path + ": " + where.at(in.name) + " has " + std::to_string(count) +
                          " samples, " + where.at(first) + " has " + std::to_string(n));
        n = count;
        first = in.name;
      }
      set.arrays_[in.name] = it->second;
    }
    check(n > 0, ErrorCode::invalid_argument,
          path + ": every input is a scalar; no samples to stack");
    set.samples_ = n;
  }
  set.digest_ = trust::to_hex(hash.finish());
  set.description_ = std::to_string(set.samples_) + " samples (" + kind + " " + path + ")";
  return set;
}

std::map<std::string, Tensor> SampleSet::batch(int64_t begin, int64_t end) const {
  check(0 <= begin && begin < end && end <= samples_, ErrorCode::invalid_argument,
        "samples [" + std::to_string(begin) + ", " + std::to_string(end) + ") of " +
            std::to_string(samples_));
  std::map<std::string, Tensor> out;
  if (!images_.empty()) {
    Tensor first;
    for (int64_t i = begin; i < end; ++i) {
      const Tensor x = preprocess_image(decode_image(images_[size_t(i)]), pre_);
      if (!first.defined()) {
        Shape s = x.shape();
        s.insert(s.begin(), end - begin);
        first = Tensor(DType::f32, s);
      }
      std::memcpy(first.data<float>() + (i - begin) * x.numel(), x.data<float>(), x.nbytes());
    }
    out[image_input_] = first;
    return out;
  }
  for (const auto& [name, t] : arrays_)
    out[name] = t.rank() == 0 ? t : t.slice(0, begin, end).contiguous();
  return out;
}

}  // namespace slim::quant
