// What the importer and the exporter share about ModelProto messages: how nodes are
// named when the file leaves them unnamed, and parsing past protobuf's 64 MiB default.
#pragma once

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <onnx/onnx_pb.h>

#include <climits>
#include <string>
#include <vector>

namespace slim {

// The name of each node of a graph as the graph IR has it: its own, or "<op>_<index>"
// (with a "_<k>" suffix when that is taken) when the file leaves it empty.
std::vector<std::string> graph_node_names(const onnx::GraphProto& graph);

// Protobuf refuses messages over its default 64 MiB unless told otherwise; weights up
// to the format's own 2 GiB limit are normal.
template <typename Message>
bool parse_large(Message& msg, const void* data, size_t size) {
  if (size > size_t(INT_MAX)) return false;
  google::protobuf::io::ArrayInputStream raw(data, int(size));
  google::protobuf::io::CodedInputStream in(&raw);
  in.SetTotalBytesLimit(INT_MAX);
  return msg.ParsePartialFromCodedStream(&in) && in.ConsumedEntireMessage();
}

}  // namespace slim
