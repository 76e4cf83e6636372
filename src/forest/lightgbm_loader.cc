// LightGBM text model loader. LightGBM compares `x <= threshold` with the input promoted
// to double; every such test is rewritten as `x < t` against a float32 t that routes
// every float32 input the same way, so one comparison rule serves both libraries.
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <sstream>

#include "slim/core/error.h"
#include "slim/core/mapped_file.h"
#include "slim/forest/forest.h"

namespace slim::forest {

// For float x: (double)x <= d  <=>  x <= f  (f = largest float32 <= d)  <=>  x < next(f).
float lightgbm_threshold_to_float(double d) {
  float f = float(d);
  if (double(f) > d) f = std::nextafter(f, -std::numeric_limits<float>::infinity());
  return std::nextafter(f, std::numeric_limits<float>::infinity());
}

namespace {

using KeyValues = std::map<std::string, std::string>;

std::vector<double> parse_doubles(const std::string& s, const std::string& where) {
  std::vector<double> out;
  const char* p = s.c_str();
  const char* end = p + s.size();
  while (p < end) {
    while (p < end && *p == ' ') ++p;
    if (p >= end) break;
    char* q = nullptr;
    errno = 0;
    const double v = std::strtod(p, &q);
    if (q == p || (*q != ' ' && *q != '\0'))
      throw Error(ErrorCode::invalid_model, where + ": malformed number near '" +
                                                std::string(p, std::min<size_t>(20, end - p)) + "'");
    out.push_back(v);
    p = q;
  }
  return out;
}

std::vector<int64_t> parse_ints(const std::string& s, const std::string& where) {
  std::vector<int64_t> out;
  for (double v : parse_doubles(s, where)) {
    if (v != std::floor(v) || std::fabs(v) > 9e15)
      throw Error(ErrorCode::invalid_model, where + ": expected integers");
    out.push_back(int64_t(v));
  }
  return out;
}

const std::string& need(const KeyValues& kv, const std::string& key, const std::string& where) {
  auto it = kv.find(key);
  if (it == kv.end()) throw Error(ErrorCode::invalid_model, where + ": missing '" + key + "'");
  return it->second;
}

template <typename T>
void need_size(const std::vector<T>& v, size_t n, const std::string& what) {
  if (v.size() != n)
    throw Error(ErrorCode::invalid_model, what + ": has " + std::to_string(v.size()) +
                                              " values, expected " + std::to_string(n));
}

void set_objective(Forest& f, const std::string& objective, const std::string& where) {
  std::stringstream ss(objective);
  std::string name, tok;
  ss >> name;
  f.objective = objective;
  f.sigmoid_scale = 1.0;
  while (ss >> tok) {
    if (tok.rfind("sigmoid:", 0) == 0) {
      char* e = nullptr;
      f.sigmoid_scale = std::strtod(tok.c_str() + 8, &e);
      slim::check(*e == '\0' && std::isfinite(f.sigmoid_scale) && f.sigmoid_scale > 0,
                  ErrorCode::invalid_model, where + ": bad " + tok);
    } else if (tok == "sqrt") {
      throw Error(ErrorCode::unsupported, where + ": objective option 'sqrt' is not supported");
    }
  }
  if (name == "binary" || name == "cross_entropy" || name == "xentropy" ||
      name == "multiclassova" || name == "multiclass_ova" || name == "ova" || name == "ovr") {
    f.transform = Transform::sigmoid;
  } else if (name == "multiclass" || name == "softmax") {
    f.transform = Transform::softmax;
  } else if (name == "poisson" || name == "gamma" || name == "tweedie") {
    f.transform = Transform::exp;
  } else if (name == "regression" || name == "regression_l2" || name == "regression_l1" ||
             name == "huber" || name == "fair" || name == "quantile" || name == "mape" ||
             name == "lambdarank" || name == "rank_xendcg" || name == "custom" || name == "none") {
    f.transform = Transform::identity;
  } else {
    throw Error(ErrorCode::unsupported, where + ": objective '" + name + "' is not supported");
  }
}

void build_tree(const KeyValues& kv, const std::string& w, Forest& f, Tree& tree) {
  const int64_t num_leaves = parse_ints(need(kv, "num_leaves", w), w + ".num_leaves").at(0);
  slim::check(num_leaves >= 1 && num_leaves <= (int64_t(1) << 24), ErrorCode::invalid_model,
              w + ": num_leaves " + std::to_string(num_leaves) + " is out of range");
  if (kv.count("is_linear") && parse_ints(kv.at("is_linear"), w + ".is_linear").at(0) != 0)
    throw Error(ErrorCode::unsupported, w + ": linear trees are not supported");
  const auto leaf_value = parse_doubles(need(kv, "leaf_value", w), w + ".leaf_value");
  need_size(leaf_value, size_t(num_leaves), w + ".leaf_value");
  const size_t ni = size_t(num_leaves - 1);
  tree.nodes.assign(ni + size_t(num_leaves), TreeNode{});
  std::vector<double> leaf_weight;
  if (kv.count("leaf_weight")) {
    leaf_weight = parse_doubles(kv.at("leaf_weight"), w + ".leaf_weight");
    need_size(leaf_weight, size_t(num_leaves), w + ".leaf_weight");
  }
  for (size_t j = 0; j < size_t(num_leaves); ++j) {
    TreeNode& leaf = tree.nodes[ni + j];
    leaf.is_leaf = true;
    leaf.leaf_value = leaf_value[j];
    if (!leaf_weight.empty()) leaf.cover = float(leaf_weight[j]);
  }
  if (ni == 0) return;

  const auto feat = parse_ints(need(kv, "split_feature", w), w + ".split_feature");
  const auto thr = parse_doubles(need(kv, "threshold", w), w + ".threshold");
  const auto dtype = parse_ints(need(kv, "decision_type", w), w + ".decision_type");
  const auto lc = parse_ints(need(kv, "left_child", w), w + ".left_child");
  const auto rc = parse_ints(need(kv, "right_child", w), w + ".right_child");
  need_size(feat, ni, w + ".split_feature");
  need_size(thr, ni, w + ".threshold");
  need_size(dtype, ni, w + ".decision_type");
  need_size(lc, ni, w + ".left_child");
  need_size(rc, ni, w + ".right_child");
  std::vector<double> gain, internal_weight;
  if (kv.count("split_gain")) {
    gain = parse_doubles(kv.at("split_gain"), w + ".split_gain");
    need_size(gain, ni, w + ".split_gain");
  }
  if (kv.count("internal_weight")) {
    internal_weight = parse_doubles(kv.at("internal_weight"), w + ".internal_weight");
    need_size(internal_weight, ni, w + ".internal_weight");
  }
  const int64_t num_cat =
      kv.count("num_cat") ? parse_ints(kv.at("num_cat"), w + ".num_cat").at(0) : 0;
  slim::check(num_cat >= 0 && num_cat <= int64_t(ni), ErrorCode::invalid_model,
              w + ": num_cat " + std::to_string(num_cat) + " is out of range");
  std::vector<int64_t> cat_bounds, cat_words;
  size_t cat_base = f.category_sets.size();
  if (num_cat > 0) {
    cat_bounds = parse_ints(need(kv, "cat_boundaries", w), w + ".cat_boundaries");
    cat_words = parse_ints(need(kv, "cat_threshold", w), w + ".cat_threshold");
    need_size(cat_bounds, size_t(num_cat) + 1, w + ".cat_boundaries");
    slim::check(cat_bounds[0] == 0 && cat_bounds.back() == int64_t(cat_words.size()),
                ErrorCode::invalid_model, w + ": cat_boundaries do not span cat_threshold");
    for (int64_t c = 0; c < num_cat; ++c) {
      slim::check(cat_bounds[size_t(c)] <= cat_bounds[size_t(c) + 1], ErrorCode::invalid_model,
                  w + ": cat_boundaries are not increasing");
      CategorySet set;
      for (int64_t k = cat_bounds[size_t(c)]; k < cat_bounds[size_t(c) + 1]; ++k) {
        slim::check(cat_words[size_t(k)] >= 0 && cat_words[size_t(k)] <= 0xffffffffLL,
                    ErrorCode::invalid_model, w + ": cat_threshold word out of range");
        set.words.push_back(uint32_t(cat_words[size_t(k)]));
      }
      f.category_sets.push_back(std::move(set));
    }
  }

  auto child = [&](int64_t c, const std::string& what) -> int32_t {
    if (c >= 0) {
      slim::check(c < int64_t(ni), ErrorCode::invalid_model,
                  what + ": internal child " + std::to_string(c) + " out of range");
      return int32_t(c);
    }
    const int64_t leaf = ~c;
    slim::check(leaf < num_leaves, ErrorCode::invalid_model,
                what + ": leaf child " + std::to_string(leaf) + " out of range");
    return int32_t(ni + size_t(leaf));
  };
  for (size_t i = 0; i < ni; ++i) {
    const std::string nw = w + " node " + std::to_string(i);
    TreeNode& node = tree.nodes[i];
    node.is_leaf = false;
    node.left = child(lc[i], nw + ".left_child");
    node.right = child(rc[i], nw + ".right_child");
    slim::check(feat[i] >= 0 && feat[i] < int64_t(f.num_features), ErrorCode::invalid_model,
                nw + ": split_feature " + std::to_string(feat[i]) + " is not below " +
                    std::to_string(f.num_features));
    node.feature = uint32_t(feat[i]);
    if (!gain.empty()) node.gain = float(gain[i]);
    if (!internal_weight.empty()) node.cover = float(internal_weight[i]);
    slim::check(dtype[i] >= 0 && dtype[i] < 16, ErrorCode::invalid_model,
                nw + ": decision_type " + std::to_string(dtype[i]) + " is out of range");
    const bool categorical = dtype[i] & 1;
    const bool default_left = (dtype[i] >> 1) & 1;
    const int missing_type = int((dtype[i] >> 2) & 3);
    slim::check(missing_type <= 2, ErrorCode::invalid_model,
                nw + ": missing type 3 does not exist");
    if (categorical) {
      const double t = thr[i];
      slim::check(t >= 0 && t < double(num_cat) && t == std::floor(t), ErrorCode::invalid_model,
                  nw + ": categorical threshold " + std::to_string(t) +
                      " is not a category-set index below num_cat");
      node.category_set = int32_t(cat_base + size_t(t));
      // LightGBM sends NaN, negative and unlisted categories right.
      node.default_left = false;
      continue;
    }
    slim::check(!std::isnan(thr[i]), ErrorCode::invalid_model, nw + ": threshold is NaN");
    node.threshold = lightgbm_threshold_to_float(thr[i]);
    if (missing_type == 2) {  // NaN: NaN takes the default direction
      node.default_left = default_left;
    } else if (missing_type == 1) {  // Zero: NaN is read as 0, and 0 is missing
      node.default_left = default_left;
      node.zero_missing = true;
    } else {  // None: NaN is read as 0 and compared like any value
      node.default_left = 0.0 <= thr[i];
    }
  }
}

}  // namespace

Forest parse_lightgbm_text(const std::string& text, const std::string& name) {
  Forest f;
  f.source = SourceKind::lightgbm;
  f.accumulate_double = true;
  f.truncate_category_first = true;
  KeyValues header;
  std::vector<KeyValues> trees;
  std::vector<int64_t> tree_ids;
  bool average_output = false;
  std::stringstream ss(text);
  std::string line;
  KeyValues* current = &header;
  size_t line_no = 0;
  while (std::getline(ss, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == "end of trees") break;
    if (line.empty()) continue;
    if (line == "average_output") {
      average_output = true;
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;  // "tree", section titles
    std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "Tree") {
      trees.emplace_back();
      current = &trees.back();
      char* e = nullptr;
      tree_ids.push_back(std::strtoll(value.c_str(), &e, 10));
      continue;
    }
    (*current)[key] = value;
  }
  const std::string hw = name + ": header";
  slim::check(!trees.empty(), ErrorCode::invalid_model,
              name + ": no 'Tree=' sections (not a LightGBM text model?)");
  const int64_t max_feature = parse_ints(need(header, "max_feature_idx", hw), hw).at(0);
  slim::check(max_feature >= 0 && max_feature < (int64_t(1) << 28), ErrorCode::invalid_model,
              hw + ": max_feature_idx " + std::to_string(max_feature) + " is out of range");
  f.num_features = uint32_t(max_feature + 1);
  const int64_t num_class =
      header.count("num_class") ? parse_ints(header["num_class"], hw + ".num_class").at(0) : 1;
  const int64_t per_iter = header.count("num_tree_per_iteration")
                               ? parse_ints(header["num_tree_per_iteration"], hw).at(0)
                               : num_class;
  slim::check(num_class >= 1 && num_class <= 100000 && per_iter == num_class,
              ErrorCode::invalid_model,
              hw + ": num_class " + std::to_string(num_class) + " / num_tree_per_iteration " +
                  std::to_string(per_iter) + " are inconsistent");
  f.num_groups = uint32_t(num_class);
  f.base_margin.assign(f.num_groups, 0.0);
  set_objective(f, header.count("objective") ? header["objective"] : "regression", hw);
  if (header.count("feature_names")) {
    std::stringstream fs(header["feature_names"]);
    std::string n;
    while (fs >> n) f.feature_names.push_back(n);
    if (f.feature_names.size() != f.num_features) f.feature_names.clear();
  }
  f.trees.resize(trees.size());
  for (size_t t = 0; t < trees.size(); ++t) {
    const std::string tw = name + ": Tree=" + std::to_string(t);
    slim::check(tree_ids[t] == int64_t(t), ErrorCode::invalid_model,
                tw + ": trees are not numbered in order");
    f.trees[t].group = uint32_t(t % f.num_groups);
    build_tree(trees[t], tw, f, f.trees[t]);
  }
  if (average_output) {
    slim::check(trees.size() % f.num_groups == 0, ErrorCode::invalid_model,
                name + ": tree count is not a multiple of the class count");
    f.average_divisor = double(trees.size() / f.num_groups);
  }
  f.validate(name);
  return f;
}

Forest load_lightgbm_text(const std::string& path) {
  auto file = MappedFile::open(path);
  return parse_lightgbm_text(std::string(file->view()), path);
}

}  // namespace slim::forest
