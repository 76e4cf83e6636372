// .slimf reader and writer.
#include "slim/forest/slimf.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>

#include "slim/core/error.h"
#include "slim/core/mapped_file.h"
#include "slim/core/tensor.h"

namespace slim::forest {
namespace {

constexpr char kMagic[8] = {'S', 'L', 'I', 'M', 'F', '\r', '\n', '\x1a'};

struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t encoding;
  uint64_t payload_size;
  uint64_t checksum;  // XXH3-64 of the payload
  uint8_t reserved[32];
};
static_assert(sizeof(FileHeader) == 64, "payload must start 64-byte aligned");

// Little helpers for the compact stream.
struct Writer {
  std::string out;
  template <typename T>
  void put(T v) { out.append(reinterpret_cast<const char*>(&v), sizeof(T)); }
  void put_code(uint32_t v, int width) {
    if (width == 1) put<uint8_t>(uint8_t(v));
    else if (width == 2) put<uint16_t>(uint16_t(v));
    else put<uint32_t>(v);
  }
};

struct Reader {
  const uint8_t* p;
  const uint8_t* end;
  std::string where;
  template <typename T>
  T get() {
    if (size_t(end - p) < sizeof(T)) throw Error(ErrorCode::invalid_model, where + ": compact payload is truncated");
    T v;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    return v;
  }
  uint32_t get_code(int width) {
    if (width == 1) return get<uint8_t>();
    if (width == 2) return get<uint16_t>();
    return get<uint32_t>();
  }
};

int code_width(uint64_t count) { return count <= 256 ? 1 : count <= 65536 ? 2 : 4; }

std::string encode_compact(const CompiledForest& cf) {
  const CompiledHeader& h = cf.header();
  const uint32_t N = h.num_nodes, F = h.num_features;
  const uint32_t* packed = cf.packed();
  const bool ranked = cf.ranked();
  const uint32_t feat_mask = ranked ? kRankedFeatureMask : kNodeFeatureMask;
  // The threshold of split i, and for categorical splits the set index in its bits.
  auto threshold_of = [&](uint32_t i) {
    const uint32_t p = packed[i];
    if (!ranked) return cf.threshold()[i];
    return cf.bin_values()[cf.bin_offsets()[p & feat_mask] + ((p >> kRankShift) & kRankMask) - 1];
  };
  // Per-feature sorted tables of the distinct thresholds; a node keeps the rank.
  std::vector<std::vector<float>> tables(F);
  for (uint32_t i = 0; i < N; ++i) {
    const uint32_t p = packed[i];
    if (!(p & (kNodeLeaf | kNodeCategorical))) tables[p & feat_mask].push_back(threshold_of(i));
  }
  size_t widest = 1;
  for (auto& t : tables) {
    std::sort(t.begin(), t.end());
    t.erase(std::unique(t.begin(), t.end(), [](float a, float b) {
              return std::memcmp(&a, &b, 4) == 0;
            }), t.end());
    widest = std::max(widest, t.size());
  }
  const int fw = code_width(F), tw = code_width(std::max<uint64_t>(widest, h.num_category_sets));
  Writer w;
  CompiledHeader counts = h;
  w.put(counts);
  w.put<uint8_t>(uint8_t(fw));
  w.put<uint8_t>(uint8_t(tw));
  for (uint32_t g = 0; g < h.num_groups; ++g) w.put<double>(cf.base_margin()[g]);
  for (uint32_t t = 0; t < h.num_trees; ++t) {
    const uint32_t end = t + 1 < h.num_trees ? cf.tree_root()[t + 1] : N;
    w.put<uint32_t>(end - cf.tree_root()[t]);
    w.put<uint32_t>(cf.tree_group()[t]);
  }
  for (auto& t : tables) {
    w.put<uint32_t>(uint32_t(t.size()));
    for (float v : t) w.put<float>(v);
  }
  for (uint32_t c = 0; c <= h.num_category_sets; ++c) w.put<uint32_t>(cf.category_offsets()[c]);
  for (uint32_t c = 0; c < h.num_category_words; ++c) w.put<uint32_t>(cf.category_words()[c]);
  // Flag bits: four bitsets over all nodes.
  for (uint32_t bit : {kNodeLeaf, kNodeDefaultLeft, kNodeCategorical, kNodeZeroMissing}) {
    for (uint32_t i = 0; i < N; i += 8) {
      uint8_t b = 0;
      for (uint32_t k = 0; k < 8 && i + k < N; ++k)
        if (packed[i + k] & bit) b |= uint8_t(1u << k);
      w.put<uint8_t>(b);
    }
  }
  const bool dbl = h.accumulate_double;
  for (uint32_t i = 0; i < N; ++i) {
    const uint32_t p = packed[i];
    if (p & kNodeLeaf) {
      const uint32_t li = p & kNodeFeatureMask;
      if (dbl) w.put<double>(static_cast<const double*>(cf.leaf_values())[li]);
      else w.put<float>(static_cast<const float*>(cf.leaf_values())[li]);
      continue;
    }
    const uint32_t f = p & feat_mask;
    w.put_code(f, fw);
    if (p & kNodeCategorical) {
      uint32_t set;
      std::memcpy(&set, &cf.threshold()[i], 4);
      w.put_code(set, tw);
    } else {
      const auto& t = tables[f];
      const float v = threshold_of(i);
      const size_t rank = size_t(std::lower_bound(t.begin(), t.end(), v) - t.begin());
      w.put_code(uint32_t(rank), tw);
    }
  }
  return w.out;
}

Forest decode_compact(const uint8_t* data, size_t size, const std::string& where) {
  Reader r{data, data + size, where};
  const CompiledHeader h = r.get<CompiledHeader>();
  const int fw = r.get<uint8_t>(), tw = r.get<uint8_t>();
  auto bad = [&](const std::string& what) { return Error(ErrorCode::invalid_model, where + ": " + what); };
  if ((fw != 1 && fw != 2 && fw != 4) || (tw != 1 && tw != 2 && tw != 4)) throw bad("bad code widths");
  if (h.num_features == 0 || h.num_features > kNodeFeatureMask) throw bad("num_features out of range");
  if (h.num_groups == 0 || h.num_groups > 100000) throw bad("num_groups out of range");
  if (h.transform > uint8_t(Transform::argmax) || h.source > uint8_t(SourceKind::lightgbm)) throw bad("bad enum");
  // Counts bound what the stream can hold, so a lying header cannot make us allocate
  // far more than the file's size.
  const uint64_t budget = size * 8 + 64;
  if (h.num_nodes > budget || h.num_trees > budget || h.num_category_words > budget ||
      h.num_category_sets > budget || h.num_groups > budget)
    throw bad("counts exceed what the file can hold");
  Forest f;
  f.source = SourceKind(h.source);
  f.transform = Transform(h.transform);
  f.accumulate_double = h.accumulate_double;
  f.truncate_category_first = h.truncate_category_first;
  f.sigmoid_scale = h.sigmoid_scale;
  f.average_divisor = h.average_divisor;
  f.num_features = h.num_features;
  f.num_groups = h.num_groups;
  for (uint32_t g = 0; g < h.num_groups; ++g) f.base_margin.push_back(r.get<double>());
  std::vector<uint32_t> sizes(h.num_trees);
  f.trees.resize(h.num_trees);
  uint64_t total = 0;
  for (uint32_t t = 0; t < h.num_trees; ++t) {
    sizes[t] = r.get<uint32_t>();
    f.trees[t].group = r.get<uint32_t>();
    total += sizes[t];
    if (sizes[t] == 0 || f.trees[t].group >= h.num_groups) throw bad("tree " + std::to_string(t) + " header is bad");
  }
  if (total != h.num_nodes) throw bad("tree sizes do not add up to the node count");
  std::vector<std::vector<float>> tables(h.num_features);
  for (auto& t : tables) {
    const uint32_t n = r.get<uint32_t>();
    if (n > size) throw bad("threshold table larger than the file");
    t.resize(n);
    for (auto& v : t) v = r.get<float>();
  }
  std::vector<uint32_t> coff(h.num_category_sets + 1);
  for (auto& v : coff) v = r.get<uint32_t>();
  if (coff[0] != 0 || coff.back() != h.num_category_words) throw bad("category offsets do not span the words");
  std::vector<uint32_t> cwords(h.num_category_words);
  for (auto& v : cwords) v = r.get<uint32_t>();
  for (uint32_t c = 0; c < h.num_category_sets; ++c)
    if (coff[c] > coff[c + 1]) throw bad("category offsets are not increasing");
  for (uint32_t c = 0; c < h.num_category_sets; ++c) {
    f.category_sets.push_back({std::vector<uint32_t>(cwords.begin() + coff[c], cwords.begin() + coff[c + 1])});
  }
  const uint32_t N = h.num_nodes;
  std::vector<uint32_t> flags(N, 0);
  for (uint32_t bit : {kNodeLeaf, kNodeDefaultLeft, kNodeCategorical, kNodeZeroMissing}) {
    for (uint32_t i = 0; i < N; i += 8) {
      const uint8_t b = r.get<uint8_t>();
      for (uint32_t k = 0; k < 8 && i + k < N; ++k)
        if (b & (1u << k)) flags[i + k] |= bit;
    }
  }
  uint32_t i = 0;
  for (uint32_t t = 0; t < h.num_trees; ++t) {
    auto& nodes = f.trees[t].nodes;
    nodes.resize(sizes[t]);
    uint32_t next_child = 1;  // breadth-first: children follow in pairs
    for (uint32_t k = 0; k < sizes[t]; ++k, ++i) {
      TreeNode& node = nodes[k];
      const uint32_t fl = flags[i];
      if (fl & kNodeLeaf) {
        node.is_leaf = true;
        node.leaf_value = h.accumulate_double ? r.get<double>() : double(r.get<float>());
        continue;
      }
      node.is_leaf = false;
      node.feature = r.get_code(fw);
      if (node.feature >= h.num_features) throw bad("node " + std::to_string(i) + ": feature out of range");
      node.default_left = fl & kNodeDefaultLeft;
      node.zero_missing = fl & kNodeZeroMissing;
      const uint32_t code = r.get_code(tw);
      if (fl & kNodeCategorical) {
        if (code >= h.num_category_sets) throw bad("node " + std::to_string(i) + ": category set out of range");
        node.category_set = int32_t(code);
      } else {
        if (code >= tables[node.feature].size()) throw bad("node " + std::to_string(i) + ": threshold rank out of range");
        node.threshold = tables[node.feature][code];
      }
      if (uint64_t(next_child) + 1 >= sizes[t])
        throw bad("tree " + std::to_string(t) + ": children run past the tree");
      node.left = int32_t(next_child);
      node.right = int32_t(next_child + 1);
      next_child += 2;
    }
    if (next_child != sizes[t]) throw bad("tree " + std::to_string(t) + ": node count does not match its shape");
  }
  if (r.p != r.end) throw bad("trailing bytes after the nodes");
  f.validate(where);
  return f;
}

std::string read_header(const MappedFile& file, FileHeader& fh) {
  const std::string& path = file.path();
  if (file.size() < sizeof(FileHeader) || std::memcmp(file.data(), kMagic, 8) != 0)
    throw Error(ErrorCode::invalid_model, path + ": not a .slimf file (bad magic)");
  std::memcpy(&fh, file.data(), sizeof(fh));
  if (fh.version != kSlimfVersion)
    throw Error(ErrorCode::unsupported, path + ": .slimf version " + std::to_string(fh.version) +
                                            " (this build reads version " + std::to_string(kSlimfVersion) + ")");
  if (fh.encoding > 1)
    throw Error(ErrorCode::invalid_model, path + ": unknown encoding " + std::to_string(fh.encoding));
  if (fh.payload_size != file.size() - sizeof(FileHeader))
    throw Error(ErrorCode::invalid_model, path + ": payload size " + std::to_string(fh.payload_size) +
                                              " does not match the file size " + std::to_string(file.size()));
  return path;
}

}  // namespace

std::string encode_slimf(const CompiledForest& cf, SlimfEncoding encoding) {
  std::string payload;
  if (encoding == SlimfEncoding::compact) {
    payload = encode_compact(cf);
  } else {
    payload.assign(reinterpret_cast<const char*>(cf.payload()), cf.payload_size());
  }
  FileHeader fh{};
  std::memcpy(fh.magic, kMagic, 8);
  fh.version = kSlimfVersion;
  fh.encoding = uint32_t(encoding);
  fh.payload_size = payload.size();
  fh.checksum = XXH3_64bits(payload.data(), payload.size());
  std::string out(reinterpret_cast<const char*>(&fh), sizeof(fh));
  out += payload;
  return out;
}

void save_slimf(const CompiledForest& cf, const std::string& path, SlimfEncoding encoding) {
  const std::string bytes = encode_slimf(cf, encoding);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream os(tmp, std::ios::binary | std::ios::trunc);
    slim::check(bool(os), ErrorCode::not_found, path + ": cannot open for writing");
    os.write(bytes.data(), std::streamsize(bytes.size()));
    slim::check(bool(os), ErrorCode::resource_exhausted, path + ": write failed");
  }
  slim::check(std::rename(tmp.c_str(), path.c_str()) == 0, ErrorCode::internal,
              path + ": cannot rename the temporary file into place");
}

CompiledForest load_slimf(const std::string& path) {
  auto file = MappedFile::open(path, /*populate=*/true);
  FileHeader fh;
  read_header(*file, fh);
  const uint8_t* payload = file->data() + sizeof(FileHeader);
  if (XXH3_64bits(payload, fh.payload_size) != fh.checksum)
    throw Error(ErrorCode::integrity, path + ": checksum mismatch (the file is corrupt)");
  if (fh.encoding == uint32_t(SlimfEncoding::plain))
    return CompiledForest::from_payload(payload, fh.payload_size, file, path);
  CompiledHeader h;
  slim::check(fh.payload_size >= sizeof(h), ErrorCode::invalid_model, path + ": compact payload is truncated");
  std::memcpy(&h, payload, sizeof(h));
  return compile_forest(decode_compact(payload, fh.payload_size, path), (h.flags & kRanked) != 0);
}

SlimfEncoding slimf_encoding(const std::string& path) {
  auto file = MappedFile::open(path);
  FileHeader fh;
  read_header(*file, fh);
  return SlimfEncoding(fh.encoding);
}

bool is_slimf_file(const std::string& path) {
  auto file = MappedFile::open(path);
  return file->size() >= 8 && std::memcmp(file->data(), kMagic, 8) == 0;
}

Forest decompile(const CompiledForest& cf) {
  const std::string payload = encode_compact(cf);
  return decode_compact(reinterpret_cast<const uint8_t*>(payload.data()), payload.size(), "decompile");
}

CompiledForest load_compiled_forest(const std::string& path) {
  if (is_slimf_file(path)) return load_slimf(path);
  return compile_forest(load_forest_source(path));
}

}  // namespace slim::forest
