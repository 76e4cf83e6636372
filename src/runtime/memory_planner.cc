#include "slim/runtime/memory_planner.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>

#include "slim/core/error.h"

namespace slim {

namespace {

int64_t align_up(int64_t bytes) {
  if (bytes > std::numeric_limits<int64_t>::max() - kArenaAlignment)
    throw Error(ErrorCode::resource_exhausted,
                "memory plan: buffer of " + std::to_string(bytes) + " bytes is too large");
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

struct Placed {
  int64_t offset, size, first, last;
};

}  // namespace

MemoryPlan plan_memory(const std::vector<BufferRequest>& requests) {
  MemoryPlan plan;
  plan.offsets.assign(requests.size(), 0);
  std::vector<int64_t> sizes(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const BufferRequest& r = requests[i];
    check(r.bytes >= 0, ErrorCode::invalid_argument,
          "memory plan: request " + std::to_string(i) + " has negative size " +
              std::to_string(r.bytes));
    check(r.first_step <= r.last_step, ErrorCode::invalid_argument,
          "memory plan: request " + std::to_string(i) + " ends (step " +
              std::to_string(r.last_step) + ") before it starts (step " +
              std::to_string(r.first_step) + ")");
    sizes[i] = align_up(r.bytes);
    if (r.bytes > std::numeric_limits<int64_t>::max() - plan.requested_bytes)
      throw Error(ErrorCode::resource_exhausted, "memory plan: total size overflows");
    plan.requested_bytes += r.bytes;
  }

  // Largest first: big buffers fix the arena's shape, small ones then fill the holes
  // their lifetimes leave. Ties go to the earlier buffer so plans are deterministic.
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (sizes[a] != sizes[b]) return sizes[a] > sizes[b];
    return requests[a].first_step < requests[b].first_step;
  });

  std::vector<Placed> placed;
  placed.reserve(requests.size());
  std::vector<const Placed*> live;
  for (size_t idx : order) {
    const BufferRequest& r = requests[idx];
    const int64_t size = sizes[idx];
    if (size == 0) continue;  // occupies no bytes, offset 0 aliases nothing
    live.clear();
    for (const Placed& p : placed)
      if (p.first <= r.last_step && r.first_step <= p.last) live.push_back(&p);
    std::sort(live.begin(), live.end(),
              [](const Placed* a, const Placed* b) { return a->offset < b->offset; });
    // Best fit: the smallest hole between buffers alive at the same time that holds this
    // one; when none does, the first offset past all of them.
    int64_t best = -1, best_gap = std::numeric_limits<int64_t>::max();
    int64_t end = 0;
    for (const Placed* p : live) {
      const int64_t gap = p->offset - end;
      if (gap >= size && gap < best_gap) {
        best = end;
        best_gap = gap;
      }
      end = std::max(end, p->offset + p->size);
    }
    if (best < 0) best = end;
    if (best > std::numeric_limits<int64_t>::max() - size)
      throw Error(ErrorCode::resource_exhausted, "memory plan: arena size overflows");
    plan.offsets[idx] = best;
    plan.arena_bytes = std::max(plan.arena_bytes, best + size);
    placed.push_back({best, size, r.first_step, r.last_step});
  }
  return plan;
}

}  // namespace slim
