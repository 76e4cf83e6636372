// PNG (libpng's simplified API) and JPEG (libjpeg-turbo) decoding to 8-bit RGB.
#include <png.h>
#include <setjmp.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>

#include "slim/core/error.h"
#include "slim/quant/sample_set.h"

namespace slim::quant {

namespace {

Tensor decode_png(const std::string& path) {
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&img, path.c_str()))
    throw Error(ErrorCode::invalid_argument, path + ": cannot decode PNG: " + img.message);
  img.format = PNG_FORMAT_RGB;
  Tensor out(DType::u8, {int64_t(img.height), int64_t(img.width), 3});
  if (!png_image_finish_read(&img, nullptr, out.raw_data(), 0, nullptr)) {
    const std::string msg = img.message;
    png_image_free(&img);
    throw Error(ErrorCode::invalid_argument, path + ": cannot decode PNG: " + msg);
  }
  return out;
}

struct JpegError {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_fail(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  longjmp(e->jump, 1);
}

Tensor decode_jpeg(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  check(f != nullptr, ErrorCode::not_found, path + ": cannot open");
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_fail;
  // Only plain data lives between setjmp and longjmp; the tensor is made after the header.
  Tensor out;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    throw Error(ErrorCode::invalid_argument, path + ": cannot decode JPEG: " + err.message);
  }
  jpeg_create_decompress(&cinfo);
  jpeg_stdio_src(&cinfo, f.get());
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  out = Tensor(DType::u8, {int64_t(cinfo.output_height), int64_t(cinfo.output_width), 3});
  auto* base = out.data<uint8_t>();
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = base + size_t(cinfo.output_scanline) * cinfo.output_width * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return out;
}

}  // namespace

Tensor decode_image(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  check(bool(f), ErrorCode::not_found, path + ": cannot open");
  unsigned char magic[8] = {};
  f.read(reinterpret_cast<char*>(magic), sizeof magic);
  if (f.gcount() == 8 && png_sig_cmp(magic, 0, 8) == 0) return decode_png(path);
  if (f.gcount() >= 3 && magic[0] == 0xFF && magic[1] == 0xD8 && magic[2] == 0xFF)
    return decode_jpeg(path);
  throw Error(ErrorCode::invalid_argument, path + ": not a PNG or JPEG image");
}

}  // namespace slim::quant
