#include "slim/trust/integrity_monitor.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <vector>

#include "slim/trust/digest.h"
#include "trust/test_util.h"

using namespace slim;
using namespace slim::trust;

namespace {
struct Reports {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<IntegrityViolation> seen;
  void add(const IntegrityViolation& v) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(v);
    cv.notify_all();
  }
  // Waits for a report; the generous bound only keeps a broken build from hanging.
  bool wait_for(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(60), [&] { return seen.size() >= n; });
  }
};
}  // namespace

TEST(IntegrityMonitor, BackgroundCheckReportsAFlippedByte) {
  Reports reports;
  IntegrityMonitorOptions o;
  o.cpu_budget = 0.5;
  o.slice_bytes = 64 << 10;
  o.pass_interval = std::chrono::milliseconds(1);
  IntegrityMonitor monitor([&](const IntegrityViolation& v) { reports.add(v); }, o);
  std::vector<uint8_t> weights(3 << 20), other(100000, 7);
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = uint8_t(i * 2654435761u >> 13);
  const uint64_t expected = fast_checksum(weights.data(), weights.size());
  const uint64_t id = monitor.add("gpt2/layer0.weight", weights.data(), weights.size());
  monitor.add("gpt2/bias", other.data(), other.size());
  monitor.start();
  while (monitor.passes() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  {
    std::lock_guard<std::mutex> lock(reports.mu);
    EXPECT_TRUE(reports.seen.empty());
  }
  weights[weights.size() / 2 + 12345] ^= 0x10;
  ASSERT_TRUE(reports.wait_for(1));
  monitor.stop();
  ASSERT_EQ(reports.seen.size(), 1u);  // reported once, not on every pass
  EXPECT_EQ(reports.seen[0].region_id, id);
  EXPECT_EQ(reports.seen[0].name, "gpt2/layer0.weight");
  EXPECT_EQ(reports.seen[0].expected, expected);
  EXPECT_EQ(reports.seen[0].actual, fast_checksum(weights.data(), weights.size()));
  EXPECT_GT(monitor.bytes_checked(), weights.size());
}

TEST(IntegrityMonitor, CheckNowAndRemove) {
  Reports reports;
  IntegrityMonitor monitor([&](const IntegrityViolation& v) { reports.add(v); });
  std::vector<uint8_t> a(5000, 1), b(7000, 2);
  const uint64_t pre = fast_checksum(a.data(), a.size());
  a[10] = 9;  // corrupted between verification and registration
  const uint64_t ia = monitor.add("a", a.data(), a.size(), pre);
  const uint64_t ib = monitor.add("b", b.data(), b.size());
  EXPECT_EQ(monitor.check_now(), 1);
  ASSERT_EQ(reports.seen.size(), 1u);
  EXPECT_EQ(reports.seen[0].region_id, ia);
  b[6999] ^= 1;
  EXPECT_EQ(monitor.check_now(), 2);
  ASSERT_EQ(reports.seen.size(), 2u);  // "a" is not reported twice
  EXPECT_EQ(reports.seen[1].region_id, ib);
  monitor.remove(ia);
  monitor.remove(ib);
  EXPECT_EQ(monitor.check_now(), 0);
  b[6999] ^= 1;
  monitor.add("b", b.data(), b.size());
  EXPECT_EQ(monitor.check_now(), 0);
}

TEST(IntegrityMonitor, RejectsBadOptions) {
  IntegrityMonitorOptions o;
  o.cpu_budget = 0;
  EXPECT_THROW(IntegrityMonitor([](const IntegrityViolation&) {}, o), Error);
  EXPECT_THROW(IntegrityMonitor(nullptr), Error);
}
