#include "slim/core/npy.h"

#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

namespace slim {

namespace {

const char* npy_descr(DType t) {
  switch (t) {
    case DType::f32: return "<f4";
    case DType::f16: return "<f2";
    case DType::f64: return "<f8";
    case DType::i8: return "|i1";
    case DType::u8: return "|u1";
    case DType::i16: return "<i2";
    case DType::u16: return "<u2";
    case DType::i32: return "<i4";
    case DType::u32: return "<u4";
    case DType::i64: return "<i8";
    case DType::u64: return "<u8";
    case DType::boolean: return "|b1";
    case DType::bf16: return nullptr;
  }
  return nullptr;
}

DType dtype_from_descr(const std::string& d, const std::string& name) {
  static const struct { const char* s; DType t; } kMap[] = {
      {"<f4", DType::f32}, {"<f2", DType::f16}, {"<f8", DType::f64}, {"|i1", DType::i8},
      {"|u1", DType::u8},  {"<i2", DType::i16}, {"<u2", DType::u16}, {"<i4", DType::i32},
      {"<u4", DType::u32}, {"<i8", DType::i64}, {"<u8", DType::u64}, {"|b1", DType::boolean},
      {"i1", DType::i8},   {"u1", DType::u8},   {"b1", DType::boolean}, {"<b1", DType::boolean},
      {"<i1", DType::i8},  {"<u1", DType::u8},
  };
  for (const auto& m : kMap)
    if (d == m.s) return m.t;
  throw Error(ErrorCode::invalid_argument,
              name + ": unsupported .npy dtype '" + d + "' (big-endian and object arrays are not supported)");
}

// Finds the value text after 'key': in the header dict.
std::string dict_value(const std::string& header, const std::string& key, const std::string& name) {
  const std::string k1 = "'" + key + "'";
  size_t p = header.find(k1);
  if (p == std::string::npos) p = header.find("\"" + key + "\"");
  check(p != std::string::npos, ErrorCode::invalid_argument,
        name + ": .npy header lacks '" + key + "'");
  p = header.find(':', p);
  check(p != std::string::npos, ErrorCode::invalid_argument, name + ": malformed .npy header");
  ++p;
  while (p < header.size() && header[p] == ' ') ++p;
  size_t e = p;
  if (p < header.size() && header[p] == '(') {
    e = header.find(')', p);
    check(e != std::string::npos, ErrorCode::invalid_argument, name + ": malformed .npy shape");
    return header.substr(p, e - p + 1);
  }
  if (p < header.size() && (header[p] == '\'' || header[p] == '"')) {
    e = header.find(header[p], p + 1);
    check(e != std::string::npos, ErrorCode::invalid_argument, name + ": malformed .npy header");
    return header.substr(p + 1, e - p - 1);
  }
  while (e < header.size() && header[e] != ',' && header[e] != '}') ++e;
  return header.substr(p, e - p);
}

// A little-endian unsigned field of `n` bytes (zip headers).
uint64_t le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

}  // namespace

Tensor parse_npy(const void* data, size_t size, const std::string& name) {
  const auto* b = static_cast<const unsigned char*>(data);
  check(size >= 10 && std::memcmp(b, "\x93NUMPY", 6) == 0, ErrorCode::invalid_argument,
        name + ": not a .npy file (bad magic)");
  const int major = b[6];
  size_t header_len, pos;
  if (major == 1) {
    header_len = size_t(b[8]) | size_t(b[9]) << 8;
    pos = 10;
  } else if (major == 2 || major == 3) {
    check(size >= 12, ErrorCode::invalid_argument, name + ": truncated .npy header");
    header_len = size_t(b[8]) | size_t(b[9]) << 8 | size_t(b[10]) << 16 | size_t(b[11]) << 24;
    pos = 12;
  } else {
    throw Error(ErrorCode::invalid_argument, name + ": unsupported .npy version " + std::to_string(major));
  }
  check(header_len <= size - pos, ErrorCode::invalid_argument, name + ": truncated .npy header");
  const std::string header(reinterpret_cast<const char*>(b + pos), header_len);
  pos += header_len;

  const DType dtype = dtype_from_descr(dict_value(header, "descr", name), name);
  const std::string fortran = dict_value(header, "fortran_order", name);
  check(fortran.find("False") != std::string::npos, ErrorCode::invalid_argument,
        name + ": Fortran-ordered .npy arrays are not supported");
  const std::string shape_text = dict_value(header, "shape", name);
  Shape shape;
  {
    std::string inner = shape_text.substr(1, shape_text.size() - 2);
    std::stringstream ss(inner);
    std::string item;
    while (std::getline(ss, item, ',')) {
      size_t a = item.find_first_not_of(" \t");
      if (a == std::string::npos) continue;
      size_t z = item.find_last_not_of(" \tL");
      const std::string num = item.substr(a, z - a + 1);
      check(!num.empty() && num.find_first_not_of("0123456789") == std::string::npos,
            ErrorCode::invalid_argument, name + ": bad .npy shape " + shape_text);
      check(num.size() < 19, ErrorCode::invalid_argument, name + ": .npy dimension too large");
      shape.push_back(std::stoll(num));
    }
  }
  const int64_t n = shape_numel(shape);
  const size_t esize = dtype_size(dtype);
  check(size_t(n) <= (size - pos) / esize, ErrorCode::invalid_argument,
        name + ": .npy data is truncated: shape " + shape_str(shape) + " needs " +
            std::to_string(size_t(n) * esize) + " bytes, file has " + std::to_string(size - pos));
  Tensor t(dtype, shape);
  if (n) std::memcpy(t.raw_data(), b + pos, t.nbytes());
  if (dtype == DType::boolean) {
    auto* p = static_cast<uint8_t*>(t.raw_data());
    for (int64_t i = 0; i < n; ++i) p[i] = p[i] != 0;
  }
  return t;
}

Tensor read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  check(bool(f), ErrorCode::not_found, path + ": cannot open");
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return parse_npy(bytes.data(), bytes.size(), path);
}

// The zip layout (PKWARE APPNOTE): an end-of-central-directory record at the end (with a
// zip64 one before it when counts or offsets overflow), the central directory it points
// to, and per member a local header followed by the data. Sizes and offsets come from the
// central directory; a local header is read only for the length of its name and extra
// field (numpy writes a zip64 extra there even for small members).
std::vector<std::pair<std::string, Tensor>> parse_npz(const void* data, size_t size, const std::string& name) {
  const auto* b = static_cast<const unsigned char*>(data);
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw Error(ErrorCode::invalid_argument, name + ": " + what);
  };
  need(size >= 22, "not an .npz file (too short for a zip archive)");
  size_t eocd = size - 22;
  while (le(b + eocd, 4) != 0x06054b50) {
    need(eocd > 0 && size - eocd < 22 + 65535, "not an .npz file (no zip directory)");
    --eocd;
  }
  uint64_t entries = le(b + eocd + 10, 2), cd_size = le(b + eocd + 12, 4), cd_off = le(b + eocd + 16, 4);
  if (entries == 0xffff || cd_size == 0xffffffff || cd_off == 0xffffffff) {
    need(eocd >= 20 && le(b + eocd - 20, 4) == 0x07064b50, "damaged zip64 directory locator");
    const uint64_t z = le(b + eocd - 20 + 8, 8);
    need(size >= 56 && z <= size - 56 && le(b + z, 4) == 0x06064b50, "damaged zip64 directory record");
    entries = le(b + z + 32, 8);
    cd_size = le(b + z + 40, 8);
    cd_off = le(b + z + 48, 8);
  }
  need(cd_off <= size && cd_size <= size - cd_off, "the zip directory lies outside the file");
  const uint64_t cd_end = cd_off + cd_size;
  std::vector<std::pair<std::string, Tensor>> out;
  std::set<std::string> seen;
  uint64_t p = cd_off;
  for (uint64_t k = 0; k < entries; ++k) {
    need(cd_end - p >= 46 && le(b + p, 4) == 0x02014b50, "damaged zip directory entry " + std::to_string(k));
    const uint64_t flags = le(b + p + 8, 2), method = le(b + p + 10, 2), nlen = le(b + p + 28, 2),
                   elen = le(b + p + 30, 2), clen = le(b + p + 32, 2);
    uint64_t csize = le(b + p + 20, 4), usize = le(b + p + 24, 4), off = le(b + p + 42, 4);
    need(cd_end - p - 46 >= nlen + elen + clen, "damaged zip directory entry " + std::to_string(k));
    const std::string member(reinterpret_cast<const char*>(b + p + 46), nlen);
    // zip64 extra field: the 8-byte forms of the fields saturated above, in this order.
    for (uint64_t e = p + 46 + nlen, end = e + elen; end - e >= 4;) {
      const uint64_t id = le(b + e, 2), len = le(b + e + 2, 2);
      need(end - e - 4 >= len, "member '" + member + "': damaged zip extra field");
      uint64_t f = e + 4;
      for (uint64_t* v : {&usize, &csize, &off})
        if (id == 1 && *v == 0xffffffff) {
          need(e + 4 + len - f >= 8, "member '" + member + "': damaged zip64 extra field");
          *v = le(b + f, 8);
          f += 8;
        }
      e += 4 + len;
    }
    p += 46 + nlen + elen + clen;
    need(!(flags & 1), "member '" + member + "' is encrypted");
    need(method == 0, "member '" + member + "' is compressed (zip method " + std::to_string(method) +
                          "); only stored members are read: write the archive with numpy.savez, not "
                          "numpy.savez_compressed");
    need(csize == usize, "member '" + member + "': stored sizes disagree");
    need(member.size() > 4 && member.ends_with(".npy"), "member '" + member + "' is not a .npy array");
    need(off <= size && size - off >= 30 && le(b + off, 4) == 0x04034b50,
         "member '" + member + "': damaged local header");
    const uint64_t at = off + 30 + le(b + off + 26, 2) + le(b + off + 28, 2);
    need(at <= size && csize <= size - at, "member '" + member + "' is truncated");
    const std::string key = member.substr(0, member.size() - 4);
    need(seen.insert(key).second, "member '" + member + "' appears twice");
    out.emplace_back(key, parse_npy(b + at, size_t(csize), name + ": member '" + member + "'"));
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> read_npz(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  check(bool(f), ErrorCode::not_found, path + ": cannot open");
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return parse_npz(bytes.data(), bytes.size(), path);
}

std::string encode_npy(const Tensor& tensor) {
  const char* descr = npy_descr(tensor.dtype());
  check(descr != nullptr, ErrorCode::unsupported,
        "cannot write a " + std::string(dtype_name(tensor.dtype())) + " tensor as .npy");
  std::string shape = "(";
  for (size_t i = 0; i < tensor.shape().size(); ++i) {
    shape += std::to_string(tensor.shape()[i]);
    shape += (tensor.shape().size() == 1 || i + 1 < tensor.shape().size()) ? "," : "";
    if (i + 1 < tensor.shape().size()) shape += " ";
  }
  shape += ")";
  std::string header = "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': " +
                       shape + ", }";
  // Pad so that the data starts on a 64-byte boundary; the header ends with '\n'.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += char(1);
  out += char(0);
  out += char(header.size() & 0xff);
  out += char((header.size() >> 8) & 0xff);
  out += header;
  const Tensor c = tensor.contiguous();
  out.append(static_cast<const char*>(c.raw_data()), c.nbytes());
  return out;
}

void write_npy(const std::string& path, const Tensor& tensor) {
  const std::string bytes = encode_npy(tensor);
  std::ofstream f(path, std::ios::binary);
  check(bool(f), ErrorCode::invalid_argument, path + ": cannot write");
  f.write(bytes.data(), std::streamsize(bytes.size()));
  check(bool(f), ErrorCode::invalid_argument, path + ": write failed");
}

}  // namespace slim
