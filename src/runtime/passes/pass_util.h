// Helpers the graph passes share: who reads each value, node removal and replacement
// that keep that index and the topological order right.
#pragma once

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "slim/runtime/passes.h"

namespace slim::passes {

// Readers of every value, one entry per input slot (a node reading a value twice appears
// twice), plus the values that must keep their name: graph outputs and values a subgraph
// reads from the outer scope.
class UseIndex {
 public:
  explicit UseIndex(const PassGraph& g);
  void add(Node* node);
  void remove(Node* node);
  const std::vector<Node*>& readers(const std::string& value) const;
  // The one node reading the value once, when nothing else (graph output, subgraph) needs it.
  Node* sole_reader(const std::string& value) const;
  bool pinned(const std::string& value) const { return pinned_.count(value) != 0; }

 private:
  std::unordered_map<std::string, std::vector<Node*>> readers_;
  std::unordered_set<std::string> pinned_;
  std::vector<Node*> none_;
};

bool has_subgraph(const Node& node);

// Position of each node in g.nodes (nullptr slots are skipped).
std::unordered_map<const Node*, size_t> positions(const PassGraph& g);

// Moves the node at `pos` to g.removed, leaving a null slot; compact() drops null slots.
void remove_at(PassGraph& g, size_t pos);
void compact(PassGraph& g);

// The scalar value of a one-element f32/f64 constant.
std::optional<double> scalar_constant(const PassGraph& g, const std::string& value);

// Replaces every input `from` of the nodes reading it by `to`, keeping `index` right.
void rename_reads(UseIndex& index, const std::string& from, const std::string& to);

}  // namespace slim::passes
