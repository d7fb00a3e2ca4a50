// GPU unit tests of the Hopper primitives (src/cuda/sm90/primitives_sm90.cuh), one per primitive, each against
// a plain CPU reference. They run only on compute capability 9.0 (the kernels are sm_90a machine code).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/half.h"
#include "cuda/sm90/swizzle.h"
#include "cuda/sm90/tensor_map.h"
#include "gpu/device_tensor.h"
#include "gpu/sm90_primitive_kernels.h"

namespace flashattn::test {
namespace {

#define FA_REQUIRE_SM90()                                                                  \
  FA_REQUIRE_GPU();                                                                        \
  if (flashattn::cuda_compute_capability(0) != 90) GTEST_SKIP() << "needs compute capability 9.0"

// desc_advance (one add on the address field) gives the same descriptor as encoding the advanced address anew,
// for every tile base and step the kernels can form. Integer arithmetic only: runs without a GPU.
TEST(Sm90Primitives, DescriptorAdvanceMatchesEncoding) {
  uint32_t first_base = 0, first_bytes = 0;
  const int mismatches = sm90::descriptor_advance_mismatches(&first_base, &first_bytes);
  EXPECT_EQ(mismatches, 0) << "first at base " << first_base << " + " << first_bytes << " bytes";
}

// A device buffer of T, freed on scope exit.
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  explicit DeviceBuffer(size_t n) : count(n) {
    if (cudaMalloc(&ptr, n * sizeof(T) + 1) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  void upload(const std::vector<T>& h) { cudaMemcpy(ptr, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> download() const {
    std::vector<T> h(count);
    cudaMemcpy(h.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

// Random 16-bit values (bits of bf16 or fp16) and their exact values as doubles.
struct Matrix16 {
  std::vector<uint16_t> bits;
  std::vector<double> values;
};

Matrix16 random_matrix(std::mt19937_64& rng, size_t n, bool bf16) {
  std::normal_distribution<double> dist(0.0, 1.0);
  Matrix16 m;
  m.bits.resize(n);
  m.values.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float x = float(dist(rng));
    if (bf16) {
      const bfloat16_t v = to_bfloat16(x);
      std::memcpy(&m.bits[i], &v, 2);
      m.values[i] = to_float(v);
    } else {
      const half_t v = to_half(x);
      std::memcpy(&m.bits[i], &v, 2);
      m.values[i] = to_float(v);
    }
  }
  return m;
}

double round16(double x, bool bf16) { return bf16 ? to_float(to_bfloat16(float(x))) : to_float(to_half(float(x))); }

// The first few entries of a [rows x cols] result that differ from the reference by more than `tol`.
std::string mismatches(const std::vector<double>& got, const std::vector<double>& want, int cols, double tol) {
  std::string out;
  int shown = 0;
  for (size_t i = 0; i < got.size() && shown < 6; ++i) {
    if (std::fabs(got[i] - want[i]) <= tol) continue;
    out += "\n  (" + std::to_string(i / size_t(cols)) + ", " + std::to_string(i % size_t(cols)) + "): got " +
           std::to_string(got[i]) + " want " + std::to_string(want[i]);
    ++shown;
  }
  return out;
}

// fp32 accumulation of k products of O(1) values: error well under 1e-5 relative; layout mistakes give O(1).
constexpr double kFp32ProductTolerance = 1e-5;

TEST(Sm90Primitives, TmaLoadWritesThe128ByteSwizzleWithZeroFilledTail) {
  FA_REQUIRE_SM90();
  constexpr int kRows = 200, kCols = 128, kBoxRows = 64, kPanels = 2, kRow0 = 160;
  std::vector<uint16_t> host(size_t(kRows) * kCols);
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) host[size_t(r) * kCols + c] = uint16_t(1 + r * kCols + c);  // never 0
  DeviceBuffer<uint16_t> src(host.size());
  src.upload(host);
  DeviceBuffer<uint8_t> dump(size_t(kPanels) * kBoxRows * cuda::sm90::kSwizzleBytes);
  CUtensorMap map;
  const int64_t dims[4] = {kCols, kRows, 1, 1}, strides[3] = {kCols, int64_t(kRows) * kCols, int64_t(kRows) * kCols};
  Status st = detail::make_tensor_map_sw128(&map, src.ptr, DType::bf16, dims, strides, kBoxRows);
  ASSERT_TRUE(st.ok()) << st.message;
  FA_CUDA_CHECK(test::sm90::tma_load_and_dump(map, 0, kRow0, kBoxRows, kPanels, dump.ptr));
  const std::vector<uint8_t> bytes = dump.download();
  int wrong = 0;
  for (int r = 0; r < kBoxRows; ++r)
    for (int c = 0; c < kCols; ++c) {
      uint16_t got;
      std::memcpy(&got, &bytes[cuda::sm90::swizzled_offset(r, c, kBoxRows)], 2);
      const int gr = kRow0 + r;
      const uint16_t want = gr < kRows ? host[size_t(gr) * kCols + c] : 0;
      if (got != want && ++wrong <= 5) ADD_FAILURE() << "smem (" << r << ", " << c << "): got " << got << " want " << want;
    }
  EXPECT_EQ(wrong, 0);
}

TEST(Sm90Primitives, ClusterMulticastFillsBothCtasAndRemoteArrivalsCarryAStore) {
  FA_REQUIRE_SM90();
  constexpr int kRows = 64, kCols = 64, kHalfRows = 32;
  std::vector<uint16_t> host(size_t(kRows) * kCols);
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) host[size_t(r) * kCols + c] = uint16_t(1 + r * kCols + c);  // never 0
  DeviceBuffer<uint16_t> src(host.size());
  src.upload(host);
  const size_t tile_bytes = size_t(kRows) * cuda::sm90::kSwizzleBytes;
  DeviceBuffer<uint8_t> dump(2 * tile_bytes);
  DeviceBuffer<uint32_t> echo(1);
  CUtensorMap map;
  const int64_t dims[4] = {kCols, kRows, 1, 1}, strides[3] = {kCols, int64_t(kRows) * kCols, int64_t(kRows) * kCols};
  Status st = detail::make_tensor_map_sw128(&map, src.ptr, DType::bf16, dims, strides, kHalfRows);
  ASSERT_TRUE(st.ok()) << st.message;
  constexpr uint32_t kToken = 0x5eed1234u;
  FA_CUDA_CHECK(test::sm90::cluster_multicast(map, kHalfRows, kToken, dump.ptr, echo.ptr));
  EXPECT_EQ(echo.download()[0], kToken);
  const std::vector<uint8_t> bytes = dump.download();
  int wrong = 0;
  for (int rank = 0; rank < 2; ++rank)
    for (int r = 0; r < kRows; ++r)
      for (int c = 0; c < kCols; ++c) {
        uint16_t got;
        std::memcpy(&got, &bytes[rank * tile_bytes + cuda::sm90::swizzled_offset(r, c, kRows)], 2);
        const uint16_t want = host[size_t(r) * kCols + c];
        if (got != want && ++wrong <= 5)
          ADD_FAILURE() << "CTA " << rank << " smem (" << r << ", " << c << "): got " << got << " want " << want;
      }
  EXPECT_EQ(wrong, 0);
}

struct ProductCase {
  bool bf16;
  int n, k;
};

class Sm90WgmmaSS : public ::testing::TestWithParam<ProductCase> {};

TEST_P(Sm90WgmmaSS, MatchesReference) {
  FA_REQUIRE_SM90();
  const ProductCase pc = GetParam();
  std::mt19937_64 rng(11 + pc.n + pc.k);
  const Matrix16 a = random_matrix(rng, size_t(64) * pc.k, pc.bf16), b = random_matrix(rng, size_t(pc.n) * pc.k, pc.bf16);
  DeviceBuffer<uint16_t> da(a.bits.size()), db(b.bits.size());
  DeviceBuffer<float> dc(size_t(64) * pc.n);
  da.upload(a.bits);
  db.upload(b.bits);
  FA_CUDA_CHECK(test::sm90::wgmma_ss_product(pc.bf16, pc.n, pc.k, da.ptr, db.ptr, dc.ptr));
  const std::vector<float> c = dc.download();
  std::vector<double> got(c.begin(), c.end()), want(c.size());
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < pc.n; ++j) {
      double s = 0;
      for (int x = 0; x < pc.k; ++x) s += a.values[size_t(i) * pc.k + x] * b.values[size_t(j) * pc.k + x];
      want[size_t(i) * pc.n + j] = s;
    }
  EXPECT_LT(relative_error(got, want), kFp32ProductTolerance) << mismatches(got, want, pc.n, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Sm90WgmmaSS,
                         ::testing::Values(ProductCase{true, 64, 64}, ProductCase{true, 128, 128},
                                           ProductCase{true, 256, 64}, ProductCase{false, 128, 128}));

class Sm90WgmmaRS : public ::testing::TestWithParam<ProductCase> {};

TEST_P(Sm90WgmmaRS, MatchesReference) {
  FA_REQUIRE_SM90();
  const ProductCase pc = GetParam();
  std::mt19937_64 rng(23 + pc.n + pc.k);
  const Matrix16 a = random_matrix(rng, size_t(64) * pc.k, pc.bf16), b = random_matrix(rng, size_t(pc.k) * pc.n, pc.bf16);
  DeviceBuffer<uint16_t> da(a.bits.size()), db(b.bits.size());
  DeviceBuffer<float> dc(size_t(64) * pc.n);
  da.upload(a.bits);
  db.upload(b.bits);
  FA_CUDA_CHECK(test::sm90::wgmma_rs_product(pc.bf16, pc.n, pc.k, da.ptr, db.ptr, dc.ptr));
  const std::vector<float> c = dc.download();
  std::vector<double> got(c.begin(), c.end()), want(c.size());
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < pc.n; ++j) {
      double s = 0;
      for (int x = 0; x < pc.k; ++x) s += a.values[size_t(i) * pc.k + x] * b.values[size_t(x) * pc.n + j];
      want[size_t(i) * pc.n + j] = s;
    }
  EXPECT_LT(relative_error(got, want), kFp32ProductTolerance) << mismatches(got, want, pc.n, 1e-2);
}

// N = 96 stops half-way into the second 64-column panel of the N-major operand (the backward's 96-column kernels).
INSTANTIATE_TEST_SUITE_P(Shapes, Sm90WgmmaRS,
                         ::testing::Values(ProductCase{true, 64, 128}, ProductCase{true, 128, 64},
                                           ProductCase{true, 256, 128}, ProductCase{false, 128, 128},
                                           ProductCase{true, 96, 64}, ProductCase{false, 96, 128}));

// S = Q Kᵀ accumulated by SS, rounded to 16 bits in registers and fed as the A operand of O = S V (RS).
class Sm90WgmmaChain : public ::testing::TestWithParam<ProductCase> {};

TEST_P(Sm90WgmmaChain, AccumulatorFeedsTheNextProduct) {
  FA_REQUIRE_SM90();
  const ProductCase pc = GetParam();  // n = keys, k = head dim
  const int n = pc.n, d = pc.k;
  std::mt19937_64 rng(37 + n + d);
  const Matrix16 q = random_matrix(rng, size_t(64) * d, pc.bf16), k = random_matrix(rng, size_t(n) * d, pc.bf16),
                 v = random_matrix(rng, size_t(n) * d, pc.bf16);
  DeviceBuffer<uint16_t> dq(q.bits.size()), dk(k.bits.size()), dv(v.bits.size());
  DeviceBuffer<float> dout(size_t(64) * d);
  dq.upload(q.bits);
  dk.upload(k.bits);
  dv.upload(v.bits);
  FA_CUDA_CHECK(test::sm90::wgmma_chain(pc.bf16, n, d, dq.ptr, dk.ptr, dv.ptr, dout.ptr));
  const std::vector<float> o = dout.download();
  std::vector<double> got(o.begin(), o.end()), want(o.size());
  std::vector<double> s(static_cast<size_t>(n));
  for (int i = 0; i < 64; ++i) {
    for (int j = 0; j < n; ++j) {
      double acc = 0;
      for (int x = 0; x < d; ++x) acc += q.values[size_t(i) * d + x] * k.values[size_t(j) * d + x];
      s[size_t(j)] = round16(acc, pc.bf16);
    }
    for (int x = 0; x < d; ++x) {
      double acc = 0;
      for (int j = 0; j < n; ++j) acc += s[size_t(j)] * v.values[size_t(j) * d + x];
      want[size_t(i) * d + x] = acc;
    }
  }
  // S is rounded once on each side (fp32 vs double accumulation can round to neighbouring 16-bit values), so
  // allow one unit roundoff of the 16-bit type on top of fp32 accumulation.
  EXPECT_LT(relative_error(got, want), unit_roundoff(pc.bf16 ? DType::bf16 : DType::f16))
      << mismatches(got, want, d, 0.5);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Sm90WgmmaChain,
                         ::testing::Values(ProductCase{true, 128, 128}, ProductCase{true, 64, 256},
                                           ProductCase{false, 128, 64}));

TEST(Sm90Primitives, WarpSpecialisedTmaRingWithSetmaxnreg) {
  FA_REQUIRE_SM90();
  constexpr int kCols = 64, kRows = 7 * 64 - 10, kTiles = 7;  // 7 tiles wrap the 2-stage ring 3 times; tail
  std::vector<uint16_t> host(size_t(kRows) * kCols);
  for (size_t i = 0; i < host.size(); ++i) host[i] = uint16_t(1 + i % 65000);
  DeviceBuffer<uint16_t> src(host.size()), out(size_t(kTiles) * 64 * kCols);
  src.upload(host);
  cudaMemset(out.ptr, 0xff, out.count * 2);
  CUtensorMap map;
  const int64_t dims[4] = {kCols, kRows, 1, 1}, strides[3] = {kCols, int64_t(kRows) * kCols, int64_t(kRows) * kCols};
  Status st = detail::make_tensor_map_sw128(&map, src.ptr, DType::f16, dims, strides, 64);
  ASSERT_TRUE(st.ok()) << st.message;
  FA_CUDA_CHECK(test::sm90::tma_ring_copy(map, kTiles, out.ptr));
  const std::vector<uint16_t> got = out.download();
  int wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const uint16_t want = i < host.size() ? host[i] : 0;
    if (got[i] != want && ++wrong <= 5) ADD_FAILURE() << "element " << i << ": got " << got[i] << " want " << want;
  }
  EXPECT_EQ(wrong, 0);
}

// Lane q of each quad ends with word i = the word q that the quad's lane i started with.
TEST(Sm90Primitives, QuadTransposeSwapsWordsAcrossTheQuad) {
  FA_REQUIRE_SM90();
  std::vector<uint32_t> host(32 * 4);
  for (size_t i = 0; i < host.size(); ++i) host[i] = uint32_t(0x1000 + 7 * i);
  DeviceBuffer<uint32_t> in(host.size()), out(host.size());
  in.upload(host);
  FA_CUDA_CHECK(test::sm90::quad_transpose_words(in.ptr, out.ptr));
  const std::vector<uint32_t> got = out.download();
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      const int source_lane = lane / 4 * 4 + i, source_word = lane % 4;
      EXPECT_EQ(got[size_t(4 * lane + i)], host[size_t(4 * source_lane + source_word)]) << "lane " << lane << " word " << i;
    }
}

// Tiles that start as garbage (NaN) end as the exact sum of every CTA's parts: turn 0 stored, the others added
// after it, none lost or added twice, and every counter passed by each CTA.
TEST(Sm90Primitives, TurnOrderedTilesStoreFirstAndAddTheRest) {
  FA_REQUIRE_SM90();
  constexpr int kCtas = 64, kTiles = 6;  // one CTA of 128 threads per SM at most: all resident
  constexpr size_t kTileFloats = size_t(test::sm90::kTurnTestParts) * test::sm90::kTurnTestPartFloats;
  DeviceBuffer<float> sums(kTiles * kTileFloats);
  DeviceBuffer<int> turns(kTiles);
  sums.upload(std::vector<float>(sums.count, std::nanf("")));
  turns.upload(std::vector<int>(turns.count, 0));
  FA_CUDA_CHECK(test::sm90::turn_ordered_tiles(kCtas, kTiles, sums.ptr, turns.ptr));
  const std::vector<float> got = sums.download();
  int wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const int seven = int(i % test::sm90::kTurnTestPartFloats % 7);
    const float want = float(kCtas * (kCtas + 1) / 2 + kCtas * seven);  // exact: below 2^24
    if (got[i] != want && ++wrong <= 5) ADD_FAILURE() << "element " << i << ": got " << got[i] << " want " << want;
  }
  EXPECT_EQ(wrong, 0);
  for (int counter : turns.download()) EXPECT_EQ(counter, kCtas);
}

TEST(Sm90Primitives, SwizzleOffsetFollowsThe128BytePattern) {
  // The host-side layout function every other test relies on.
  FA_REQUIRE_SM90();
  EXPECT_EQ(cuda::sm90::swizzled_offset(0, 0, 64), 0u);
  EXPECT_EQ(cuda::sm90::swizzled_offset(1, 0, 64), 128u + 16u);     // row 1: chunk 0 stored at chunk 1
  EXPECT_EQ(cuda::sm90::swizzled_offset(7, 8, 64), 7u * 128u + 6u * 16u);  // chunk 1 ^ 7 = 6
  EXPECT_EQ(cuda::sm90::swizzled_offset(8, 0, 64), 8u * 128u);      // the pattern repeats every 8 rows
  EXPECT_EQ(cuda::sm90::swizzled_offset(0, 64, 64), 64u * 128u);    // the next panel after all rows
}

}  // namespace
}  // namespace flashattn::test
