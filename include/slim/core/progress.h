// A one-line progress display for long work (conformance runs, quantization, signing of
// large files). It redraws in place on a terminal and prints nothing when stderr is
// piped or redirected, so logs and CI output stay clean.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace slim {

class Progress {
 public:
  Progress(std::string label, int64_t total);
  ~Progress();  // clears the line
  void update(int64_t done, const std::string& detail = "");
  void finish();
  // Erases the line so the caller can print a full line; the next update() redraws.
  void clear_line();
  static bool enabled();  // true when stderr is a terminal

 private:
  std::string label_;
  int64_t total_;
  bool active_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace slim
