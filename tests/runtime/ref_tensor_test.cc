// Unit tests of the ref provider's data-movement, shape and index kernels, run one node
// at a time: opset-dependent inputs versus attributes, numpy-equivalent results worked
// out by hand (numpy expressions beside them), and the errors that bad input raises.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <optional>

#include "slim/core/convert.h"
#include "runtime/ref_kernel_test_util.h"
#include "slim/runtime/kernel.h"

namespace slim {
namespace {

using namespace ref_test;

Tensor i64s(std::vector<int64_t> v) { return tensor<int64_t>({int64_t(v.size())}, v); }
Tensor x234() { return tensor<float>({2, 3, 4}, arange_f(24)); }

TEST(RefTensorReshape, ZeroCopiesADimUnlessAllowzero) {
  const Tensor x = x234();
  auto y = run_op("Reshape", 13, {x, i64s({0, -1})});
  EXPECT_EQ(y[0].shape(), (Shape{2, 12}));
  EXPECT_EQ(values<float>(y[0]), arange_f(24));
  // With allowzero a 0 is a real zero-size dim, so [0, 4] cannot hold 24 values...
  error_of(ErrorCode::invalid_argument, [&] { run_op("Reshape", 14, {x, i64s({0, 4})}, {{"allowzero", attr_i(1)}}); });
  // ...but reshaping an empty tensor to it works.
  const Tensor empty(DType::f32, {0, 3});
  EXPECT_EQ(run_op("Reshape", 14, {empty, i64s({3, 0})}, {{"allowzero", attr_i(1)}})[0].shape(), (Shape{3, 0}));
  // Opset 1-4 take the shape as an attribute.
  EXPECT_EQ(run_op("Reshape", 4, {x}, {{"shape", attr_ints({4, 6})}})[0].shape(), (Shape{4, 6}));
  const std::string msg = error_of(ErrorCode::invalid_argument, [&] { run_op("Reshape", 13, {x, i64s({-1, -1})}); });
  EXPECT_NE(msg.find("Reshape node 'n0'"), std::string::npos) << msg;
  error_of(ErrorCode::invalid_argument, [&] { run_op("Reshape", 13, {x, i64s({5, -1})}); });
}

TEST(RefTensorTranspose, PermAndDefaultReverse) {
  const Tensor x = tensor<float>({2, 3}, arange_f(6));
  EXPECT_EQ(values<float>(run_op("Transpose", 13, {x})[0]), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  // np.transpose(arange(24).reshape(2,3,4), (1,2,0))[1,2,:] == [6+... ]: element (j,k,i) = x[i,j,k].
  const auto y = run_op("Transpose", 13, {x234()}, {{"perm", attr_ints({1, 2, 0})}});
  EXPECT_EQ(y[0].shape(), (Shape{3, 4, 2}));
  const auto v = values<float>(y[0]);
  EXPECT_EQ(v[size_t((1 * 4 + 2) * 2 + 1)], 12 + 4 + 2);
  error_of(ErrorCode::invalid_model, [&] { run_op("Transpose", 13, {x}, {{"perm", attr_ints({0, 0})}}); });
}

TEST(RefTensorConcatSplit, ConcatThenSplitRoundTrips) {
  const Tensor a = tensor<float>({2, 1}, {1, 2}), b = tensor<float>({2, 2}, {3, 4, 5, 6});
  const auto c = run_op("Concat", 13, {a, b}, {{"axis", attr_i(-1)}});
  EXPECT_EQ(values<float>(c[0]), (std::vector<float>{1, 3, 4, 2, 5, 6}));
  error_of(ErrorCode::invalid_argument, [&] { run_op("Concat", 13, {a, b}, {{"axis", attr_i(0)}}); });
  // Opset 13: split sizes as an input.
  auto s = run_op("Split", 13, {c[0], i64s({1, 2})}, {{"axis", attr_i(1)}}, 2);
  EXPECT_EQ(values<float>(s[0]), (std::vector<float>{1, 2}));
  EXPECT_EQ(values<float>(s[1]), (std::vector<float>{3, 4, 5, 6}));
  // Opset 11: as an attribute; no sizes means equal parts.
  s = run_op("Split", 11, {c[0]}, {{"axis", attr_i(1)}, {"split", attr_ints({2, 1})}}, 2);
  EXPECT_EQ(s[1].shape(), (Shape{2, 1}));
  s = run_op("Split", 13, {tensor<float>({6}, arange_f(6))}, {}, 3);
  EXPECT_EQ(values<float>(s[2]), (std::vector<float>{4, 5}));
  // Opset 18 num_outputs: ceil(7/3) = 3 per part, the last one smaller.
  s = run_op("Split", 18, {tensor<float>({7}, arange_f(7))}, {{"num_outputs", attr_i(3)}}, 3);
  EXPECT_EQ(s[0].shape(), (Shape{3}));
  EXPECT_EQ(values<float>(s[2]), (std::vector<float>{6}));
  error_of(ErrorCode::invalid_argument, [] { run_op("Split", 13, {tensor<float>({7}, arange_f(7))}, {}, 3); });
  error_of(ErrorCode::invalid_argument, [&] { run_op("Split", 13, {c[0], i64s({1, 1})}, {{"axis", attr_i(1)}}, 2); });
}

TEST(RefTensorSlice, StepsClampingAndNegativeAxes) {
  const Tensor x = tensor<float>({10}, arange_f(10));
  // x[8:1:-3] == [8, 5, 2]
  EXPECT_EQ(values<float>(run_op("Slice", 13, {x, i64s({8}), i64s({1}), i64s({0}), i64s({-3})})[0]),
            (std::vector<float>{8, 5, 2}));
  // x[-100:100:4] == [0, 4, 8]; x[::-1] via INT64_MIN end.
  EXPECT_EQ(values<float>(run_op("Slice", 13, {x, i64s({-100}), i64s({100}), Tensor(), i64s({4})})[0]),
            (std::vector<float>{0, 4, 8}));
  EXPECT_EQ(values<float>(run_op("Slice", 13, {x, i64s({-1}), i64s({INT64_MIN}), Tensor(), i64s({-4})})[0]),
            (std::vector<float>{9, 5, 1}));
  // x234[:, 1:, -2:] with axes given out of order and negative.
  const auto y = run_op("Slice", 13, {x234(), i64s({-2, 1}), i64s({INT64_MAX, 3}), i64s({-1, 1})});
  EXPECT_EQ(y[0].shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(values<float>(y[0]), (std::vector<float>{6, 7, 10, 11, 18, 19, 22, 23}));
  // Empty result, and opset 9's attributes.
  EXPECT_EQ(run_op("Slice", 13, {x, i64s({5}), i64s({2})})[0].shape(), (Shape{0}));
  EXPECT_EQ(values<float>(run_op("Slice", 9, {x}, {{"starts", attr_ints({2})}, {"ends", attr_ints({4})}})[0]),
            (std::vector<float>{2, 3}));
  error_of(ErrorCode::invalid_argument, [&] { run_op("Slice", 13, {x, i64s({0}), i64s({5}), Tensor(), i64s({0})}); });
  const std::string msg = error_of(ErrorCode::invalid_model, [&] { run_op("Slice", 13, {x, i64s({0}), i64s({5}), i64s({1})}); });
  EXPECT_NE(msg.find("axis 1 out of range"), std::string::npos) << msg;
}

TEST(RefTensorGather, GatherWithNegativeIndicesAndRangeCheck) {
  const Tensor x = tensor<float>({3, 2}, arange_f(6));
  const auto y = run_op("Gather", 13, {x, tensor<int64_t>({2, 2}, {2, -3, 1, 1})});
  EXPECT_EQ(y[0].shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(values<float>(y[0]), (std::vector<float>{4, 5, 0, 1, 2, 3, 2, 3}));
  EXPECT_EQ(values<float>(run_op("Gather", 13, {x, Tensor::scalar<int32_t>(1)}, {{"axis", attr_i(1)}})[0]),
            (std::vector<float>{1, 3, 5}));
  const std::string msg = error_of(ErrorCode::invalid_argument, [&] { run_op("Gather", 13, {x, i64s({3})}); });
  EXPECT_NE(msg.find("index 3"), std::string::npos) << msg;
}

TEST(RefTensorGather, GatherElementsAndGatherNDBatchDims) {
  // np.take_along_axis([[1,2],[3,4]], [[0,0],[1,0]], 1) == [[1,1],[4,3]]
  const Tensor d = tensor<float>({2, 2}, {1, 2, 3, 4});
  EXPECT_EQ(values<float>(run_op("GatherElements", 13, {d, tensor<int64_t>({2, 2}, {0, 0, 1, 0})}, {{"axis", attr_i(1)}})[0]),
            (std::vector<float>{1, 1, 4, 3}));
  EXPECT_EQ(values<float>(run_op("GatherElements", 13, {d, tensor<int64_t>({1, 2}, {1, -2})})[0]),
            (std::vector<float>{3, 2}));
  // GatherND, batch_dims=1: data [2,2,2], indices [[1],[0]] -> [data[0][1], data[1][0]].
  const Tensor d3 = tensor<float>({2, 2, 2}, arange_f(8));
  const auto y = run_op("GatherND", 13, {d3, tensor<int64_t>({2, 1}, {1, 0})}, {{"batch_dims", attr_i(1)}});
  EXPECT_EQ(y[0].shape(), (Shape{2, 2}));
  EXPECT_EQ(values<float>(y[0]), (std::vector<float>{2, 3, 4, 5}));
  EXPECT_EQ(values<float>(run_op("GatherND", 13, {d3, tensor<int64_t>({2, 3}, {0, 1, 1, 1, 0, 0})})[0]),
            (std::vector<float>{3, 4}));
  error_of(ErrorCode::invalid_argument, [&] { run_op("GatherND", 13, {d3, tensor<int64_t>({1, 3}, {0, 2, 0})}); });
}

TEST(RefTensorScatter, ElementsAndNDWithReductions) {
  const Tensor d = tensor<float>({1, 5}, {1, 2, 3, 4, 5});
  const Tensor idx = tensor<int64_t>({1, 2}, {1, 1});
  const Tensor upd = tensor<float>({1, 2}, {1.1f, 2.1f});
  // Duplicate indices: "add" accumulates both, "none" keeps the last write.
  EXPECT_EQ(values<float>(run_op("ScatterElements", 16, {d, idx, upd}, {{"axis", attr_i(1)}, {"reduction", attr_s("add")}})[0]),
            (std::vector<float>{1, 2 + 1.1f + 2.1f, 3, 4, 5}));
  EXPECT_EQ(values<float>(run_op("ScatterElements", 18, {d, idx, upd}, {{"axis", attr_i(1)}, {"reduction", attr_s("max")}})[0]),
            (std::vector<float>{1, 2.1f, 3, 4, 5}));
  EXPECT_EQ(values<float>(run_op("Scatter", 9, {d, tensor<int64_t>({1, 2}, {0, -1}), upd}, {{"axis", attr_i(1)}})[0]),
            (std::vector<float>{1.1f, 2, 3, 4, 2.1f}));
  error_of(ErrorCode::invalid_model, [&] { run_op("ScatterElements", 16, {d, idx, upd}, {{"reduction", attr_s("max")}}); });
  // ScatterND replaces / multiplies whole rows.
  const Tensor m = tensor<float>({3, 2}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(values<float>(run_op("ScatterND", 16, {m, tensor<int64_t>({2, 1}, {2, 0}), tensor<float>({2, 2}, {10, 20, 2, 3})},
                                 {{"reduction", attr_s("mul")}})[0]),
            (std::vector<float>{2, 6, 3, 4, 50, 120}));
  error_of(ErrorCode::invalid_argument, [&] {
    run_op("ScatterND", 13, {m, tensor<int64_t>({1, 1}, {3}), tensor<float>({1, 2}, {0, 0})});
  });
}

TEST(RefTensorExpandTile, BroadcastAndRepeat) {
  const Tensor x = tensor<float>({3, 1}, {1, 2, 3});
  const auto e = run_op("Expand", 13, {x, i64s({2, 1, 2})});
  EXPECT_EQ(e[0].shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(values<float>(e[0]), (std::vector<float>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
  error_of(ErrorCode::invalid_argument, [&] { run_op("Expand", 13, {x, i64s({2, 2})}); });
  const auto t = run_op("Tile", 13, {tensor<float>({2, 2}, {1, 2, 3, 4}), i64s({1, 2})});
  EXPECT_EQ(values<float>(t[0]), (std::vector<float>{1, 2, 1, 2, 3, 4, 3, 4}));
  EXPECT_EQ(run_op("Tile", 13, {x, i64s({0, 3})})[0].shape(), (Shape{0, 3}));
  error_of(ErrorCode::invalid_argument, [&] { run_op("Tile", 13, {x, i64s({2})}); });
}

TEST(RefTensorPad, ModesNegativePadsAndAxes) {
  const Tensor x = tensor<float>({3}, {1, 2, 3});
  // np.pad([1,2,3], (2,3), mode): constant 9 / reflect / edge / wrap.
  EXPECT_EQ(values<float>(run_op("Pad", 13, {x, i64s({2, 3}), Tensor::scalar<float>(9)})[0]),
            (std::vector<float>{9, 9, 1, 2, 3, 9, 9, 9}));
  EXPECT_EQ(values<float>(run_op("Pad", 13, {x, i64s({2, 3})}, {{"mode", attr_s("reflect")}})[0]),
            (std::vector<float>{3, 2, 1, 2, 3, 2, 1, 2}));
  EXPECT_EQ(values<float>(run_op("Pad", 13, {x, i64s({2, 3})}, {{"mode", attr_s("edge")}})[0]),
            (std::vector<float>{1, 1, 1, 2, 3, 3, 3, 3}));
  EXPECT_EQ(values<float>(run_op("Pad", 19, {x, i64s({2, 3})}, {{"mode", attr_s("wrap")}})[0]),
            (std::vector<float>{2, 3, 1, 2, 3, 1, 2, 3}));
  // A negative pad crops.
  EXPECT_EQ(values<float>(run_op("Pad", 13, {x, i64s({-1, 1})})[0]), (std::vector<float>{2, 3, 0}));
  // Opset 18 axes: pad only axis 1 of a [2,2].
  const auto y = run_op("Pad", 18, {tensor<int32_t>({2, 2}, {1, 2, 3, 4}), i64s({1, 0}), Tensor::scalar<int32_t>(-1), i64s({-1})});
  EXPECT_EQ(values<int32_t>(y[0]), (std::vector<int32_t>{-1, 1, 2, -1, 3, 4}));
  // Opset 2-10: pads and value are attributes.
  EXPECT_EQ(values<float>(run_op("Pad", 2, {x}, {{"pads", attr_ints({1, 0})}, {"value", attr_f(5)}})[0]),
            (std::vector<float>{5, 1, 2, 3}));
  error_of(ErrorCode::invalid_argument, [&] { run_op("Pad", 13, {x, i64s({1})}); });
  error_of(ErrorCode::invalid_model, [&] { run_op("Pad", 13, {x, i64s({1, 1})}, {{"mode", attr_s("wrap")}}); });
}

TEST(RefTensorShapeOps, SqueezeUnsqueezeFlattenAcrossOpsets) {
  const Tensor x = tensor<float>({1, 3, 1}, {1, 2, 3});
  EXPECT_EQ(run_op("Squeeze", 13, {x})[0].shape(), (Shape{3}));
  EXPECT_EQ(run_op("Squeeze", 13, {x, i64s({-1})})[0].shape(), (Shape{1, 3}));
  EXPECT_EQ(run_op("Squeeze", 11, {x}, {{"axes", attr_ints({0})}})[0].shape(), (Shape{3, 1}));
  error_of(ErrorCode::invalid_argument, [&] { run_op("Squeeze", 13, {x, i64s({1})}); });
  EXPECT_EQ(run_op("Unsqueeze", 13, {x, i64s({-1, 0})})[0].shape(), (Shape{1, 1, 3, 1, 1}));
  EXPECT_EQ(run_op("Unsqueeze", 11, {x}, {{"axes", attr_ints({1})}})[0].shape(), (Shape{1, 1, 3, 1}));
  error_of(ErrorCode::invalid_argument, [&] { run_op("Unsqueeze", 13, {x, i64s({0, 0})}); });
  error_of(ErrorCode::invalid_model, [&] { run_op("Unsqueeze", 11, {x}); });
  EXPECT_EQ(run_op("Flatten", 13, {x234()}, {{"axis", attr_i(-1)}})[0].shape(), (Shape{6, 4}));
  EXPECT_EQ(run_op("Flatten", 13, {x234()}, {{"axis", attr_i(0)}})[0].shape(), (Shape{1, 24}));
  error_of(ErrorCode::invalid_argument, [] { run_op("Flatten", 9, {x234()}, {{"axis", attr_i(-1)}}); });
}

TEST(RefTensorShapeOps, ShapeSizeConstantOfShapeRange) {
  EXPECT_EQ(values<int64_t>(run_op("Shape", 13, {x234()})[0]), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(values<int64_t>(run_op("Shape", 15, {x234()}, {{"start", attr_i(-2)}})[0]), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(values<int64_t>(run_op("Shape", 15, {x234()}, {{"start", attr_i(1)}, {"end", attr_i(-1)}})[0]),
            (std::vector<int64_t>{3}));
  EXPECT_EQ(values<int64_t>(run_op("Shape", 15, {x234()}, {{"start", attr_i(-10)}, {"end", attr_i(10)}})[0]),
            (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(values<int64_t>(run_op("Size", 13, {x234()})[0]), (std::vector<int64_t>{24}));
  const auto c = run_op("ConstantOfShape", 9, {i64s({2, 1})}, {{"value", attr_t(tensor<int32_t>({1}, {7}))}});
  EXPECT_EQ(c[0].dtype(), DType::i32);
  EXPECT_EQ(values<int32_t>(c[0]), (std::vector<int32_t>{7, 7}));
  EXPECT_EQ(run_op("ConstantOfShape", 9, {i64s({0})})[0].shape(), (Shape{0}));
  EXPECT_EQ(values<int32_t>(run_op("Range", 11, {Tensor::scalar<int32_t>(10), Tensor::scalar<int32_t>(4), Tensor::scalar<int32_t>(-3)})[0]),
            (std::vector<int32_t>{10, 7}));
  EXPECT_EQ(values<float>(run_op("Range", 11, {Tensor::scalar<float>(1), Tensor::scalar<float>(2), Tensor::scalar<float>(0.25f)})[0]),
            (std::vector<float>{1, 1.25f, 1.5f, 1.75f}));
  error_of(ErrorCode::invalid_argument, [] {
    run_op("Range", 11, {Tensor::scalar<float>(1), Tensor::scalar<float>(2), Tensor::scalar<float>(0)});
  });
}

TEST(RefTensorMisc, TriluEyeLikeOneHotNonZero) {
  const Tensor m = tensor<float>({3, 3}, arange_f(9, 1));
  // np.triu(m, 1) and np.tril(m, -1)
  EXPECT_EQ(values<float>(run_op("Trilu", 14, {m, Tensor::scalar<int64_t>(1)})[0]),
            (std::vector<float>{0, 2, 3, 0, 0, 6, 0, 0, 0}));
  EXPECT_EQ(values<float>(run_op("Trilu", 14, {m, Tensor::scalar<int64_t>(-1)}, {{"upper", attr_i(0)}})[0]),
            (std::vector<float>{0, 0, 0, 4, 0, 0, 7, 8, 0}));
  const auto e = run_op("EyeLike", 9, {tensor<float>({2, 3}, arange_f(6))}, {{"k", attr_i(1)}, {"dtype", attr_i(7)}});
  EXPECT_EQ(e[0].dtype(), DType::i64);
  EXPECT_EQ(values<int64_t>(e[0]), (std::vector<int64_t>{0, 1, 0, 0, 0, 1}));
  // OneHot on axis 0 with a negative index and an out-of-range one (all off).
  const auto o = run_op("OneHot", 11, {i64s({1, -1, 5}), Tensor::scalar<float>(3), tensor<int32_t>({2}, {0, 9})},
                        {{"axis", attr_i(0)}});
  EXPECT_EQ(o[0].shape(), (Shape{3, 3}));
  EXPECT_EQ(values<int32_t>(o[0]), (std::vector<int32_t>{0, 0, 0, 9, 0, 0, 0, 9, 0}));
  // np.nonzero([[1,0],[0,2]]) == ([0,1],[0,1])
  EXPECT_EQ(values<int64_t>(run_op("NonZero", 13, {tensor<float>({2, 2}, {1, 0, 0, 2})})[0]),
            (std::vector<int64_t>{0, 1, 0, 1}));
}

TEST(RefTensorMisc, DepthToSpaceModesInvertSpaceToDepth) {
  const Tensor x = tensor<float>({1, 8, 1, 2}, arange_f(16));
  // DCR: out[0, c, h*2+i, w*2+j] = x[0, (i*2+j)*2 + c, h, w]
  const auto dcr = run_op("DepthToSpace", 13, {x}, {{"blocksize", attr_i(2)}});
  EXPECT_EQ(dcr[0].shape(), (Shape{1, 2, 2, 4}));
  EXPECT_EQ(values<float>(dcr[0]), (std::vector<float>{0, 4, 1, 5, 8, 12, 9, 13, 2, 6, 3, 7, 10, 14, 11, 15}));
  // CRD: out[0, c, h*2+i, w*2+j] = x[0, c*4 + i*2 + j, h, w]
  const auto crd = run_op("DepthToSpace", 13, {x}, {{"blocksize", attr_i(2)}, {"mode", attr_s("CRD")}});
  EXPECT_EQ(values<float>(crd[0]), (std::vector<float>{0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15}));
  const auto back = run_op("SpaceToDepth", 13, {dcr[0]}, {{"blocksize", attr_i(2)}});
  EXPECT_EQ(back[0].shape(), x.shape());
  EXPECT_EQ(values<float>(back[0]), arange_f(16));
  error_of(ErrorCode::invalid_argument, [&] { run_op("DepthToSpace", 13, {x}, {{"blocksize", attr_i(3)}}); });
  error_of(ErrorCode::invalid_model, [&] { run_op("SpaceToDepth", 13, {x}); });
}

TEST(RefTensorMisc, CompressReverseSequenceUnique) {
  const Tensor x = tensor<float>({3, 2}, arange_f(6));
  const Tensor cond = tensor<bool>({3}, {false, true, true});
  EXPECT_EQ(values<float>(run_op("Compress", 11, {x, cond}, {{"axis", attr_i(0)}})[0]), (std::vector<float>{2, 3, 4, 5}));
  EXPECT_EQ(values<float>(run_op("Compress", 11, {x, cond})[0]), (std::vector<float>{1, 2}));
  // time_axis 0, batch_axis 1: column b reverses its first lens[b] rows.
  const auto r = run_op("ReverseSequence", 10, {x, i64s({3, 1})});
  EXPECT_EQ(values<float>(r[0]), (std::vector<float>{4, 1, 2, 3, 0, 5}));
  error_of(ErrorCode::invalid_argument, [&] { run_op("ReverseSequence", 10, {x, i64s({4, 1})}); });
  // np.unique([2,1,1,3,2], return_index, return_inverse, return_counts)
  const auto u = run_op("Unique", 11, {tensor<float>({5}, {2, 1, 1, 3, 2})}, {}, 4);
  EXPECT_EQ(values<float>(u[0]), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(values<int64_t>(u[1]), (std::vector<int64_t>{1, 0, 3}));
  EXPECT_EQ(values<int64_t>(u[2]), (std::vector<int64_t>{1, 0, 0, 2, 1}));
  EXPECT_EQ(values<int64_t>(u[3]), (std::vector<int64_t>{2, 2, 1}));
  const auto un = run_op("Unique", 11, {tensor<float>({5}, {2, 1, 1, 3, 2})}, {{"sorted", attr_i(0)}}, 4);
  EXPECT_EQ(values<float>(un[0]), (std::vector<float>{2, 1, 3}));
  EXPECT_EQ(values<int64_t>(un[2]), (std::vector<int64_t>{0, 1, 1, 2, 0}));
  // Unique rows along axis 0.
  const auto ua = run_op("Unique", 11, {tensor<int32_t>({3, 2}, {3, 1, 0, 5, 3, 1})}, {{"axis", attr_i(0)}}, 4);
  EXPECT_EQ(values<int32_t>(ua[0]), (std::vector<int32_t>{0, 5, 3, 1}));
  EXPECT_EQ(values<int64_t>(ua[3]), (std::vector<int64_t>{1, 2}));
}

TEST(RefTensorMisc, IdentityDropoutConstant) {
  const Tensor x = tensor<float>({4}, {1, 2, 3, 4});
  EXPECT_EQ(values<float>(run_op("Identity", 13, {x})[0]), values<float>(x));
  // Inference: identity with an all-true mask.
  auto d = run_op("Dropout", 13, {x, Tensor::scalar<float>(0.5f)}, {}, 2);
  EXPECT_EQ(values<float>(d[0]), values<float>(x));
  EXPECT_EQ(values<bool>(d[1]), (std::vector<bool>{true, true, true, true}));
  // Training with a seed: kept values scale by 1/(1-ratio), dropped are 0, and the mask says which.
  d = run_op("Dropout", 13, {x, Tensor::scalar<float>(0.75f), Tensor::scalar<bool>(true)}, {{"seed", attr_i(3)}}, 2);
  const auto y = values<float>(d[0]);
  const auto mask = values<bool>(d[1]);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(y[i], mask[i] ? 4.f * float(i + 1) : 0.f);
  const auto again = run_op("Dropout", 13, {x, Tensor::scalar<float>(0.75f), Tensor::scalar<bool>(true)}, {{"seed", attr_i(3)}}, 2);
  EXPECT_EQ(values<bool>(again[1]), mask);
  error_of(ErrorCode::invalid_argument, [&] {
    run_op("Dropout", 13, {x, Tensor::scalar<float>(1.0f), Tensor::scalar<bool>(true)});
  });
  EXPECT_EQ(values<int64_t>(run_op("Constant", 13, {}, {{"value_ints", attr_ints({3, 4})}})[0]), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(values<float>(run_op("Constant", 13, {}, {{"value", attr_t(x)}})[0]), values<float>(x));
  error_of(ErrorCode::invalid_model, [] { run_op("Constant", 13, {}); });
  error_of(ErrorCode::unsupported, [] { run_op("Constant", 13, {}, {{"value_string", attr_s("a")}}); });
}

TEST(RefTensorShapeOps, CosineWindows) {
  // Periodic Hann of 4: 0.5 - 0.5 cos(pi n / 2); symmetric of 3 divides by 2 instead.
  expect_near_all(values<float>(run_op("HannWindow", 17, {Tensor::scalar<int32_t>(4)})[0]), {0, 0.5f, 1, 0.5f});
  expect_near_all(values<float>(run_op("HannWindow", 17, {Tensor::scalar<int64_t>(3)}, {{"periodic", attr_i(0)}})[0]), {0, 1, 0});
  // Blackman of 4: 0.42 - 0.5 cos(pi n / 2) + 0.08 cos(pi n).
  expect_near_all(values<float>(run_op("BlackmanWindow", 17, {Tensor::scalar<int32_t>(4)})[0]), {0, 0.34f, 1, 0.34f});
  const auto h = run_op("HammingWindow", 17, {Tensor::scalar<int32_t>(2)}, {{"output_datatype", attr_i(11)}});
  EXPECT_EQ(h[0].dtype(), DType::f64);
  EXPECT_NEAR(values<double>(h[0])[1], 25.0 / 46 + 21.0 / 46, 1e-12);
  error_of(ErrorCode::invalid_argument, [] { run_op("HannWindow", 17, {Tensor::scalar<int32_t>(-1)}); });
}

TEST(RefTensorMisc, NonMaxSuppressionGreedyByScore) {
  // Box 1 overlaps box 0 with IoU 0.9 / 1.1 and scores higher; box 2 is disjoint.
  const Tensor boxes = tensor<float>({1, 3, 4}, {0, 0, 1, 1, 0, 0.1f, 1, 1.1f, 0, 2, 1, 3});
  const Tensor scores = tensor<float>({1, 1, 3}, {0.9f, 0.95f, 0.5f});
  auto run = [&](int64_t max_out, float iou, std::optional<float> score) {
    std::vector<Tensor> in = {boxes, scores, i64s({max_out}), tensor<float>({1}, {iou})};
    if (score) in.push_back(tensor<float>({1}, {*score}));
    return run_op("NonMaxSuppression", 11, in)[0];
  };
  Tensor y = run(3, 0.5f, std::nullopt);
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  EXPECT_EQ(values<int64_t>(y), (std::vector<int64_t>{0, 0, 1, 0, 0, 2}));
  EXPECT_EQ(values<int64_t>(run(3, 0.9f, std::nullopt)), (std::vector<int64_t>{0, 0, 1, 0, 0, 0, 0, 0, 2}));
  EXPECT_EQ(values<int64_t>(run(3, 0.5f, 0.6f)), (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ(values<int64_t>(run(1, 0.5f, std::nullopt)), (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ(run(0, 0.5f, std::nullopt).shape(), (Shape{0, 3}));
  // The same boxes as (x_center, y_center, width, height).
  const Tensor centred = tensor<float>({1, 3, 4}, {0.5f, 0.5f, 1, 1, 0.6f, 0.5f, 1, 1, 2.5f, 0.5f, 1, 1});
  EXPECT_EQ(values<int64_t>(run_op("NonMaxSuppression", 11, {centred, scores, i64s({3}), tensor<float>({1}, {0.5f})},
                                   {{"center_point_box", attr_i(1)}})[0]),
            (std::vector<int64_t>{0, 0, 1, 0, 0, 2}));
  error_of(ErrorCode::invalid_argument, [&] { run_op("NonMaxSuppression", 11, {boxes, tensor<float>({1, 1, 2}, {1, 2})}); });
}

TEST(RefTensorMisc, NonMaxSuppressionEdgeCases) {
  const Tensor max_out = i64s({10}), iou = tensor<float>({1}, {0.5f});
  // No boxes at all.
  EXPECT_EQ(run_op("NonMaxSuppression", 11, {tensor<float>({1, 0, 4}, {}), tensor<float>({1, 1, 0}, {}), max_out, iou})[0].shape(),
            (Shape{0, 3}));
  // Every score at or below the threshold: nothing is selected.
  const Tensor boxes = tensor<float>({1, 3, 4}, {0, 0, 1, 1, 0, 0, 1, 1, 5, 5, 6, 6});
  EXPECT_EQ(run_op("NonMaxSuppression", 11, {boxes, tensor<float>({1, 1, 3}, {0.2f, 0.3f, 0.3f}), max_out, iou,
                                             tensor<float>({1}, {0.3f})})[0].shape(),
            (Shape{0, 3}));
  // Equal scores: the lower box index wins; its identical twin is suppressed.
  EXPECT_EQ(values<int64_t>(run_op("NonMaxSuppression", 11, {boxes, tensor<float>({1, 1, 3}, {0.7f, 0.7f, 0.7f}), max_out, iou})[0]),
            (std::vector<int64_t>{0, 0, 0, 0, 0, 2}));
  // IoU exactly at the threshold is kept (only a larger IoU suppresses): the second box is
  // half of the first, IoU 0.5.
  const Tensor half = tensor<float>({1, 2, 4}, {0, 0, 1, 2, 0, 0, 1, 1});
  EXPECT_EQ(values<int64_t>(run_op("NonMaxSuppression", 11, {half, tensor<float>({1, 1, 2}, {0.9f, 0.8f}), max_out, iou})[0]),
            (std::vector<int64_t>{0, 0, 0, 0, 0, 1}));
  // Two batches and two classes: rows go batch by batch, class by class, then by score.
  const Tensor boxes2 = tensor<float>({2, 2, 4}, {0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 1, 1, 2, 2, 3, 3});
  const Tensor scores2 = tensor<float>({2, 2, 2}, {0.1f, 0.9f, 0.8f, 0.2f, 0.5f, 0.6f, 0.7f, 0.4f});
  EXPECT_EQ(values<int64_t>(run_op("NonMaxSuppression", 11, {boxes2, scores2, i64s({1}), iou})[0]),
            (std::vector<int64_t>{0, 0, 1, 0, 1, 0, 1, 0, 1, 1, 1, 0}));
  EXPECT_EQ(error_of(ErrorCode::invalid_model, [&] {
              run_op("NonMaxSuppression", 11, {boxes, tensor<float>({1, 1, 3}, {1, 1, 1})}, {{"center_point_box", attr_i(2)}});
            }),
            "NonMaxSuppression node 'n0': center_point_box must be 0 or 1");
}

TEST(RefTensorMisc, ExtremeValuesGiveErrorsOrExactResultsNotOverflow) {
  const Tensor x = tensor<float>({4}, arange_f(4));
  // Steps far beyond the axis take one element.
  EXPECT_EQ(values<float>(run_op("Slice", 13, {x, i64s({-1}), i64s({INT64_MIN}), Tensor(), i64s({INT64_MIN})})[0]),
            (std::vector<float>{3}));
  EXPECT_EQ(values<float>(run_op("Slice", 13, {x, i64s({1}), i64s({INT64_MAX}), Tensor(), i64s({INT64_MAX})})[0]),
            (std::vector<float>{1}));
  error_of(ErrorCode::invalid_argument, [&] { run_op("Tile", 13, {x, i64s({INT64_MAX / 2})}); });
  error_of(ErrorCode::invalid_argument, [&] { run_op("Pad", 13, {x, i64s({INT64_MAX, 1})}); });
  error_of(ErrorCode::invalid_argument, [&] { run_op("Reshape", 13, {x, i64s({INT64_MAX, 4, -1})}); });
  error_of(ErrorCode::invalid_argument, [&] {
    run_op("OneHot", 11, {i64s({0}), Tensor::scalar<float>(1e30f), tensor<float>({2}, {0, 1})});
  });
  error_of(ErrorCode::invalid_model, [] {
    run_op("DepthToSpace", 13, {tensor<float>({1, 4, 1, 1}, arange_f(4))}, {{"blocksize", attr_i(INT64_MAX)}});
  });
  // The last value of an int32 Range sits next to INT32_MAX; the step past it is never taken.
  EXPECT_EQ(values<int32_t>(run_op("Range", 11, {Tensor::scalar<int32_t>(INT32_MAX - 3), Tensor::scalar<int32_t>(INT32_MAX),
                                                 Tensor::scalar<int32_t>(2)})[0]),
            (std::vector<int32_t>{INT32_MAX - 3, INT32_MAX - 1}));
  EXPECT_EQ(values<float>(run_op("EyeLike", 9, {tensor<float>({1, 2}, {0, 0})}, {{"k", attr_i(INT64_MAX)}})[0]),
            (std::vector<float>{0, 0}));
  // An empty tensor may not have dims whose product overflows (its strides would).
  const Tensor empty(DType::f32, {0});
  error_of(ErrorCode::invalid_argument, [&] {
    run_op("Reshape", 14, {empty, i64s({0, int64_t(1) << 40, int64_t(1) << 40})}, {{"allowzero", attr_i(1)}});
  });
  error_of(ErrorCode::invalid_argument, [&] { run_op("ConstantOfShape", 9, {i64s({0, int64_t(1) << 40, int64_t(1) << 40})}); });
  // Scalars have no axis to concatenate, split, slice, squeeze or gather along.
  const Tensor s = Tensor::scalar<float>(1);
  error_of(ErrorCode::invalid_argument, [&] { run_op("Concat", 13, {s, s}, {{"axis", attr_i(0)}}); });
  error_of(ErrorCode::invalid_argument, [&] { run_op("Split", 13, {s}, {}, 1); });
  error_of(ErrorCode::invalid_argument, [&] { run_op("Slice", 13, {s, i64s({0}), i64s({1})}); });
  error_of(ErrorCode::invalid_argument, [&] { run_op("Squeeze", 13, {s, i64s({0})}); });
  error_of(ErrorCode::invalid_argument, [&] { run_op("Gather", 13, {s, i64s({0})}); });
  error_of(ErrorCode::invalid_argument, [&] { run_op("Compress", 11, {s, tensor<bool>({1}, {true})}, {{"axis", attr_i(0)}}); });
}

}  // namespace
}  // namespace slim
