// slim: the command-line front door over libslim. Subcommands live in cmd_*.cc.
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "slim/core/cpu_features.h"
#include "slim/core/error.h"
#include "slim/core/thread_pool.h"

namespace slim::cli {

std::vector<CommandEntry>& command_registry() {
  static std::vector<CommandEntry> registry;
  return registry;
}

void add_threads_option(CLI::App* cmd, int* threads) {
  cmd->add_option("--threads", *threads, "Worker threads (0 = all hardware threads)")
      ->check(CLI::NonNegativeNumber);
}

void add_isa_option(CLI::App* cmd) {
  // A bad SLIM_ISA is an error before the command prints or does anything.
  cmd->preparse_callback([](size_t) { active_isa(); });
  cmd->add_option_function<std::string>(
         "--isa", [](const std::string& name) { set_isa_limit(name); },
         "Kernel instruction set, at most the CPU's: " + isa_names() + " (default: the CPU's best, or SLIM_ISA)")
      ->type_name("ISA");
}

std::string cpu_note() {
  return active_isa() == hardware_isa() ? "" : std::string(" (CPU: ") + isa_name(hardware_isa()) + ")";
}

std::string isa_report() { return isa_name(active_isa()) + cpu_note(); }

void add_mmap_flag(CLI::App* cmd, bool* map) {
  cmd->add_flag("--mmap", *map,
                "Use the weights in place from the file's page cache instead of reading them into "
                "huge-page memory (less memory and a faster load; decode 10-20% slower)");
}

}  // namespace slim::cli

int main(int argc, char** argv) {
  CLI::App app{
      "slim: compress, verify and serve ONNX networks, GGUF language models and "
      "gradient-boosted trees.\n\n"
      "Exit codes: 0 success; 1 internal error; 2 bad input (usage, malformed file, "
      "unsupported model, missing file); 3 integrity failure (digest, signature, audit "
      "chain); 4 resource exhausted or service unavailable."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "slim " SLIM_VERSION_STRING);
  auto& reg = slim::cli::command_registry();
  std::stable_sort(reg.begin(), reg.end(),
                   [](const auto& a, const auto& b) { return a.order < b.order; });
  for (auto& entry : reg) entry.add(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  } catch (const slim::Error& e) {
    std::fflush(stdout);
    std::cerr << "slim: error [" << slim::error_code_name(e.code()) << "]: " << e.what() << "\n";
    return slim::exit_code_for(e.code());
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << "slim: internal error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
