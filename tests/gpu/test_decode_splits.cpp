// The decode kernel's split heuristic (cuda/sm80/decode_config.h decode_num_splits), host code only: runs
// without a GPU. What each step promises, on the H200's shape (132 SMs, two decode blocks per SM).
#include <gtest/gtest.h>

#include "cuda/sm80/decode_config.h"

namespace flashattn::test {
namespace {

using cuda::sm80::decode_num_splits;
using cuda::sm80::kDecodeCombineSplits;
using cuda::sm80::kMaxClusterSplits;
using cuda::sm80::kMaxDecodeSplits;

constexpr int kSms = 132, kPerSm = 2;
const auto kNoClusters = [](int) { return false; };
const auto kClusters = [](int s) { return s > 1 && s <= kMaxClusterSplits; };

TEST(DecodeSplits, BoundedByTheKeysAndTheCombine) {
  for (int64_t tiles : {1, 3, 8, 32, 64, 128, 200, 211, 264, 5000}) {
    for (int64_t key_blocks : {0, 1, 2, 3, 16, 17, 64, 256, 2048, 1 << 16}) {
      for (bool clusters : {false, true}) {
        for (bool paged : {false, true}) {
          const int s = clusters ? decode_num_splits(tiles, key_blocks, kSms, kPerSm, paged, kClusters)
                                 : decode_num_splits(tiles, key_blocks, kSms, kPerSm, paged, kNoClusters);
          SCOPED_TRACE(testing::Message() << "tiles " << tiles << " key blocks " << key_blocks << " paged " << paged);
          EXPECT_GE(s, 1);
          EXPECT_LE(s, kMaxDecodeSplits);
          if (s > 1) EXPECT_GE(key_blocks / s, 2) << "at least two key tiles per split";
          EXPECT_LE(s, std::max<int64_t>(kDecodeCombineSplits, (paged ? kSms * kPerSm : kSms) / tiles));
          if (tiles >= kSms * kPerSm * 8 / 10) EXPECT_EQ(s, 1) << "the unsplit grid fills the GPU";
        }
      }
    }
  }
}

TEST(DecodeSplits, EvenSharesOfTheKeyTiles) {
  // b = 1, GQA 32/8, 1k keys: 8 row blocks over 16 key tiles. The wave rule alone stops at 7 splits, whose
  // longest split reads 3 tiles; the even share reads 2.
  const int s = decode_num_splits(8, 16, kSms, kPerSm, false, kNoClusters);
  EXPECT_EQ(16 % s, 0) << s;
  EXPECT_EQ((16 + s - 1) / s, 2) << s;
}

TEST(DecodeSplits, ClustersOnlyWhereTheyFitAndSaveALaunch) {
  // b = 1, 2k keys: more splits through the combine kernel, or kMaxClusterSplits merged in clusters (2 tiles more
  // each). At 4k keys the clustered splits would read 4 tiles more each: the combine kernel's splits are taken.
  EXPECT_GT(decode_num_splits(8, 32, kSms, kPerSm, false, kNoClusters), kMaxClusterSplits);
  EXPECT_EQ(decode_num_splits(8, 32, kSms, kPerSm, false, kClusters), kMaxClusterSplits);
  EXPECT_GT(decode_num_splits(8, 64, kSms, kPerSm, false, kClusters), kMaxClusterSplits);
  // 128k keys: clustered splits would each read 128 tiles more than the combine kernel's: not taken.
  EXPECT_GT(decode_num_splits(8, 2048, kSms, kPerSm, false, kClusters), kMaxClusterSplits);
  // One row block (MQA, b = 1) at 16k keys: kMaxClusterSplits blocks would leave most SMs idle.
  EXPECT_GT(decode_num_splits(1, 256, kSms, kPerSm, false, kClusters), kMaxClusterSplits);
}

TEST(DecodeSplits, PagedCachesFillEveryBlockSlot) {
  // b = 1, GQA 32/8, 128k keys: 8 row blocks. Dense caches stop at one block per SM (16 splits), paged ones take the
  // wave rule's count over both blocks per SM.
  EXPECT_EQ(decode_num_splits(8, 2048, kSms, kPerSm, false, kClusters), kDecodeCombineSplits);
  const int paged = decode_num_splits(8, 2048, kSms, kPerSm, true, kClusters);
  EXPECT_GT(paged, kDecodeCombineSplits);
  EXPECT_LE(paged * 8, kSms * kPerSm);
}

}  // namespace
}  // namespace flashattn::test
