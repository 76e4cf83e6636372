// Runs seeded mutations of valid models (bit flips, truncations, overwritten and inserted
// bytes, splices, pure noise) through the importer: each must load or throw slim::Error.
// Any other exception fails the test; a crash or hang fails the whole binary.
#include <iostream>
#include <random>

#include "onnx/onnx_test_util.h"

using namespace slim;
using namespace slim::test;
using TP = onnx::TensorProto;

namespace {

// Seeds that reach most of the importer: every tensor encoding, Constant nodes,
// subgraphs with outer-scope reads, sparse tensors, symbolic dims, external data refs.
std::vector<std::string> seed_models() {
  std::vector<std::string> seeds;
  {
    auto m = make_model();
    auto* g = m.mutable_graph();
    auto* x = add_input(g, "x", {});
    auto* shape = x->mutable_type()->mutable_tensor_type()->mutable_shape();
    shape->add_dim()->set_dim_param("batch");
    shape->add_dim()->set_dim_value(4);
    add_initializer(g, "w", {4}, {1, 2, 3, 4});
    auto* r = g->add_initializer();
    r->set_name("r");
    r->set_data_type(TP::FLOAT16);
    r->add_dims(2);
    r->set_raw_data(std::string("\x00\x3c\x00\x40", 4));
    auto* i8 = g->add_initializer();
    i8->set_name("q");
    i8->set_data_type(TP::INT8);
    i8->add_dims(3);
    for (int v : {-1, 0, 1}) i8->add_int32_data(v);
    auto* i64 = g->add_initializer();
    i64->set_name("shape");
    i64->set_data_type(TP::INT64);
    i64->add_dims(2);
    i64->add_int64_data(-1);
    i64->add_int64_data(4);
    auto* c = add_node(g, "Constant", {}, {"k"}, "k");
    auto* a = c->add_attribute();
    a->set_name("value_floats");
    a->set_type(onnx::AttributeProto::FLOATS);
    a->add_floats(0.5f);
    add_node(g, "Mul", {"x", "w"}, {"t0"}, "mul");
    add_node(g, "Add", {"t0", "k"}, {"t1"}, "add");
    auto* conv = add_node(g, "Reshape", {"t1", "shape"}, {"y"}, "reshape");
    auto* ai = conv->add_attribute();
    ai->set_name("allowzero");
    ai->set_type(onnx::AttributeProto::INT);
    ai->set_i(0);
    add_output(g, "y", {4});
    seeds.push_back(serialize(m));
  }
  {
    auto m = make_model();
    auto* g = m.mutable_graph();
    add_input(g, "cond", {}, TP::BOOL);
    add_input(g, "x");
    add_node(g, "Relu", {"x"}, {"h"}, "h");
    auto* n = add_node(g, "If", {"cond"}, {"y"}, "if");
    for (const char* branch : {"then_branch", "else_branch"}) {
      auto* a = n->add_attribute();
      a->set_name(branch);
      a->set_type(onnx::AttributeProto::GRAPH);
      auto* sub = a->mutable_g();
      sub->set_name(branch);
      add_initializer(sub, "one", {1}, {1});
      add_node(sub, "Add", {"h", "one"}, {std::string(branch) + "_out"});
      add_output(sub, std::string(branch) + "_out");
    }
    auto* sp = g->add_sparse_initializer();
    sp->add_dims(3);
    sp->mutable_values()->set_name("sp");
    sp->mutable_values()->set_data_type(TP::FLOAT);
    sp->mutable_values()->add_dims(1);
    sp->mutable_values()->add_float_data(2);
    sp->mutable_indices()->set_data_type(TP::INT64);
    sp->mutable_indices()->add_dims(1);
    sp->mutable_indices()->add_int64_data(1);
    add_node(g, "Add", {"y", "sp"}, {"z"}, "add");
    add_output(g, "z");
    seeds.push_back(serialize(m));
  }
  {
    // Last: refers to external data, which load_bytes without a folder refuses.
    auto m = make_model();
    auto* g = m.mutable_graph();
    auto* ext = g->add_initializer();
    ext->set_name("ext");
    ext->set_data_type(TP::FLOAT);
    ext->add_dims(1);
    ext->set_data_location(TP::EXTERNAL);
    for (auto [k, v] : {std::pair{"location", "w.bin"}, {"offset", "0"}, {"length", "4"}}) {
      auto* kv = ext->add_external_data();
      kv->set_key(k);
      kv->set_value(v);
    }
    add_node(g, "Identity", {"ext"}, {"y"}, "id");
    add_output(g, "y", {1});
    seeds.push_back(serialize(m));
  }
  return seeds;
}

// Loads or throws slim::Error; anything else is a failure. Touches every loaded
// initializer byte so that a tensor over bad memory shows up under the sanitizers.
void try_load(const std::string& bytes, const std::string& label, int* loaded) {
  try {
    Model m = OnnxImporter::load_bytes(bytes.data(), bytes.size(), "mutant.onnx", "");
    uint64_t sum = 0;
    for (const auto& [name, t] : m.graph.initializers) {
      const auto* p = static_cast<const uint8_t*>(t.raw_data());
      for (size_t i = 0; i < t.nbytes(); ++i) sum += p[i];
    }
    EXPECT_GE(sum, 0u);
    ++*loaded;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mutant.onnx"), std::string::npos)
        << label << ": message does not name the file: " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << label << ": threw a non-slim exception: " << e.what();
  }
}

}  // namespace

TEST(OnnxMutation, SeedsLoad) {
  const auto seeds = seed_models();
  for (size_t i = 0; i + 1 < seeds.size(); ++i) {
    Model m = OnnxImporter::load_bytes(seeds[i].data(), seeds[i].size(), "seed.onnx", "");
    EXPECT_FALSE(m.graph.nodes.empty());
  }
  expect_error([&] { OnnxImporter::load_bytes(seeds.back().data(), seeds.back().size(), "seed.onnx", ""); },
               ErrorCode::invalid_model, {"initializer 'ext'", "loaded from memory"});
}

TEST(OnnxMutation, MutatedModelsLoadOrThrowSlimError) {
  constexpr int kMutations = 20000;
  const auto seeds = seed_models();
  std::mt19937_64 rng(20261130);
  int loaded = 0, runs = 0;
  auto pick = [&](size_t n) { return size_t(rng() % std::max<size_t>(n, 1)); };
  for (int iter = 0; iter < kMutations; ++iter) {
    std::string b = seeds[pick(seeds.size())];
    const int kind = int(rng() % 6);
    switch (kind) {
      case 0:  // flip a few bits
        for (int k = 0, n = 1 + int(rng() % 8); k < n; ++k) b[pick(b.size())] ^= char(1 << (rng() % 8));
        break;
      case 1:  // truncate
        b.resize(pick(b.size()));
        break;
      case 2:  // overwrite a run with random bytes
        for (size_t at = pick(b.size()), n = 1 + pick(16), k = 0; k < n && at + k < b.size(); ++k)
          b[at + k] = char(rng());
        break;
      case 3:  // insert random bytes
        b.insert(pick(b.size()), std::string(1 + pick(8), char(rng())));
        break;
      case 4: {  // splice two seeds
        const std::string& other = seeds[pick(seeds.size())];
        b = b.substr(0, pick(b.size())) + other.substr(pick(other.size()));
        break;
      }
      default:  // pure noise
        b.assign(pick(512), '\0');
        for (auto& ch : b) ch = char(rng());
        break;
    }
    try_load(b, "mutation " + std::to_string(iter) + " kind " + std::to_string(kind), &loaded);
    ++runs;
  }
  // Many bit flips land in names or float payloads and still give a valid model; the
  // count shows the corpus reaches past the parser.
  std::cout << loaded << " of " << runs << " mutants loaded\n";
  EXPECT_GT(loaded, 50);
  EXPECT_EQ(runs, kMutations);
}
