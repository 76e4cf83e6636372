// Ref kernel of Einsum: any equation with explicit or implicit output, ellipsis
// broadcasting, repeated labels within an operand (diagonals) and summed labels. It loops
// over every combination of label values, which is slow but obviously right.
#include <algorithm>
#include <array>
#include <cctype>

#include "runtime/ref/math_common.h"
#include "runtime/ref/ref_kernels.h"

namespace slim::ref {

namespace {

constexpr int kLetterLabels = 52;   // a-z, A-Z
constexpr int kEllipsisLabel = -1;  // marks "..." in a parsed term

struct EinsumEquation {
  std::vector<std::vector<int>> inputs;  // per operand: letter labels, kEllipsisLabel for "..."
  std::vector<int> output;
  bool explicit_output = false;
};

int letter_label(char c) {
  if (c >= 'a' && c <= 'z') return c - 'a';
  if (c >= 'A' && c <= 'Z') return 26 + (c - 'A');
  return -2;
}

[[noreturn]] void bad_equation(const Node& node, const std::string& eq, const std::string& why) {
  throw Error(ErrorCode::invalid_model, node.describe() + ": equation '" + eq + "': " + why);
}

std::vector<int> parse_term(const Node& node, const std::string& eq, const std::string& term) {
  std::vector<int> labels;
  bool ellipsis = false;
  for (size_t i = 0; i < term.size(); ++i) {
    if (term[i] == '.') {
      if (term.compare(i, 3, "...") != 0) bad_equation(node, eq, "a lone '.'");
      if (ellipsis) bad_equation(node, eq, "more than one '...' in a term");
      ellipsis = true;
      labels.push_back(kEllipsisLabel);
      i += 2;
      continue;
    }
    const int l = letter_label(term[i]);
    if (l < 0) bad_equation(node, eq, std::string("unexpected character '") + term[i] + "'");
    labels.push_back(l);
  }
  return labels;
}

EinsumEquation parse_equation(const Node& node, const std::string& raw) {
  std::string eq;
  for (char c : raw)
    if (!std::isspace(static_cast<unsigned char>(c))) eq += c;
  EinsumEquation e;
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  size_t start = 0;
  while (true) {
    const size_t comma = lhs.find(',', start);
    e.inputs.push_back(parse_term(node, raw, lhs.substr(start, comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (arrow != std::string::npos) {
    e.explicit_output = true;
    e.output = parse_term(node, raw, eq.substr(arrow + 2));
    std::array<int, kLetterLabels> seen{};
    bool any_ellipsis = false;
    for (const auto& in : e.inputs)
      for (int l : in) {
        if (l >= 0)
          seen[size_t(l)] = 1;
        else
          any_ellipsis = true;
      }
    std::array<int, kLetterLabels> out_seen{};
    for (int l : e.output) {
      if (l == kEllipsisLabel) {
        if (!any_ellipsis) bad_equation(node, raw, "'...' in the output but in no input");
        continue;
      }
      if (!seen[size_t(l)]) bad_equation(node, raw, "output label absent from the inputs");
      if (out_seen[size_t(l)]++) bad_equation(node, raw, "output label repeated");
    }
  }
  return e;
}

void compute_einsum(KernelContext& ctx, const EinsumEquation& eq_in) {
  const int n_in = ctx.num_inputs();
  if (n_in != int(eq_in.inputs.size()))
    ctx.fail(ErrorCode::invalid_model, "equation has " + std::to_string(eq_in.inputs.size()) +
                                           " operands but the node has " + std::to_string(n_in) +
                                           " inputs");
  std::vector<const Tensor*> ins;
  for (int i = 0; i < n_in; ++i) {
    ins.push_back(&ctx.required_input(i));
    if (ins.back()->dtype() != ins[0]->dtype())
      ctx.fail(ErrorCode::invalid_model, "operands have different dtypes");
  }

  // Ellipsis dims of operand i: its rank minus its letters; all right-aligned to the
  // widest one and given labels kLetterLabels + position.
  int ell_rank = 0;
  std::vector<int> ell_of(size_t(n_in), 0);
  for (int i = 0; i < n_in; ++i) {
    const auto& term = eq_in.inputs[size_t(i)];
    const int letters = int(std::count_if(term.begin(), term.end(), [](int l) { return l >= 0; }));
    const bool has_ell = letters != int(term.size());
    const int r = ins[size_t(i)]->rank();
    if ((!has_ell && r != letters) || (has_ell && r < letters))
      ctx.fail(ErrorCode::invalid_argument,
               "operand " + std::to_string(i) + " " + ins[size_t(i)]->describe() +
                   " does not match its term's " + std::to_string(letters) + " labels");
    ell_of[size_t(i)] = r - letters;
    ell_rank = std::max(ell_rank, r - letters);
  }
  const int n_labels = kLetterLabels + ell_rank;
  std::vector<int64_t> size(size_t(n_labels), -1);
  std::vector<int> count(size_t(n_labels), 0);
  // Per operand: for each dim, its label.
  std::vector<std::vector<int>> dim_label(static_cast<size_t>(n_in));
  for (int i = 0; i < n_in; ++i) {
    for (int l : eq_in.inputs[size_t(i)]) {
      if (l == kEllipsisLabel) {
        for (int e = 0; e < ell_of[size_t(i)]; ++e)
          dim_label[size_t(i)].push_back(kLetterLabels + ell_rank - ell_of[size_t(i)] + e);
      } else {
        dim_label[size_t(i)].push_back(l);
      }
    }
    for (size_t d = 0; d < dim_label[size_t(i)].size(); ++d) {
      const int l = dim_label[size_t(i)][d];
      const int64_t s = ins[size_t(i)]->shape()[d];
      ++count[size_t(l)];
      int64_t& known = size[size_t(l)];
      if (known == -1) {
        known = s;
      } else if (s != known) {
        // Only ellipsis dims broadcast; a letter must have one size everywhere.
        if (l >= kLetterLabels && (s == 1 || known == 1)) {
          known = std::max(known, s);
        } else {
          ctx.fail(ErrorCode::invalid_argument, "label sizes disagree: operand " +
                                                    std::to_string(i) + " dim " +
                                                    std::to_string(d) + " is " + std::to_string(s) +
                                                    ", elsewhere " + std::to_string(known));
        }
      }
    }
  }

  // Output labels: explicit, or implicit = ellipsis dims then letters used exactly once.
  std::vector<int> out_labels;
  if (eq_in.explicit_output) {
    for (int l : eq_in.output) {
      if (l == kEllipsisLabel)
        for (int e = 0; e < ell_rank; ++e) out_labels.push_back(kLetterLabels + e);
      else
        out_labels.push_back(l);
    }
  } else {
    for (int e = 0; e < ell_rank; ++e) out_labels.push_back(kLetterLabels + e);
    for (int l = 0; l < kLetterLabels; ++l)
      if (count[size_t(l)] == 1) out_labels.push_back(l);
  }
  std::vector<int> loop_labels = out_labels;
  for (int l = 0; l < n_labels; ++l)
    if (size[size_t(l)] >= 0 &&
        std::find(out_labels.begin(), out_labels.end(), l) == out_labels.end())
      loop_labels.push_back(l);
  Shape out_shape;
  for (int l : out_labels) out_shape.push_back(size[size_t(l)]);

  // Strides of each loop label in each operand (summed over repeated labels, so a label
  // used twice walks the diagonal; 0 where an ellipsis dim of size 1 broadcasts).
  const size_t nl = loop_labels.size();
  std::vector<std::vector<int64_t>> stride(size_t(n_in), std::vector<int64_t>(nl, 0));
  for (int i = 0; i < n_in; ++i) {
    const Shape st = contiguous_strides(ins[size_t(i)]->shape());
    for (size_t d = 0; d < dim_label[size_t(i)].size(); ++d) {
      const int l = dim_label[size_t(i)][d];
      if (ins[size_t(i)]->shape()[d] == 1 && size[size_t(l)] != 1) continue;
      const size_t pos =
          size_t(std::find(loop_labels.begin(), loop_labels.end(), l) - loop_labels.begin());
      stride[size_t(i)][pos] += st[d];
    }
  }
  Shape loop_shape;
  for (int l : loop_labels) loop_shape.push_back(size[size_t(l)]);
  const int64_t total = shape_numel(loop_shape);
  const int64_t out_n = shape_numel(out_shape);
  const int64_t inner_n = out_n == 0 ? 0 : total / out_n;  // combinations summed per output

  visit_class<kFloat | kInt>(ctx, ins[0]->dtype(), "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = std::conditional_t<kIsFloat<T>, double, T>;
    Tensor& y = ctx.output(0, ins[0]->dtype(), out_shape);
    T* out = elems_mut<T>(y);
    std::vector<int64_t> idx(nl, 0);
    std::vector<int64_t> off(size_t(n_in), 0);
    // Output labels lead loop_labels, so the row-major walk over loop_shape visits each
    // output element's inner_n terms consecutively.
    for (int64_t o = 0; o < out_n; ++o) {
      A acc = A(0);
      for (int64_t t = 0; t < inner_n; ++t) {
        A prod = A(1);
        for (int i = 0; i < n_in; ++i) {
          const T v = elems<T>(*ins[size_t(i)])[off[size_t(i)]];
          if constexpr (kIsFloat<T>)
            prod *= to_double(v);
          else
            prod = wrap_mul(prod, v);
        }
        if constexpr (kIsFloat<T>)
          acc += prod;
        else
          acc = wrap_add(acc, prod);
        for (size_t d = nl; d-- > 0;) {
          ++idx[d];
          for (int i = 0; i < n_in; ++i) off[size_t(i)] += stride[size_t(i)][d];
          if (idx[d] < loop_shape[d]) break;
          for (int i = 0; i < n_in; ++i) off[size_t(i)] -= stride[size_t(i)][d] * idx[d];
          idx[d] = 0;
        }
      }
      out[o] = T(compute_t<T>(acc));
    }
  });
}

}  // namespace

void register_matmul_einsum_kernels(KernelRegistry& r) {
  KernelFactory f = [](const Node& node, int64_t) -> std::unique_ptr<OpKernel> {
    if (!node.has_attr("equation"))
      throw Error(ErrorCode::invalid_model, node.describe() + ": attribute 'equation' is missing");
    const EinsumEquation eq = parse_equation(node, node.attr_string("equation", ""));
    return make_kernel([eq](KernelContext& ctx) { compute_einsum(ctx, eq); });
  };
  r.add(KernelDef{"Einsum", "", 12, INT_MAX, f, {}});
}

}  // namespace slim::ref
