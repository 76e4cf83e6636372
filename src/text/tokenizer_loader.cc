#include "slim/text/tokenizer_loader.h"

#include <filesystem>
#include <mutex>
#include <vector>

#include "slim/core/error.h"

namespace slim::text {
namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::vector<TokenizerLoader>& registry() {
  static std::vector<TokenizerLoader> loaders;
  return loaders;
}

}  // namespace

void register_tokenizer_loader(TokenizerLoader loader) {
  std::lock_guard lock(registry_mutex());
  registry().push_back(std::move(loader));
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw Error(ErrorCode::not_found, path + ": no such tokenizer or model file");
  std::vector<TokenizerLoader> loaders;
  {
    std::lock_guard lock(registry_mutex());
    loaders = registry();
  }
  for (auto it = loaders.rbegin(); it != loaders.rend(); ++it) {
    if (it->accepts && it->accepts(path)) return it->load(path);
  }
  return Tokenizer::from_hf_json(path);
}

}  // namespace slim::text
