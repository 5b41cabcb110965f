// load_npy and save_npy (declared in tensor.h).
//
// xtensor's xt::load_npy / xt::dump_npy do not fit here: they need the element type at
// compile time while a Tensor learns it from the header; their descriptor check rejects the
// '<V2' that bfloat16 files carry and has no 2-byte floats; and a short file loads without
// complaint. So the header is parsed here, and xtensor does the part it is good at: turning
// Fortran-order data into row-major by assignment between layouts.
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>

#include "error.h"
#include "tensor.h"

namespace ladle {

namespace {

static_assert(std::endian::native == std::endian::little,
              "ladle's .npy I/O copies element bytes as they are, so it needs a little-endian host");

constexpr std::string_view kMagic{"\x93NUMPY", 6};
// numpy starts the data at a multiple of 64 bytes and leaves room in the header for the first
// axis to grow to 21 digits; doing the same makes save_npy's bytes identical to np.save's.
constexpr std::size_t kDataAlignment = 64;
constexpr std::size_t kGrowthAxisDigits = 21;

struct DescrEntry {
  std::string_view kind_and_size;  // the descriptor without its byte-order character
  DType dtype;
  std::string_view note;  // shown in the list of supported descriptors
};

constexpr DescrEntry kDescrs[] = {
    {"f4", DType::f32, "float32"},
    {"f8", DType::f64, "float64"},
    {"f2", DType::f16, "float16"},
    {"V2", DType::bf16, "bfloat16, as numpy saves ml_dtypes.bfloat16"},
    {"i4", DType::i32, "int32"},
    {"i8", DType::i64, "int64"},
    {"u1", DType::u8, "uint8"},
    {"b1", DType::u8, "bool, loaded as uint8"},
};

std::string_view descr_for(DType dtype) {
  switch (dtype) {
    case DType::f32: return "<f4";
    case DType::f16: return "<f2";
    case DType::bf16: return "<V2";
    case DType::f64: return "<f8";
    case DType::i32: return "<i4";
    case DType::i64: return "<i8";
    case DType::u8: return "|u1";
  }
  detail::throw_unknown_dtype(static_cast<int>(dtype));
}

DType dtype_for_descr(const std::string& descr, const std::string& file) {
  const DescrEntry* found = nullptr;
  if (descr.size() >= 3 && std::string_view("<>|=").find(descr[0]) != std::string_view::npos) {
    for (const auto& entry : kDescrs) {
      if (descr.substr(1) == entry.kind_and_size) found = &entry;
    }
  }
  if (found == nullptr) {
    std::vector<std::string> supported;
    for (const auto& entry : kDescrs) {
      const char order = entry.kind_and_size.substr(1) == "1" ? '|' : '<';
      supported.push_back(fmt::format("'{}{}' ({})", order, entry.kind_and_size, entry.note));
    }
    throw InvalidArgument(fmt::format("load_npy: '{}' has dtype '{}', which ladle cannot load; "
                                      "expected one of {}",
                                      file, descr, fmt::join(supported, ", ")));
  }
  if (descr[0] == '>' && dtype_size(found->dtype) > 1) {
    throw InvalidArgument(fmt::format(
        "load_npy: '{}' has dtype '{}' (big-endian), expected little-endian", file, descr));
  }
  return found->dtype;
}

struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<std::size_t> shape;
};

// Reads the one Python literal a .npy header holds: a dict with the keys 'descr' (a str),
// 'fortran_order' (a bool) and 'shape' (a tuple of ints), in any order.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& file) : text_(text), file_(file) {}

  NpyHeader parse() {
    NpyHeader header;
    bool seen_descr = false, seen_fortran_order = false, seen_shape = false;
    expect('{');
    while (!accept('}')) {
      const std::string key = parse_string();
      expect(':');
      if (key == "descr" && !seen_descr) {
        skip_space();
        if (pos_ < text_.size() && text_[pos_] == '[') {
          throw InvalidArgument(fmt::format("load_npy: '{}' has a structured dtype (descr is a "
                                            "list of fields), expected a plain numeric dtype",
                                            file_));
        }
        header.descr = parse_string();
        seen_descr = true;
      } else if (key == "fortran_order" && !seen_fortran_order) {
        header.fortran_order = parse_bool();
        seen_fortran_order = true;
      } else if (key == "shape" && !seen_shape) {
        header.shape = parse_shape();
        seen_shape = true;
      } else {
        fail(fmt::format("unexpected or repeated key '{}'", key));
      }
      if (!accept(',')) {
        expect('}');
        break;
      }
    }
    skip_space();
    if (pos_ != text_.size()) fail("text after the closing '}'");
    if (!seen_descr) fail("no 'descr' key");
    if (!seen_fortran_order) fail("no 'fortran_order' key");
    if (!seen_shape) fail("no 'shape' key");
    return header;
  }

 private:
  [[noreturn]] void fail(std::string_view problem) const {
    throw InvalidArgument(fmt::format("load_npy: '{}' has a malformed header ({} at offset {}): {}",
                                      file_, problem, pos_, text_));
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool accept(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void expect(char c) {
    if (!accept(c)) fail(fmt::format("expected '{}'", c));
  }

  std::string parse_string() {
    skip_space();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      fail("expected a quoted string");
    }
    const char quote = text_[pos_++];
    const std::size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string value(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return value;
  }

  bool parse_bool() {
    skip_space();
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
      if (text_.substr(pos_).starts_with(word)) {
        pos_ += std::string_view(word).size();
        return value;
      }
    }
    fail("expected True or False");
  }

  std::vector<std::size_t> parse_shape() {
    std::vector<std::size_t> shape;
    expect('(');
    while (!accept(')')) {
      skip_space();
      const std::size_t start = pos_;
      std::size_t extent = 0;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        const auto digit = static_cast<std::size_t>(text_[pos_] - '0');
        if (extent > (std::numeric_limits<std::size_t>::max() - digit) / 10) fail("shape overflow");
        extent = extent * 10 + digit;
        ++pos_;
      }
      if (pos_ == start) fail("expected a non-negative integer in the shape");
      if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2 wrote longs as 3L
      shape.push_back(extent);
      if (!accept(',')) {
        expect(')');
        break;
      }
    }
    return shape;
  }

  std::string_view text_;
  const std::string& file_;
  std::size_t pos_ = 0;
};

std::uint32_t read_little_endian(const unsigned char* bytes, std::size_t count) {
  std::uint32_t value = 0;
  for (std::size_t i = 0; i < count; ++i) value |= static_cast<std::uint32_t>(bytes[i]) << (8 * i);
  return value;
}

std::string python_tuple(const std::vector<std::size_t>& shape) {
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  return fmt::format("({})", fmt::join(shape, ", "));
}

}  // namespace

Tensor load_npy(const std::filesystem::path& path) {
  const std::string file = path.string();
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    throw InvalidArgument(fmt::format("load_npy: '{}' does not exist", file));
  }
  if (std::filesystem::is_directory(path, error)) {
    throw InvalidArgument(fmt::format("load_npy: '{}' is a directory, expected a .npy file", file));
  }
  // Lengths in the file are checked against its size before anything that large is
  // allocated, so a corrupt header fails cleanly instead of exhausting memory.
  const std::uintmax_t file_size = std::filesystem::file_size(path, error);
  std::ifstream stream(path, std::ios::binary);
  if (!stream || error) {
    throw InvalidArgument(fmt::format("load_npy: '{}' cannot be opened for reading: {}", file,
                                      std::strerror(errno)));
  }

  unsigned char prefix[12] = {};
  stream.read(reinterpret_cast<char*>(prefix), 8);
  if (stream.gcount() < 8 ||
      std::string_view(reinterpret_cast<const char*>(prefix), kMagic.size()) != kMagic) {
    throw InvalidArgument(fmt::format(
        "load_npy: '{}' is not a .npy file: it does not start with \"\\x93NUMPY\" and a version",
        file));
  }
  const unsigned major = prefix[6], minor = prefix[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    throw InvalidArgument(fmt::format(
        "load_npy: '{}' has .npy format version {}.{}, expected 1.0, 2.0 or 3.0", file, major, minor));
  }
  // Version 1.0 stores the header length in 2 bytes, later versions in 4.
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  stream.read(reinterpret_cast<char*>(prefix + 8), static_cast<std::streamsize>(length_bytes));
  if (static_cast<std::size_t>(stream.gcount()) < length_bytes) {
    throw InvalidArgument(fmt::format("load_npy: '{}' is truncated inside its header", file));
  }
  const std::size_t header_length = read_little_endian(prefix + 8, length_bytes);
  const std::size_t data_offset = 8 + length_bytes + header_length;
  if (data_offset > file_size) {
    throw InvalidArgument(fmt::format(
        "load_npy: '{}' is truncated: its header should end at byte {}, the file holds {}", file,
        data_offset, file_size));
  }
  std::string header_text(header_length, '\0');
  stream.read(header_text.data(), static_cast<std::streamsize>(header_length));
  if (static_cast<std::size_t>(stream.gcount()) < header_length) {
    throw Error(fmt::format("load_npy: reading the header of '{}' failed: {}", file,
                            std::strerror(errno)));
  }

  const NpyHeader header = HeaderParser(header_text, file).parse();
  const DType dtype = dtype_for_descr(header.descr, file);
  // The bound leaves room to multiply by the element size (8 bytes at most).
  std::size_t count = 1;
  for (const std::size_t extent : header.shape) {
    if (extent != 0 && count > std::numeric_limits<std::size_t>::max() / 8 / extent) {
      throw InvalidArgument(fmt::format("load_npy: '{}' has shape {}, too many elements to hold",
                                        file, python_tuple(header.shape)));
    }
    count *= extent;
  }
  const std::size_t data_bytes = count * dtype_size(dtype);
  if (data_bytes > file_size - data_offset) {
    throw InvalidArgument(fmt::format(
        "load_npy: '{}' is truncated: {} {} needs {} bytes of data, the file holds {}", file,
        dtype_name(dtype), python_tuple(header.shape), data_bytes, file_size - data_offset));
  }

  std::vector<std::int64_t> shape(header.shape.begin(), header.shape.end());
  Tensor tensor(dtype, shape, 0.0f);
  auto read_into = [&](void* target) {
    stream.read(static_cast<char*>(target), static_cast<std::streamsize>(data_bytes));
    if (static_cast<std::size_t>(stream.gcount()) < data_bytes) {
      throw Error(fmt::format("load_npy: reading {} bytes of data from '{}' failed: {}",
                              data_bytes, file, std::strerror(errno)));
    }
  };
  if (!header.fortran_order || header.shape.size() < 2) {
    read_into(tensor.data());
    return tensor;
  }
  // Column-major data: read as is, then assigned into the row-major tensor through xt::adapt.
  visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto column_major = xt::xarray<T, xt::layout_type::column_major>::from_shape(header.shape);
    read_into(column_major.data());
    auto row_major = xt::adapt(static_cast<T*>(tensor.data()), static_cast<std::size_t>(count), xt::no_ownership(),
                               header.shape);
    row_major = column_major;
  });
  return tensor;
}

void save_npy(const std::filesystem::path& path, const TensorView& view) {
  const std::string file = path.string();
  // Row-major bytes on the host: a strided or device view is copied first.
  const Tensor tensor = view.on_host() && view.is_contiguous() ? Tensor() : Tensor::copy_of(view, Location::host());
  const void* data = view.on_host() && view.is_contiguous() ? view.data : tensor.data();
  const std::size_t bytes = static_cast<std::size_t>(view.numel()) * dtype_size(view.type);
  const std::vector<std::size_t> shape(view.shape.begin(), view.shape.end());
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                   descr_for(view.type), python_tuple(shape));
  if (!shape.empty()) {
    header.append(kGrowthAxisDigits - fmt::formatted_size("{}", shape[0]), ' ');
  }
  // numpy pads a full block when the header is already aligned; so does this, to match.
  auto padded_length = [&](std::size_t prefix) {
    const std::size_t unpadded = prefix + header.size() + 1;  // + the closing '\n'
    return header.size() + 1 + (kDataAlignment - unpadded % kDataAlignment);
  };
  unsigned char major = 1;
  std::size_t length_bytes = 2;
  std::size_t header_length = padded_length(kMagic.size() + 2 + length_bytes);
  if (header_length > 0xFFFF) {
    major = 2;
    length_bytes = 4;
    header_length = padded_length(kMagic.size() + 2 + length_bytes);
  }
  header.resize(header_length - 1, ' ');
  header.push_back('\n');

  std::ofstream stream(path, std::ios::binary | std::ios::trunc);
  if (!stream) {
    throw InvalidArgument(fmt::format("save_npy: '{}' cannot be opened for writing: {}", file,
                                      std::strerror(errno)));
  }
  unsigned char prefix[12] = {};
  std::memcpy(prefix, kMagic.data(), kMagic.size());
  prefix[6] = major;
  prefix[7] = 0;
  for (std::size_t i = 0; i < length_bytes; ++i) {
    prefix[8 + i] = static_cast<unsigned char>(header_length >> (8 * i));
  }
  stream.write(reinterpret_cast<const char*>(prefix),
               static_cast<std::streamsize>(8 + length_bytes));
  stream.write(header.data(), static_cast<std::streamsize>(header.size()));
  stream.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  stream.flush();
  if (!stream) {
    throw Error(fmt::format("save_npy: writing {} bytes to '{}' failed: {}", bytes, file,
                            std::strerror(errno)));
  }
}

}  // namespace ladle
