#include "slim/serve/canary.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "slim/core/error.h"

using namespace slim;
using namespace slim::serve;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

ModelConfig config(std::map<std::string, std::string> parameters) {
  ModelConfig c;
  c.name = "digits";
  c.parameters = std::move(parameters);
  return c;
}

}  // namespace

TEST(CanaryCompare, Top1AgreementOfScoresAndLabels) {
  // Four rows of three scores; the new version's argmax differs in row 2 only.
  const Tensor old_p =
      Tensor::from_vector<float>({4, 3}, {.7f, .2f, .1f, .1f, .8f, .1f, .3f, .3f, .4f, 0, 0, 1});
  const Tensor new_p = Tensor::from_vector<float>(
      {4, 3}, {.6f, .3f, .1f, .2f, .7f, .1f, .5f, .3f, .2f, 0, .1f, .9f});
  OutputAgreement a = compare_outputs({{"probabilities", old_p}}, {{"probabilities", new_p}});
  EXPECT_EQ(a.rows, 4);
  ASSERT_TRUE(a.top1_agreement);
  EXPECT_DOUBLE_EQ(*a.top1_agreement, 0.75);
  EXPECT_EQ(a.top1_output, "probabilities");
  EXPECT_FALSE(a.max_abs_diff);
  CanaryPolicy p;
  EXPECT_EQ(disagreement(a, p),
            "its outputs disagree with the serving version's on the reference inputs: top-1 "
            "agreement 0.75 on output "
            "'probabilities' is below 0.99");
  p.min_top1_agreement = 0.75;
  EXPECT_EQ(disagreement(a, p), "");

  // Scores behind dims of 1 ([rows, 1, C]) and integer labels are classifier outputs too;
  // the lowest agreement of them counts.
  const Tensor labels_old = Tensor::from_vector<int64_t>({4}, {3, 1, 4, 1});
  const Tensor labels_new = Tensor::from_vector<int64_t>({4}, {3, 1, 5, 9});
  a = compare_outputs({{"scores", old_p.reshape({4, 1, 3})}, {"label", labels_old}},
                      {{"label", labels_new}, {"scores", new_p.reshape({4, 1, 3})}});
  EXPECT_DOUBLE_EQ(*a.top1_agreement, 0.5);
  EXPECT_EQ(a.top1_output, "label");
}

TEST(CanaryCompare, MaxAbsDiffOfOtherOutputs) {
  // Non-batching outputs stacked by row ([rows, 2, 3]) and a regression's [rows, 1].
  const Tensor y_old =
      Tensor::from_vector<float>({2, 2, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  Tensor y_new = y_old.clone();
  y_new.data<float>()[4] += 0.25f;
  const Tensor r = Tensor::from_vector<double>({2, 1}, {0.5, -1});
  OutputAgreement a =
      compare_outputs({{"y", y_old}, {"r", r}, {"only_old", r}}, {{"r", r}, {"y", y_new}});
  EXPECT_FALSE(a.top1_agreement);
  ASSERT_TRUE(a.max_abs_diff);
  EXPECT_DOUBLE_EQ(*a.max_abs_diff, 0.25);
  EXPECT_EQ(a.diff_output, "y");
  CanaryPolicy p;
  EXPECT_EQ(disagreement(a, p),
            "its outputs disagree with the serving version's on the reference inputs: max abs diff "
            "0.25 on output "
            "'y' is above 0.001");
  p.reference_file = "reference.npz";
  EXPECT_EQ(
      agreement_json(a, p).dump(),
      R"({"file":"reference.npz","max_abs_diff":{"max":0.001,"measured":0.25,"output":"y"},"rows":2})");
  p.max_abs_diff = 0.25;
  EXPECT_EQ(disagreement(a, p), "");

  // A NaN against a number is as far off as can be; NaN against NaN agrees.
  Tensor nan_old = Tensor::from_vector<float>({2, 1}, {NAN, NAN}),
         nan_new = Tensor::from_vector<float>({2, 1}, {NAN, 1});
  EXPECT_TRUE(std::isinf(*compare_outputs({{"r", nan_old}}, {{"r", nan_new}}).max_abs_diff));
  EXPECT_EQ(*compare_outputs({{"r", nan_old}}, {{"r", nan_old}}).max_abs_diff, 0);
}

TEST(CanaryCompare, ShapeMismatchAndNothingSharedAreErrors) {
  const Tensor a = Tensor(DType::f32, {4, 3}), b = Tensor(DType::f32, {4, 2});
  EXPECT_EQ(error_of([&] {
              compare_outputs({{"probabilities", a}}, {{"probabilities", b}});
            }),
            "output 'probabilities' has shape [4,2] in the new version, [4,3] in the serving one");
  EXPECT_EQ(error_of([&] {
              compare_outputs({{"probabilities", a}}, {{"logits", a}});
            }),
            "the two versions have no output in common");
}

TEST(CanaryCompare, ChunksAndStacksRows) {
  const Tensor x = Tensor::from_vector<float>({5, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  const std::vector<NamedTensors> batched = reference_chunks({{"x", x}}, 2);
  ASSERT_EQ(batched.size(), 3u);
  EXPECT_EQ(batched[2][0].second.shape(), (Shape{1, 2}));
  EXPECT_EQ(batched[2][0].second.data<float>()[1], 9);
  const NamedTensors back = stack_chunks(batched, true);
  EXPECT_EQ(back[0].second.shape(), (Shape{5, 2}));
  EXPECT_EQ(back[0].second.data<float>()[7], 7);

  // A model that does not batch gets each row without its sample axis.
  const std::vector<NamedTensors> rows = reference_chunks({{"x", x}}, 0);
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[3][0].second.shape(), (Shape{2}));
  EXPECT_EQ(rows[3][0].second.data<float>()[0], 6);
  EXPECT_EQ(stack_chunks(rows, false)[0].second.shape(), (Shape{5, 2}));
}

TEST(CanaryPolicy, ReadsBoundsAndRefusesBadOnes) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / "slim_canary_policy_test").string();
  std::filesystem::create_directories(dir);
  CanaryPolicy p = canary_policy(config({{"canary_share", "0.25"}}), dir);
  EXPECT_EQ(p.share, 0.25);
  EXPECT_EQ(p.min_top1_agreement, 0.99);
  EXPECT_EQ(p.max_abs_diff, 1e-3);
  EXPECT_TRUE(p.reference.empty());
  EXPECT_EQ(error_of([&] {
              canary_policy(config({{"canary_share", "2"}}), dir);
            }),
            "model 'digits': parameter 'canary_share' must be a number from 0 to 1, not '2'");
  EXPECT_EQ(
      error_of([&] {
        canary_policy(config({{"canary_reference", "r.npz"}, {"canary_max_abs_diff", "-1"}}), dir);
      }),
      "model 'digits': parameter 'canary_max_abs_diff' must be a number from 0 to inf, not '-1'");
  EXPECT_EQ(error_of([&] {
              canary_policy(config({{"canary_min_top1_agreement", "0.9"}}), dir);
            }),
            "model 'digits': parameters 'canary_min_top1_agreement' and 'canary_max_abs_diff' need "
            "a reference set "
            "(parameter 'canary_reference')");
  EXPECT_EQ(error_of([&] {
              canary_policy(config({{"canary_reference", "../other/r.npz"}}), dir);
            }),
            "model 'digits': parameter 'canary_reference' (../other/r.npz): must name a file "
            "inside the model's folder");
  EXPECT_EQ(error_of([&] {
              canary_policy(config({{"canary_reference", "missing.npz"}}), dir);
            }),
            "model 'digits': parameter 'canary_reference' (missing.npz): " + dir +
                "/missing.npz: cannot open");
  std::ofstream(dir + "/garbage.npz") << "this is not a zip archive at all";
  EXPECT_EQ(error_of([&] {
              canary_policy(config({{"canary_reference", "garbage.npz"}}), dir);
            }),
            "model 'digits': parameter 'canary_reference' (garbage.npz): " + dir +
                "/garbage.npz: not an .npz file (no zip directory)");
  try {
    canary_policy(config({{"canary_reference", "missing.npz"}}), dir);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_model);
  }
}
