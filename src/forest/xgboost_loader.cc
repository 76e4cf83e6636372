// XGBoost model loader for the JSON and UBJSON formats (versions 1.x to 3.x).
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "forest/json_util.h"
#include "slim/core/error.h"
#include "slim/core/mapped_file.h"
#include "slim/forest/forest.h"

namespace slim::forest {
namespace detail {

using nlohmann::json;

std::string quote_nonfinite_tokens(const std::string& text) {
  std::string out;
  out.reserve(text.size() + 64);
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out.push_back(c);
      if (c == '\\' && i + 1 < text.size()) {
        out.push_back(text[++i]);
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      out.push_back(c);
      continue;
    }
    auto starts = [&](const char* tok) { return text.compare(i, std::strlen(tok), tok) == 0; };
    if (starts("NaN")) {
      out += "\"NaN\"";
      i += 2;
    } else if (starts("-Infinity")) {
      out += "\"-Infinity\"";
      i += 8;
    } else if (starts("Infinity")) {
      out += "\"Infinity\"";
      i += 7;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

const json& field(const json& obj, const char* key, const std::string& where) {
  if (!obj.is_object())
    throw Error(ErrorCode::invalid_model, where + ": expected an object holding '" + key + "'");
  auto it = obj.find(key);
  if (it == obj.end())
    throw Error(ErrorCode::invalid_model, where + ": missing field '" + key + "'");
  return *it;
}

static double parse_number_string(const std::string& s, const std::string& where) {
  if (s == "NaN" || s == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (s == "Infinity" || s == "inf") return std::numeric_limits<double>::infinity();
  if (s == "-Infinity" || s == "-inf") return -std::numeric_limits<double>::infinity();
  std::string t = s;
  // XGBoost 3.1 writes base_score as a one-element list string: "[5E-1]".
  if (t.size() >= 2 && t.front() == '[' && t.back() == ']') t = t.substr(1, t.size() - 2);
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (t.empty() || end != t.c_str() + t.size())
    throw Error(ErrorCode::invalid_model, where + ": '" + s + "' is not a number");
  return v;
}

double as_double(const json& v, const std::string& where) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) return parse_number_string(v.get<std::string>(), where);
  if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
  throw Error(ErrorCode::invalid_model, where + ": expected a number, got " + v.type_name());
}

float as_float(const json& v, const std::string& where) {
  if (v.is_string()) {
    // Parse straight to float so the decimal is rounded once, as XGBoost does.
    const std::string s = v.get<std::string>();
    if (s == "NaN" || s == "Infinity" || s == "-Infinity") return float(as_double(v, where));
    char* end = nullptr;
    const float f = std::strtof(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) return f;
  }
  return float(as_double(v, where));
}

int64_t as_int(const json& v, const std::string& where) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_boolean()) return v.get<bool>() ? 1 : 0;
  const double d = as_double(v, where);
  if (!(d == std::floor(d)) || std::fabs(d) > 9e15)
    throw Error(ErrorCode::invalid_model, where + ": expected an integer");
  return int64_t(d);
}

}  // namespace detail

namespace {

using nlohmann::json;
using detail::as_double;
using detail::as_float;
using detail::as_int;
using detail::field;

const json& array_field(const json& obj, const char* key, const std::string& where,
                        size_t expected_size) {
  const json& a = field(obj, key, where);
  if (!a.is_array())
    throw Error(ErrorCode::invalid_model, where + "." + key + ": expected an array");
  if (expected_size != size_t(-1) && a.size() != expected_size)
    throw Error(ErrorCode::invalid_model, where + "." + key + ": has " +
                                              std::to_string(a.size()) + " entries, expected " +
                                              std::to_string(expected_size));
  return a;
}

void set_objective(Forest& f, const std::string& name, const std::string& where) {
  f.objective = name;
  if (name == "binary:logistic" || name == "reg:logistic") {
    f.transform = Transform::sigmoid;
  } else if (name == "binary:logitraw") {
    f.transform = Transform::identity;
  } else if (name == "count:poisson" || name == "reg:gamma" || name == "reg:tweedie" ||
             name == "survival:cox") {
    f.transform = Transform::exp;
  } else if (name == "multi:softprob") {
    f.transform = Transform::softmax;
  } else if (name == "multi:softmax") {
    f.transform = Transform::argmax;
  } else if (name == "reg:squarederror" || name == "reg:linear" ||
             name == "reg:squaredlogerror" || name == "reg:pseudohubererror" ||
             name == "reg:absoluteerror" || name == "reg:quantileerror" ||
             name.rfind("rank:", 0) == 0) {
    f.transform = Transform::identity;
  } else {
    throw Error(ErrorCode::unsupported, where + ": objective '" + name + "' is not supported");
  }
}

// base_score is stored in output space; the margin starts at its image under the
// objective's link, computed in float32 as XGBoost's ProbToMargin does.
float base_score_to_margin(const std::string& objective, float base_score,
                           const std::string& where) {
  // binary:logitraw adds base_score to the margin as is.
  if (objective == "binary:logistic" || objective == "reg:logistic") {
    slim::check(base_score > 0.0f && base_score < 1.0f, ErrorCode::invalid_model,
                where + ": base_score " + std::to_string(base_score) +
                    " must lie in (0, 1) for a logistic objective");
    return -logf(1.0f / base_score - 1.0f);
  }
  if (objective == "count:poisson" || objective == "reg:gamma" || objective == "reg:tweedie" ||
      objective == "survival:cox") {
    slim::check(base_score > 0.0f, ErrorCode::invalid_model,
                where + ": base_score must be positive for a log-link objective");
    return logf(base_score);
  }
  return base_score;
}

void load_tree(const json& jt, const std::string& where, Forest& forest, Tree& tree) {
  const json& tp = field(jt, "tree_param", where);
  const int64_t num_nodes = as_int(field(tp, "num_nodes", where + ".tree_param"), where);
  slim::check(num_nodes >= 1 && num_nodes <= (int64_t(1) << 28), ErrorCode::invalid_model,
              where + ": num_nodes " + std::to_string(num_nodes) + " is out of range");
  if (tp.contains("size_leaf_vector")) {
    const int64_t slv = as_int(tp["size_leaf_vector"], where + ".size_leaf_vector");
    slim::check(slv <= 1, ErrorCode::unsupported,
                where + ": vector-leaf (multi-target) trees are not supported");
  }
  const size_t n = size_t(num_nodes);
  const json& lc = array_field(jt, "left_children", where, n);
  const json& rc = array_field(jt, "right_children", where, n);
  const json& si = array_field(jt, "split_indices", where, n);
  const json& sc = array_field(jt, "split_conditions", where, n);
  const json& dl = array_field(jt, "default_left", where, n);
  const json* st = jt.contains("split_type") ? &array_field(jt, "split_type", where, n) : nullptr;
  const json* lch = jt.contains("loss_changes") ? &array_field(jt, "loss_changes", where, n) : nullptr;
  const json* hes = jt.contains("sum_hessian") ? &array_field(jt, "sum_hessian", where, n) : nullptr;

  tree.nodes.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string w = where + ".node[" + std::to_string(i) + "]";
    TreeNode& node = tree.nodes[i];
    const int64_t l = as_int(lc[i], w + ".left_children");
    const int64_t r = as_int(rc[i], w + ".right_children");
    if (lch) node.gain = as_float((*lch)[i], w + ".loss_changes");
    if (hes) node.cover = as_float((*hes)[i], w + ".sum_hessian");
    if (l == -1) {
      slim::check(r == -1, ErrorCode::invalid_model, w + ": leaf with a right child");
      node.is_leaf = true;
      node.leaf_value = as_float(sc[i], w + ".split_conditions");
      slim::check(std::isfinite(node.leaf_value), ErrorCode::invalid_model,
                  w + ": leaf value is not finite");
      continue;
    }
    slim::check(l > 0 && l < num_nodes && r > 0 && r < num_nodes && l != r,
                ErrorCode::invalid_model,
                w + ": child index " + std::to_string(l) + "/" + std::to_string(r) +
                    " out of range [1, " + std::to_string(num_nodes) + ")");
    node.is_leaf = false;
    node.left = int32_t(l);
    node.right = int32_t(r);
    const int64_t feat = as_int(si[i], w + ".split_indices");
    slim::check(feat >= 0 && feat < int64_t(forest.num_features), ErrorCode::invalid_model,
                w + ": split feature " + std::to_string(feat) + " is not below num_feature " +
                    std::to_string(forest.num_features));
    node.feature = uint32_t(feat);
    node.default_left = as_int(dl[i], w + ".default_left") != 0;
    const int64_t type = st ? as_int((*st)[i], w + ".split_type") : 0;
    slim::check(type == 0 || type == 1, ErrorCode::invalid_model,
                w + ": split_type " + std::to_string(type) + " is neither 0 nor 1");
    if (type == 0) {
      node.threshold = as_float(sc[i], w + ".split_conditions");
      slim::check(!std::isnan(node.threshold), ErrorCode::invalid_model,
                  w + ": numeric split threshold is NaN");
    } else {
      node.category_set = -2;  // filled from the categories_* arrays below
    }
  }

  // Categorical splits: the listed categories go RIGHT; the bitset XGBoost tests has
  // ceil((max category + 1) / 32) words, and a category past it takes the default.
  if (jt.contains("categories_nodes")) {
    const json& cn = array_field(jt, "categories_nodes", where, size_t(-1));
    const json& cs = array_field(jt, "categories_segments", where, cn.size());
    const json& cz = array_field(jt, "categories_sizes", where, cn.size());
    const json& cats = array_field(jt, "categories", where, size_t(-1));
    for (size_t j = 0; j < cn.size(); ++j) {
      const std::string w = where + ".categories_nodes[" + std::to_string(j) + "]";
      const int64_t nid = as_int(cn[j], w);
      slim::check(nid >= 0 && nid < num_nodes && tree.nodes[size_t(nid)].category_set == -2,
                  ErrorCode::invalid_model, w + ": node " + std::to_string(nid) +
                                                " is not a categorical split");
      const int64_t seg = as_int(cs[j], w + ".segment");
      const int64_t size = as_int(cz[j], w + ".size");
      slim::check(seg >= 0 && size >= 0 && seg + size <= int64_t(cats.size()),
                  ErrorCode::invalid_model,
                  w + ": segment [" + std::to_string(seg) + ", +" + std::to_string(size) +
                      ") exceeds the " + std::to_string(cats.size()) + " categories");
      int64_t max_cat = -1;
      std::vector<int64_t> values;
      for (int64_t k = seg; k < seg + size; ++k) {
        const int64_t c = as_int(cats[size_t(k)], w + ".categories");
        slim::check(c >= 0 && c < (int64_t(1) << 24), ErrorCode::invalid_model,
                    w + ": category " + std::to_string(c) + " out of range");
        values.push_back(c);
        max_cat = std::max(max_cat, c);
      }
      CategorySet set;
      set.words.assign(size_t((max_cat + 1 + 31) / 32), ~uint32_t(0));
      for (int64_t c : values) set.words[size_t(c / 32)] &= ~(uint32_t(1) << (c % 32));
      tree.nodes[size_t(nid)].category_set = int32_t(forest.category_sets.size());
      forest.category_sets.push_back(std::move(set));
    }
  }
  for (size_t i = 0; i < n; ++i)
    slim::check(tree.nodes[i].category_set != -2, ErrorCode::invalid_model,
                where + ".node[" + std::to_string(i) + "]: categorical split without categories");
}

Forest forest_from_document(const json& doc, const std::string& name) {
  Forest f;
  f.source = SourceKind::xgboost;
  f.accumulate_double = false;
  const json& learner = field(doc, "learner", name);
  const std::string lw = name + ": learner";
  const json& lmp = field(learner, "learner_model_param", lw);
  const int64_t num_feature = as_int(field(lmp, "num_feature", lw), lw + ".num_feature");
  slim::check(num_feature >= 1 && num_feature <= (int64_t(1) << 28), ErrorCode::invalid_model,
              lw + ".num_feature " + std::to_string(num_feature) + " is out of range");
  f.num_features = uint32_t(num_feature);
  const int64_t num_class =
      lmp.contains("num_class") ? as_int(lmp["num_class"], lw + ".num_class") : 0;
  slim::check(num_class >= 0 && num_class <= 100000, ErrorCode::invalid_model,
              lw + ".num_class " + std::to_string(num_class) + " is out of range");
  if (lmp.contains("num_target")) {
    const int64_t nt = as_int(lmp["num_target"], lw + ".num_target");
    slim::check(nt <= 1, ErrorCode::unsupported, lw + ": multi-target models are not supported");
  }
  f.num_groups = num_class > 1 ? uint32_t(num_class) : 1;

  const json& obj = field(learner, "objective", lw);
  set_objective(f, field(obj, "name", lw + ".objective").get<std::string>(), lw + ".objective");

  // base_score: a number string, "[v]" (3.1) or "[v0,v1,...]" (one per target/class).
  std::vector<float> base_scores;
  {
    const json& bs = field(lmp, "base_score", lw);
    const std::string bw = lw + ".base_score";
    if (bs.is_string()) {
      std::string s = bs.get<std::string>();
      if (s.size() >= 2 && s.front() == '[' && s.back() == ']') {
        std::stringstream ss(s.substr(1, s.size() - 2));
        std::string item;
        while (std::getline(ss, item, ','))
          base_scores.push_back(as_float(json(item), bw));
      } else {
        base_scores.push_back(as_float(bs, bw));
      }
    } else if (bs.is_array()) {
      for (const auto& v : bs) base_scores.push_back(as_float(v, bw));
    } else {
      base_scores.push_back(as_float(bs, bw));
    }
    slim::check(base_scores.size() == 1 || base_scores.size() == f.num_groups,
                ErrorCode::invalid_model,
                bw + ": has " + std::to_string(base_scores.size()) + " values for " +
                    std::to_string(f.num_groups) + " outputs");
  }
  for (uint32_t g = 0; g < f.num_groups; ++g) {
    const float b = base_scores.size() == 1 ? base_scores[0] : base_scores[g];
    f.base_margin.push_back(base_score_to_margin(f.objective, b, lw + ".base_score"));
  }

  if (learner.contains("feature_names") && learner["feature_names"].is_array()) {
    for (const auto& v : learner["feature_names"])
      if (v.is_string()) f.feature_names.push_back(v.get<std::string>());
    if (f.feature_names.size() != f.num_features) f.feature_names.clear();
  }

  const json& gb = field(learner, "gradient_booster", lw);
  const std::string gname = field(gb, "name", lw + ".gradient_booster").get<std::string>();
  const json* model = nullptr;
  std::vector<double> weight_drop;
  if (gname == "gbtree") {
    model = &field(gb, "model", lw + ".gradient_booster");
  } else if (gname == "dart") {
    model = &field(field(gb, "gbtree", lw + ".gradient_booster"), "model", lw + ".gbtree");
    for (const auto& w : array_field(gb, "weight_drop", lw + ".gradient_booster", size_t(-1)))
      weight_drop.push_back(as_double(w, lw + ".weight_drop"));
  } else {
    throw Error(ErrorCode::unsupported,
                lw + ": booster '" + gname + "' is not supported (only gbtree and dart)");
  }
  const std::string mw = lw + ".gradient_booster.model";
  const json& trees = array_field(*model, "trees", mw, size_t(-1));
  const json& info = array_field(*model, "tree_info", mw, trees.size());
  slim::check(weight_drop.empty() || weight_drop.size() == trees.size(), ErrorCode::invalid_model,
              mw + ": weight_drop has " + std::to_string(weight_drop.size()) +
                  " entries for " + std::to_string(trees.size()) + " trees");
  f.trees.resize(trees.size());
  for (size_t t = 0; t < trees.size(); ++t) {
    const std::string tw = mw + ".trees[" + std::to_string(t) + "]";
    const int64_t g = as_int(info[t], mw + ".tree_info");
    slim::check(g >= 0 && g < int64_t(f.num_groups), ErrorCode::invalid_model,
                tw + ": tree_info group " + std::to_string(g) + " is not below " +
                    std::to_string(f.num_groups));
    f.trees[t].group = uint32_t(g);
    load_tree(trees[t], tw, f, f.trees[t]);
    if (!weight_drop.empty()) {
      // DART scales each tree's leaves by its weight when predicting.
      const float w = float(weight_drop[t]);
      for (auto& node : f.trees[t].nodes)
        if (node.is_leaf) node.leaf_value = float(node.leaf_value) * w;
    }
  }
  f.validate(name);
  return f;
}

std::string read_whole_file(const std::string& path) {
  auto file = MappedFile::open(path);
  return std::string(file->view());
}

}  // namespace

Forest parse_xgboost_json_text(std::string text, const std::string& name) {
  json doc;
  try {
    doc = json::parse(detail::quote_nonfinite_tokens(text));
  } catch (const json::exception& e) {
    throw Error(ErrorCode::invalid_model, name + ": not valid JSON: " + e.what());
  }
  return forest_from_document(doc, name);
}

Forest load_xgboost_json(const std::string& path) {
  return parse_xgboost_json_text(read_whole_file(path), path);
}

Forest load_xgboost_ubjson(const std::string& path) {
  auto file = MappedFile::open(path);
  json doc;
  try {
    doc = json::from_ubjson(file->data(), file->data() + file->size());
  } catch (const json::exception& e) {
    throw Error(ErrorCode::invalid_model, path + ": not valid UBJSON: " + e.what());
  }
  return forest_from_document(doc, path);
}

Forest load_forest_source(const std::string& path) {
  auto file = MappedFile::open(path);
  const std::string_view v = file->view();
  size_t i = 0;
  while (i < v.size() && (v[i] == ' ' || v[i] == '\n' || v[i] == '\r' || v[i] == '\t')) ++i;
  if (i < v.size() && v[i] == '{') {
    // UBJSON objects open with '{' followed by a length marker for the first key.
    if (i + 1 < v.size() && (v[i + 1] == 'i' || v[i + 1] == 'U' || v[i + 1] == 'I' ||
                             v[i + 1] == 'l' || v[i + 1] == 'L' || v[i + 1] == '$' ||
                             v[i + 1] == '#'))
      return load_xgboost_ubjson(path);
    return load_xgboost_json(path);
  }
  if (v.substr(0, 4) == "tree" || v.find("\nTree=") != std::string_view::npos)
    return parse_lightgbm_text(std::string(v), path);
  throw Error(ErrorCode::invalid_model,
              path + ": not an XGBoost JSON/UBJSON or LightGBM text model");
}

}  // namespace slim::forest
