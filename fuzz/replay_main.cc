// A bounded fuzz run for CI without clang: the libFuzzer targets' LLVMFuzzerTestOneInput
// linked with this driver (and ASan/UBSan under gcc) runs every seed, then mutations of
// the seeds (bit flips, byte changes, insertions, deletions, truncation, splices of two
// seeds, repeated chunks) until the time is up. Mutation without coverage feedback finds
// less than libFuzzer (`make fuzz`), but it runs on every CI build, and a crash, sanitizer
// report or hang fails the test. Deterministic for a given --seed.
//   usage: FUZZER [--seconds N] [--seed S] DIR_OR_FILE...
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using Bytes = std::vector<uint8_t>;

Bytes read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

Bytes mutate(const std::vector<Bytes>& seeds, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n ? size_t(rng() % n) : 0; };
  Bytes b = seeds[pick(seeds.size())];
  const int rounds = 1 + int(rng() % 4);
  for (int r = 0; r < rounds; ++r) {
    switch (rng() % 7) {
      case 0:  // flip a bit
        if (!b.empty()) b[pick(b.size())] ^= uint8_t(1u << (rng() % 8));
        break;
      case 1: {  // an interesting byte
        static const uint8_t kBytes[] = {0, 1, 0x7f, 0x80, 0xff, '"', '{', '}', '[', ']', ':', ',', '-', '9', '\\'};
        if (!b.empty()) b[pick(b.size())] = kBytes[rng() % sizeof kBytes];
        break;
      }
      case 2:  // insert a random byte
        b.insert(b.begin() + std::ptrdiff_t(pick(b.size() + 1)), uint8_t(rng()));
        break;
      case 3:  // delete a run
        if (!b.empty()) {
          const size_t at = pick(b.size()), n = 1 + pick(std::min<size_t>(16, b.size() - at));
          b.erase(b.begin() + std::ptrdiff_t(at), b.begin() + std::ptrdiff_t(at + n));
        }
        break;
      case 4:  // truncate
        b.resize(pick(b.size() + 1));
        break;
      case 5: {  // splice: our head, another seed's tail
        const Bytes& o = seeds[pick(seeds.size())];
        const size_t cut = pick(b.size() + 1), from = pick(o.size() + 1);
        b.resize(cut);
        b.insert(b.end(), o.begin() + std::ptrdiff_t(from), o.end());
        break;
      }
      case 6:  // repeat a chunk
        if (!b.empty() && b.size() < (1u << 16)) {
          const size_t at = pick(b.size()), n = 1 + pick(std::min<size_t>(64, b.size() - at));
          const Bytes chunk(b.begin() + std::ptrdiff_t(at), b.begin() + std::ptrdiff_t(at + n));
          for (int k = int(rng() % 8); k >= 0; --k) b.insert(b.begin() + std::ptrdiff_t(at), chunk.begin(), chunk.end());
        }
        break;
    }
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 10;
  uint64_t seed = 1;
  std::vector<Bytes> seeds;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (std::filesystem::is_directory(a)) {
      for (const auto& e : std::filesystem::directory_iterator(a))
        if (e.is_regular_file()) seeds.push_back(read_file(e.path()));
    } else if (std::filesystem::is_regular_file(a)) {
      seeds.push_back(read_file(a));
    } else {
      std::fprintf(stderr, "usage: %s [--seconds N] [--seed S] DIR_OR_FILE...\n(no such file or folder: %s)\n",
                   argv[0], a.c_str());
      return 2;
    }
  }
  if (seeds.empty()) seeds.push_back({});
  for (const Bytes& s : seeds) LLVMFuzzerTestOneInput(s.data(), s.size());
  std::mt19937_64 rng(seed);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  uint64_t runs = 0;
  while (std::chrono::steady_clock::now() < end) {
    const Bytes b = mutate(seeds, rng);
    LLVMFuzzerTestOneInput(b.data(), b.size());
    ++runs;
  }
  std::printf("%zu seeds and %llu mutated inputs in %.0f s: no crash\n", seeds.size(), (unsigned long long)runs,
              seconds);
  return 0;
}
