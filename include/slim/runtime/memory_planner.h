// The memory planner of compiled sessions: places every intermediate tensor whose size is
// known at compile time into one 64-byte-aligned arena, reusing an offset once the
// tensor that held it is dead. Placement is greedy by size with best fit.
#pragma once

#include <cstdint>
#include <vector>

namespace slim {

// One buffer to place: its size and the steps (node positions in execution order) of its
// first write and last read, both inclusive.
struct BufferRequest {
  int64_t bytes = 0;
  int64_t first_step = 0;
  int64_t last_step = 0;
};

struct MemoryPlan {
  std::vector<int64_t> offsets;  // one per request, multiples of the alignment
  int64_t arena_bytes = 0;       // the smallest arena that holds every placed buffer
  int64_t requested_bytes = 0;   // sum of the requested sizes (unaligned)
};

inline constexpr int64_t kArenaAlignment = 64;

// Two requests may share bytes only when their [first_step, last_step] ranges are
// disjoint. Throws invalid_argument for a negative size or a range that ends before it
// starts.
MemoryPlan plan_memory(const std::vector<BufferRequest>& requests);

}  // namespace slim
