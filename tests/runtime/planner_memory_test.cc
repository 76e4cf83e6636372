#include <gtest/gtest.h>

#include <random>

#include "slim/core/error.h"
#include "slim/runtime/memory_planner.h"

using namespace slim;

namespace {

int64_t aligned(int64_t b) { return (b + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

// The property the session relies on: buffers alive at the same step never share a byte,
// every buffer is aligned and lies inside the arena.
void expect_valid(const std::vector<BufferRequest>& req, const MemoryPlan& plan) {
  ASSERT_EQ(plan.offsets.size(), req.size());
  int64_t total = 0;
  for (size_t i = 0; i < req.size(); ++i) {
    total += req[i].bytes;
    EXPECT_EQ(plan.offsets[i] % kArenaAlignment, 0) << "request " << i;
    EXPECT_GE(plan.offsets[i], 0);
    EXPECT_LE(plan.offsets[i] + req[i].bytes, plan.arena_bytes) << "request " << i;
    for (size_t j = i + 1; j < req.size(); ++j) {
      const bool live_together =
          req[i].first_step <= req[j].last_step && req[j].first_step <= req[i].last_step;
      if (!live_together || req[i].bytes == 0 || req[j].bytes == 0) continue;
      const bool disjoint = plan.offsets[i] + req[i].bytes <= plan.offsets[j] ||
                            plan.offsets[j] + req[j].bytes <= plan.offsets[i];
      EXPECT_TRUE(disjoint) << "requests " << i << " and " << j << " overlap at offsets "
                            << plan.offsets[i] << " and " << plan.offsets[j];
    }
  }
  EXPECT_EQ(plan.requested_bytes, total);
}

}  // namespace

TEST(MemoryPlanner, EmptyPlanHasNoArena) {
  const MemoryPlan plan = plan_memory({});
  EXPECT_EQ(plan.arena_bytes, 0);
  EXPECT_TRUE(plan.offsets.empty());
}

TEST(MemoryPlanner, ChainReusesTwoBuffers) {
  // a -> b -> c -> d -> e: each value is read only by the next step, so two buffers of
  // the largest size suffice.
  std::vector<BufferRequest> req;
  for (int s = 0; s < 5; ++s) req.push_back({1000, s, s + 1});
  const MemoryPlan plan = plan_memory(req);
  expect_valid(req, plan);
  EXPECT_EQ(plan.arena_bytes, 2 * aligned(1000));
  EXPECT_EQ(plan.offsets[0], plan.offsets[2]);
  EXPECT_EQ(plan.offsets[1], plan.offsets[3]);
}

TEST(MemoryPlanner, ValuesAliveTogetherGetDisjointRanges) {
  const std::vector<BufferRequest> req = {{100, 0, 3}, {200, 1, 2}, {300, 2, 3}};
  const MemoryPlan plan = plan_memory(req);
  expect_valid(req, plan);
  EXPECT_EQ(plan.arena_bytes, aligned(100) + aligned(200) + aligned(300));
}

TEST(MemoryPlanner, BestFitPicksTheSmallestHole) {
  // When E arrives, the long-lived A, G and H leave two holes: 1024 bytes where C was
  // and 512 where D was. Best fit takes the 512-byte hole (first fit would not).
  const std::vector<BufferRequest> req = {
      {1024, 0, 10},  // A
      {1024, 0, 4},   // C
      {640, 0, 10},   // G
      {512, 0, 4},    // D
      {256, 0, 10},   // H
      {100, 5, 6},    // E
  };
  const MemoryPlan plan = plan_memory(req);
  expect_valid(req, plan);
  EXPECT_EQ(plan.offsets[1], 1024);
  EXPECT_EQ(plan.offsets[3], 2688);
  EXPECT_EQ(plan.offsets[5], plan.offsets[3]);
  EXPECT_EQ(plan.arena_bytes, 1024 + 1024 + 640 + 512 + 256);
}

TEST(MemoryPlanner, ZeroByteBuffersTakeNoSpace) {
  const std::vector<BufferRequest> req = {{0, 0, 5}, {64, 0, 5}};
  const MemoryPlan plan = plan_memory(req);
  expect_valid(req, plan);
  EXPECT_EQ(plan.arena_bytes, 64);
}

TEST(MemoryPlanner, RejectsBadRequests) {
  try {
    plan_memory({{10, 0, 1}, {-5, 0, 1}});
    FAIL() << "negative size accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("request 1 has negative size -5"), std::string::npos)
        << e.what();
  }
  try {
    plan_memory({{10, 4, 2}});
    FAIL() << "reversed lifetime accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("ends (step 2) before it starts (step 4)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(plan_memory({{INT64_MAX - 3, 0, 0}}), Error);
}

TEST(MemoryPlanner, RandomDagLifetimesNeverOverlap) {
  // Lifetimes as a real graph produces them: node s writes value s, and each value is
  // read by a few later nodes; its life ends at the last reader.
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 2 + int(rng() % 60);
    std::vector<BufferRequest> req(static_cast<size_t>(n));
    for (int s = 0; s < n; ++s) {
      req[size_t(s)].first_step = s;
      req[size_t(s)].last_step = s;
      req[size_t(s)].bytes = int64_t(rng() % 5000);
    }
    for (int s = 1; s < n; ++s) {
      const int reads = 1 + int(rng() % 3);
      for (int k = 0; k < reads; ++k) {
        const int src = int(rng() % uint32_t(s));
        req[size_t(src)].last_step = std::max<int64_t>(req[size_t(src)].last_step, s);
      }
    }
    const MemoryPlan plan = plan_memory(req);
    expect_valid(req, plan);
    // Never worse than giving every buffer its own place.
    int64_t no_reuse = 0;
    for (const auto& r : req) no_reuse += aligned(r.bytes);
    EXPECT_LE(plan.arena_bytes, no_reuse);
  }
}
