// ladle::Tensor: construction, host and device memory, copies between views and locations, .npy I/O.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>

#include "runtime/driver.h"
#include "runtime/error.h"
#include "runtime/tensor.h"

using namespace std::string_literals;
using Catch::Contains;
using ladle::bfloat16;
using ladle::DType;
using ladle::half;
using ladle::InvalidArgument;
using ladle::Location;
using ladle::Tensor;

namespace {

const DType kAllDTypes[] = {DType::f32, DType::f16, DType::bf16, DType::f64,
                            DType::i32, DType::i64, DType::u8};

// A fresh directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::random_device entropy;
    path_ = std::filesystem::temp_directory_path() /
            ("ladle-tensor-test-" + std::to_string(entropy()) + std::to_string(entropy()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream stream(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(stream), std::istreambuf_iterator<char>()};
}

// A version 1.0 .npy header around `dict`, padded the way np.save pads it.
std::string npy_header(const std::string& dict, std::size_t total_length = 128) {
  const std::size_t header_length = total_length - 10;
  std::string bytes = "\x93NUMPY\x01\x00"s;
  bytes.push_back(static_cast<char>(header_length & 0xFF));
  bytes.push_back(static_cast<char>(header_length >> 8));
  return bytes + dict + std::string(header_length - dict.size() - 1, ' ') + "\n";
}

template <class T>
std::string raw_bytes(std::initializer_list<T> values) {
  std::string bytes;
  for (const T value : values) {
    bytes.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  return bytes;
}

template <class T>
Tensor tensor_of(std::vector<std::int64_t> shape, std::vector<T> values) {
  Tensor tensor(ladle::dtype_of<T>, std::move(shape));
  REQUIRE(static_cast<std::size_t>(tensor.numel()) == values.size());
  if (!values.empty()) std::memcpy(tensor.data(), values.data(), values.size() * sizeof(T));
  return tensor;
}

template <class T>
std::vector<T> values_of(const Tensor& tensor) {
  REQUIRE(tensor.type() == ladle::dtype_of<T>);
  std::vector<T> values(static_cast<std::size_t>(tensor.numel()));
  if (!values.empty()) std::memcpy(values.data(), tensor.data(), values.size() * sizeof(T));
  return values;
}

// Random elements of any dtype (integers from [1, 120), floats normal), from a seed.
Tensor random_tensor(DType dtype, std::vector<std::int64_t> shape, std::uint64_t seed) {
  Tensor tensor(dtype, std::move(shape), 0.0f);
  std::mt19937_64 rng(seed);
  ladle::visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto* data = static_cast<T*>(tensor.data());
    for (std::int64_t i = 0; i < tensor.numel(); ++i) {
      if constexpr (std::is_integral_v<T>) data[i] = static_cast<T>(std::uniform_int_distribution<int>(1, 119)(rng));
      else data[i] = T(std::normal_distribution<double>(0.5, 2.0)(rng));
    }
  });
  return tensor;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.type() == b.type() && a.shape() == b.shape() && a.location() == b.location() &&
         (a.bytes() == 0 || std::memcmp(a.data(), b.data(), a.bytes()) == 0);
}

}  // namespace

// ---- Tensor -------------------------------------------------------------------------------

TEST_CASE("a default Tensor is an empty f32 host tensor") {
  const Tensor empty;
  CHECK(empty.type() == DType::f32);
  CHECK(empty.shape() == std::vector<std::int64_t>{0});
  CHECK(empty.numel() == 0);
  CHECK(empty.location() == Location::host());
}

TEST_CASE("a host Tensor is filled (NaN by default) and reads and writes elements rounded to its dtype") {
  const Tensor poisoned(DType::bf16, {2, 3});
  CHECK(poisoned.numel() == 6);
  CHECK(poisoned.bytes() == 12);
  CHECK(std::isnan(poisoned.get(5)));
  Tensor halves(DType::f16, {4}, 0.1f);
  CHECK(halves.get(3) == static_cast<float>(half(0.1f)));
  halves.set(0, 65520.0f);  // past the largest half: infinity
  CHECK(std::isinf(halves.get(0)));
  CHECK(values_of<std::int64_t>(Tensor(DType::i64, {2}, 7.0f)) == std::vector<std::int64_t>{7, 7});
  CHECK(values_of<std::int32_t>(Tensor(DType::i32, {2})) == std::vector<std::int32_t>{0, 0});
  REQUIRE_THROWS_WITH(Tensor(DType::f32, {2, -1}), Contains("extent -1"));
}

TEST_CASE("a Tensor's view is dense, row-major and located on the host") {
  const Tensor tensor(DType::f32, {2, 3, 4});
  const ladle::TensorView view = tensor.view();
  CHECK(view.data == tensor.data());
  CHECK(view.strides == std::vector<std::int64_t>{12, 4, 1});
  CHECK(view.on_host());
  CHECK(view.is_contiguous());
  CHECK(ladle::describe(view) == "f32[2,3,4] on host");
}

TEST_CASE("copies of a Tensor are deep") {
  const Tensor original = tensor_of<std::int32_t>({3}, {1, 2, 3});
  Tensor copy = original;
  static_cast<std::int32_t*>(copy.data())[0] = 7;
  CHECK(values_of<std::int32_t>(original) == std::vector<std::int32_t>{1, 2, 3});
  const Tensor moved = std::move(copy);
  CHECK(values_of<std::int32_t>(moved) == std::vector<std::int32_t>{7, 2, 3});
}

TEST_CASE("copy() moves elements between strided host views; copy_of packs one densely") {
  const Tensor source = tensor_of<float>({2, 3}, {0, 1, 2, 3, 4, 5});
  // The transpose of source, as a [3,2] view with strides (1, 3).
  ladle::TensorView transposed = source.view();
  transposed.shape = {3, 2};
  transposed.strides = {1, 3};
  CHECK_FALSE(transposed.is_contiguous());
  const Tensor packed = Tensor::copy_of(transposed, Location::host());
  CHECK(values_of<float>(packed) == std::vector<float>{0, 3, 1, 4, 2, 5});
  Tensor target(DType::f32, {2, 3});
  ladle::TensorView target_transposed = target.view();
  target_transposed.shape = {3, 2};
  target_transposed.strides = {1, 3};
  ladle::copy(packed.view(), target_transposed);
  CHECK(values_of<float>(target) == values_of<float>(source));
  REQUIRE_THROWS_WITH(ladle::copy(source.view(), Tensor(DType::f32, {3, 2}).view()),
                      Contains("copy: source is f32[2,3] on host, target is f32[3,2] on host"));
}

TEST_CASE("a device Tensor round-trips through device memory on a stream, or says there is no GPU") {
  const Tensor host = random_tensor(DType::bf16, {3, 5, 7}, 3);
  if (!ladle::driver_available()) {
    WARN("device tensors not exercised here: " << ladle::driver_unavailable_reason());
    REQUIRE_THROWS_AS(host.to(Location::device(0)), ladle::NoCudaDriver);
    return;
  }
  const ladle::Stream stream;
  const Tensor device = host.to(Location::device(0), &stream);
  CHECK(device.location() == Location::device(0));
  CHECK(device.view().on_device());
  CHECK(ladle::location_of(device.data()) == Location::device(0));
  CHECK(ladle::location_of(host.data()) == Location::host());
  REQUIRE_THROWS_WITH(device.get(0), Contains("Tensor::get") && Contains("on cuda:0, expected host memory"));
  const Tensor device_copy = device;  // device to device
  const Tensor back = device_copy.to(Location::host(), &stream);
  CHECK(same_bytes(back, host));
  // A device tensor starts poisoned: every byte 0xff.
  const Tensor fresh = Tensor(DType::f32, {4}, Location::device(0), &stream).to(Location::host(), &stream);
  for (int i = 0; i < 4; ++i) CHECK(std::isnan(fresh.get(i)));
  // Into a strided host view, from a contiguous device one.
  Tensor target(DType::bf16, {7, 5, 3}, 0.0f);
  ladle::TensorView transposed = target.view();
  transposed.shape = {3, 5, 7};
  transposed.strides = {1, 3, 15};
  ladle::copy(device.view(), transposed, &stream);
  CHECK(same_bytes(Tensor::copy_of(transposed, Location::host()), host));
}

// ---- .npy ---------------------------------------------------------------------------------

TEST_CASE("every dtype round-trips bit-exactly through save_npy and load_npy") {
  const TempDir dir;
  const std::vector<std::vector<std::int64_t>> shapes = {{3, 5, 7}, {1000}, {}, {0, 4}};
  for (const DType dtype : kAllDTypes) {
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const Tensor original = random_tensor(dtype, shapes[i], i);
      INFO(ladle::describe(original.view()));
      const auto path = dir / (std::string(ladle::dtype_name(dtype)) + std::to_string(i) + ".npy");
      ladle::save_npy(path, original.view());
      const Tensor loaded = ladle::load_npy(path);
      CHECK(same_bytes(loaded, original));
    }
  }
}

TEST_CASE("save_npy writes a strided view in row-major order") {
  const TempDir dir;
  const Tensor source = tensor_of<float>({3, 2}, {0, 3, 1, 4, 2, 5});
  ladle::TensorView transposed = source.view();
  transposed.shape = {2, 3};
  transposed.strides = {1, 2};
  ladle::save_npy(dir / "t.npy", transposed);
  CHECK(values_of<float>(ladle::load_npy(dir / "t.npy")) == std::vector<float>{0, 1, 2, 3, 4, 5});
}

// Bytes np.save writes for np.arange(6, dtype=np.float32).reshape(2, 3).
const std::string kNumpyFloat32File =
    npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }") +
    raw_bytes<float>({0, 1, 2, 3, 4, 5});

TEST_CASE("save_npy writes the same bytes as np.save") {
  const TempDir dir;
  ladle::save_npy(dir / "f32.npy", tensor_of<float>({2, 3}, {0, 1, 2, 3, 4, 5}).view());
  CHECK(read_file(dir / "f32.npy") == kNumpyFloat32File);

  // np.save of np.array([1/3, -2, 65504], dtype=ml_dtypes.bfloat16).
  const std::string numpy_bfloat16 =
      npy_header("{'descr': '<V2', 'fortran_order': False, 'shape': (3,), }") +
      raw_bytes<std::uint16_t>({0x3EAB, 0xC000, 0x4780});
  ladle::save_npy(dir / "bf16.npy", tensor_of<bfloat16>({3}, {bfloat16(1 / 3.0f), bfloat16(-2.0f), bfloat16(65504.0f)}).view());
  CHECK(read_file(dir / "bf16.npy") == numpy_bfloat16);
}

TEST_CASE("load_npy reads a float32 file as numpy writes it") {
  const TempDir dir;
  write_file(dir / "numpy.npy", kNumpyFloat32File);
  const Tensor loaded = ladle::load_npy(dir / "numpy.npy");
  CHECK(loaded.shape() == std::vector<std::int64_t>{2, 3});
  CHECK(values_of<float>(loaded) == std::vector<float>{0, 1, 2, 3, 4, 5});
}

TEST_CASE("load_npy reads numpy's bfloat16 files ('<V2' and '|V2') as bfloat16") {
  const TempDir dir;
  for (const std::string descr : {"<V2", "|V2"}) {
    INFO(descr);
    write_file(dir / "bf16.npy",
               npy_header("{'descr': '" + descr + "', 'fortran_order': False, 'shape': (2,), }") +
                   raw_bytes<std::uint16_t>({0x3EAB, 0xC000}));
    const Tensor loaded = ladle::load_npy(dir / "bf16.npy");
    REQUIRE(loaded.type() == DType::bf16);
    CHECK(values_of<bfloat16>(loaded)[0].bits() == 0x3EAB);
    CHECK(loaded.get(1) == -2.0f);
  }
}

TEST_CASE("load_npy reads a bool file as uint8") {
  const TempDir dir;
  write_file(dir / "bool.npy",
             npy_header("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }") + "\x01\x00\x01"s);
  const Tensor loaded = ladle::load_npy(dir / "bool.npy");
  CHECK(values_of<std::uint8_t>(loaded) == std::vector<std::uint8_t>{1, 0, 1});
}

TEST_CASE("load_npy transposes a Fortran-order file into row-major") {
  const TempDir dir;
  // np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)): columns are contiguous.
  write_file(dir / "fortran.npy",
             npy_header("{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }") +
                 raw_bytes<std::int32_t>({0, 3, 1, 4, 2, 5}));
  const Tensor loaded = ladle::load_npy(dir / "fortran.npy");
  CHECK(loaded.shape() == std::vector<std::int64_t>{2, 3});
  CHECK(values_of<std::int32_t>(loaded) == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5});
}

TEST_CASE("load_npy accepts format version 2.0 and header keys in any order") {
  const TempDir dir;
  const std::string dict = "{'shape': (2,), 'fortran_order': False, 'descr': '<f8'}";
  std::string bytes = "\x93NUMPY\x02\x00"s;
  const std::size_t header_length = 128 - 12;
  bytes += raw_bytes<std::uint32_t>({static_cast<std::uint32_t>(header_length)});
  bytes += dict + std::string(header_length - dict.size() - 1, ' ') + "\n";
  write_file(dir / "v2.npy", bytes + raw_bytes<double>({1.5, -2.5}));
  const Tensor loaded = ladle::load_npy(dir / "v2.npy");
  CHECK(values_of<double>(loaded) == std::vector<double>{1.5, -2.5});
}

TEST_CASE("load_npy rejects bad files with InvalidArgument naming the file and the problem") {
  const TempDir dir;
  const auto path = dir / "bad.npy";
  const std::string file = path.string();

  SECTION("missing file") {
    REQUIRE_THROWS_AS(ladle::load_npy(dir / "absent.npy"), InvalidArgument);
    REQUIRE_THROWS_WITH(ladle::load_npy(dir / "absent.npy"),
                        Contains("absent.npy") && Contains("does not exist"));
  }
  SECTION("bad magic") {
    write_file(path, "PK\x03\x04 not numpy at all, but long enough"s);
    REQUIRE_THROWS_AS(ladle::load_npy(path), InvalidArgument);
    REQUIRE_THROWS_WITH(ladle::load_npy(path), Contains(file) && Contains("not a .npy file"));
  }
  SECTION("truncated data") {
    write_file(path, kNumpyFloat32File.substr(0, kNumpyFloat32File.size() - 12));
    REQUIRE_THROWS_AS(ladle::load_npy(path), InvalidArgument);
    REQUIRE_THROWS_WITH(ladle::load_npy(path),
                        Contains(file) && Contains("truncated") && Contains("needs 24 bytes") &&
                            Contains("holds 12"));
  }
  SECTION("truncated header") {
    write_file(path, kNumpyFloat32File.substr(0, 40));
    REQUIRE_THROWS_AS(ladle::load_npy(path), InvalidArgument);
    REQUIRE_THROWS_WITH(ladle::load_npy(path), Contains(file) && Contains("truncated"));
  }
  SECTION("big-endian") {
    write_file(path, npy_header("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }") +
                         "\x3f\x80\x00\x00"s);
    REQUIRE_THROWS_AS(ladle::load_npy(path), InvalidArgument);
    REQUIRE_THROWS_WITH(ladle::load_npy(path),
                        Contains("load_npy: '" + file + "' has dtype '>f4' (big-endian), expected "
                                 "little-endian"));
  }
  SECTION("unsupported descriptor") {
    write_file(path, npy_header("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }") +
                         std::string(8, '\0'));
    REQUIRE_THROWS_AS(ladle::load_npy(path), InvalidArgument);
    REQUIRE_THROWS_WITH(ladle::load_npy(path), Contains("'<c8'") && Contains("'<V2' (bfloat16"));
  }
  SECTION("structured dtype") {
    write_file(path, npy_header("{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, "
                                "'shape': (1,), }") +
                         std::string(8, '\0'));
    REQUIRE_THROWS_AS(ladle::load_npy(path), InvalidArgument);
    REQUIRE_THROWS_WITH(ladle::load_npy(path), Contains(file) && Contains("structured dtype"));
  }
  SECTION("malformed header") {
    write_file(path, npy_header("{'descr': '<f4', 'fortran_order': False, }") + std::string(4, '\0'));
    REQUIRE_THROWS_AS(ladle::load_npy(path), InvalidArgument);
    REQUIRE_THROWS_WITH(ladle::load_npy(path), Contains(file) && Contains("no 'shape' key"));
  }
  SECTION("unknown format version") {
    std::string bytes = kNumpyFloat32File;
    bytes[6] = '\x04';
    write_file(path, bytes);
    REQUIRE_THROWS_AS(ladle::load_npy(path), InvalidArgument);
    REQUIRE_THROWS_WITH(ladle::load_npy(path), Contains(file) && Contains("version 4.0"));
  }
}

TEST_CASE("save_npy into a missing directory throws naming the path") {
  const TempDir dir;
  const auto path = dir / "no-such-dir" / "x.npy";
  REQUIRE_THROWS_AS(ladle::save_npy(path, Tensor(DType::f32, {2}).view()), InvalidArgument);
  REQUIRE_THROWS_WITH(ladle::save_npy(path, Tensor(DType::f32, {2}).view()),
                      Contains(path.string()) && Contains("cannot be opened for writing"));
}

