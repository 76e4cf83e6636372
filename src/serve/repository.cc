#include "slim/serve/repository.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "slim/forest/forest_model.h"
#include "slim/forest/slimf.h"
#include "slim/llm/kv_policy.h"
#include "slim/runtime/session_model.h"

namespace slim::serve {
namespace fs = std::filesystem;
namespace {

// Model file names looked for in a version folder, in order (Triton's FIL backend names too).
const char* const kModelFiles[] = {"model.onnx", "model.slimf", "model.json", "model.ubj", "model.txt",
                                   "xgboost.json", "xgboost.ubj", "lightgbm.txt"};

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  check(bool(in), ErrorCode::not_found, "cannot read " + p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool is_version_name(const std::string& s) {
  return !s.empty() && s.size() < 18 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string dims_str(const Shape& s) { return shape_str(s); }

// The served form of one tensor: the config's view checked against the model's own spec.
ServedTensor reconcile(const TensorConfig& cfg, const TensorSpec& model, bool batching, const std::string& what,
                       const std::string& origin) {
  const std::string where = origin + ": " + what + " '" + cfg.name + "'";
  check(cfg.dtype == model.dtype, ErrorCode::invalid_model,
        where + " is " + triton_dtype_name(cfg.dtype) + " in the config but " + triton_dtype_name(model.dtype) +
            " in the model");
  ServedTensor st;
  st.spec.name = cfg.name;
  st.spec.dtype = cfg.dtype;
  st.sample_dims = cfg.dims;
  if (model.rank_known) {
    Shape msd = model.shape;
    if (batching) {
      check(!msd.empty() && msd[0] < 0, ErrorCode::invalid_model,
            where + ": max_batch_size > 0 needs a free first dimension, but the model's shape is " + dims_str(msd));
      msd.erase(msd.begin());
    }
    if (msd.size() == cfg.dims.size()) {
      for (size_t i = 0; i < msd.size(); ++i) {
        check(msd[i] < 0 || cfg.dims[i] < 0 || msd[i] == cfg.dims[i], ErrorCode::invalid_model,
              where + ": config dims " + dims_str(cfg.dims) + " contradict the model's " + dims_str(msd));
        if (st.sample_dims[i] < 0) st.sample_dims[i] = msd[i];
      }
    } else {
      const bool fixed = std::all_of(msd.begin(), msd.end(), [](int64_t d) { return d >= 0; }) &&
                         std::all_of(cfg.dims.begin(), cfg.dims.end(), [](int64_t d) { return d >= 0; });
      check(fixed && shape_numel(msd) == shape_numel(cfg.dims), ErrorCode::invalid_model,
            where + ": config dims " + dims_str(cfg.dims) + " do not match the model's " + dims_str(msd) +
                " (a different rank needs fixed dims with the same element count)");
      st.model_sample_dims = msd;
    }
  }
  st.spec.shape = st.sample_dims;
  if (batching) st.spec.shape.insert(st.spec.shape.begin(), -1);
  return st;
}

// A config tensor list read off the model (Triton's auto-complete) when the config has none.
std::vector<TensorConfig> from_model(const std::vector<TensorSpec>& specs, bool batching, const std::string& what,
                                     const std::string& origin) {
  std::vector<TensorConfig> out;
  for (const TensorSpec& s : specs) {
    check(s.rank_known, ErrorCode::invalid_model,
          origin + ": the model does not declare the shape of " + what + " '" + s.name + "'; list it in the config");
    TensorConfig c;
    c.name = s.name;
    c.dtype = s.dtype;
    c.dims = s.shape;
    if (batching && !c.dims.empty()) c.dims.erase(c.dims.begin());
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<ServedTensor> reconcile_all(std::vector<TensorConfig>& cfgs, const std::vector<TensorSpec>& specs,
                                        bool batching, bool require_all, const std::string& what,
                                        const std::string& origin) {
  if (cfgs.empty()) cfgs = from_model(specs, batching, what, origin);
  std::vector<ServedTensor> out;
  std::string names;
  for (const TensorSpec& s : specs) names += (names.empty() ? "" : ", ") + s.name;
  for (const TensorConfig& c : cfgs) {
    auto it = std::find_if(specs.begin(), specs.end(), [&](const TensorSpec& s) { return s.name == c.name; });
    check(it != specs.end(), ErrorCode::invalid_model,
          origin + ": config " + what + " '" + c.name + "' is not an " + what + " of the model (its " + what +
              "s: " + names + ")");
    out.push_back(reconcile(c, *it, batching, what, origin));
  }
  if (require_all)
    for (const TensorSpec& s : specs)
      check(std::any_of(cfgs.begin(), cfgs.end(), [&](const TensorConfig& c) { return c.name == s.name; }),
            ErrorCode::invalid_model, origin + ": model " + what + " '" + s.name + "' is missing from the config");
  return out;
}

BatchPolicy batch_policy(const ModelConfig& c, int64_t max_queue_size) {
  BatchPolicy p;
  p.max_batch_size = c.max_batch_size;
  p.max_queue_size = max_queue_size;
  if (c.dynamic_batching && c.max_batch_size > 0) {
    const DynamicBatchingConfig& d = *c.dynamic_batching;
    p.dynamic = true;
    p.preferred_batch_size = d.preferred_batch_size;
    p.max_queue_delay_us = d.max_queue_delay_microseconds;
    p.levels = std::max<uint32_t>(1, d.priority_levels);
    p.default_level = d.priority_levels > 0 ? d.default_priority_level : 1;
    for (uint32_t l = 1; l <= p.levels; ++l) {
      auto it = d.priority_queue_policy.find(l);
      p.queue_policy.push_back(it != d.priority_queue_policy.end() ? it->second : d.default_queue_policy);
    }
  } else {
    p.queue_policy.push_back(QueuePolicy{});
  }
  return p;
}

// A language model's options: the server's, overridden by its config's parameters.
LlmOptions llm_options(LlmOptions o, const ModelConfig& cfg, const fs::path& dir, const std::string& origin) {
  for (const auto& [key, value] : cfg.parameters) {
    if (key == "variants") continue;  // the repository's
    const std::string where = origin + ": parameter '" + key + "'";
    auto number = [&](int64_t lo, int64_t hi) {
      int64_t v = 0;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      check(ec == std::errc() && end == value.data() + value.size() && v >= lo && v <= hi, ErrorCode::invalid_model,
            where + " must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi) + ", not '" +
                value + "'");
      return v;
    };
    try {
      if (key == "max_sequences") {
        o.max_sequences = int(number(1, 256));
      } else if (key == "cache_sequences") {
        o.cache_sequences = int(number(-1, 1024));
      } else if (key == "context_length") {
        o.n_ctx = int(number(0, 1 << 20));
      } else if (key == "kv_type") {
        llm::parse_kv_type(value);
        o.kv_type = value;
      } else if (key == "kv_policy") {
        llm::make_kv_policy(value, llm::KvBudget{});  // a name it knows
        o.kv_policy = value;
      } else if (key == "kv_budget") {
        llm::KvBudget::parse(value);
        o.kv_budget = value;
      } else if (key == "kv_pool_mb") {
        o.kv_pool_bytes = number(0, int64_t(1) << 20) << 20;
      } else if (key == "prefill_chunk") {
        o.prefill_chunk = int(number(1, 65536));
      } else if (key == "default_priority") {
        o.default_priority = int(number(-1000, 1000));
      } else if (key == "max_queue") {
        o.max_queue = int(number(1, 1 << 20));
      } else if (key == "chat_template") {
        o.chat_template = read_text(dir / value);
      } else {
        throw Error(ErrorCode::invalid_model,
                    where + " is not a language-model option (max_sequences, cache_sequences, context_length, "
                            "kv_type, kv_policy, kv_budget, kv_pool_mb, prefill_chunk, default_priority, max_queue, "
                            "chat_template)");
      }
    } catch (const Error& e) {
      if (std::string(e.what()).rfind(where, 0) == 0) throw;
      throw Error(ErrorCode::invalid_model, where + ": " + e.what());
    }
  }
  return o;
}

// The `variants` parameter: file names separated by commas, each a plain name in the version folder.
std::vector<std::string> parse_variants(const std::string& value, const std::string& origin) {
  std::vector<std::string> out;
  std::istringstream in(value);
  for (std::string f; std::getline(in, f, ',');) {
    f.erase(0, f.find_first_not_of(" \t"));
    f.erase(f.find_last_not_of(" \t") + 1);
    check(!f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos && f != "model.sig",
          ErrorCode::invalid_model,
          origin + ": parameter 'variants' must list model file names of the version folder, separated by commas, not '" +
              value + "'");
    check(std::find(out.begin(), out.end(), f) == out.end(), ErrorCode::invalid_model,
          origin + ": parameter 'variants' lists '" + f + "' twice");
    out.push_back(f);
  }
  check(!out.empty(), ErrorCode::invalid_model, origin + ": parameter 'variants' is empty");
  return out;
}

}  // namespace

LoadedModel::~LoadedModel() {
  for (auto& [v, lv] : versions)
    if (lv->batcher) lv->batcher->stop(true);
}

std::vector<std::shared_ptr<TensorModel>> load_model_file(const std::string& path, int instances, int threads,
                                                          int64_t batch_sizes, int64_t* memory_bytes,
                                                          std::string* platform) {
  const std::string ext = fs::path(path).extension().string();
  std::vector<std::shared_ptr<TensorModel>> out;
  *memory_bytes = 0;
  if (ext == ".onnx") {
    *platform = "onnxruntime_onnx";
    SessionOptions opt;
    opt.num_threads = threads;
    // A session compiles a plan per input shape it sees twice and keeps the last few; the
    // batcher pads its batches to `batch_sizes` sizes (batch_ladder), which would evict
    // each other with fewer plans and run on the generic plan (reference kernels).
    opt.shape_specializations = int(std::max<int64_t>(opt.shape_specializations, batch_sizes));
    for (int i = 0; i < instances; ++i) {
      auto model = std::make_shared<SessionModel>(Session::load(path, opt));
      *memory_bytes += int64_t(fs::file_size(path)) + model->session().stats().memory.planned_bytes;
      out.push_back(std::move(model));
    }
    return out;
  }
  *platform = "slim_forest";
  // A compiled forest is read-only and safe to call from several executors at once.
  auto model = std::make_shared<forest::ForestModel>(forest::load_compiled_forest(path));
  *memory_bytes = int64_t(model->forest().payload_size());
  out.assign(size_t(instances), model);
  return out;
}

Repository::Repository(std::string root) : root_(std::move(root)) {
  check(fs::is_directory(root_), ErrorCode::not_found, "model repository '" + root_ + "' is not a folder");
}

std::vector<std::string> Repository::model_names() const {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root_)) {
    if (!e.is_directory()) continue;
    bool model = fs::exists(e.path() / "config.pbtxt") || fs::exists(e.path() / "config.json");
    for (const auto& v : fs::directory_iterator(e.path()))
      model = model || (v.is_directory() && is_version_name(v.path().filename().string()));
    if (model) names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::shared_ptr<LoadedModel> Repository::load(const std::string& name, const LoadOptions& options,
                                              std::vector<std::string>* warnings) const {
  check(!name.empty() && name.find('/') == std::string::npos && name != "." && name != "..",
        ErrorCode::invalid_argument, "'" + name + "' is not a model name");
  check(options.metrics != nullptr, ErrorCode::internal, "Repository::load needs a metrics registry");
  const fs::path dir = fs::path(root_) / name;
  check(fs::is_directory(dir), ErrorCode::not_found, "no model '" + name + "' in repository " + root_);

  auto m = std::make_shared<LoadedModel>();
  m->name = name;
  std::string origin;
  if (fs::exists(dir / "config.pbtxt")) {
    origin = (dir / "config.pbtxt").string();
    m->config = parse_model_config_pbtxt(read_text(dir / "config.pbtxt"), origin);
  } else if (fs::exists(dir / "config.json")) {
    origin = (dir / "config.json").string();
    m->config = parse_model_config_json(read_text(dir / "config.json"), origin);
  } else {
    origin = dir.string();
    warnings->push_back(origin + ": no config.pbtxt or config.json; inputs and outputs are read off the model, "
                                 "which is served without batching");
  }
  ModelConfig& cfg = m->config;
  for (const std::string& w : cfg.warnings) warnings->push_back(w);
  check(cfg.name.empty() || cfg.name == name, ErrorCode::invalid_model,
        origin + ": name '" + cfg.name + "' differs from the model's folder name '" + name + "'");
  cfg.name = name;

  // Versions on disk, newest first, then the ones the policy serves.
  std::vector<int64_t> on_disk;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && is_version_name(e.path().filename().string()))
      on_disk.push_back(std::stoll(e.path().filename().string()));
  std::sort(on_disk.rbegin(), on_disk.rend());
  check(!on_disk.empty(), ErrorCode::invalid_model, dir.string() + ": no version folder (1/, 2/, ...)");
  std::vector<int64_t> serve;
  switch (cfg.version_policy.kind) {
    case VersionPolicy::Kind::latest:
      serve.assign(on_disk.begin(),
                   on_disk.begin() + std::min<size_t>(on_disk.size(), cfg.version_policy.latest_num_versions));
      break;
    case VersionPolicy::Kind::all: serve = on_disk; break;
    case VersionPolicy::Kind::specific:
      for (int64_t v : cfg.version_policy.specific_versions) {
        check(std::find(on_disk.begin(), on_disk.end(), v) != on_disk.end(), ErrorCode::invalid_model,
              origin + ": version_policy names version " + std::to_string(v) + ", which has no folder");
        serve.push_back(v);
      }
      std::sort(serve.rbegin(), serve.rend());
      break;
  }

  m->policy = batch_policy(cfg, options.max_queue_size);
  std::string filename = cfg.default_model_filename;
  if (auto it = cfg.parameters.find("variants"); it != cfg.parameters.end()) {
    m->variants = parse_variants(it->second, origin);
    for (const std::string& f : m->variants) {
      int64_t bytes = 0;
      for (int64_t v : serve) {
        const fs::path file = dir / std::to_string(v) / f;
        check(fs::is_regular_file(file), ErrorCode::invalid_model,
              origin + ": variant '" + f + "' (parameter 'variants') is not in " + file.parent_path().string());
        bytes += int64_t(fs::file_size(file));
      }
      check(bytes > 0, ErrorCode::invalid_model, origin + ": variant '" + f + "' is empty");
      if (!m->variant_bytes.empty() && bytes >= m->variant_bytes.back())
        throw Error(ErrorCode::invalid_model,
                    origin + ": parameter 'variants' lists the largest first, but '" + f + "' (" +
                        std::to_string(bytes) + " bytes) is not smaller than '" +
                        m->variants[m->variant_bytes.size() - 1] + "' (" + std::to_string(m->variant_bytes.back()) +
                        " bytes)");
      m->variant_bytes.push_back(bytes);
    }
    const auto gguf = [](const std::string& f) { return fs::path(f).extension() == ".gguf"; };
    check(std::all_of(m->variants.begin(), m->variants.end(), gguf) || std::none_of(m->variants.begin(), m->variants.end(), gguf),
          ErrorCode::invalid_model, origin + ": parameter 'variants' mixes language models (.gguf) with other models");
    if (options.choose_variant) m->variant = std::min(options.choose_variant(m->variant_bytes), m->variants.size() - 1);
    filename = m->variants[m->variant];
  }
  const bool language = fs::exists(dir / std::to_string(serve.front()) / (filename.empty() ? "model.gguf" : filename)) &&
                        fs::path(filename.empty() ? "model.gguf" : filename).extension() == ".gguf";
  for (const auto& [key, value] : cfg.parameters)
    if (key.rfind("canary_", 0) != 0 && key != "variants" && !language)
      warnings->push_back(origin + ": parameter '" + key + "' is read by language models only; ignored");
  if (language) {
    const fs::path gguf = dir / std::to_string(serve.front()) / (filename.empty() ? "model.gguf" : filename);
    // A language model: one version (the newest the policy serves), no tensors, no batcher
    // (its scheduler batches tokens).
    check(cfg.inputs.empty() && cfg.outputs.empty() && cfg.max_batch_size == 0, ErrorCode::invalid_model,
          origin + ": a language model (" + gguf.string() + ") has no inputs, outputs or max_batch_size to configure");
    auto lv = std::make_shared<LoadedVersion>();
    lv->version = serve.front();
    lv->name = std::to_string(serve.front());
    lv->dir = gguf.parent_path().string();
    if (options.hash_versions || !options.trusted_keys.empty())
      lv->verified = verify_version(lv->dir, options.trusted_keys);  // before a byte of it is parsed
    lv->llm = std::make_shared<LlmService>(name, gguf.string(), llm_options(options.llm, cfg, dir, origin),
                                           options.metrics, options.energy, lv->name);
    lv->memory_bytes = int64_t(fs::file_size(gguf));
    m->platform = "slim_llm";
    m->versions[lv->version] = std::move(lv);
    return m;
  }
  const bool batching = cfg.max_batch_size > 0;
  for (int64_t v : serve) {
    const fs::path vdir = dir / std::to_string(v);
    fs::path file;
    if (!filename.empty()) {
      file = vdir / filename;
      check(fs::exists(file), ErrorCode::invalid_model,
            origin + ": default_model_filename '" + filename + "' is not in " + vdir.string());
    } else {
      for (const char* f : kModelFiles)
        if (file.empty() && fs::exists(vdir / f)) file = vdir / f;
      check(!file.empty(), ErrorCode::invalid_model,
            vdir.string() + ": no model file (model.onnx, model.slimf, model.json, model.ubj, model.txt)");
    }
    auto lv = std::make_shared<LoadedVersion>();
    lv->version = v;
    lv->name = std::to_string(v);
    lv->dir = vdir.string();
    if (options.hash_versions || !options.trusted_keys.empty())
      lv->verified = verify_version(lv->dir, options.trusted_keys);  // before a byte of it is parsed
    std::string platform;
    const std::vector<int64_t> ladder =
        batch_ladder(cfg.max_batch_size, cfg.dynamic_batching ? cfg.dynamic_batching->preferred_batch_size
                                                              : std::vector<int64_t>{});
    auto instances = load_model_file(file.string(), int(cfg.instance_count), options.threads,
                                     int64_t(ladder.size()), &lv->memory_bytes, &platform);
    if (m->versions.empty()) {  // the newest version fixes the served signature; the others must agree
      m->platform = platform;
      // ONNX sessions compile a plan per batch size: keep the sizes few. Forests take any.
      if (batching && platform == "onnxruntime_onnx") m->policy.padded_sizes = ladder;
      m->inputs = reconcile_all(cfg.inputs, instances[0]->input_specs(), batching, true, "input", file.string());
      m->outputs = reconcile_all(cfg.outputs, instances[0]->output_specs(), batching, false, "output", file.string());
    } else {
      reconcile_all(cfg.inputs, instances[0]->input_specs(), batching, true, "input", file.string());
      reconcile_all(cfg.outputs, instances[0]->output_specs(), batching, false, "output", file.string());
    }
    {
      options.metrics->gauge("slim_model_memory_bytes", "Bytes of a loaded model version: weights and planned buffers.",
                             {{"model", name}, {"version", lv->name}})
          .set(double(lv->memory_bytes));
    }
    lv->batcher = std::make_unique<DynamicBatcher>(name, lv->name, m->policy, std::move(instances),
                                                   ModelStats::create(*options.metrics, name, lv->name, m->policy,
                                                                      options.energy));
    m->versions[v] = std::move(lv);
  }
  return m;
}

}  // namespace slim::serve
