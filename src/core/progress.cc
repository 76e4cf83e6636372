#include "slim/core/progress.h"

#include <unistd.h>

#include <cstdio>

namespace slim {

bool Progress::enabled() { return ::isatty(STDERR_FILENO) == 1; }

Progress::Progress(std::string label, int64_t total)
    : label_(std::move(label)), total_(total), active_(enabled()) {}

Progress::~Progress() { finish(); }

void Progress::update(int64_t done, const std::string& detail) {
  if (!active_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  if (done < total_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  const int pct = total_ > 0 ? int(100 * done / total_) : 0;
  std::fprintf(stderr, "\r\033[K%s %lld/%lld (%d%%) %s", label_.c_str(), (long long)done,
               (long long)total_, pct, detail.substr(0, 60).c_str());
  std::fflush(stderr);
}

void Progress::clear_line() {
  if (!active_ || finished_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  last_ = {};
}

void Progress::finish() {
  if (!active_ || finished_) return;
  finished_ = true;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

}  // namespace slim
