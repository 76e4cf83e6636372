// How subcommands join the `slim` command line: each tools/slim/cmd_*.cc file adds its
// subcommands from a static SLIM_COMMAND registrar, so a new front door needs no edit
// to main.cc. Callbacks throw slim::Error; main() turns it into a message and exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace slim {
struct Model;
struct ModelSummary;
}  // namespace slim

namespace slim::cli {

struct CommandEntry {
  int order;  // position in `slim --help`
  std::function<void(CLI::App&)> add;
};

std::vector<CommandEntry>& command_registry();

struct CommandRegistrar {
  CommandRegistrar(int order, std::function<void(CLI::App&)> add) {
    command_registry().push_back({order, std::move(add)});
  }
};

// Options every command that runs kernels shares.
void add_threads_option(CLI::App* cmd, int* threads);
// --isa scalar|avx2|avx512|neon: lowers the kernel sets below the CPU's best (as SLIM_ISA
// does), for commands that choose kernels.
void add_isa_option(CLI::App* cmd);
// " (CPU: avx512)" when the kernel level was lowered below the CPU's, else "".
std::string cpu_note();
// The kernel level in use, for reports: "avx2" or "avx2 (CPU: avx512)" when lowered.
std::string isa_report();
// --mmap for commands that load a GGUF model (see LlamaModel::load).
void add_mmap_flag(CLI::App* cmd, bool* map);
// Refuses (unsupported, exit code 2) a model with ops the providers have no kernel for,
// naming every such op with its reason and nodes, before compile touches a weight.
void require_supported_ops(const Model& model, const std::vector<std::string>& providers, const std::string& path);
// What `slim inspect` reports of a model (ops, parameters, FLOPs of one run at its input
// shapes), with shapes from a compile without graph passes: passes fuse nodes before
// shapes are inferred, and a fused node's FLOPs would go uncounted.
ModelSummary summarize_model_shapes(const Model& model, const std::vector<std::string>& providers);

}  // namespace slim::cli

#define SLIM_CONCAT_INNER(a, b) a##b
#define SLIM_CONCAT(a, b) SLIM_CONCAT_INNER(a, b)
#define SLIM_COMMAND(order, fn) \
  static ::slim::cli::CommandRegistrar SLIM_CONCAT(slim_command_, __LINE__)(order, fn)
