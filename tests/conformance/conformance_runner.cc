// Conformance runner over the ONNX backend test data (Debian's libonnx-testdata): for
// each case it loads model.onnx, reads test_data_set_*/input_*.pb and output_*.pb, runs
// the model and compares. Each case runs in a forked child so that a crash or a hang is
// reported as that case's failure instead of ending the run.
//
// Output: one line per case ("PASS name", "FAIL name: why", "SKIP name: why"), then
// "N passed, N failed, N skipped". With --must-pass FILE the exit code is 1 when a
// listed case does not pass.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include <CLI/CLI.hpp>

#include "slim/core/convert.h"
#include "slim/core/dispatch.h"
#include "slim/core/progress.h"
#include "slim/onnx/importer.h"
#include "slim/runtime/session.h"

namespace fs = std::filesystem;
using namespace slim;

namespace {

enum class Verdict { pass, fail, skip };

struct Outcome {
  Verdict verdict;
  std::string why;  // for a pass: the nodes each provider ran, "cpu=3 ref=1"
};

struct Tolerance {
  double rtol = 1e-3, atol = 1e-5;
};

// Compares an output with its expected value: exact for integers and bools, within
// tolerance for floats (NaN matches NaN, infinities must match exactly).
std::string compare(const Tensor& got, const Tensor& want, const Tolerance& tol) {
  if (got.dtype() != want.dtype())
    return "dtype " + std::string(dtype_name(got.dtype())) + ", expected " +
           std::string(dtype_name(want.dtype()));
  if (got.shape() != want.shape())
    return "shape " + shape_str(got.shape()) + ", expected " + shape_str(want.shape());
  const Tensor g = got.contiguous(), w = want.contiguous();
  const int64_t n = g.numel();
  std::string err;
  visit_dtype(g.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* a = static_cast<const T*>(g.raw_data());
    const T* b = static_cast<const T*>(w.raw_data());
    for (int64_t i = 0; i < n && err.empty(); ++i) {
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> ||
                    std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
        const double x = double(a[i]), y = double(b[i]);
        if (std::isnan(x) && std::isnan(y)) continue;
        if (std::isinf(y) || std::isinf(x)) {
          if (x == y) continue;
        } else if (std::fabs(x - y) <= tol.atol + tol.rtol * std::fabs(y)) {
          continue;
        }
        std::ostringstream os;
        os << "element " << i << ": got " << x << ", expected " << y;
        err = os.str();
      } else {
        if (a[i] == b[i]) continue;
        std::ostringstream os;
        os << "element " << i << ": got " << double(a[i]) << ", expected " << double(b[i]);
        err = os.str();
      }
    }
  });
  return err;
}

// The Bernoulli cases expect values that continue the data generator's numpy random
// stream (seeded once per test, the inputs drawn first), which no implementation of the
// op can reproduce; the spec leaves the draws to the implementation. Their outputs are
// checked for dtype, shape and every value being 0 or 1.
bool random_output_case(const fs::path& dir) { return dir.filename().string().rfind("test_bernoulli", 0) == 0; }

std::string compare_random_bits(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape())
    return "got " + got.describe() + ", expected " + want.describe();
  const std::vector<double> v = tensor_to_doubles(got);
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != 0 && v[i] != 1) return "element " + std::to_string(i) + " is " + std::to_string(v[i]) + ", not 0 or 1";
  return "";
}

// onnx 1.12's backend data stores bfloat16 tensors with data_type UINT16 (same bits).
// Reinterpret them when the model says bf16, so those cases test the kernels, not the quirk.
Tensor bf16_if_stored_as_u16(const Tensor& t, DType wanted) {
  if (wanted != DType::bf16 || t.dtype() != DType::u16) return t;
  const Tensor c = t.contiguous();
  return Tensor::borrow(DType::bf16, c.shape(), c.raw_data(), c.storage());
}

// Sequences and optionals compare item by item.
std::string compare(const Value& got, const Value& want, const Tolerance& tol) {
  if (got.kind() != want.kind() || got.has_element() != want.has_element())
    return "got " + got.describe() + ", expected " + want.describe();
  if (want.is_tensor())
    return compare(got.tensor(), bf16_if_stored_as_u16(want.tensor(), got.tensor().dtype()), tol);
  if (want.is_optional()) return want.has_element() ? compare(got.element(), want.element(), tol) : "";
  if (got.items().size() != want.items().size())
    return "got " + got.describe() + ", expected " + want.describe();
  for (size_t i = 0; i < want.items().size(); ++i) {
    const std::string diff = compare(Value(got.items()[i]), Value(want.items()[i]), tol);
    if (!diff.empty()) return "item " + std::to_string(i) + ": " + diff;
  }
  return "";
}

std::vector<fs::path> sorted_files(const fs::path& dir, const std::string& prefix) {
  std::vector<std::pair<int, fs::path>> found;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && e.path().extension() == ".pb")
      found.emplace_back(std::stoi(name.substr(prefix.size())), e.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

Outcome run_case(const fs::path& dir, const SessionOptions& options, const Tolerance& tol) {
  Model model;
  try {
    model = OnnxImporter::load_file((dir / "model.onnx").string());
  } catch (const Error& e) {
    if (e.code() == ErrorCode::unsupported) return {Verdict::skip, e.what()};
    return {Verdict::fail, std::string("load: ") + e.what()};
  }
  std::unique_ptr<Session> session;
  try {
    session = Session::compile(model, options);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::unsupported) return {Verdict::skip, e.what()};
    return {Verdict::fail, std::string("compile: ") + e.what()};
  }
  // Which provider ran how many nodes: shows that a pass with "cpu,ref" exercised cpu.
  std::map<std::string, int> per_provider;
  for (const auto& a : session->partition()) ++per_provider[a.provider];
  std::string ran;
  for (const auto& [p, n] : per_provider) ran += (ran.empty() ? "" : " ") + p + "=" + std::to_string(n);
  std::vector<fs::path> sets;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0)
      sets.push_back(e.path());
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) return {Verdict::skip, "no test data set"};
  for (const auto& set : sets) {
    // Files hold TensorProtos, or Sequence/OptionalProtos where the model's value is one.
    ValueMap inputs;
    const auto input_files = sorted_files(set, "input_");
    const auto& graph_inputs = session->inputs();
    if (input_files.size() > graph_inputs.size())
      return {Verdict::fail, set.filename().string() + ": more input files than model inputs"};
    for (size_t i = 0; i < input_files.size(); ++i) {
      try {
        Value v = read_value_pb(input_files[i].string(), graph_inputs[i].onnx_type);
        if (v.is_tensor())
          v = bf16_if_stored_as_u16(v.tensor(), graph_inputs[i].dtype.value_or(v.tensor().dtype()));
        inputs[graph_inputs[i].name] = std::move(v);
      } catch (const Error& e) {
        return {Verdict::skip, std::string("input is not a supported value: ") + e.what()};
      }
    }
    const auto& graph_outputs = session->outputs();
    std::vector<Value> expected;
    for (const auto& f : sorted_files(set, "output_")) {
      try {
        const size_t i = expected.size();
        expected.push_back(read_value_pb(f.string(), i < graph_outputs.size() ? graph_outputs[i].onnx_type : ""));
      } catch (const Error& e) {
        return {Verdict::skip, std::string("output is not a supported value: ") + e.what()};
      }
    }
    ValueMap outputs;
    try {
      outputs = session->run_values(inputs);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::unsupported) return {Verdict::skip, e.what()};
      return {Verdict::fail, std::string("run: ") + e.what()};
    }
    if (expected.size() != graph_outputs.size())
      return {Verdict::fail, "model has " + std::to_string(graph_outputs.size()) + " outputs, data set has " +
                                 std::to_string(expected.size())};
    for (size_t i = 0; i < expected.size(); ++i) {
      const std::string& name = graph_outputs[i].name;
      auto it = outputs.find(name);
      if (it == outputs.end()) return {Verdict::fail, "output '" + name + "' missing"};
      const std::string diff = random_output_case(dir) && it->second.is_tensor() && expected[i].is_tensor()
                                   ? compare_random_bits(it->second.tensor(), expected[i].tensor())
                                   : compare(it->second, expected[i], tol);
      if (!diff.empty()) return {Verdict::fail, "output '" + name + "': " + diff};
    }
  }
  return {Verdict::pass, ran};
}

// Runs one case in a child process; the verdict comes back through shared memory.
Outcome run_isolated(const fs::path& dir, const SessionOptions& options, const Tolerance& tol,
                     int timeout_s) {
  constexpr size_t kMsg = 4096;
  void* shm = mmap(nullptr, kMsg, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shm == MAP_FAILED) return run_case(dir, options, tol);
  auto* buf = static_cast<char*>(shm);
  std::memset(buf, 0, kMsg);
  std::cout.flush();
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(unsigned(timeout_s));
    Outcome o;
    try {
      o = run_case(dir, options, tol);
    } catch (const std::exception& e) {
      o = {Verdict::fail, std::string("exception: ") + e.what()};
    }
    buf[0] = char('0' + int(o.verdict));
    std::strncpy(buf + 1, o.why.c_str(), kMsg - 2);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  Outcome o;
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    o = {Verdict::fail, sig == SIGALRM ? "timeout after " + std::to_string(timeout_s) + " s"
                                       : "CRASH: signal " + std::to_string(sig) + " (" + strsignal(sig) + ")"};
  } else if (buf[0] < '0' || buf[0] > '2') {
    o = {Verdict::fail, "CRASH: child exited with status " + std::to_string(WEXITSTATUS(status))};
  } else {
    o = {Verdict(buf[0] - '0'), std::string(buf + 1)};
  }
  munmap(shm, kMsg);
  return o;
}

std::set<std::string> read_list(const std::string& path) {
  std::set<std::string> names;
  std::ifstream f(path);
  if (!f) throw Error(ErrorCode::not_found, path + ": cannot open");
  std::string line;
  while (std::getline(f, line)) {
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    line.erase(line.find_last_not_of(" \t\r") + 1);
    line.erase(0, line.find_first_not_of(" \t"));
    if (!line.empty()) names.insert(line);
  }
  return names;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Runs the ONNX backend test cases and compares slim's outputs with the expected ones."};
  std::string data_dir = "/usr/share/libonnx-testdata/data";
  std::vector<std::string> suites = {"node", "pytorch-converted", "pytorch-operator", "simple"};
  std::string filter, must_pass, write_passing, providers = "ref";
  int timeout_s = 60;
  bool isolate = true, quiet = false;
  double rtol = 1e-3, atol = 1e-5;
  app.add_option("--data", data_dir, "Root of the backend test data")->capture_default_str();
  app.add_option("--suites", suites, "Suites to run")->delimiter(',')->capture_default_str();
  app.add_option("--filter", filter, "Run only cases whose suite/name contains this text");
  app.add_option("--providers", providers, "Providers in priority order, comma-separated")->capture_default_str();
  app.add_option("--must-pass", must_pass, "File listing suite/case names that must pass (exit 1 otherwise)");
  app.add_option("--write-passing", write_passing, "Write the names of the passing cases to this file");
  app.add_option("--timeout", timeout_s, "Seconds per case before it counts as hung")->capture_default_str();
  app.add_option("--rtol", rtol, "Relative tolerance for floats")->capture_default_str();
  app.add_option("--atol", atol, "Absolute tolerance for floats")->capture_default_str();
  app.add_flag("!--no-isolate", isolate, "Run cases in this process instead of one child per case");
  app.add_flag("--quiet", quiet, "Print only failures and the closing line");
  CLI11_PARSE(app, argc, argv);

  SessionOptions options;
  options.num_threads = 1;
  options.providers.clear();
  std::stringstream ps(providers);
  for (std::string p; std::getline(ps, p, ',');) options.providers.push_back(p);
  const Tolerance tol{rtol, atol};

  std::vector<std::string> cases;
  for (const auto& suite : suites) {
    const fs::path d = fs::path(data_dir) / suite;
    if (!fs::is_directory(d)) {
      std::cerr << "conformance: no suite at " << d << "\n";
      return 2;
    }
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(d))
      if (e.is_directory() && fs::exists(e.path() / "model.onnx"))
        names.push_back(suite + "/" + e.path().filename().string());
    std::sort(names.begin(), names.end());
    for (auto& n : names)
      if (filter.empty() || n.find(filter) != std::string::npos) cases.push_back(n);
  }

  std::set<std::string> required;
  if (!must_pass.empty()) required = read_list(must_pass);

  int passed = 0, failed = 0, skipped = 0;
  std::map<std::string, int64_t> nodes_by_provider, cases_by_provider;
  std::vector<std::string> passing, regressions;
  Progress progress("conformance", int64_t(cases.size()));
  for (size_t i = 0; i < cases.size(); ++i) {
    const fs::path dir = fs::path(data_dir) / cases[i];
    progress.update(int64_t(i), cases[i]);
    const Outcome o = isolate ? run_isolated(dir, options, tol, timeout_s) : run_case(dir, options, tol);
    std::string line;
    switch (o.verdict) {
      case Verdict::pass:
        ++passed;
        passing.push_back(cases[i]);
        if (!quiet) line = "PASS " + cases[i] + (options.providers.size() > 1 ? "  [" + o.why + "]" : "");
        {
          std::stringstream ran(o.why);
          for (std::string item; ran >> item;) {
            const auto eq = item.find('=');
            if (eq == std::string::npos) continue;
            nodes_by_provider[item.substr(0, eq)] += std::stoll(item.substr(eq + 1));
            ++cases_by_provider[item.substr(0, eq)];
          }
        }
        break;
      case Verdict::fail:
        ++failed;
        line = "FAIL " + cases[i] + ": " + o.why;
        break;
      case Verdict::skip:
        ++skipped;
        if (!quiet) line = "SKIP " + cases[i] + ": " + o.why;
        break;
    }
    if (o.verdict != Verdict::pass && required.count(cases[i])) regressions.push_back(cases[i]);
    if (!line.empty()) {
      progress.clear_line();
      std::cout << line.substr(0, 400) << "\n";
    }
  }
  progress.finish();
  if (!write_passing.empty()) {
    std::ofstream f(write_passing);
    f << "# ONNX backend test cases that must pass with providers " << providers
      << " (regenerate with\n# slim_conformance --providers " << providers
      << " --write-passing FILE). One suite/case per line.\n";
    for (const auto& p : passing) f << p << "\n";
  }
  for (const auto& r : required)
    if (std::find(cases.begin(), cases.end(), r) == cases.end() && filter.empty())
      regressions.push_back(r + " (case not found)");
  if (!regressions.empty()) {
    std::cout << "\nmust-pass cases that did not pass (" << regressions.size() << "):\n";
    for (const auto& r : regressions) std::cout << "  " << r << "\n";
  }
  if (options.providers.size() > 1) {
    std::cout << "nodes run in passing cases:";
    for (const auto& [p, n] : nodes_by_provider)
      std::cout << " " << p << " " << n << " (in " << cases_by_provider[p] << " cases)";
    std::cout << "\n";
  }
  std::cout << passed << " passed, " << failed << " failed, " << skipped << " skipped\n";
  return regressions.empty() ? 0 : 1;
}
