// Fixture access for the llm tests: tests/fixtures/make_gguf.py is run once per build
// tree (atomically, so parallel test processes share one copy); its NumPy references, and
// rewritten copies of its files for load-time validation.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <utility>

#include "slim/core/npy.h"
#include "slim/llm/gguf.h"
#include "slim/llm/model.h"

namespace slim::llm::testing {

inline std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

inline std::string tmp_dir() {
  const std::string d = env_or("SLIM_TEST_TMP", "/tmp/slim_test_tmp");
  std::filesystem::create_directories(d);
  return d;
}

// The source tree: $SLIM_SOURCE_DIR, else the CMAKE_HOME_DIRECTORY of the CMakeCache.txt
// above the test binary (ctest does not always pass every variable of a test's ENVIRONMENT).
inline std::string source_dir() {
  if (const char* v = std::getenv("SLIM_SOURCE_DIR"); v && *v) return v;
  namespace fs = std::filesystem;
  for (fs::path d = fs::canonical("/proc/self/exe").parent_path(); !d.empty() && d != d.root_path();
       d = d.parent_path()) {
    std::ifstream cache(d / "CMakeCache.txt");
    for (std::string line; std::getline(cache, line);)
      if (line.rfind("CMAKE_HOME_DIRECTORY:INTERNAL=", 0) == 0) return line.substr(line.find('=') + 1);
  }
  return ".";
}

// Directory with the generated GGUF fixtures and their NumPy references.
inline const std::string& fixture_dir() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    const std::string src = source_dir();
    const std::string script = src + "/tests/fixtures/make_gguf.py";
    const std::string stamp = std::to_string(fs::last_write_time(script).time_since_epoch().count());
    const std::string out = tmp_dir() + "/llm_fixtures_" + stamp;
    if (!fs::exists(out + "/done")) {
      const std::string staging = out + ".tmp" + std::to_string(::getpid());
      const std::string cmd = "/usr/bin/python3 '" + script + "' '" + staging + "' && touch '" + staging + "/done'";
      if (std::system(cmd.c_str()) != 0) throw std::runtime_error("fixture script failed: " + cmd);
      std::error_code ec;
      fs::rename(staging, out, ec);
      if (ec) fs::remove_all(staging);  // another process won the race
    }
    return out;
  }();
  return dir;
}

inline std::string fixture(const std::string& name) { return fixture_dir() + "/" + name; }

struct Reference {
  std::vector<int32_t> tokens;
  Tensor exact, emulated;
};

inline Reference load_reference(const std::string& name) {
  Reference r;
  Tensor t = read_npy(fixture(name + ".tokens.npy"));
  r.tokens.assign(t.data<int32_t>(), t.data<int32_t>() + t.numel());
  r.exact = read_npy(fixture(name + ".logits.npy"));
  r.emulated = read_npy(fixture(name + ".emul.npy"));
  return r;
}

// Logits of every prompt token, evaluated in one batch.
inline std::vector<float> run_all(const std::string& name, const std::vector<int32_t>& tokens, ContextOptions o) {
  auto model = LlamaModel::load(fixture(name + ".gguf"));
  o.all_logits = true;
  LlamaContext ctx(model, o);
  ctx.eval(tokens);
  const int nv = model->config().n_vocab;
  std::vector<float> out(tokens.size() * size_t(nv));
  for (size_t i = 0; i < tokens.size(); ++i) std::memcpy(&out[i * nv], ctx.logits(int(i)), size_t(nv) * 4);
  return out;
}

// max |a - b| / max |b|: the error relative to the logits' scale.
inline double rel_error(const std::vector<float>& a, const Tensor& b) {
  const float* r = b.data<float>();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(double(a[i]) - r[i]));
    den = std::max(den, std::fabs(double(r[i])));
  }
  return num / den;
}

inline ContextOptions exact_options() {
  ContextOptions o;
  o.f16_kv = false;
  o.n_threads = 2;
  return o;
}

// Rewrites a fixture into tmp_dir()/llm_<label>.gguf, to check load-time validation:
// `metadata` may override keys after they are copied; `tensor` is dropped, or has the dims
// of `swap` exchanged when given.
inline std::string rewrite_fixture(const std::string& src_name, const std::string& label,
                                   const std::function<void(GgufWriter&)>& metadata, const std::string& tensor = "",
                                   std::pair<int, int> swap = {-1, -1}) {
  auto g = GgufFile::open(fixture(src_name + ".gguf"));
  GgufWriter w;
  for (const auto& k : g->metadata_order()) w.copy_value(k, *g, g->metadata().at(k));
  if (metadata) metadata(w);
  for (const auto& t : g->tensors()) {
    if (t.name == tensor && swap.first < 0) continue;
    std::vector<int64_t> dims = t.dims;
    const uint8_t* p = g->tensor_data(t);
    if (t.name == tensor) std::swap(dims[size_t(swap.first)], dims[size_t(swap.second)]);
    w.add_tensor(t.name, t.type(), dims, std::vector<uint8_t>(p, p + t.size));
  }
  const std::string out = tmp_dir() + "/llm_" + label + ".gguf";
  w.write(out);
  return out;
}

// A fixture with one tensor dropped, or with its first two dims exchanged.
inline std::string rewrite_without(const std::string& src_name, const std::string& drop, bool reshape) {
  return rewrite_fixture(src_name, drop + (reshape ? "_reshaped" : "_dropped"), {}, drop,
                         reshape ? std::pair{0, 1} : std::pair{-1, -1});
}

}  // namespace slim::llm::testing
