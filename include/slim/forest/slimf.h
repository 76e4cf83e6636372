// .slimf: slim's versioned, checksummed file for compiled forests. The plain encoding is
// the compiled tables themselves (plain or ranked layout), used in place from a memory
// map; the compact encoding stores each threshold as its rank in a per-feature table
// with the narrowest integer that holds it (and children implicitly), a lossless form
// several times smaller that is expanded on load into the layout it was saved from.
#pragma once

#include <string>

#include "slim/forest/compiled_forest.h"

namespace slim::forest {

enum class SlimfEncoding : uint32_t { plain = 0, compact = 1 };

// 2: leaf indices in the packed word, the ranked layout and its threshold tables.
inline constexpr uint32_t kSlimfVersion = 2;

// The whole file as bytes; save_slimf writes it atomically (temp file + rename).
std::string encode_slimf(const CompiledForest& forest, SlimfEncoding encoding);
void save_slimf(const CompiledForest& forest, const std::string& path, SlimfEncoding encoding);

// Maps the file, checks magic, version, sizes and the XXH3 checksum (integrity error on
// mismatch), then validates the tables. Plain files are used in place.
CompiledForest load_slimf(const std::string& path);
SlimfEncoding slimf_encoding(const std::string& path);
bool is_slimf_file(const std::string& path);

// Rebuilds the loaded form from compiled tables (for re-encoding and inspection).
Forest decompile(const CompiledForest& forest);

// A .slimf file, or any source model (XGBoost JSON/UBJSON, LightGBM text) compiled now.
CompiledForest load_compiled_forest(const std::string& path);

}  // namespace slim::forest
