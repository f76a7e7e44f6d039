// Learning-rate schedules against hand-computed values with Hugging Face semantics: the rate of
// 0-based step s is base * lambda(s), warmup lambda = s / warmup, decay progress measured from the end
// of warmup to total_steps.
#include "optim/lr_schedule.hpp"

#include <gtest/gtest.h>

#include <string>

#include "anvil/error.hpp"

namespace anvil {
namespace {

// base 2, 10 warmup steps, 110 steps in all: the decay spans steps 10..110 (100 steps).
constexpr double kBase = 2.0;
constexpr int64_t kWarmup = 10, kTotal = 110;

double lr(LrSchedule s, int64_t step) {
  return lr_at(s, kBase, step, kWarmup, kTotal);
}

TEST(LrSchedule, Constant) {
  for (int64_t step : {0, 5, 10, 60, 110}) EXPECT_DOUBLE_EQ(lr(LrSchedule::Constant, step), 2.0) << step;
}

TEST(LrSchedule, ConstantWithWarmup) {
  EXPECT_DOUBLE_EQ(lr(LrSchedule::ConstantWithWarmup, 0), 0.0);  // HF starts warmup at 0, not base/warmup
  EXPECT_DOUBLE_EQ(lr(LrSchedule::ConstantWithWarmup, 5), 1.0);
  EXPECT_DOUBLE_EQ(lr(LrSchedule::ConstantWithWarmup, 9), 1.8);
  EXPECT_DOUBLE_EQ(lr(LrSchedule::ConstantWithWarmup, 10), 2.0);
  EXPECT_DOUBLE_EQ(lr(LrSchedule::ConstantWithWarmup, 60), 2.0);
  EXPECT_DOUBLE_EQ(lr(LrSchedule::ConstantWithWarmup, 110), 2.0);
}

TEST(LrSchedule, Linear) {
  EXPECT_DOUBLE_EQ(lr(LrSchedule::Linear, 0), 0.0);
  EXPECT_DOUBLE_EQ(lr(LrSchedule::Linear, 5), 1.0);
  EXPECT_DOUBLE_EQ(lr(LrSchedule::Linear, 10), 2.0);
  EXPECT_DOUBLE_EQ(lr(LrSchedule::Linear, 35), 1.5);  // (110 - 35) / 100 = 0.75
  EXPECT_DOUBLE_EQ(lr(LrSchedule::Linear, 60), 1.0);  // halfway through the decay
  EXPECT_NEAR(lr(LrSchedule::Linear, 109), 0.02, 1e-12);
  EXPECT_DOUBLE_EQ(lr(LrSchedule::Linear, 110), 0.0);
  EXPECT_DOUBLE_EQ(lr(LrSchedule::Linear, 150), 0.0);  // clamped at 0 past the end
}

TEST(LrSchedule, Cosine) {
  EXPECT_DOUBLE_EQ(lr(LrSchedule::Cosine, 0), 0.0);
  EXPECT_DOUBLE_EQ(lr(LrSchedule::Cosine, 5), 1.0);
  EXPECT_DOUBLE_EQ(lr(LrSchedule::Cosine, 10), 2.0);
  EXPECT_NEAR(lr(LrSchedule::Cosine, 35), 1.7071067811865475, 1e-12);  // 1 + cos(pi/4)
  EXPECT_NEAR(lr(LrSchedule::Cosine, 60), 1.0, 1e-12);                 // 1 + cos(pi/2)
  EXPECT_NEAR(lr(LrSchedule::Cosine, 85), 0.2928932188134524, 1e-12);  // 1 + cos(3 pi/4)
  EXPECT_NEAR(lr(LrSchedule::Cosine, 110), 0.0, 1e-12);
}

TEST(LrSchedule, NoWarmupStartsAtBase) {
  for (LrSchedule s : {LrSchedule::ConstantWithWarmup, LrSchedule::Linear, LrSchedule::Cosine})
    EXPECT_DOUBLE_EQ(lr_at(s, kBase, 0, 0, 100), 2.0) << lr_schedule_name(s);
  EXPECT_DOUBLE_EQ(lr_at(LrSchedule::Linear, kBase, 50, 0, 100), 1.0);
  EXPECT_NEAR(lr_at(LrSchedule::Cosine, kBase, 50, 0, 100), 1.0, 1e-12);
}

TEST(LrSchedule, NamesRoundTrip) {
  for (LrSchedule s :
       {LrSchedule::Constant, LrSchedule::ConstantWithWarmup, LrSchedule::Linear, LrSchedule::Cosine})
    EXPECT_EQ(parse_lr_schedule(lr_schedule_name(s)), s);
  EXPECT_EQ(parse_lr_schedule("constant_with_warmup"), LrSchedule::ConstantWithWarmup);
}

TEST(LrSchedule, ParseErrorNamesTheBadValue) {
  for (const std::string bad : {"cosine_with_restarts", "Linear", "warmup", ""}) {
    try {
      parse_lr_schedule(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'" + bad + "'"), std::string::npos) << e.what();
      // ...and lists what is valid.
      EXPECT_NE(std::string(e.what()).find("cosine"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace anvil
