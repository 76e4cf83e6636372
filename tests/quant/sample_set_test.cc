// Calibration data readers: .npy folders, .npz archives and image folders, and the
// messages for data that does not fit the model.
#include "slim/quant/sample_set.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "forest/forest_fixtures.h"
#include "slim/core/npy.h"

using namespace slim;
using namespace slim::quant;
using slim::forest::testing::env_or;
using slim::forest::testing::fixture_dir;
namespace fs = std::filesystem;

namespace {

std::string fixtures() {
  return fixture_dir("quant_fixtures.py");
}

fs::path scratch(const std::string& name) {
  return slim::forest::testing::scratch_dir("quant_samples_" + name);
}

ValueInfo input(const std::string& name, DType dt, std::vector<Dim> dims) {
  return ValueInfo{name, dt, dims, ""};
}
Dim fixed(int64_t v) {
  return Dim{v, ""};
}
Dim sym(const char* p) {
  return Dim{-1, p};
}

Tensor filled(Shape s, float v = 1.0f) {
  Tensor t(DType::f32, s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = v + float(i);
  return t;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << e.what();
    return e.what();
  }
  return "(no error)";
}

const std::vector<ValueInfo> kInputs = {input("x", DType::f32, {sym("n"), fixed(3), fixed(2)}),
                                        input("mask", DType::i64, {sym("n"), fixed(2)}),
                                        input("temp", DType::f32, {})};

}  // namespace

TEST(SampleSet, NpyFolderBatches) {
  const fs::path d = scratch("npy");
  write_npy((d / "x.npy").string(), filled({5, 3, 2}));
  write_npy((d / "mask.npy").string(), Tensor(DType::i64, {5, 2}));
  write_npy((d / "temp.npy").string(), Tensor::scalar<float>(0.5f));
  const SampleSet s = SampleSet::open(d.string(), kInputs);
  EXPECT_EQ(s.size(), 5);
  EXPECT_EQ(s.digest().size(), 64u);
  const auto b = s.batch(3, 5);
  EXPECT_EQ(b.at("x").shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(b.at("x").data<float>()[0], 1.0f + 18);
  EXPECT_EQ(b.at("mask").shape(), (Shape{2, 2}));
  EXPECT_EQ(b.at("temp").rank(), 0);
  // The same data gives the same digest; other data another one.
  EXPECT_EQ(SampleSet::open(d.string(), kInputs).digest(), s.digest());
  write_npy((d / "x.npy").string(), filled({5, 3, 2}, 2.0f));
  EXPECT_NE(SampleSet::open(d.string(), kInputs).digest(), s.digest());
}

TEST(SampleSet, NpzArchive) {
  const fs::path d = scratch("npz");
  // numpy.savez writes a stored zip of NAME.npy members; build one from encode_npy.
  const std::string path = (d / "calib.npz").string();
  ASSERT_EQ(
      std::system(
          ("cd " + d.string() +
           " && /usr/bin/python3 -c \"import numpy as np; "
           "np.savez('calib.npz', x=np.ones((4,3,2),np.float32), mask=np.zeros((4,2),np.int64), "
           "temp=np.float32(1))\"")
              .c_str()),
      0);
  const SampleSet s = SampleSet::open(path, kInputs);
  EXPECT_EQ(s.size(), 4);
  EXPECT_EQ(s.batch(0, 4).at("x").shape(), (Shape{4, 3, 2}));
  ASSERT_EQ(std::system(
                ("cd " + d.string() +
                 " && /usr/bin/python3 -c \"import numpy as np; "
                 "np.savez('bad.npz', x=np.ones((4,3,2),np.float32), y=np.zeros((4,2),np.int64))\"")
                    .c_str()),
            0);
  EXPECT_EQ(error_of([&] { SampleSet::open((d / "bad.npz").string(), kInputs); }),
            (d / "bad.npz").string() +
                ": member 'y' is not an input of the model (inputs: x, mask, temp)");
}

TEST(SampleSet, BadDataIsNamed) {
  const fs::path d = scratch("bad");
  EXPECT_EQ(error_of([&] { SampleSet::open(d.string(), kInputs); }),
            d.string() + ": empty (no .npy files, no PNG or JPEG images)");
  write_npy((d / "x.npy").string(), filled({5, 3, 2}));
  write_npy((d / "temp.npy").string(), Tensor::scalar<float>(0.5f));
  EXPECT_EQ(error_of([&] { SampleSet::open(d.string(), kInputs); }),
            d.string() + ": no data for the model's input 'mask' i64[n,2] (a file mask.npy)");
  write_npy((d / "mask.npy").string(), Tensor(DType::i32, {5, 2}));
  EXPECT_EQ(error_of([&] { SampleSet::open(d.string(), kInputs); }),
            (d / "mask.npy").string() + ": i32 values, but the model's input 'mask' is i64");
  write_npy((d / "mask.npy").string(), Tensor(DType::i64, {4, 2}));
  EXPECT_EQ(error_of([&] { SampleSet::open(d.string(), kInputs); }),
            d.string() + ": " + (d / "mask.npy").string() + " has 4 samples, " +
                (d / "x.npy").string() + " has 5");
  write_npy((d / "mask.npy").string(), Tensor(DType::i64, {5, 3}));
  EXPECT_EQ(error_of([&] { SampleSet::open(d.string(), kInputs); }),
            (d / "mask.npy").string() +
                ": shape [5,3] does not fit the model's input 'mask' i64[n,2] (dim 1)");
  write_npy((d / "mask.npy").string(), Tensor(DType::i64, {5}));
  EXPECT_EQ(error_of([&] { SampleSet::open(d.string(), kInputs); }),
            (d / "mask.npy").string() +
                ": shape [5] has rank 1, the model's input 'mask' is i64[n,2] (samples stack "
                "along the first axis)");
  write_npy((d / "mask.npy").string(), Tensor(DType::i64, {5, 2}));
  write_npy((d / "temp.npy").string(), Tensor(DType::f32, {5}));
  EXPECT_EQ(error_of([&] { SampleSet::open(d.string(), kInputs); }),
            (d / "temp.npy").string() +
                ": shape [5], but the model's input 'temp' is a scalar (give a 0-d array, "
                "used for every sample)");
  write_npy((d / "temp.npy").string(), Tensor::scalar<float>(1));
  write_npy((d / "y.npy").string(), filled({5, 3, 2}));
  EXPECT_EQ(error_of([&] { SampleSet::open(d.string(), kInputs); }),
            (d / "y.npy").string() + ": 'y' is not an input of the model (inputs: x, mask, temp)");
  fs::remove(d / "y.npy");
  write_npy((d / "x.npy").string(), filled({0, 3, 2}));
  EXPECT_EQ(error_of([&] { SampleSet::open(d.string(), kInputs); }),
            (d / "x.npy").string() + ": no samples (first dim 0)");
  std::ofstream((d / "x.npy").string()) << "not numpy";
  EXPECT_NE(error_of([&] { SampleSet::open(d.string(), kInputs); }).find((d / "x.npy").string()),
            std::string::npos);
  try {
    SampleSet::open((d / "missing").string(), kInputs);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::not_found);
    EXPECT_EQ(std::string(e.what()), (d / "missing").string() + ": no such file or folder");
  }
}

TEST(SampleSet, ImagesDecodeAndPreprocessLikeNumpy) {
  const std::string d = fixtures() + "/images", ref = fixtures() + "/images_ref";
  for (int i = 0; i < 3; ++i) {
    const std::string ext = i == 2 ? ".jpg" : ".png";
    const Tensor rgb = decode_image(d + "/img" + std::to_string(i) + ext);
    const Tensor want = read_npy(ref + "/img" + std::to_string(i) + "_rgb.npy");
    ASSERT_EQ(rgb.shape(), want.shape());
    int64_t off = 0;
    for (int64_t k = 0; k < rgb.numel(); ++k)
      off += std::abs(int(rgb.data<uint8_t>()[k]) - int(want.data<uint8_t>()[k]));
    // PIL decodes JPEG with libjpeg-turbo too; the DCT method may differ by a unit.
    EXPECT_LE(off, ext == ".png" ? 0 : rgb.numel()) << ext;
  }
  const std::vector<ValueInfo> in = {
      input("image", DType::f32, {sym("n"), fixed(3), sym("h"), sym("w")})};
  const SampleSet s = SampleSet::open(d, in);
  ASSERT_EQ(s.size(), 3);
  const Tensor got = s.batch(0, 3).at("image");
  const Tensor want = read_npy(ref + "/expected.npy");
  ASSERT_EQ(got.shape(), want.shape());
  for (int64_t k = 0; k < got.numel(); ++k)
    ASSERT_NEAR(got.data<float>()[k], want.data<float>()[k], k < 2 * got.numel() / 3 ? 1e-4 : 0.1)
        << k;

  const std::vector<ValueInfo> two = {in[0], input("y", DType::f32, {fixed(1)})};
  EXPECT_EQ(error_of([&] { SampleSet::open(d, two); }),
            d + ": images feed one input; the model has 2 (name it in the preprocessing spec's "
                "\"input\") (inputs: image, y)");
  const std::vector<ValueInfo> gray = {
      input("image", DType::f32, {sym("n"), fixed(1), fixed(12), fixed(20)})};
  EXPECT_EQ(error_of([&] { SampleSet::open(d, gray); }),
            d + ": preprocessed images are 12x20x3 (nchw), the model's 'image' is f32[n,1,12,20]");
  const fs::path bad = scratch("img");
  std::ofstream((bad / "a.png").string()) << "not a png";
  std::ofstream((bad / "preprocess.json").string()) << R"({"size": [4, 4], "colour": "rgb"})";
  EXPECT_EQ(
      error_of([&] { SampleSet::open(bad.string(), in); }),
      (bad / "preprocess.json").string() +
          ": unknown key 'colour' (input, size, resize, pad, scale, mean, std, layout, color)");
  std::ofstream((bad / "preprocess.json").string()) << R"({"size": [4, 4]})";
  const SampleSet broken = SampleSet::open(bad.string(), in);
  EXPECT_EQ(error_of([&] { broken.batch(0, 1); }),
            (bad / "a.png").string() + ": not a PNG or JPEG image");
}
