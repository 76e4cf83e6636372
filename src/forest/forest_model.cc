#include "slim/forest/forest_model.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <algorithm>
#include <limits>

#include "slim/core/error.h"
#include "slim/core/convert.h"
#include "slim/core/mapped_file.h"
#include "slim/core/npy.h"
#include "slim/core/thread_pool.h"

namespace slim::forest {

std::vector<TensorSpec> ForestModel::input_specs() const {
  return {{"input", DType::f32, {-1, int64_t(forest_.num_features())}}};
}

std::vector<TensorSpec> ForestModel::output_specs() const {
  if (width() == 1) return {{"output", DType::f32, {-1}}};
  return {{"output", DType::f32, {-1, int64_t(width())}}};
}

std::map<std::string, Tensor> ForestModel::predict(const std::map<std::string, Tensor>& inputs) const {
  auto it = inputs.find("input");
  slim::check(it != inputs.end(), ErrorCode::invalid_argument, "forest: missing input 'input'");
  slim::check(inputs.size() == 1, ErrorCode::invalid_argument, "forest: takes only 'input'");
  const Tensor& in = it->second;
  slim::check(in.defined() && in.dtype() == DType::f32, ErrorCode::invalid_argument,
              "forest: input must be f32, got " + (in.defined() ? in.describe() : std::string("undefined")));
  const int64_t F = forest_.num_features();
  slim::check((in.rank() == 2 && in.dim(1) == F) || (in.rank() == 1 && in.dim(0) == F),
              ErrorCode::invalid_argument,
              "forest: input shape " + shape_str(in.shape()) + " does not match [N, " + std::to_string(F) + "]");
  const Tensor x = in.contiguous();
  const int64_t n = in.rank() == 2 ? in.dim(0) : 1;
  Tensor out = width() == 1 ? Tensor(DType::f32, {n}) : Tensor(DType::f32, {n, int64_t(width())});
  if (n == 1) {
    forest_.predict_row(x.data<float>(), out.data<float>(), margin_);
  } else {
    forest_.predict(x.data<float>(), n, out.data<float>(), margin_, &default_thread_pool());
  }
  return {{"output", std::move(out)}};
}

namespace {

bool parse_cell(const char* b, const char* e, float& v) {
  while (b < e && (*b == ' ' || *b == '"')) ++b;
  while (e > b && (e[-1] == ' ' || e[-1] == '"' || e[-1] == '\r')) --e;
  const std::string s(b, e);
  if (s.empty() || s == "NA" || s == "nan" || s == "NaN" || s == "?" || s == "null") {
    v = std::numeric_limits<float>::quiet_NaN();
    return true;
  }
  char* end = nullptr;
  v = std::strtof(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

}  // namespace

CsvTable read_csv(const std::string& path) {
  auto file = MappedFile::open(path);
  const char* p = reinterpret_cast<const char*>(file->data());
  const char* end = p + file->size();
  CsvTable t;
  int64_t line_no = 0;
  while (p < end) {
    const char* eol = p;
    while (eol < end && *eol != '\n') ++eol;
    ++line_no;
    std::vector<std::pair<const char*, const char*>> cells;
    const char* c = p;
    for (const char* q = p; q <= eol; ++q) {
      if (q == eol || *q == ',') {
        cells.push_back({c, q});
        c = q + 1;
      }
    }
    const bool blank = eol == p || (eol - p == 1 && *p == '\r');
    if (!blank) {
      std::vector<float> vals(cells.size());
      bool numeric = true;
      for (size_t i = 0; i < cells.size() && numeric; ++i)
        numeric = parse_cell(cells[i].first, cells[i].second, vals[i]);
      if (!numeric && t.rows == 0 && t.columns.empty()) {
        for (auto& [b, e] : cells) {
          std::string name(b, e);
          while (!name.empty() && (name.back() == '\r' || name.back() == '"' || name.back() == ' ')) name.pop_back();
          while (!name.empty() && (name.front() == '"' || name.front() == ' ')) name.erase(0, 1);
          t.columns.push_back(name);
        }
        t.cols = int64_t(cells.size());
      } else {
        slim::check(numeric, ErrorCode::invalid_argument,
                    path + ":" + std::to_string(line_no) + ": a cell is not a number");
        if (t.cols == 0) t.cols = int64_t(cells.size());
        slim::check(int64_t(cells.size()) == t.cols, ErrorCode::invalid_argument,
                    path + ":" + std::to_string(line_no) + ": has " + std::to_string(cells.size()) +
                        " cells, expected " + std::to_string(t.cols));
        t.values.insert(t.values.end(), vals.begin(), vals.end());
        ++t.rows;
      }
    }
    p = eol + 1;
  }
  return t;
}

FeatureRows read_feature_rows(const std::string& path, const std::string& label_column, uint32_t features,
                              bool label_optional) {
  CsvTable t;
  if (path.size() > 4 && path.compare(path.size() - 4, 4, ".npy") == 0) {
    const Tensor a = read_npy(path);
    check(a.rank() == 2 && (a.dtype() == DType::f32 || a.dtype() == DType::f64), ErrorCode::invalid_argument,
          path + ": expected a 2-D f32 or f64 array of rows, got " + a.describe());
    const Tensor f = convert_dtype(a, DType::f32).contiguous();
    t.rows = a.shape()[0];
    t.cols = a.shape()[1];
    t.values.assign(f.data<float>(), f.data<float>() + f.numel());
  } else {
    t = read_csv(path);
  }
  int64_t label = -1;
  if (!label_column.empty()) {
    auto it = std::find(t.columns.begin(), t.columns.end(), label_column);
    if (it != t.columns.end()) {
      label = it - t.columns.begin();
    } else if (!(label_optional && int64_t(t.columns.size()) == int64_t(features))) {
      char* e = nullptr;
      label = std::strtoll(label_column.c_str(), &e, 10);
      check(*e == '\0' && label >= 0 && label < t.cols, ErrorCode::invalid_argument,
            path + ": no label column '" + label_column + "'");
    }
  }
  FeatureRows r;
  r.n = t.rows;
  r.f = t.cols - (label >= 0 ? 1 : 0);
  check(r.f == int64_t(features), ErrorCode::invalid_argument,
        path + ": has " + std::to_string(r.f) + " feature columns, the model expects " + std::to_string(features));
  r.x.reserve(size_t(r.n * r.f));
  for (int64_t i = 0; i < t.rows; ++i)
    for (int64_t c = 0; c < t.cols; ++c) {
      const float v = t.values[size_t(i * t.cols + c)];
      if (c == label) r.labels.push_back(v);
      else r.x.push_back(v);
    }
  return r;
}

}  // namespace slim::forest
