// ladle::Tensor: construction, conversion, random fill, .npy I/O and relative_l2_error.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>

#include <xtensor/xarray.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xoperation.hpp>

#include "runtime/error.h"
#include "runtime/tensor.h"

using namespace std::string_literals;
using Catch::Contains;
using ladle::bfloat16;
using ladle::DType;
using ladle::half;
using ladle::InvalidArgument;
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

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.bytes() == 0 || std::memcmp(a.data(), b.data(), a.bytes()) == 0);
}

}  // namespace

// ---- Tensor -------------------------------------------------------------------------------

TEST_CASE("a default Tensor is an empty float32 tensor") {
  const Tensor empty;
  CHECK(empty.dtype() == DType::f32);
  CHECK(empty.numel() == 0);
  CHECK(empty.bytes() == 0);
  CHECK(empty.shape() == std::vector<std::size_t>{0});
  CHECK(empty.describe() == "f32[0]");
}

TEST_CASE("a Tensor made from a dtype and shape is zero-filled and reports its geometry") {
  const Tensor tensor(DType::bf16, {2, 64, 8, 128});
  CHECK(tensor.describe() == "bf16[2,64,8,128]");
  CHECK(tensor.rank() == 4);
  CHECK(tensor.numel() == 2 * 64 * 8 * 128);
  CHECK(tensor.bytes() == 2 * tensor.numel());
  const auto& values = tensor.array<bfloat16>();
  CHECK(std::all_of(values.begin(), values.end(), [](bfloat16 v) { return v.bits() == 0; }));

  const Tensor scalar(DType::f64, {});
  CHECK(scalar.rank() == 0);
  CHECK(scalar.numel() == 1);
  CHECK(scalar.describe() == "f64[]");
  CHECK(scalar.array<double>()() == 0.0);
}

TEST_CASE("Tensor::from keeps the values and data() points at them in row-major order") {
  Tensor tensor = Tensor::from(xt::xarray<float>{{1, 2, 3}, {4, 5, 6}});
  CHECK(tensor.dtype() == DType::f32);
  CHECK(tensor.describe() == "f32[2,3]");
  CHECK(tensor.data() == tensor.array<float>().data());
  CHECK(static_cast<const float*>(std::as_const(tensor).data())[4] == 5.0f);
  tensor.array<float>()(0, 2) = 9.0f;
  CHECK(static_cast<float*>(tensor.data())[2] == 9.0f);
}

TEST_CASE("array<T>() with the wrong element type throws naming both dtypes") {
  Tensor tensor(DType::bf16, {2});
  REQUIRE_THROWS_AS(tensor.array<float>(), InvalidArgument);
  REQUIRE_THROWS_WITH(tensor.array<float>(), Contains("tensor has dtype bf16, requested f32"));
  REQUIRE_THROWS_WITH(std::as_const(tensor).array<half>(),
                      Contains("tensor has dtype bf16, requested f16"));
}

TEST_CASE("copies of a Tensor are deep") {
  Tensor original = Tensor::from(xt::xarray<std::int32_t>{1, 2, 3});
  Tensor copy = original;
  copy.array<std::int32_t>()(0) = 7;
  CHECK(original.array<std::int32_t>()(0) == 1);
  Tensor moved = std::move(copy);
  CHECK(moved.array<std::int32_t>()(0) == 7);
}

TEST_CASE("reshape keeps row-major order and checks the element count") {
  const Tensor tensor = Tensor::from(xt::xarray<double>{{0, 1, 2}, {3, 4, 5}});
  const Tensor reshaped = tensor.reshape({3, 2});
  CHECK(reshaped.describe() == "f64[3,2]");
  CHECK(reshaped.array<double>()(2, 1) == 5.0);
  CHECK(reshaped.array<double>()(1, 0) == 2.0);
  CHECK(tensor.describe() == "f64[2,3]");
  REQUIRE_THROWS_AS(tensor.reshape({4, 2}), InvalidArgument);
  REQUIRE_THROWS_WITH(tensor.reshape({4, 2}),
                      Contains("[4,2] holds 8 elements") && Contains("f64[2,3] holds 6"));
}

TEST_CASE("to() rounds float32 to bfloat16 and float16 to nearest even") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor source = Tensor::from(xt::xarray<float>{1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f,
                                                       1.0f / 3.0f, 1e6f, nan});
  const auto bf16 = source.to(DType::bf16).array<bfloat16>();
  CHECK(bf16(0).bits() == 0x3F80);
  CHECK(bf16(1).bits() == 0x3F82);
  CHECK(bf16(2).bits() == 0x3EAB);
  CHECK(bf16(3).bits() == bfloat16(1e6f).bits());
  CHECK(std::isnan(static_cast<float>(bf16(4))));
  const auto f16 = source.to(DType::f16).array<half>();
  CHECK(f16(2).bits() == 0x3555);
  CHECK(f16(3).bits() == 0x7C00);  // 1e6 overflows float16
  CHECK(std::isnan(static_cast<float>(f16(4))));
}

TEST_CASE("to() from float64 to float16 and bfloat16 rounds once") {
  const Tensor source = Tensor::from(xt::xarray<double>{1.0 + 0x1p-11 + 0x1p-40, 1.0 + 0x1p-8 + 0x1p-40});
  CHECK(source.to(DType::f16).array<half>()(0).bits() == 0x3C01);
  CHECK(source.to(DType::bf16).array<bfloat16>()(1).bits() == 0x3F81);
}

TEST_CASE("to() from int64 to bfloat16 rounds once above 2^53") {
  // 2^60 + 2^52 + 1 sits just above the tie between bfloat16's 2^60 and 2^60 + 2^53; going
  // through double would first round it onto the tie and then down to 2^60.
  const std::int64_t value = (std::int64_t{1} << 60) + (std::int64_t{1} << 52) + 1;
  const Tensor source = Tensor::from(xt::xarray<std::int64_t>{value, -value});
  const auto converted = source.to(DType::bf16).array<bfloat16>();
  CHECK(converted(0).bits() == bfloat16(0x1p60 + 0x1p53).bits());
  CHECK(converted(1).bits() == bfloat16(-(0x1p60 + 0x1p53)).bits());
}

TEST_CASE("to() widens exactly, so widening and narrowing back is the identity") {
  const Tensor halves = Tensor::random_normal({1000}, DType::f16, 3);
  CHECK(same_bytes(halves.to(DType::f32).to(DType::f16), halves));
  CHECK(same_bytes(halves.to(DType::f64).to(DType::f16), halves));
  const Tensor ints = Tensor::random_uniform({1000}, DType::i32, 4, -1e9, 1e9);
  CHECK(same_bytes(ints.to(DType::f64).to(DType::i32), ints));
  CHECK(same_bytes(ints.to(DType::i64).to(DType::i32), ints));
}

TEST_CASE("to() an integer dtype truncates toward zero like numpy") {
  const Tensor source = Tensor::from(xt::xarray<float>{2.7f, -2.7f, 0.5f, -0.5f, 255.9f});
  const auto ints = source.to(DType::i32).array<std::int32_t>();
  CHECK(ints == xt::xarray<std::int32_t>{2, -2, 0, 0, 255});
  const auto bytes = Tensor::from(xt::xarray<float>{0.5f, 255.9f}).to(DType::u8).array<std::uint8_t>();
  CHECK(bytes(1) == 255);
  const auto edge = Tensor::from(xt::xarray<double>{-0x1p31}).to(DType::i32).array<std::int32_t>();
  CHECK(edge(0) == std::numeric_limits<std::int32_t>::min());
}

TEST_CASE("to() an integer dtype throws on NaN, infinity or an out-of-range value, naming it") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  REQUIRE_THROWS_AS(Tensor::from(xt::xarray<float>{1, nan}).to(DType::i32), InvalidArgument);
  REQUIRE_THROWS_WITH(Tensor::from(xt::xarray<float>{1, nan}).to(DType::i32),
                      Contains("Tensor::to(i32)") && Contains("element 1 is nan"));
  REQUIRE_THROWS_WITH(Tensor::from(xt::xarray<float>{300}).to(DType::u8),
                      Contains("element 0 is 300") && Contains("u8"));
  REQUIRE_THROWS_WITH(Tensor::from(xt::xarray<double>{0x1p31}).to(DType::i32),
                      Contains("2147483648") && Contains("i32"));
  REQUIRE_THROWS_WITH(Tensor::from(xt::xarray<std::int32_t>{4, -1}).to(DType::u8),
                      Contains("element 1 is -1") && Contains("u8"));
  REQUIRE_THROWS_WITH(Tensor::from(xt::xarray<std::int64_t>{std::int64_t{1} << 40}).to(DType::i32),
                      Contains("1099511627776"));
  REQUIRE_THROWS_WITH(Tensor::from(xt::xarray<half>{half(1e6f)}).to(DType::i64), Contains("inf"));
}

TEST_CASE("fill sets every element, converted to the dtype") {
  Tensor tensor(DType::bf16, {3, 4});
  tensor.fill(1.0 / 3.0);
  const auto& values = tensor.array<bfloat16>();
  CHECK(std::all_of(values.begin(), values.end(), [](bfloat16 v) { return v.bits() == 0x3EAB; }));
  Tensor ints(DType::i32, {2});
  REQUIRE_THROWS_AS(ints.fill(std::nan("")), InvalidArgument);
  REQUIRE_THROWS_WITH(ints.fill(std::nan("")), Contains("Tensor::fill") && Contains("nan") &&
                                                   Contains("i32"));
}

// ---- random -------------------------------------------------------------------------------

TEST_CASE("random tensors are deterministic for a seed and differ between seeds") {
  for (const DType dtype : kAllDTypes) {
    INFO(ladle::dtype_name(dtype));
    const double lo = dtype == DType::u8 ? 0.0 : -8.0;
    CHECK(same_bytes(Tensor::random_uniform({4, 33}, dtype, 42, lo, 8.0),
                     Tensor::random_uniform({4, 33}, dtype, 42, lo, 8.0)));
    CHECK_FALSE(same_bytes(Tensor::random_uniform({4, 33}, dtype, 42, lo, 8.0),
                           Tensor::random_uniform({4, 33}, dtype, 43, lo, 8.0)));
    CHECK(same_bytes(Tensor::random_normal({4, 33}, dtype, 7, 20.0, 4.0),
                     Tensor::random_normal({4, 33}, dtype, 7, 20.0, 4.0)));
    CHECK_FALSE(same_bytes(Tensor::random_normal({4, 33}, dtype, 7, 20.0, 4.0),
                           Tensor::random_normal({4, 33}, dtype, 8, 20.0, 4.0)));
  }
}

TEST_CASE("random_uniform stays in its range and is not all zeros, for every dtype") {
  for (const DType dtype : kAllDTypes) {
    INFO(ladle::dtype_name(dtype));
    const double lo = dtype == DType::u8 ? 0.0 : -3.0;
    const double hi = lo + 6.0;
    const auto values = Tensor::random_uniform({2000}, dtype, 1, lo, hi).to(DType::f64).array<double>();
    CHECK(xt::amin(values)() >= lo);
    CHECK(xt::amax(values)() <= hi);  // rounding to 16 bits may reach hi
    CHECK(xt::amax(xt::abs(values))() > 0.0);
    CHECK(xt::amax(values)() - xt::amin(values)() > 2.0);
  }
}

TEST_CASE("random_normal has the requested mean and standard deviation") {
  const auto values = Tensor::random_normal({200000}, DType::f64, 5, 2.0, 3.0).array<double>();
  const double mean = xt::mean(values)();
  const double stddev = std::sqrt(xt::mean(xt::square(values - mean))());
  CHECK(mean == Approx(2.0).margin(0.05));
  CHECK(stddev == Approx(3.0).margin(0.05));
  const auto ints = Tensor::random_normal({1000}, DType::i32, 5, 0.0, 10.0).array<std::int32_t>();
  CHECK(xt::amax(xt::abs(ints))() > 0);
}

TEST_CASE("random tensors reject invalid parameters and all-zero results") {
  REQUIRE_THROWS_AS(Tensor::random_normal({4}, DType::f32, 1, 0.0, 0.0), InvalidArgument);
  REQUIRE_THROWS_WITH(Tensor::random_normal({4}, DType::f32, 1, 0.0, 0.0), Contains("stddev is 0"));
  REQUIRE_THROWS_WITH(Tensor::random_normal({4}, DType::f32, 1, std::nan(""), 1.0),
                      Contains("mean is nan"));
  REQUIRE_THROWS_WITH(Tensor::random_uniform({4}, DType::f32, 1, 1.0, 1.0), Contains("[1, 1)"));
  REQUIRE_THROWS_WITH(Tensor::random_uniform({4}, DType::u8, 1, 0.0, 1.0),
                      Contains("u8[4] rounded to zero"));
  REQUIRE_THROWS_WITH(Tensor::random_normal({4}, DType::f16, 1, 0.0, 1e-12),
                      Contains("f16[4] rounded to zero"));
  REQUIRE_THROWS_WITH(Tensor::random_uniform({4}, DType::u8, 1, 0.0, 1000.0),
                      Contains("u8 cannot represent"));
}

// ---- .npy ---------------------------------------------------------------------------------

TEST_CASE("every dtype round-trips bit-exactly through save_npy and load_npy") {
  const TempDir dir;
  const std::vector<std::vector<std::size_t>> shapes = {{3, 5, 7}, {1000}, {}, {0, 4}};
  for (const DType dtype : kAllDTypes) {
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      // Integers from [1, 120) cannot come out all zero, whatever the seed.
      const bool integral = dtype == DType::i32 || dtype == DType::i64 || dtype == DType::u8;
      const Tensor original = integral ? Tensor::random_uniform(shapes[i], dtype, i, 1.0, 120.0)
                                       : Tensor::random_normal(shapes[i], dtype, i, 0.5, 2.0);
      INFO(original.describe());
      const auto path = dir / (ladle::dtype_name(dtype) + std::to_string(i) + ".npy");
      ladle::save_npy(path, original);
      const Tensor loaded = ladle::load_npy(path);
      CHECK(loaded.describe() == original.describe());
      CHECK(same_bytes(loaded, original));
    }
  }
}

// Bytes np.save writes for np.arange(6, dtype=np.float32).reshape(2, 3).
const std::string kNumpyFloat32File =
    npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }") +
    raw_bytes<float>({0, 1, 2, 3, 4, 5});

TEST_CASE("save_npy writes the same bytes as np.save") {
  const TempDir dir;
  ladle::save_npy(dir / "f32.npy", Tensor::from(xt::xarray<float>{{0, 1, 2}, {3, 4, 5}}));
  CHECK(read_file(dir / "f32.npy") == kNumpyFloat32File);

  // np.save of np.array([1/3, -2, 65504], dtype=ml_dtypes.bfloat16).
  const std::string numpy_bfloat16 =
      npy_header("{'descr': '<V2', 'fortran_order': False, 'shape': (3,), }") +
      raw_bytes<std::uint16_t>({0x3EAB, 0xC000, 0x4780});
  ladle::save_npy(dir / "bf16.npy",
                  Tensor::from(xt::xarray<float>{1 / 3.0f, -2.0f, 65504.0f}).to(DType::bf16));
  CHECK(read_file(dir / "bf16.npy") == numpy_bfloat16);
}

TEST_CASE("load_npy reads a float32 file as numpy writes it") {
  const TempDir dir;
  write_file(dir / "numpy.npy", kNumpyFloat32File);
  const Tensor loaded = ladle::load_npy(dir / "numpy.npy");
  CHECK(loaded.describe() == "f32[2,3]");
  CHECK(loaded.array<float>() == xt::xarray<float>{{0, 1, 2}, {3, 4, 5}});
}

TEST_CASE("load_npy reads numpy's bfloat16 files ('<V2' and '|V2') as bfloat16") {
  const TempDir dir;
  for (const std::string descr : {"<V2", "|V2"}) {
    INFO(descr);
    write_file(dir / "bf16.npy",
               npy_header("{'descr': '" + descr + "', 'fortran_order': False, 'shape': (2,), }") +
                   raw_bytes<std::uint16_t>({0x3EAB, 0xC000}));
    const Tensor loaded = ladle::load_npy(dir / "bf16.npy");
    REQUIRE(loaded.dtype() == DType::bf16);
    CHECK(loaded.array<bfloat16>()(0).bits() == 0x3EAB);
    CHECK(static_cast<float>(loaded.array<bfloat16>()(1)) == -2.0f);
  }
}

TEST_CASE("load_npy reads a bool file as uint8") {
  const TempDir dir;
  write_file(dir / "bool.npy",
             npy_header("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }") + "\x01\x00\x01"s);
  const Tensor loaded = ladle::load_npy(dir / "bool.npy");
  CHECK(loaded.describe() == "u8[3]");
  CHECK(loaded.array<std::uint8_t>() == xt::xarray<std::uint8_t>{1, 0, 1});
}

TEST_CASE("load_npy transposes a Fortran-order file into row-major") {
  const TempDir dir;
  // np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)): columns are contiguous.
  write_file(dir / "fortran.npy",
             npy_header("{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }") +
                 raw_bytes<std::int32_t>({0, 3, 1, 4, 2, 5}));
  const Tensor loaded = ladle::load_npy(dir / "fortran.npy");
  CHECK(loaded.describe() == "i32[2,3]");
  CHECK(loaded.array<std::int32_t>() == xt::xarray<std::int32_t>{{0, 1, 2}, {3, 4, 5}});
  CHECK(static_cast<const std::int32_t*>(loaded.data())[1] == 1);
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
  CHECK(loaded.array<double>() == xt::xarray<double>{1.5, -2.5});
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
  REQUIRE_THROWS_AS(ladle::save_npy(path, Tensor(DType::f32, {2})), InvalidArgument);
  REQUIRE_THROWS_WITH(ladle::save_npy(path, Tensor(DType::f32, {2})),
                      Contains(path.string()) && Contains("cannot be opened for writing"));
}

// ---- relative_l2_error --------------------------------------------------------------------

TEST_CASE("relative_l2_error of known values, across dtypes") {
  const Tensor ref = Tensor::from(xt::xarray<double>{1, 2, 2});  // norm 3
  CHECK(ladle::relative_l2_error(Tensor::from(xt::xarray<float>{1, 2, 3}), ref) ==
        Approx(1.0 / 3.0).epsilon(1e-15));
  CHECK(ladle::relative_l2_error(ref.to(DType::bf16), ref) == 0.0);
  CHECK(ladle::relative_l2_error(Tensor::from(xt::xarray<std::int32_t>{1, 2, 2}), ref) == 0.0);
  CHECK(ladle::relative_l2_error(Tensor::from(xt::xarray<float>{1, 2, 3}).to(DType::f16),
                                 ref.to(DType::bf16)) == Approx(1.0 / 3.0).epsilon(1e-15));
}

TEST_CASE("relative_l2_error sums over more elements than one chunk") {
  const Tensor ref = Tensor::random_normal({3, 5000}, DType::f64, 9);
  const Tensor out = Tensor::from(xt::xarray<double>(ref.array<double>() * 1.001));
  CHECK(ladle::relative_l2_error(out, ref) == Approx(1e-3).epsilon(1e-9));
}

TEST_CASE("relative_l2_error is infinite when out holds a NaN or an infinity") {
  const Tensor ref = Tensor::from(xt::xarray<double>{1, 2, 3});
  CHECK(std::isinf(ladle::relative_l2_error(Tensor::from(xt::xarray<float>{1, std::nanf(""), 3}), ref)));
  CHECK(std::isinf(ladle::relative_l2_error(
      Tensor::from(xt::xarray<half>{half(1.0f), half(1e6f), half(3.0f)}), ref)));
}

TEST_CASE("relative_l2_error returns the norm of out when ref is all zeros") {
  const Tensor zeros(DType::f64, {2});
  CHECK(ladle::relative_l2_error(Tensor::from(xt::xarray<float>{3, 4}), zeros) == 5.0);
  CHECK(ladle::relative_l2_error(zeros, zeros) == 0.0);
}

TEST_CASE("relative_l2_error rejects a shape mismatch and a non-finite reference") {
  const Tensor out(DType::f32, {2, 3});
  REQUIRE_THROWS_AS(ladle::relative_l2_error(out, Tensor(DType::f64, {3, 2})), InvalidArgument);
  REQUIRE_THROWS_WITH(ladle::relative_l2_error(out, Tensor(DType::f64, {3, 2})),
                      Contains("f32[2,3]") && Contains("f64[3,2]"));
  REQUIRE_THROWS_WITH(
      ladle::relative_l2_error(Tensor(DType::f32, {2}), Tensor::from(xt::xarray<double>{1, std::nan("")})),
      Contains("ref element 1 is nan"));
}
