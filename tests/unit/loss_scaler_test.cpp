// The fp16 loss scaler against hand-derived DeepSpeed DynamicLossScaler behaviour.
#include "precision/loss_scaler.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "anvil/error.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;

LossScalerConfig dyn(int power, int window, int hysteresis, bool consecutive = false, double min_scale = 1) {
  LossScalerConfig c;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.consecutive_hysteresis = consecutive;
  c.min_loss_scale = min_scale;
  return c;
}

// Runs `pattern` ('O' overflow, 'C' clean) and returns the scale after each step.
std::vector<double> run(LossScaler& s, const std::string& pattern, int64_t first_step = 1) {
  std::vector<double> scales;
  int64_t step = first_step;
  for (const char ch : pattern) {
    const double before = s.scale();
    const LossScaler::Update u = s.update(ch == 'O', step++);
    EXPECT_EQ(u.skip, ch == 'O');
    EXPECT_EQ(u.old_scale, before);
    EXPECT_EQ(u.new_scale, s.scale());
    EXPECT_EQ(u.message.empty(), ch == 'C');
    scales.push_back(s.scale());
  }
  return scales;
}

using V = std::vector<double>;

TEST(LossScaler, DefaultsAreDeepSpeeds) {
  const LossScalerConfig c;
  EXPECT_EQ(c.loss_scale, 0);
  EXPECT_EQ(c.initial_scale_power, 16);
  EXPECT_EQ(c.loss_scale_window, 1000);
  EXPECT_EQ(c.hysteresis, 2);
  EXPECT_FALSE(c.consecutive_hysteresis);
  EXPECT_EQ(c.min_loss_scale, 1);
  LossScaler s(c);
  EXPECT_TRUE(s.dynamic());
  EXPECT_EQ(s.scale(), 65536);
  EXPECT_EQ(s.cur_hysteresis(), 2);
  EXPECT_EQ(s.cur_iter(), 0);
  EXPECT_EQ(s.last_overflow_iter(), -1);
}

// No overflow: the first growth comes when (cur_iter - last_overflow_iter - 1) reaches the window, i.e.
// at the (window+1)-th update (last_overflow_iter starts at -1), then every `window` updates.
TEST(LossScaler, GrowsAfterWindowOfCleanSteps) {
  LossScaler s(dyn(8, 2, 2));
  EXPECT_EQ(run(s, "CCCCCCCCCC"), (V{256, 256, 512, 512, 1024, 1024, 2048, 2048, 4096, 4096}));
  EXPECT_EQ(s.cur_iter(), 10);
  EXPECT_EQ(s.skipped_steps(), 0);

  LossScaler w(dyn(4, 3, 1));
  EXPECT_EQ(run(w, "CCCCCCC"), (V{16, 16, 16, 32, 32, 32, 64}));
}

// Hysteresis 1: every overflow halves; after an overflow, the (window+1)-th clean step doubles.
TEST(LossScaler, Hysteresis1) {
  LossScaler s(dyn(8, 2, 1));
  EXPECT_EQ(run(s, "OO"), (V{128, 64}));
  EXPECT_EQ(run(s, "CCC", 3), (V{64, 64, 128}));
  EXPECT_EQ(run(s, "O", 6), (V{64}));
  EXPECT_EQ(s.cur_iter(), 6);
  EXPECT_EQ(s.last_overflow_iter(), 5);
  EXPECT_EQ(s.skipped_steps(), 3);

  LossScaler t(dyn(4, 3, 1));
  EXPECT_EQ(run(t, "OCCCCCCC"), (V{8, 8, 8, 8, 16, 16, 16, 32}));
}

// Hysteresis N: the first N-1 overflows are absorbed; a decrease does not refill it, so each further
// overflow halves (DeepSpeed's behaviour).
TEST(LossScaler, HysteresisAbsorbsThenHalves) {
  LossScaler s(dyn(8, 1000, 3));
  EXPECT_EQ(run(s, "OOOO"), (V{256, 256, 128, 64}));
  EXPECT_EQ(s.cur_hysteresis(), 1);

  LossScaler t(dyn(8, 1000, 2));
  EXPECT_EQ(run(t, "OCOCOCO"), (V{256, 256, 128, 128, 64, 64, 32}));
  EXPECT_EQ(t.skipped_steps(), 4);
}

TEST(LossScaler, ConsecutiveHysteresisRefillsOnEveryCleanStep) {
  LossScaler s(dyn(8, 1000, 2, /*consecutive=*/true));
  EXPECT_EQ(run(s, "OCOCOCO"), (V{256, 256, 256, 256, 256, 256, 256}));
  EXPECT_EQ(s.cur_hysteresis(), 1);
  EXPECT_EQ(run(s, "O", 8), (V{128}));  // two in a row exhaust it
  EXPECT_EQ(run(s, "C", 9), (V{128}));
  EXPECT_EQ(s.cur_hysteresis(), 2);
}

// Without consecutive_hysteresis the hysteresis is refilled only when the scale grows.
TEST(LossScaler, WindowGrowthRefillsHysteresis) {
  LossScaler s(dyn(4, 2, 2));
  EXPECT_EQ(run(s, "OCCCOO"), (V{16, 16, 16, 32, 32, 16}));
  LossScaler c(dyn(4, 2, 2, /*consecutive=*/true));
  EXPECT_EQ(run(c, "OCCCOO"), (V{16, 16, 16, 32, 32, 16}));
  // Without the refill (consecutive off, no growth yet) the second overflow would halve at once.
  LossScaler n(dyn(4, 100, 2));
  EXPECT_EQ(run(n, "OCCCOO"), (V{16, 16, 16, 16, 8, 4}));
}

TEST(LossScaler, MinScaleClamps) {
  LossScaler s(dyn(4, 1000, 1, false, 3));
  EXPECT_EQ(run(s, "OOOO"), (V{8, 4, 3, 3}));
  LossScaler f(dyn(0, 1000, 1, false, 0.25));
  EXPECT_EQ(run(f, "OOO"), (V{0.5, 0.25, 0.25}));
}

TEST(LossScaler, StaticScaleNeverChangesButSkips) {
  LossScalerConfig c;
  c.loss_scale = 128;
  LossScaler s(c);
  EXPECT_FALSE(s.dynamic());
  EXPECT_EQ(s.scale(), 128);
  EXPECT_EQ(run(s, "OCCCCOCCCCCCCCC"), V(15, 128));
  EXPECT_EQ(s.skipped_steps(), 2);
  const LossScaler::Update u = s.update(true, 16);
  EXPECT_TRUE(u.skip);
  EXPECT_EQ(u.message, "OVERFLOW: skipping step 16, loss scale 128 -> 128");
}

TEST(LossScaler, OverflowMessage) {
  LossScaler s(dyn(16, 1000, 1));
  LossScaler::Update u = s.update(true, 7);
  EXPECT_EQ(u.message, "OVERFLOW: skipping step 7, loss scale 65536 -> 32768");
  EXPECT_EQ(u.old_scale, 65536);
  EXPECT_EQ(u.new_scale, 32768);
  u = s.update(false, 8);
  EXPECT_FALSE(u.skip);
  EXPECT_TRUE(u.message.empty());

  LossScaler h(dyn(16, 1000, 2));
  EXPECT_EQ(h.update(true, 1).message, "OVERFLOW: skipping step 1, loss scale 65536 -> 65536");
  EXPECT_EQ(h.update(true, 2).message, "OVERFLOW: skipping step 2, loss scale 65536 -> 32768");

  LossScaler f(dyn(0, 1000, 1, false, 0.125));
  EXPECT_EQ(f.update(true, 3).message, "OVERFLOW: skipping step 3, loss scale 1 -> 0.5");
  EXPECT_EQ(f.update(true, 4).message, "OVERFLOW: skipping step 4, loss scale 0.5 -> 0.25");

  EXPECT_EQ(format_loss_scale(4294967296.0), "4294967296");
  EXPECT_EQ(format_loss_scale(0.125), "0.125");
  EXPECT_EQ(format_loss_scale(1.5), "1.5");
}

std::string stuck_error(LossScaler& s, const std::string& pattern, int64_t* thrown_at) {
  int64_t step = 1;
  *thrown_at = 0;
  for (const char ch : pattern) {
    try {
      s.update(ch == 'O', step);
    } catch (const Error& e) {
      *thrown_at = step;
      return e.what();
    }
    ++step;
  }
  return "";
}

TEST(LossScaler, StuckAtMinimumScaleAborts) {
  LossScalerConfig c = dyn(4, 1000, 1, false, 4);
  c.max_overflows_at_min_scale = 3;
  // 16 -> 8 -> 4 (not at the minimum yet), then three overflows at 4: the third throws.
  {
    LossScaler s(c);
    int64_t at = 0;
    const std::string e = stuck_error(s, "OOOOOOOO", &at);
    EXPECT_EQ(at, 5);
    EXPECT_NE(e.find("stuck skipping steps at the minimum loss scale"), std::string::npos) << e;
    EXPECT_NE(e.find("3 consecutive steps overflowed at loss scale 4"), std::string::npos) << e;
    EXPECT_NE(e.find("step 5"), std::string::npos) << e;
    EXPECT_NE(e.find("5 steps skipped"), std::string::npos) << e;
    EXPECT_NE(e.find("--bf16"), std::string::npos) << e;
    EXPECT_NE(e.find("learning rate"), std::string::npos) << e;
    EXPECT_NE(e.find("data"), std::string::npos) << e;
  }
  {  // Not before: two at the minimum are fine.
    LossScaler s(c);
    int64_t at = 0;
    EXPECT_EQ(stuck_error(s, "OOOO", &at), "");
    EXPECT_EQ(s.overflows_at_min_scale(), 2);
  }
  {  // A clean step resets the count.
    LossScaler s(c);
    int64_t at = 0;
    EXPECT_EQ(stuck_error(s, "OOOOCOOCOO", &at), "");
    EXPECT_EQ(s.overflows_at_min_scale(), 2);
    EXPECT_EQ(s.skipped_steps(), 8);
    EXPECT_THROW(s.update(true, 11), Error);
  }
  {  // With hysteresis, overflows at the minimum count whether or not they spend hysteresis.
    LossScalerConfig h = dyn(0, 1000, 2, false, 1);
    h.max_overflows_at_min_scale = 2;
    LossScaler s(h);
    int64_t at = 0;
    stuck_error(s, "OOOO", &at);
    EXPECT_EQ(at, 2);
  }
  {  // Static scale: consecutive overflows at the (fixed) scale.
    LossScalerConfig st;
    st.loss_scale = 1024;
    st.max_overflows_at_min_scale = 2;
    LossScaler s(st);
    int64_t at = 0;
    const std::string e = stuck_error(s, "OCOO", &at);
    EXPECT_EQ(at, 4);
    EXPECT_NE(e.find("static loss scale"), std::string::npos) << e;
    EXPECT_NE(e.find("--bf16"), std::string::npos) << e;
  }
  {  // Default: 20.
    LossScaler s(dyn(0, 1000, 1));
    int64_t at = 0;
    stuck_error(s, std::string(30, 'O'), &at);
    EXPECT_EQ(at, 20);
  }
}

TEST(LossScaler, StateRoundTripResumesExactly) {
  const LossScalerConfig c = dyn(6, 3, 2);
  const std::string before = "OCCCCOOCCCCCCOCOCC";
  const std::string after = "CCCOCCCCOOOCCCCCCCCOC";
  LossScaler straight(c);
  run(straight, before);
  // Through text, as a checkpoint stores it.
  const json saved = json::parse(straight.state().dump());
  LossScaler resumed(c);
  resumed.load_state(saved, "trainer_state.json");
  EXPECT_EQ(resumed.state(), straight.state());
  EXPECT_EQ(run(resumed, after), run(straight, after));
  EXPECT_EQ(resumed.state(), straight.state());
  EXPECT_EQ(resumed.skipped_steps(), straight.skipped_steps());
  EXPECT_EQ(resumed.cur_hysteresis(), straight.cur_hysteresis());
  EXPECT_EQ(resumed.overflows_at_min_scale(), straight.overflows_at_min_scale());

  // Hysteresis partly spent survives the round trip.
  LossScaler h(dyn(8, 100, 3));
  h.update(true, 1);
  LossScaler h2(dyn(8, 100, 3));
  h2.load_state(h.state(), "x");
  EXPECT_EQ(h2.cur_hysteresis(), 2);
  EXPECT_EQ(run(h2, "OO", 2), (V{256, 128}));

  // A static config keeps its scale but restores the counters.
  LossScalerConfig st;
  st.loss_scale = 32;
  LossScaler s(st);
  s.load_state(saved, "x");
  EXPECT_EQ(s.scale(), 32);
  EXPECT_EQ(s.skipped_steps(), straight.skipped_steps() - 5);  // `after` has 5 overflows
}

TEST(LossScaler, LoadStateErrorsNameTheSource) {
  LossScaler s{LossScalerConfig{}};
  const json good = s.state();
  test::expect_error([&] { s.load_state(json::array(), "ck/trainer_state.json"); },
                     {"ck/trainer_state.json", "JSON object"});
  json missing = good;
  missing.erase("cur_hysteresis");
  test::expect_error([&] { s.load_state(missing, "ck"); }, {"ck", "'cur_hysteresis'"});
  json bad = good;
  bad["cur_scale"] = -1;
  test::expect_error([&] { s.load_state(bad, "ck"); }, {"ck", "'cur_scale'", "-1"});
  bad = good;
  bad["cur_iter"] = "3";
  test::expect_error([&] { s.load_state(bad, "ck"); }, {"'cur_iter'", "\"3\""});
  bad = good;
  bad["cur_iter"] = 4;
  bad["last_overflow_iter"] = 4;
  test::expect_error([&] { s.load_state(bad, "ck"); }, {"'last_overflow_iter' (4)", "'cur_iter' (4)"});
  // Nothing changed by the failed loads.
  EXPECT_EQ(s.state(), good);
}

TEST(LossScaler, ConfigValidationNamesKeyAndValue) {
  auto err = [](auto mutate, std::initializer_list<std::string> needles) {
    LossScalerConfig c;
    mutate(c);
    test::expect_error([&] { LossScaler s(c); }, needles);
    test::expect_error([&] { c.validate("cfg.json"); }, needles);
  };
  err([](LossScalerConfig& c) { c.loss_scale = -2; }, {"loss_scale", "-2"});
  err([](LossScalerConfig& c) { c.initial_scale_power = 64; }, {"initial_scale_power", "64"});
  err([](LossScalerConfig& c) { c.initial_scale_power = -1; }, {"initial_scale_power", "-1"});
  err([](LossScalerConfig& c) { c.loss_scale_window = 0; }, {"loss_scale_window", "got 0"});
  err([](LossScalerConfig& c) { c.hysteresis = 0; }, {"hysteresis must be >= 1", "got 0"});
  err([](LossScalerConfig& c) { c.min_loss_scale = 0; }, {"min_loss_scale must be > 0", "got 0"});
  err([](LossScalerConfig& c) { c.min_loss_scale = 1e9; }, {"min_loss_scale (1000000000)", "65536"});
  err([](LossScalerConfig& c) { c.max_overflows_at_min_scale = 0; }, {"max_overflows_at_min_scale", "got 0"});
  test::expect_error(
      [] {
        LossScalerConfig c;
        c.hysteresis = 0;
        c.validate("cfg.json");
      },
      {"cfg.json: hysteresis"});
  // A static scale ignores the dynamic settings' relation (min above the initial scale is fine).
  LossScalerConfig st;
  st.loss_scale = 8;
  st.min_loss_scale = 1e9;
  EXPECT_NO_THROW(LossScaler{st});
}

}  // namespace
}  // namespace anvil
