#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <limits>
#include <thread>

#include "slim/core/half.h"
#include "slim/core/mapped_file.h"
#include "slim/core/npy.h"
#include "slim/core/tensor.h"
#include "slim/core/thread_pool.h"

using namespace slim;

TEST(Tensor, OwnedIsAlignedZeroedContiguous) {
  Tensor t(DType::f32, {2, 3, 5});
  EXPECT_EQ(t.numel(), 30);
  EXPECT_EQ(t.nbytes(), 120u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % kTensorAlignment, 0u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.strides(), (Shape{15, 5, 1}));
  for (int i = 0; i < 30; ++i) EXPECT_EQ(t.data<float>()[i], 0.f);
}

// Buffers of 2 MiB and more come from mappings of their own that are reused after free:
// a reused buffer must be zeroed again, and all are aligned.
TEST(Tensor, LargeBuffersAreZeroedWhenReused) {
  for (int round = 0; round < 3; ++round) {
    for (int64_t n : {int64_t(1) << 19, (int64_t(3) << 19) + 5, int64_t(1) << 21}) {  // 2 MiB, ~6 MiB, 8 MiB of f32
      Tensor t(DType::f32, {n});
      ASSERT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % kTensorAlignment, 0u);
      float* p = t.data<float>();
      for (int64_t i = 0; i < n; i += 997) ASSERT_EQ(p[i], 0.f) << "round " << round << " n " << n << " at " << i;
      ASSERT_EQ(p[n - 1], 0.f);
      std::fill(p, p + n, 3.5f);  // dirty it for the next round's reuse
    }
  }
}

TEST(Tensor, PermuteSliceAndContiguousCopy) {
  std::vector<int32_t> v(24);
  for (int i = 0; i < 24; ++i) v[size_t(i)] = i;
  Tensor t = Tensor::from_vector<int32_t>({2, 3, 4}, v);
  Tensor p = t.permute({2, 0, 1});  // [4,2,3]
  EXPECT_FALSE(p.is_contiguous());
  Tensor c = p.contiguous();
  ASSERT_EQ(c.shape(), (Shape{4, 2, 3}));
  // c[k][i][j] == t[i][j][k]
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) EXPECT_EQ(c.data<int32_t>()[k * 6 + i * 3 + j], i * 12 + j * 4 + k);
  Tensor s = t.slice(2, 1, 3).contiguous();  // [2,3,2]
  EXPECT_EQ(s.data<int32_t>()[0], 1);
  EXPECT_EQ(s.data<int32_t>()[11], 23 - 1);
}

TEST(Tensor, ReshapeInfersAndRejects) {
  Tensor t(DType::i64, {4, 6});
  EXPECT_EQ(t.reshape({-1, 3}).shape(), (Shape{8, 3}));
  EXPECT_THROW(t.reshape({5, 5}), Error);
  EXPECT_THROW(t.reshape({-1, -1}), Error);
  EXPECT_THROW(Tensor(DType::f32, {-1}), Error);
}

TEST(Tensor, WrongTypeAccessThrows) {
  Tensor t(DType::f32, {2});
  EXPECT_THROW(t.data<int32_t>(), Error);
}

TEST(Half, RoundTripsAndRounds) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), h) << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(65520.f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::nanf("")))));
}

TEST(Npy, RoundTripAllTypes) {
  const auto dir = std::filesystem::temp_directory_path();
  for (DType t : {DType::f32, DType::f64, DType::i8, DType::u8, DType::i32, DType::i64,
                  DType::boolean, DType::f16}) {
    Tensor x(t, {3, 2});
    auto* p = static_cast<uint8_t*>(x.raw_data());
    for (size_t i = 0; i < x.nbytes(); ++i) p[i] = uint8_t(t == DType::boolean ? i % 2 : i * 7);
    const std::string path = (dir / ("slim_npy_" + std::string(dtype_name(t)) + ".npy")).string();
    write_npy(path, x);
    Tensor y = read_npy(path);
    EXPECT_EQ(y.dtype(), t);
    EXPECT_EQ(y.shape(), x.shape());
    EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0);
  }
  Tensor s = Tensor::scalar<float>(2.5f);
  Tensor r = parse_npy(encode_npy(s).data(), encode_npy(s).size(), "scalar");
  EXPECT_EQ(r.rank(), 0);
  EXPECT_EQ(r.data<float>()[0], 2.5f);
}

TEST(Npy, RejectsBadFiles) {
  EXPECT_THROW(parse_npy("garbage!!garbage", 16, "g"), Error);
  std::string good = encode_npy(Tensor(DType::f32, {4, 4}));
  try {
    parse_npy(good.data(), good.size() - 3, "trunc.npy");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos);
  }
  std::string big = good;
  big.replace(big.find("'<f4'"), 5, "'>f4'");
  EXPECT_THROW(parse_npy(big.data(), big.size(), "be.npy"), Error);
  EXPECT_THROW(read_npy("/nonexistent/x.npy"), Error);
}

// A zip of .npy members as numpy.savez writes it: stored, each local header with a zip64
// extra field, sizes in the central directory; `method` marks the members compressed.
std::string npz_bytes(const std::vector<std::pair<std::string, Tensor>>& arrays, int method = 0) {
  auto put = [](std::string& s, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) s += char(v >> (8 * i) & 0xff);
  };
  std::string body, dir;
  for (const auto& [key, t] : arrays) {
    const std::string name = key + ".npy", data = encode_npy(t);
    std::string extra;
    put(extra, 1, 2), put(extra, 16, 2), put(extra, data.size(), 8), put(extra, data.size(), 8);
    const uint64_t off = body.size();
    put(body, 0x04034b50, 4), put(body, 20, 2), put(body, 0, 2), put(body, method, 2), put(body, 0, 8);
    put(body, 0xffffffff, 4), put(body, 0xffffffff, 4), put(body, name.size(), 2), put(body, extra.size(), 2);
    body += name + extra + data;
    put(dir, 0x02014b50, 4), put(dir, 20, 2), put(dir, 20, 2), put(dir, 0, 2), put(dir, method, 2), put(dir, 0, 8);
    put(dir, data.size(), 4), put(dir, data.size(), 4), put(dir, name.size(), 2), put(dir, 0, 6);
    put(dir, 0, 6), put(dir, off, 4);
    dir += name;
  }
  std::string out = body + dir;
  put(out, 0x06054b50, 4), put(out, 0, 4), put(out, arrays.size(), 2), put(out, arrays.size(), 2);
  put(out, dir.size(), 4), put(out, body.size(), 4), put(out, 0, 2);
  return out;
}

TEST(Npz, ReadsNamedArraysInOrder) {
  const std::string z = npz_bytes({{"x", Tensor::from_vector<float>({2, 3}, {0, 1, 2, 3, 4, 5})},
                                   {"ids", Tensor::from_vector<int64_t>({2}, {7, 9})}});
  const auto a = parse_npz(z.data(), z.size(), "ref.npz");
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].first, "x");
  EXPECT_EQ(a[0].second.shape(), (Shape{2, 3}));
  EXPECT_EQ(a[0].second.data<float>()[5], 5.0f);
  EXPECT_EQ(a[1].first, "ids");
  EXPECT_EQ(a[1].second.data<int64_t>()[1], 9);
  const std::string path = (std::filesystem::temp_directory_path() / "slim_npz_test.npz").string();
  FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(z.data(), 1, z.size(), f);
  std::fclose(f);
  EXPECT_EQ(read_npz(path).size(), 2u);
}

TEST(Npz, RejectsBadArchives) {
  auto message = [](const std::string& z) {
    try {
      parse_npz(z.data(), z.size(), "ref.npz");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string good = npz_bytes({{"x", Tensor(DType::f32, {4, 4})}});
  EXPECT_EQ(message(npz_bytes({{"x", Tensor(DType::f32, {4})}}, 8)),
            "ref.npz: member 'x.npy' is compressed (zip method 8); only stored members are read: write the "
            "archive with numpy.savez, not numpy.savez_compressed");
  EXPECT_EQ(message("not a zip file at all, not even close"), "ref.npz: not an .npz file (no zip directory)");
  EXPECT_EQ(message(good.substr(0, 40) + good.substr(100)), "ref.npz: the zip directory lies outside the file");
  std::string bad_member = good;
  bad_member.replace(bad_member.find("'<f4'"), 5, "'>f4'");
  EXPECT_NE(message(bad_member).find("ref.npz: member 'x.npy': unsupported .npy dtype '>f4'"), std::string::npos);
  for (size_t cut = 0; cut < good.size(); cut += 7) EXPECT_NE(message(good.substr(0, cut)), "no error");
  EXPECT_THROW(read_npz("/nonexistent/ref.npz"), Error);
}

TEST(ThreadPool, CoversRangeOnceAndPropagatesErrors) {
  ThreadPool pool(4);
  std::vector<int> hits(1000, 0);
  pool.parallel_for(1000, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
  });
  for (int h : hits) EXPECT_EQ(h, 1);
  EXPECT_THROW(pool.parallel_for(10, [](int64_t, int64_t) { throw Error(ErrorCode::internal, "x"); }),
               Error);
  // Nested calls run inline instead of deadlocking.
  std::atomic<int> total{0};
  pool.parallel_for(8, [&](int64_t b, int64_t e) {
    pool.parallel_for(10, [&](int64_t b2, int64_t e2) { total += int(e2 - b2); });
    (void)b; (void)e;
  });
  EXPECT_EQ(total.load(), 10 * std::min<int>(8, pool.num_threads()));
}

// A pool whose idle threads poll for work: thousands of short jobs back to back (each
// sees every index once, none sees another job's function), errors, jobs after the
// workers have gone to sleep, and destruction while they poll.
TEST(ThreadPool, SpinningPoolRunsBackToBackJobsExactly) {
  for (int threads : {2, 3}) {
    ThreadPool pool(threads, 500);
    std::vector<int> hits(64, 0);
    for (int job = 0; job < 3000; ++job) {
      const int n = 1 + job % 64;
      pool.parallel_for(n, [&, job](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[size_t(i)] += job;
      });
      if (job % 500 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // workers fall asleep
    }
    for (int i = 0; i < 64; ++i) {
      int64_t want = 0;
      for (int job = 0; job < 3000; ++job)
        if (i < 1 + job % 64) want += job;
      EXPECT_EQ(hits[size_t(i)], want) << i;
    }
    EXPECT_THROW(pool.parallel_for(10, [](int64_t, int64_t) { throw Error(ErrorCode::internal, "x"); }), Error);
    int after = 0;
    pool.parallel_for(1, [&](int64_t, int64_t) { ++after; });
    EXPECT_EQ(after, 1);
  }
}

// Every item is claimed exactly once, for any item count against 1-4 slots (more slots
// than items too), over back-to-back reuses of one split.
TEST(WorkSplit, ClaimsEveryItemOnce) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads, 200);
    WorkSplit split(threads);
    for (int64_t n : {0, 1, 2, 3, 5, 17, 64, 1000}) {
      for (int rep = 0; rep < 20; ++rep) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        split.reset(n);
        pool.parallel_for(threads, [&](int64_t b, int64_t e) {
          for (int64_t slot = b; slot < e; ++slot)
            for (int64_t i; split.next(int(slot), &i);) {
              ASSERT_GE(i, 0);
              ASSERT_LT(i, n);
              hits[size_t(i)]++;
            }
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "n " << n << " item " << i;
      }
    }
  }
  WorkSplit split(2);
  EXPECT_THROW(split.reset(int64_t(1) << 31), Error);  // items are packed in 32 bits
}

// A slot that is held up hands its share to the others: slot 1 makes no claim until
// slot 0 has stopped claiming, so slot 0 must have taken slot 1's share, all but the
// last item (a share's last item is left to its owner).
TEST(WorkSplit, OthersTakeOverAHeldUpSlotsShare) {
  ThreadPool pool(2, 200);
  WorkSplit split(2);
  split.reset(200);
  std::atomic<int> by_slot[2] = {0, 0};
  std::atomic<bool> slot0_done{false};
  pool.parallel_for(2, [&](int64_t b, int64_t e) {
    for (int64_t slot = b; slot < e; ++slot) {
      if (slot == 1)
        while (!slot0_done.load()) std::this_thread::yield();
      for (int64_t i; split.next(int(slot), &i);) by_slot[slot]++;
      if (slot == 0) slot0_done = true;
    }
  });
  EXPECT_EQ(by_slot[0].load(), 199);
  EXPECT_EQ(by_slot[1].load(), 1);
}

// The resident copy reads the same bytes as the mapping, for sizes on and off the 2 MiB
// rounding, and missing files or directories fail with the mapping's errors.
TEST(MappedFile, ResidentCopyEqualsTheMapping) {
  const auto dir = std::filesystem::temp_directory_path();
  for (size_t size : {size_t(0), size_t(1), size_t(4096), size_t(3) << 20}) {
    std::string bytes(size, '\0');
    for (size_t i = 0; i < size; ++i) bytes[i] = char((i * 131 + 7) & 0xff);
    const std::string path = (dir / ("slim_resident_" + std::to_string(size) + ".bin")).string();
    {
      std::FILE* f = std::fopen(path.c_str(), "wb");
      ASSERT_TRUE(f);
      if (size) {
        ASSERT_EQ(std::fwrite(bytes.data(), 1, size, f), size);
      }
      std::fclose(f);
    }
    auto mapped = MappedFile::open(path);
    auto resident = MappedFile::read_resident(path);
    ASSERT_EQ(resident->size(), size);
    EXPECT_EQ(resident->view(), mapped->view());
    EXPECT_EQ(resident->path(), path);
    // `prepare` sees the whole copy and may rewrite it before it becomes read-only.
    bool called = false;
    auto rewritten = MappedFile::read_resident(path, [&](const MappedFile& m, uint8_t* data) {
      called = true;
      EXPECT_EQ(m.size(), size);
      EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(data), size), mapped->view());
      for (size_t i = 0; i < size; ++i) data[i] = uint8_t(~data[i]);
    });
    EXPECT_EQ(called, size > 0);
    for (size_t i = 0; i < size; i += 997) EXPECT_EQ(rewritten->data()[i], uint8_t(~uint8_t(bytes[i])));
    std::filesystem::remove(path);
  }
  try {
    MappedFile::read_resident((dir / "slim_no_such_file.bin").string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::not_found);
  }
  try {
    MappedFile::read_resident(dir.string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  }
}

TEST(Storage, LargeFreedBuffersAreKeptUntilReleased) {
  Storage::release_cached();
  { auto s = Storage::allocate(size_t(5) << 20); }  // a mapping of its own: kept for reuse
  EXPECT_GE(Storage::release_cached(), size_t(5) << 20);
  EXPECT_EQ(Storage::release_cached(), 0u);
  { auto s = Storage::allocate(1024); }  // heap: never cached
  EXPECT_EQ(Storage::release_cached(), 0u);
}
