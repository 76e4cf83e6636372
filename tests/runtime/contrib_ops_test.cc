// ONNX Runtime's contrib ops (com.microsoft) against ONNX Runtime itself: every model in
// tests/fixtures/contrib_ops/ (written by tests/fixtures/contrib_ops.py, which ran it in
// onnxruntime-node) runs through slim with the ref provider alone and with cpu,ref, and
// each output must match ONNX Runtime's in dtype, shape and value (within 1e-4 relative).
// Error paths: bad attributes and input shapes fail with messages naming node and problem.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include <map>

#include "runtime/test_graphs.h"
#include "slim/core/convert.h"
#include "slim/core/npy.h"
#include "slim/runtime/session.h"

using namespace slim;
namespace fs = std::filesystem;

namespace {

fs::path fixture_dir() {
  const char* src = std::getenv("SLIM_SOURCE_DIR");
  return fs::path(src ? src : ".") / "tests/fixtures/contrib_ops";
}

// Empty when `got` matches `want`; otherwise what differs.
std::string compare(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape())
    return "got " + got.describe() + ", expected " + want.describe();
  const std::vector<double> g = tensor_to_doubles(got), w = tensor_to_doubles(want);
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::fabs(g[i] - w[i]) <= 1e-5 + 1e-4 * std::fabs(w[i])))
      return "element " + std::to_string(i) + ": got " + std::to_string(g[i]) + ", expected " +
             std::to_string(w[i]);
  return "";
}

// Runs every fixture case with `providers`; returns the number of cases that matched.
int run_cases(const std::vector<std::string>& providers) {
  int cases = 0, passed = 0;
  for (const auto& entry : fs::directory_iterator(fixture_dir())) {
    if (entry.path().extension() != ".onnx") continue;
    ++cases;
    const std::string name = entry.path().stem().string();
    fs::path npz = entry.path();
    npz.replace_extension(".npz");
    TensorMap inputs, want;
    for (auto& [key, t] : read_npz(npz.string()))
      (key.rfind("in.", 0) == 0 ? inputs : want)[key.substr(key.find('.') + 1)] = std::move(t);
    std::string problem;
    try {
      SessionOptions opts;
      opts.providers = providers;
      opts.num_threads = 2;
      const TensorMap got = Session::load(entry.path().string(), opts)->run(inputs);
      for (const auto& [out, w] : want) {
        const auto it = got.find(out);
        problem = it == got.end() ? "no output " + out : compare(it->second, w);
        if (!problem.empty()) {
          problem = out + ": " + problem;
          break;
        }
      }
    } catch (const Error& e) {
      problem = e.what();
    }
    EXPECT_EQ(problem, "") << name;
    passed += problem.empty();
  }
  EXPECT_GE(cases, 60) << "fixtures missing in " << fixture_dir();
  return passed == cases ? cases : -1;
}

TEST(ContribOps, RefMatchesOnnxRuntime) { EXPECT_GT(run_cases({"ref"}), 0); }

TEST(ContribOps, CpuMatchesOnnxRuntime) { EXPECT_GT(run_cases({"cpu", "ref"}), 0); }

}  // namespace

// ---- single kernels: error messages and the forms ONNX Runtime's CPU provider lacks ----

namespace {

using slim::testing::attr_float;
using slim::testing::attr_int;

using slim::testing::attr_string;

struct KernelRun {
  std::vector<Tensor> outputs;
  std::string error;  // "<code>: <message>" when the kernel threw
};

// Builds the ref kernel of a com.microsoft node (attribute errors surface here) and runs
// it; an undefined tensor among `inputs` is an omitted optional input.
KernelRun run_ref(const std::string& op, const std::vector<Tensor>& inputs, std::map<std::string, Attribute> attrs,
            int num_outputs = 1) {
  Node n;
  n.name = "n";
  n.op_type = op;
  n.domain = "com.microsoft";
  for (size_t i = 0; i < inputs.size(); ++i) n.inputs.push_back(inputs[i].defined() ? "x" + std::to_string(i) : "");
  for (int i = 0; i < num_outputs; ++i) n.outputs.push_back("y" + std::to_string(i));
  n.attrs = std::move(attrs);
  KernelRun r;
  try {
    const KernelDef* def = ref_kernel_registry().find(op, "com.microsoft", 1);
    if (!def) throw Error(ErrorCode::unsupported, "no ref kernel for " + op);
    const auto kernel = def->factory(n, 1);
    std::vector<const Tensor*> in;
    for (const Tensor& t : inputs) in.push_back(t.defined() ? &t : nullptr);
    r.outputs.resize(size_t(num_outputs));
    KernelContext ctx(n, in, &r.outputs, nullptr, nullptr);
    kernel->compute(ctx);
  } catch (const Error& e) {
    r.error = std::string(error_code_name(e.code())) + ": " + e.what();
  }
  return r;
}

Tensor f32(const Shape& shape, float start = 0.1f, float step = 0.37f) {
  Tensor t(DType::f32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = std::sin(start + step * float(i));
  return t;
}

Tensor i32(const Shape& shape, std::vector<int32_t> v) { return Tensor::from_vector<int32_t>(shape, v); }

std::map<std::string, Attribute> nbits_attrs(int64_t k, int64_t n, int64_t block, int64_t bits = 4) {
  return {{"K", attr_int(k)}, {"N", attr_int(n)}, {"block_size", attr_int(block)}, {"bits", attr_int(bits)}};
}

TEST(ContribOps, MatMulNBitsRejectsBadAttributesAndShapes) {
  const Tensor a = f32({2, 64}), b(DType::u8, {8, 2, 16}), s = f32({16});
  EXPECT_EQ(run_ref("MatMulNBits", {a, b, s}, nbits_attrs(64, 8, 24)).error,
            "invalid_model: MatMulNBits node 'n': block_size must be a power of two >= 16, got 24");
  EXPECT_EQ(run_ref("MatMulNBits", {a, b, s}, nbits_attrs(64, 8, 32, 3)).error,
            "unsupported: MatMulNBits node 'n': bits=3 is not supported (2, 4 or 8)");
  EXPECT_EQ(run_ref("MatMulNBits", {a, b, s}, nbits_attrs(0, 8, 32)).error,
            "invalid_model: MatMulNBits node 'n': attributes K and N must be positive, got K=0 N=8");
  EXPECT_EQ(run_ref("MatMulNBits", {a, b, s, Tensor(), i32({64}, std::vector<int32_t>(64, 0))}, nbits_attrs(64, 8, 32))
                .error,
            "unsupported: MatMulNBits node 'n': input 4 (g_idx) is not supported");
  EXPECT_EQ(run_ref("MatMulNBits", {f32({2, 60}), b, s}, nbits_attrs(64, 8, 32)).error,
            "invalid_argument: MatMulNBits node 'n': A must end in K=64, got f32[2,60]");
  EXPECT_EQ(run_ref("MatMulNBits", {a, Tensor(DType::u8, {8, 2, 8}), s}, nbits_attrs(64, 8, 32)).error,
            "invalid_argument: MatMulNBits node 'n': B must be uint8 (8, 2, 16), got u8[8,2,8]");
  EXPECT_EQ(run_ref("MatMulNBits", {a, b, f32({15})}, nbits_attrs(64, 8, 32)).error,
            "invalid_argument: MatMulNBits node 'n': scales must have 16 elements, got f32[15]");
  EXPECT_EQ(run_ref("MatMulNBits", {a, b, s, Tensor(DType::u8, {8, 2})}, nbits_attrs(64, 8, 32)).error,
            "invalid_argument: MatMulNBits node 'n': zero_points must have 8 elements, got u8[8,2]");
}

TEST(ContribOps, NormsAndActivationsRejectBadShapes) {
  const Tensor x = f32({2, 3, 8});
  EXPECT_EQ(run_ref("SkipLayerNormalization", {x, f32({2, 8}), f32({8})}, {}).error,
            "invalid_argument: SkipLayerNormalization node 'n': skip f32[2,8] must have the input's dtype and "
            "trailing dims, input is f32[2,3,8]");
  EXPECT_EQ(run_ref("SkipLayerNormalization", {x, x, f32({7})}, {}).error,
            "invalid_argument: SkipLayerNormalization node 'n': gamma must have 8 elements, got f32[7]");
  EXPECT_EQ(run_ref("SkipSimplifiedLayerNormalization", {x, x, f32({8})}, {}, 2).error,
            "unsupported: SkipSimplifiedLayerNormalization node 'n': output 1 (mean) of the RMS normalization is "
            "not supported");
  EXPECT_EQ(run_ref("BiasGelu", {x, f32({3})}, {}).error,
            "invalid_argument: BiasGelu node 'n': bias f32[3] must be 1-D with X's dtype and last dim, X is "
            "f32[2,3,8]");
  EXPECT_EQ(run_ref("Gelu", {Tensor(DType::i32, {2})}, {}).error,
            "unsupported: Gelu node 'n': input of dtype i32 is not supported");
  const Tensor ids = i32({1, 3}, {0, 5, 9}), word = f32({9, 8}), pos = f32({4, 8}), g = f32({8});
  EXPECT_EQ(run_ref("EmbedLayerNormalization", {ids, Tensor(), word, pos, Tensor(), g, g}, {}, 2).error,
            "invalid_argument: EmbedLayerNormalization node 'n': input_ids holds 9, outside [0, 9)");
  EXPECT_EQ(run_ref("FusedMatMul", {f32({2, 3}), f32({3, 2})}, {{"transBatchA", attr_int(1)}}).error,
            "unsupported: FusedMatMul node 'n': transBatchA/transBatchB is not supported");
  EXPECT_EQ(run_ref("FusedMatMul", {f32({2, 3}), f32({2, 3})}, {}).error,
            "invalid_argument: FusedMatMul node 'n': inner dimensions differ: [2,3] x [2,3]");
}

TEST(ContribOps, RotaryEmbeddingRejectsBadInputs) {
  const Tensor cos = f32({4, 4}), x = f32({1, 2, 16});
  const Tensor pos = Tensor::from_vector<int64_t>({1, 2}, {0, 4});
  EXPECT_EQ(run_ref("RotaryEmbedding", {x, pos, cos, cos}, {{"rotary_embedding_dim", attr_int(4)}}).error,
            "invalid_model: RotaryEmbedding node 'n': rotary_embedding_dim needs num_heads");
  EXPECT_EQ(run_ref("RotaryEmbedding", {x, pos, cos, cos}, {}).error,
            "invalid_argument: RotaryEmbedding node 'n': position 4 is outside cos_cache f32[4,4]");
  EXPECT_EQ(run_ref("RotaryEmbedding", {f32({2, 16}), pos, cos, cos}, {}).error,
            "invalid_argument: RotaryEmbedding node 'n': input must be (batch, sequence, hidden) or (batch, heads, "
            "sequence, head), got f32[2,16]");
  EXPECT_EQ(run_ref("RotaryEmbedding", {x, pos, cos, cos}, {{"scale", attr_float(2.f)}}).error,
            "unsupported: RotaryEmbedding node 'n': scale other than 1 is not supported");
}

TEST(ContribOps, AttentionOpsRejectWhatTheyDoNotSupport) {
  const Tensor x = f32({1, 3, 8}), w = f32({8, 24});
  EXPECT_EQ(run_ref("Attention", {x, w}, {}).error,
            "invalid_model: Attention node 'n': attribute num_heads must be positive, got 0");
  EXPECT_EQ(run_ref("Attention", {x, w}, {{"num_heads", attr_int(2)}, {"do_rotary", attr_int(1)}}).error,
            "unsupported: Attention node 'n': do_rotary is not supported");
  EXPECT_EQ(run_ref("Attention", {x, f32({8, 20})}, {{"num_heads", attr_int(2)}}).error,
            "invalid_argument: Attention node 'n': weights f32[8,20] do not split into Q, K and V of 2 heads");
  EXPECT_EQ(run_ref("Attention", {x, w, Tensor(), i32({1, 1, 3, 3}, std::vector<int32_t>(9, 1))},
                    {{"num_heads", attr_int(2)}})
                .error,
            "unsupported: Attention node 'n': mask_index i32[1,1,3,3] is not supported: expected (1), (2), (1, 3) "
            "or (1, 3, 3)");
  EXPECT_EQ(run_ref("MultiHeadAttention", {x}, {{"num_heads", attr_int(2)}}).error,
            "invalid_argument: MultiHeadAttention node 'n': query f32[1,3,8] must hold num_heads=2 heads, with key "
            "and value given unless it packs Q, K and V");
  std::vector<Tensor> ten(10, Tensor());
  ten[0] = x;
  ten[9] = i32({1}, {0});
  EXPECT_EQ(run_ref("MultiHeadAttention", ten, {{"num_heads", attr_int(2)}}).error,
            "unsupported: MultiHeadAttention node 'n': input 9 (cache_indirection) is not supported");
  const Tensor lens = i32({1}, {2}), total = i32({}, {3});
  EXPECT_EQ(run_ref("GroupQueryAttention", {x, f32({1, 3, 4}), f32({1, 3, 4}), Tensor(), Tensor(), lens, total},
                    {{"num_heads", attr_int(3)}, {"kv_num_heads", attr_int(2)}})
                .error,
            "invalid_model: GroupQueryAttention node 'n': num_heads 3 is not a multiple of kv_num_heads 2");
  EXPECT_EQ(run_ref("GroupQueryAttention", {x, f32({1, 3, 4}), f32({1, 3, 4}), Tensor(), Tensor(), lens, total},
                    {{"num_heads", attr_int(2)}, {"kv_num_heads", attr_int(1)}, {"k_quant_type", attr_string("PER_TENSOR")}})
                .error,
            "unsupported: GroupQueryAttention node 'n': a quantized KV cache (k_quant_type) is not supported");
  EXPECT_EQ(run_ref("GroupQueryAttention", {x, f32({1, 3, 4}), f32({1, 3, 4}), Tensor(), Tensor(), i32({1}, {5}), total},
                    {{"num_heads", attr_int(2)}, {"kv_num_heads", attr_int(1)}})
                .error,
            "invalid_argument: GroupQueryAttention node 'n': seqlens_k[0] = 5 does not fit sequence length 3, past "
            "length 0 and total_sequence_length 3");
}

// MultiHeadAttention's packed forms (which ONNX Runtime runs on GPUs only) equal the
// separate Q, K, V they pack.
TEST(ContribOps, MultiHeadAttentionPackedFormsEqualSeparateQkv) {
  const int64_t b = 2, s = 3, l = 4, n = 2, h = 4;
  const Tensor packed = f32({b, s, n, 3, h}, 0.3f, 0.71f), kv = f32({b, l, n, 2, h}, 0.5f, 0.53f);
  const Tensor q = f32({b, l, n, h}, 1.1f, 0.29f);
  // Slices of the packed tensors as (batch, sequence, hidden).
  const auto part = [](const Tensor& t, int64_t parts, int64_t which) {
    const int64_t tokens = t.dim(0) * t.dim(1), heads = t.dim(2), head = t.dim(4);
    Tensor out(DType::f32, {t.dim(0), t.dim(1), heads * head});
    for (int64_t i = 0; i < tokens; ++i)
      for (int64_t j = 0; j < heads; ++j)
        for (int64_t d = 0; d < head; ++d)
          out.data<float>()[(i * heads + j) * head + d] = t.data<float>()[((i * heads + j) * parts + which) * head + d];
    return out;
  };
  const std::map<std::string, Attribute> attrs = {{"num_heads", attr_int(n)}};
  const KernelRun p = run_ref("MultiHeadAttention", {packed}, attrs);
  const KernelRun sep = run_ref("MultiHeadAttention", {part(packed, 3, 0), part(packed, 3, 1), part(packed, 3, 2)}, attrs);
  ASSERT_EQ(p.error, "");
  ASSERT_EQ(sep.error, "");
  EXPECT_EQ(compare(p.outputs[0], sep.outputs[0]), "");
  const Tensor q3 = q.reshape({b, l, n * h});
  const KernelRun pkv = run_ref("MultiHeadAttention", {q3, kv}, attrs);
  const KernelRun skv = run_ref("MultiHeadAttention", {q3, part(kv, 2, 0), part(kv, 2, 1)}, attrs);
  ASSERT_EQ(pkv.error, "");
  EXPECT_EQ(compare(pkv.outputs[0], skv.outputs[0]), "");
}

// Attention without its optional bias is the projection without a bias; f16 inputs give
// the f32 result rounded (ONNX Runtime's CPU kernels are f32 only).
TEST(ContribOps, AttentionWithoutBiasAndHalfInputs) {
  const Tensor x = f32({2, 3, 8}), w = f32({8, 24}, 0.2f, 0.13f);
  const std::map<std::string, Attribute> attrs = {{"num_heads", attr_int(2)}, {"unidirectional", attr_int(1)}};
  const KernelRun none = run_ref("Attention", {x, w}, attrs);
  const KernelRun zero = run_ref("Attention", {x, w, Tensor(DType::f32, {24})}, attrs);
  ASSERT_EQ(none.error, "");
  EXPECT_EQ(compare(none.outputs[0], zero.outputs[0]), "");
  const KernelRun half = run_ref("FastGelu", {convert_dtype(x, DType::f16)}, {});
  const KernelRun full = run_ref("FastGelu", {x}, {});
  ASSERT_EQ(half.outputs[0].dtype(), DType::f16);
  const std::vector<double> hv = tensor_to_doubles(half.outputs[0]), fv = tensor_to_doubles(full.outputs[0]);
  for (size_t i = 0; i < hv.size(); ++i) EXPECT_NEAR(hv[i], fv[i], 2e-3 * (1 + std::fabs(fv[i]))) << i;
}

}  // namespace

namespace {

// GroupQueryAttention's present length is max(total_sequence_length, past length): compile
// must not infer it from a probe run, where the value of that input is made up.
TEST(ContribOps, GroupQueryAttentionPresentShapeFollowsTotalSequenceLength) {
  const auto session = Session::load((fixture_dir() / "gqa_decode.onnx").string());
  EXPECT_EQ(session->static_shape("present_key"), std::nullopt);
  TensorMap inputs;
  for (auto& [key, t] : read_npz((fixture_dir() / "gqa_decode.npz").string()))
    if (key.rfind("in.", 0) == 0) inputs[key.substr(3)] = std::move(t);
  EXPECT_EQ(session->run(inputs).at("present_key").shape(), (Shape{2, 2, 7, 16}));
}

}  // namespace

namespace {

// In a decoder layer as ONNX Runtime GenAI writes it, every MatMulNBits runs on cpu, also
// those after GroupQueryAttention, whose outputs' dtype compile cannot know (it does not
// probe a node whose shapes depend on a run-time value).
TEST(ContribOps, DecoderLayerRunsEveryMatMulNBitsOnCpu) {
  const auto session = Session::load((fixture_dir() / "decoder_layer_decode.onnx").string());
  int nbits = 0;
  for (const auto& a : session->partition())
    if (a.op == "com.microsoft:MatMulNBits") {
      ++nbits;
      EXPECT_EQ(a.provider, "cpu") << a.node;
    }
  EXPECT_EQ(nbits, 4);
}

}  // namespace
