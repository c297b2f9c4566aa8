// The host planner, checked on the CPU for every D in 1..2^20: coverage,
// minimal bands, CTA geometry, reduction groups that never mix rows,
// batch-invariant row plans, and the backward workspace bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "plan.hpp"

namespace rmsnorm::plan {
namespace {

constexpr int64_t kMaxD = int64_t{1} << 20;

Device hopper(int max_cluster = 8) {
  Device d;
  d.sm_count = 132;
  d.cc_major = 9;
  d.max_cluster = max_cluster;
  return d;
}
// An sm_90 device whose queries gave no co-scheduled cluster of the fp32 forms' backward kernel (device.cu then
// clears f32_clusters).
Device hopper_without_f32_clusters() {
  Device d = hopper(16);
  d.f32_clusters = false;
  return d;
}
Device ampere() {
  Device d;
  d.sm_count = 108;
  d.cc_major = 8;
  d.max_smem_optin = 163 * 1024;
  d.smem_per_sm = 164 * 1024;
  d.max_cluster = 1;
  return d;
}

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }
// The rows band's chunk counts of 2 chunks per thread, written out (plan.hpp's rule, kept apart from it).
bool few_chunks(int64_t chunks, int esize) {
  return (chunks > 12 && chunks <= 16) || (chunks > 48 && chunks <= 64) || (chunks > 256 && chunks <= 512) ||
         (esize == 4 && chunks > 768 && chunks <= 1024);
}

// Invariants of one row plan; returns a failure message or "".
std::string check_row_plan(const RowPlan& p, int64_t d, int esize, const Device& dev) {
  std::ostringstream os;
  if (p.vec != 16 / esize) os << "vec " << p.vec << "; ";
  if (p.chunks != (d + p.vec - 1) / p.vec) os << "chunks " << p.chunks << "; ";
  if (p.cta_threads > 1024 || p.cta_threads < 1) os << "block " << p.cta_threads << "; ";
  if (p.rows_per_cta * p.threads_per_row != p.cta_threads) os << "rows_per_cta * tpr != block; ";
  if (!is_pow2(p.threads_per_row)) os << "tpr not a power of two; ";
  if (p.threads_per_row <= 32 ? 32 % p.threads_per_row != 0 : p.threads_per_row % 32 != 0)
    os << "tpr does not tile warps; ";
  switch (p.band) {
    case Band::kRows: {
      // 2 chunks per thread at 13..16, 49..64 and 257..512 chunks (D 97..128, 385..512, 2049..4096 at 16-bit),
      // and at fp32 769..1024 (D 3073..4096), 4 elsewhere.
      if (p.chunks_per_thread != (few_chunks(p.chunks, esize) ? 2 : 4)) os << "rows cpt; ";
      if (p.chunks_per_thread == 2 ? p.threads_per_row != 8 && p.threads_per_row != 32 && p.threads_per_row != 256 &&
                                         (esize != 4 || p.threads_per_row != 512)
                                   : p.threads_per_row == 128)
        os << "rows (tpr, cpt) without a kernel (dispatch_rows); ";
      if (p.cluster != 1) os << "rows cluster; ";
      if (p.threads_per_row > kMaxRowsTpr) os << "rows tpr above the maximum; ";
      // Covers the row, and the next smaller power of two would not (no idle half).
      if (int64_t{p.threads_per_row} * p.chunks_per_thread < p.chunks) os << "rows band does not cover D; ";
      if (p.threads_per_row > 1 && int64_t{p.threads_per_row / 2} * p.chunks_per_thread >= p.chunks)
        os << "rows band not minimal; ";
      if (d > (esize == 2 ? 16384 : 8192)) os << "rows band above D = 16384 (16-bit) / 8192 (fp32); ";
      break;
    }
    case Band::kCluster: {
      if (d <= (esize == 2 ? 16384 : 8192)) os << "cluster band inside the rows band; ";
      if (p.cta_threads != kClusterTpr || p.threads_per_row != kClusterTpr || p.rows_per_cta != 1) os << "cluster block; ";
      if (p.chunks_per_thread != 4) os << "cluster cpt; ";
      if (!is_pow2(p.cluster) || p.cluster < 2 || p.cluster > (dev.cc_major >= 9 ? dev.max_cluster : 1))
        os << "cluster size; ";
      const int64_t per_cta = int64_t{kClusterTpr} * p.chunks_per_thread;
      if (per_cta * p.cluster < p.chunks) os << "cluster does not cover D; ";
      if (p.cluster > 1 && per_cta * (p.cluster / 2) >= p.chunks) os << "cluster not minimal; ";
      break;
    }
    case Band::kLooped: {
      const int max_cluster = dev.cc_major >= 9 ? dev.max_cluster : 1;
      const int64_t per_cta = int64_t{kClusterTpr} * kMaxChunksPerThread;
      if (per_cta * std::max(max_cluster, 1) >= p.chunks) os << "looped although a cluster covers D; ";
      if (p.cta_threads != kLoopedThreads) os << "looped block; ";
      break;
    }
  }
  return os.str();
}

TEST(Plan, EveryDInEveryBandIsCoveredAndMinimal) {
  // Clusters of 2 and 4 at most: what device.cu leaves of max_cluster where larger sizes are not co-scheduled.
  const Device devs[] = {hopper(8), hopper(16), hopper(4), hopper(2), ampere()};
  for (const Device& dev : devs) {
    for (int esize : {2, 4}) {
      for (int64_t d = 1; d <= kMaxD; ++d) {
        const RowPlan f = row_plan(d, esize, Direction::kForward, dev);
        const RowPlan b = row_plan(d, esize, Direction::kBackward, dev);
        const std::string ef = check_row_plan(f, d, esize, dev), eb = check_row_plan(b, d, esize, dev);
        ASSERT_EQ(ef, "") << "forward D=" << d << " esize=" << esize << " cc=" << dev.cc_major;
        ASSERT_EQ(eb, "") << "backward D=" << d << " esize=" << esize << " cc=" << dev.cc_major;
        // Same reduction geometry in both directions: backward's recomputed
        // rstd is bitwise the forward's.
        ASSERT_EQ(f.band, b.band) << d;
        ASSERT_EQ(f.threads_per_row, b.threads_per_row) << d;
        ASSERT_EQ(f.chunks_per_thread, b.chunks_per_thread) << d;
        ASSERT_EQ(f.cluster, b.cluster) << d;
      }
    }
  }
}

// Walks the kernels' ownership loops: thread g of the row (CTA rank major)
// owns chunks it * G + g; every element must be owned exactly once.
TEST(Plan, ChunkOwnershipCoversEachElementExactlyOnce) {
  std::vector<int> hits;
  auto check = [&](int64_t d, int esize, const Device& dev) {
    const RowPlan p = row_plan(d, esize, Direction::kForward, dev);
    if (p.band == Band::kLooped) return;  // strided loop over all chunks, trivially exact
    hits.assign(static_cast<size_t>(d), 0);
    const int64_t g_total = int64_t{p.threads_per_row} * p.cluster;
    for (int rank = 0; rank < p.cluster; ++rank)
      for (int t = 0; t < p.threads_per_row; ++t)
        for (int it = 0; it < p.chunks_per_thread; ++it) {
          const int64_t c = it * g_total + int64_t{rank} * p.threads_per_row + t;
          if (c >= p.chunks) continue;
          for (int j = 0; j < p.vec; ++j)
            if (c * p.vec + j < d) ++hits[static_cast<size_t>(c * p.vec + j)];
        }
    for (int64_t i = 0; i < d; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)], 1) << "D=" << d << " element " << i;
  };
  for (int esize : {2, 4}) {
    for (int64_t d = 1; d <= 20000; ++d) check(d, esize, hopper());
    for (int64_t d = 16385; d <= kMaxD; d += 997) check(d, esize, hopper(16));
    for (int64_t d : {int64_t{131072}, int64_t{262144}, int64_t{262143}, int64_t{262145}}) check(d, esize, hopper(16));
  }
}

// The same for every D in 1..2^20, both directions and element sizes, on
// Hopper (clusters of up to 8 and 16) and a pre-Hopper device, every band
// (the looped one too: thread t takes chunks t, t + G, ... with G its block).
// The ownership map c = it * G + g (thread g of the row's G threads, CTA rank
// major) depends on the geometry (threads per row, cluster, chunks per
// thread) alone, so it is walked once per distinct geometry and must be
// one-to-one onto [0, chunks per thread * G). Per D it then suffices that the
// plan has chunks = ceil(D / vec) and chunks per thread * G >= chunks: the
// chunks below `chunks` are owned exactly once (the kernels skip c >= chunks)
// and their elements tile [0, D).
TEST(Plan, ChunkOwnershipExactlyOnceForEveryD) {
  std::set<std::tuple<int, int, int>> walked;
  std::vector<int> hits;
  auto walk = [&](int tpr, int cluster, int cpt) -> std::string {
    const int64_t g_total = int64_t{tpr} * cluster, n = g_total * cpt;
    hits.assign(static_cast<size_t>(n), 0);
    for (int rank = 0; rank < cluster; ++rank)
      for (int t = 0; t < tpr; ++t)
        for (int it = 0; it < cpt; ++it) {
          const int64_t c = it * g_total + int64_t{rank} * tpr + t;
          if (c < 0 || c >= n) return "chunk " + std::to_string(c) + " outside the map";
          ++hits[static_cast<size_t>(c)];
        }
    for (int64_t c = 0; c < n; ++c)
      if (hits[static_cast<size_t>(c)] != 1)
        return "chunk " + std::to_string(c) + " owned " + std::to_string(hits[static_cast<size_t>(c)]) + " times";
    return "";
  };
  const Device devs[] = {hopper(8), hopper(16), ampere()};
  for (const Device& dev : devs) {
    for (int esize : {2, 4}) {
      for (int64_t d = 1; d <= kMaxD; ++d) {
        for (bool backward : {false, true}) {
          const RowPlan p = row_plan(d, esize, backward ? Direction::kBackward : Direction::kForward, dev);
          const auto key = std::make_tuple(p.threads_per_row, p.cluster, p.chunks_per_thread);
          if (walked.insert(key).second) {
            ASSERT_EQ(walk(p.threads_per_row, p.cluster, p.chunks_per_thread), "")
                << "tpr " << p.threads_per_row << " cluster " << p.cluster << " cpt " << p.chunks_per_thread;
          }
          ASSERT_EQ(p.chunks, (d + p.vec - 1) / p.vec) << "D=" << d;
          ASSERT_GE(int64_t{p.chunks_per_thread} * p.threads_per_row * p.cluster, p.chunks)
              << "D=" << d << " esize=" << esize << " backward=" << backward << " cc=" << dev.cc_major;
        }
      }
    }
  }
  EXPECT_GT(walked.size(), 20u);  // every band's geometries were walked
}

// Reduction participants: the xor butterfly partners of a thread and the
// scratch entries it reads belong to its own row slot, no two (slot, warp,
// parity) share a scratch entry, and each slot has its own named barrier.
TEST(Plan, ReductionGroupsNeverMixRows) {
  for (int tpr = 1; tpr <= kMaxRowsTpr; tpr *= 2) {
    for (bool backward : {false, true}) {
      const int block = backward ? backward_cta_threads(tpr) : forward_cta_threads(tpr);
      ASSERT_EQ(block % tpr, 0);
      ASSERT_LE(block, 1024);
      const int slots = block / tpr;
      const int lanes = tpr < 32 ? tpr : 32;
      for (int t = 0; t < block; ++t) {
        for (int off = 1; off < lanes; off <<= 1) {
          const int partner = t ^ off;
          ASSERT_LT(partner, block);
          ASSERT_EQ(row_slot(partner, tpr), row_slot(t, tpr)) << "tpr " << tpr << " thread " << t;
          ASSERT_EQ(partner / 32, t / 32) << "shuffle partner in another warp";
        }
      }
      if (tpr > 32) {
        const int wpr = warps_per_row(tpr);
        const int entries = 2 * slots * wpr;
        std::vector<int> owner(static_cast<size_t>(entries), -1);
        for (int parity = 0; parity < 2; ++parity) {
          for (int t = 0; t < block; t += 32) {
            const int s = row_slot(t, tpr), w = (t % tpr) / 32;
            const int idx = scratch_index(parity, s, w, tpr, slots);
            ASSERT_GE(idx, 0);
            ASSERT_LT(idx, entries);
            ASSERT_EQ(owner[static_cast<size_t>(idx)], -1) << "two warps share a scratch entry";
            owner[static_cast<size_t>(idx)] = s;
          }
        }
        // Warp sums of a slot are contiguous (read in warp order).
        for (int parity = 0; parity < 2; ++parity)
          for (int s = 0; s < slots; ++s)
            for (int w = 0; w < wpr; ++w)
              ASSERT_EQ(scratch_index(parity, s, w, tpr, slots), scratch_index(parity, s, 0, tpr, slots) + w);
        // Named barriers: slot s of several uses id 1 + s (0 is __syncthreads), all < 16.
        std::vector<int> ids;
        for (int s = 0; s < slots; ++s) ids.push_back(slot_barrier_id(s, slots));
        for (size_t i = 0; i < ids.size(); ++i) {
          ASSERT_LT(ids[i], 16);
          ASSERT_EQ(ids[i] == 0, slots == 1);
          for (size_t j = 0; j < i; ++j) ASSERT_NE(ids[i], ids[j]);
        }
      }
    }
  }
}

// The row plan is a function of D alone: never of the number of rows.
TEST(Plan, RowPlanDoesNotDependOnRows) {
  const Device dev = hopper();
  for (int64_t d : {1, 8, 31, 33, 64, 128, 384, 512, 3584, 4096, 8192, 8193, 40000, 262144, 300000}) {
    for (int esize : {2, 4}) {
      const RowPlan ref = forward_launch(1, d, esize, Io::kVector, dev).row;
      for (int64_t rows : {int64_t{2}, int64_t{3}, int64_t{1000}, int64_t{1} << 20, int64_t{1} << 33}) {
        const RowPlan f = forward_launch(rows, d, esize, Io::kVector, dev).row;
        const RowPlan b = backward_launch(rows, d, esize, Io::kVector, true, dev).row;
        EXPECT_EQ(f.threads_per_row, ref.threads_per_row);
        EXPECT_EQ(f.cluster, ref.cluster);
        EXPECT_EQ(f.band, ref.band);
        EXPECT_EQ(b.threads_per_row, ref.threads_per_row);
        EXPECT_EQ(b.cluster, ref.cluster);
      }
    }
  }
}

// The cp.async stages of every kernel fit the device: per CTA under the
// opt-in limit, and the CTAs an SM is meant to hold fit its shared memory.
TEST(Plan, PipelineStagesFitTheDevice) {
  for (const Device& dev : {hopper(8), hopper(16), ampere()}) {
    for (int esize : {2, 4}) {
      for (int64_t d : {1, 8, 64, 128, 384, 512, 1024, 4096, 8192, 16384, 20000, 100000}) {
        const Launch f = forward_launch(1 << 20, d, esize, Io::kVector, dev);
        if (f.kernel == Kernel::kForwardRows) {
          EXPECT_EQ(f.smem, 0u) << d;  // the row in registers, no stages
          EXPECT_EQ(f.stages, 1) << d;
        } else if (f.row.band != Band::kLooped) {
          EXPECT_EQ(f.smem, stage_bytes(f.row.cta_threads, 1, f.row.chunks_per_thread) * static_cast<size_t>(f.stages));
          EXPECT_LE(f.smem, dev.max_smem_optin);
          EXPECT_LE((f.smem + 1024) * static_cast<size_t>(forward_ctas_per_sm(f.row.threads_per_row, f.row.chunks_per_thread, f.kernel)),
                    f.stages > 1 ? dev.smem_per_sm : SIZE_MAX);
        }
        const Launch b = backward_launch(1 << 20, d, esize, Io::kVector, true, dev);
        EXPECT_LE(b.smem, dev.max_smem_optin) << d;
      }
    }
  }
  // On the H200 both directions get the full depth (the forward's stages: the cluster band).
  const Launch f = forward_launch(1024, 65536, 2, Io::kVector, hopper());
  ASSERT_EQ(f.kernel, Kernel::kForwardCluster);
  const Launch b = backward_launch(8192, 4096, 2, Io::kVector, true, hopper());
  EXPECT_EQ(f.stages, kMaxStages);
  EXPECT_EQ(b.stages, kMaxStages);
}

// The rows band's 16-byte forward takes one row group per CTA at every
// shape, up to the grid cap (past it the CTAs loop), and stages nothing.
TEST(Plan, ForwardRowsOneGroupPerCta) {
  for (const Device& dev : {hopper(), ampere()}) {
    for (int esize : {2, 4}) {
      for (int64_t d : {int64_t{1}, int64_t{128}, int64_t{1000}, int64_t{4096}, int64_t{8192}}) {
        for (int64_t rows : {int64_t{1}, int64_t{3}, int64_t{128}, int64_t{8192}, int64_t{1} << 20,
                             (int64_t{1} << 31) + 3}) {
          const Launch f = forward_launch(rows, d, esize, Io::kVector, dev);
          ASSERT_EQ(f.kernel, Kernel::kForwardRows) << d;
          const int64_t groups = (rows + f.row.rows_per_cta - 1) / f.row.rows_per_cta;
          EXPECT_EQ(f.grid, std::min<int64_t>(groups, int64_t{1} << 24)) << d << " " << rows;
          EXPECT_EQ(f.groups_per_cta, 0);
          EXPECT_EQ(f.stages, 1);
          EXPECT_EQ(f.smem, 0u);
        }
      }
    }
  }
}

// forward_rows_exact: exactly the rows-band 16-byte launches whose D is the row's threads x chunks x chunk width
// (each thread's chunks all in the row: the band's powers of two, one per threads-per-row and chunks-per-thread
// pair), and only where the grid is the row groups (past kMaxGrid the CTAs loop: not exact).
TEST(Plan, ForwardRowsExactWhereEveryChunkIsInTheRow) {
  for (const Device& dev : {hopper(), ampere()}) {
    for (int esize : {2, 4}) {
      std::set<std::pair<int, int>> geometries;
      for (int64_t d = 1; d <= kMaxD; ++d) {
        for (Io io : {Io::kVector, Io::kElement, Io::kPaired}) {
          const Launch f = forward_launch(7, d, esize, io, dev);
          const bool whole = f.kernel == Kernel::kForwardRows &&
                             d == int64_t{f.row.threads_per_row} * f.row.chunks_per_thread * vec_elems(esize);
          ASSERT_EQ(forward_rows_exact(f, 7, d, esize), whole) << d << " esize " << esize;
          if (!whole) continue;
          ASSERT_EQ(d & (d - 1), 0) << d;  // a power of two
          ASSERT_EQ(f.row.chunks, int64_t{f.row.threads_per_row} * f.row.chunks_per_thread) << d;
          ASSERT_TRUE(geometries.emplace(f.row.threads_per_row, f.row.chunks_per_thread).second) << d;
          const int64_t cap = int64_t{1} << 24;  // the planner's largest grid
          const int64_t past = (cap + 1) * f.row.rows_per_cta;  // more row groups than CTAs
          EXPECT_FALSE(forward_rows_exact(forward_launch(past, d, esize, io, dev), past, d, esize)) << d;
          const int64_t fill = cap * f.row.rows_per_cta;
          EXPECT_TRUE(forward_rows_exact(forward_launch(fill, d, esize, io, dev), fill, d, esize)) << d;
        }
      }
      EXPECT_EQ(geometries.size(), 10u) << "esize " << esize;  // 32 ... 16384 at 16-bit, 16 ... 8192 at fp32
    }
  }
}

// kBackwardRowsSplit (plan::split_backward_launch): only a direct backward with gw and several partials of at
// most kSplitMaxSlots rows, a gw thread reading at most kSplitMaxRowsPerThread rows, row groups and gw CTAs on one
// CTA per SM; the geometry the kernel assumes (split_gw_columns); no workspace and no finalize; the partials kept
// (the order of gw's sums).
TEST(Plan, SplitBackwardGeometry) {
  for (bool is_hopper : {true, false}) {
    const Device dev = is_hopper ? hopper() : ampere();
    int split = 0;
    for (int esize : {2, 4}) {
      for (int64_t d = 1; d <= (esize == 2 ? 16384 : 8192); d += (d < 512 ? 1 : 61)) {
        for (int64_t rows : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{5}, int64_t{37}, int64_t{128}, int64_t{300},
                             int64_t{5000}}) {
          for (bool with_gw : {true, false}) {
            const Launch b = backward_launch(rows, d, esize, Io::kVector, with_gw, dev);
            const Launch s = split_backward_launch(b, rows, dev);
            if (s.kernel != Kernel::kBackwardRowsSplit) {
              ASSERT_EQ(s.kernel, b.kernel);
              ASSERT_EQ(s.grid, b.grid);
              ASSERT_EQ(s.workspace, b.workspace);
              continue;
            }
            ++split;
            SCOPED_TRACE(::testing::Message() << "D " << d << " rows " << rows << " esize " << esize);
            ASSERT_EQ(b.kernel, Kernel::kBackwardRowsDirect);
            ASSERT_TRUE(with_gw);
            ASSERT_GT(b.partials, 1);
            ASSERT_EQ(s.partials, b.partials);
            ASSERT_EQ(b.grid, (rows + b.row.rows_per_cta - 1) / b.row.rows_per_cta);  // the kernel's count
            const int lanes = finalize_lanes(b.partials);
            ASSERT_EQ(s.finalize_lanes, lanes);
            const int per_cta = split_gw_chunks_per_cta(s.row.cta_threads, lanes);
            ASSERT_EQ(per_cta * lanes, s.row.cta_threads);
            ASSERT_EQ(s.row.cta_threads % kWarp, 0);
            const int64_t gw_ctas = s.grid - b.grid;
            ASSERT_GE(gw_ctas * per_cta, s.row.chunks);
            ASSERT_LT((gw_ctas - 1) * per_cta, s.row.chunks);
            ASSERT_LE(s.grid, int64_t{dev.sm_count} * kBackwardCtasPerSm);
            ASSERT_LE(s.row.rows_per_cta, kSplitMaxSlots);
            ASSERT_LE(s.row.rows_per_cta * ((b.partials + lanes - 1) / lanes), kSplitMaxRowsPerThread);
            ASSERT_EQ(s.smem, static_cast<size_t>(lanes) * (per_cta * (16 / esize) + 1) * sizeof(float));
            ASSERT_LE(s.smem, dev.max_smem_optin);
            ASSERT_TRUE(s.direct_gw);
            ASSERT_FALSE(s.finalize);
            ASSERT_EQ(s.workspace, 0u);
          }
        }
      }
    }
    EXPECT_GT(split, 100);
  }
  // The decode shape the plan is for: 128 x 4096 at 16-bit on the H200, 64 row CTAs of 2 rows, 64 partials
  // (32 finalize lanes), so 16 chunks per gw CTA and 32 gw CTAs.
  const Launch s = split_backward_launch(backward_launch(128, 4096, 2, Io::kVector, true, hopper()), 128, hopper());
  EXPECT_EQ(s.kernel, Kernel::kBackwardRowsSplit);
  EXPECT_EQ(s.grid, 64 + 32);
  // 264 rows: 132 row CTAs leave no SM for the gw CTAs.
  EXPECT_EQ(split_backward_launch(backward_launch(264, 4096, 2, Io::kVector, true, hopper()), 264, hopper()).kernel,
            Kernel::kBackwardRowsDirect);
  // One row: the decode kernel writes gw itself.
  EXPECT_EQ(split_backward_launch(backward_launch(1, 4096, 2, Io::kVector, true, hopper()), 1, hopper()).kernel,
            Kernel::kBackwardRowsDecode);
}

// quant_sum_pairs: the fused quantized forwards (every kind, block scales too) of 256-thread rows of 2 chunks
// (16-bit D 2049..4096, fp32 D 1025..2048) with at least kQuantSumPairsMinRows rows run 128 threads of 4 chunks,
// two row slots per 256-thread CTA, summing as the 256 threads do; nothing else changes (fewer rows and every
// other D keep the forward's row).
TEST(Plan, QuantSumPairs) {
  for (const Device& dev : {hopper(), ampere()})
    for (int esize : {2, 4})
      for (int64_t d = 1; d <= 20000; d += d < 5000 ? 1 : 7)
        for (int64_t rows : {kQuantSumPairsMinRows - 1, kQuantSumPairsMinRows, int64_t{100000}})
          for (int bc : {0, 64 / vec_elems(esize), 128 / vec_elems(esize)}) {
            const Launch f = forward_launch(rows, d, esize, Io::kVector, dev);
            const Launch q = quant_launch(rows, d, esize, Io::kVector, true, dev, bc);
            const int64_t lo = esize == 2 ? 2049 : 1025, hi = esize == 2 ? 4096 : 2048;
            const bool pairs = quant_fused(f, true, bc) && d >= lo && d <= hi && rows >= kQuantSumPairsMinRows;
            ASSERT_EQ(quant_sum_pairs(f, rows, bc), pairs) << d << " rows " << rows;
            if (!pairs) {
              ASSERT_EQ(q.sum_tpr, 0) << d;
              if (q.kernel == Kernel::kForwardRows) {
                ASSERT_EQ(q.row.threads_per_row, f.row.threads_per_row) << d;
                ASSERT_EQ(q.grid, f.grid) << d;
              }
              continue;
            }
            ASSERT_EQ(f.row.threads_per_row, kFewChunksTpr) << d;
            ASSERT_EQ(f.row.chunks_per_thread, kFewChunksPerThread) << d;
            ASSERT_EQ(q.kernel, Kernel::kForwardRows);
            ASSERT_EQ(q.sum_tpr, kFewChunksTpr);
            ASSERT_EQ(q.row.threads_per_row, kFewChunksTpr / 2);
            ASSERT_EQ(q.row.chunks_per_thread, kMaxChunksPerThread);
            ASSERT_EQ(q.row.chunks, f.row.chunks);
            // The same chunks: thread pos holds pos + it 128, it = 0..3, i.e. threads pos and pos + 128 of the row.
            ASSERT_GE(int64_t{q.row.threads_per_row} * q.row.chunks_per_thread, q.row.chunks) << d;
            ASSERT_EQ(q.row.cta_threads, forward_cta_threads(q.row.threads_per_row));
            ASSERT_EQ(q.row.rows_per_cta, q.row.cta_threads / q.row.threads_per_row);
            ASSERT_EQ(q.grid, (rows + q.row.rows_per_cta - 1) / q.row.rows_per_cta) << d;  // below the grid cap here
          }
}

// rmsnorm_forward_block_quant: fused only where the quantized forward fuses and a row's threads hold whole
// blocks at each chunk index (threads per row a multiple of the block's chunks, so a block is consecutive lanes
// of one warp, at most 32 of them), else the looped kernel, as for per-row scales. On the H200 that fuses the
// 16-bit rows band from D = 97 (blocks of 64) or 257 (blocks of 128) to 16384 (docs/fusions.md says so).
TEST(Plan, BlockQuantFusedWhereARowHoldsWholeBlocks) {
  for (bool is_hopper : {true, false}) {
    const Device dev = is_hopper ? hopper() : ampere();
    for (int esize : {2, 4}) {
      for (int block_cols : {64, 128}) {
        const int bc = block_cols / vec_elems(esize);
        ASSERT_LE(bc, 32);
        for (int64_t d = 1; d <= kMaxD; d += d < 4096 ? 1 : 61) {
          for (Io io : {Io::kVector, Io::kElement}) {
            for (bool q_aligned : {true, false}) {
              for (int64_t rows : {int64_t{1}, int64_t{1000}}) {
                const Launch f = forward_launch(rows, d, esize, io, dev);
                const Launch q = quant_launch(rows, d, esize, io, q_aligned, dev, bc);
                const bool fused = quant_fused(f, q_aligned) && f.row.threads_per_row % bc == 0;
                ASSERT_EQ(quant_fused(f, q_aligned, bc), fused) << d;
                ASSERT_EQ(q.kernel, fused ? Kernel::kForwardRows : Kernel::kForwardLooped) << d;
                if (fused) {
                  ASSERT_GE(q.row.threads_per_row, 64 / vec_elems(esize)) << d;  // the instantiated kernels
                  ASSERT_EQ(q.grid, f.grid) << d;
                } else {
                  ASSERT_EQ(q.row.cta_threads, kLoopedThreads) << d;
                  ASSERT_EQ(kLoopedThreads % bc, 0);
                }
                if (is_hopper && esize == 2 && io == Io::kVector && q_aligned) {
                  const bool claimed = d > (block_cols == 64 ? 96 : 256) && d <= 16384;
                  ASSERT_EQ(fused, claimed) << d << " block " << block_cols;
                }
              }
            }
          }
        }
      }
    }
  }
}

// rmsnorm_forward_quant: for every D, the forward's own launch where it is the
// rows band's 16-byte kernel and q is aligned (fused: the same geometry, so
// the same rstd bits), else the looped kernel's geometry over the same chunks
// (one row per CTA of kLoopedThreads, a valid looped row plan).
TEST(Plan, QuantFusedInTheRowsForwardElseLooped) {
  for (const Device& dev : {hopper(), ampere()}) {
    for (int esize : {2, 4}) {
      for (int64_t d = 1; d <= kMaxD; d += d < 4096 ? 1 : 61) {
        for (Io io : {Io::kVector, Io::kElement}) {
          for (bool q_aligned : {true, false}) {
            for (int64_t rows : {int64_t{1}, int64_t{1000}, (int64_t{1} << 25) + 1}) {
              const Launch f = forward_launch(rows, d, esize, io, dev);
              const Launch q = quant_launch(rows, d, esize, io, q_aligned, dev);
              const bool fused = f.kernel == Kernel::kForwardRows && q_aligned;
              ASSERT_EQ(quant_fused(f, q_aligned), fused) << d;
              if (fused && quant_sum_pairs(f, rows, 0)) {  // two rows per CTA (Plan.QuantSumPairs); the grid capped
                ASSERT_EQ(q.sum_tpr, kFewChunksTpr) << d;
                ASSERT_EQ(q.grid, std::min<int64_t>((rows + 1) / 2, int64_t{1} << 24)) << d << " " << rows;
                continue;
              }
              if (fused) {
                ASSERT_EQ(q.kernel, f.kernel) << d;
                ASSERT_EQ(q.grid, f.grid) << d;
                ASSERT_EQ(q.row.threads_per_row, f.row.threads_per_row) << d;
                ASSERT_EQ(q.row.rows_per_cta, f.row.rows_per_cta) << d;
                continue;
              }
              ASSERT_EQ(q.kernel, Kernel::kForwardLooped) << d;
              ASSERT_EQ(q.row.band, Band::kLooped) << d;
              ASSERT_EQ(q.row.chunks, f.row.chunks) << d;
              ASSERT_EQ(q.row.cta_threads, kLoopedThreads) << d;
              ASSERT_EQ(q.row.rows_per_cta, 1) << d;
              ASSERT_EQ(q.io, io) << d;
              ASSERT_EQ(q.grid, std::min<int64_t>(rows, int64_t{1} << 24)) << d << " " << rows;
              ASSERT_EQ(q.smem, 0u) << d;
            }
          }
        }
      }
    }
  }
}

// RMSNORM_FLAG_WEIGHT_F32's launches, for every D: the looped band's kernels over the same chunks, the forward one row
// per CTA, the backward's workspace within rmsnorm.h's bound (2 x SMs x D x 4 bytes) and as the workspace query
// computes it.
TEST(Plan, MixedWeightLaunchesAreTheLoopedKernels) {
  for (const Device& dev : {hopper(), ampere()}) {
    for (int64_t d = 1; d <= kMaxD; d += d < 4096 ? 1 : 61) {
      for (int64_t rows : {int64_t{1}, int64_t{1000}, (int64_t{1} << 25) + 1}) {
        const Launch f = looped_forward_launch(rows, d, 2, Io::kVector, dev);
        ASSERT_EQ(f.kernel, Kernel::kForwardLooped) << d;
        ASSERT_EQ(f.row.band, Band::kLooped) << d;
        ASSERT_EQ(f.row.chunks, (d + 7) / 8) << d;
        ASSERT_EQ(f.grid, std::min<int64_t>(rows, int64_t{1} << 24)) << d;
        for (bool with_gw : {false, true}) {
          const Launch b = mixed_backward_launch(rows, d, 2, Io::kElement, with_gw, dev);
          ASSERT_EQ(b.kernel, Kernel::kBackwardLooped) << d;
          ASSERT_EQ(b.row.cta_threads, kLoopedThreads) << d;
          ASSERT_EQ(b.grid, std::min<int64_t>(rows, int64_t{dev.sm_count} * kLoopedCtasPerSm)) << d;
          ASSERT_LE(b.workspace, 2u * static_cast<size_t>(dev.sm_count) * static_cast<size_t>(d) * 4u) << d;
          ASSERT_EQ(b.workspace, mixed_backward_launch(rows, d, 2, Io::kVector, with_gw, dev).workspace) << d;
          ASSERT_EQ(b.workspace == 0, !with_gw) << d;
        }
      }
    }
  }
}

// The backward of fp32 x with a 16-bit gy (RMSNORM_FLAG_Y_DTYPE, the fp32 residual stream), for every D: the looped
// row (its chunks of 4 columns, its 1024 summing threads, so the recompute sums rstd as the forward does) run by CTAs
// of kLoopedShareThreads holding whole shares of it, on the looped grid and its partials, the workspace within
// rmsnorm.h's bound (2 x SMs x D x 4 bytes), none where one CTA writes gw itself.
TEST(Plan, Fp32MixedBackwardIsTheLoopedRowInShares) {
  static_assert(kLoopedThreads % kLoopedShareThreads == 0 && kLoopedShareThreads % 32 == 0, "whole shares of warps");
  // Every D to 4096, then every 61st, and every D around the shared-memory partial's bounds (D 16384 here, 12288 on
  // the small SM below).
  std::vector<int64_t> ds;
  for (int64_t d = 1; d <= kMaxD; d += d < 4096 ? 1 : 61) ds.push_back(d);
  for (int64_t d = 12280; d <= 12300; ++d) ds.push_back(d);
  for (int64_t d = 16376; d <= 16396; ++d) ds.push_back(d);
  for (const Device& dev : {hopper(), ampere()}) {
    for (int64_t d : ds) {
      for (int64_t rows : {int64_t{1}, int64_t{1000}, (int64_t{1} << 25) + 1}) {
        for (bool with_gw : {false, true}) {
          const Launch b = mixed_backward_launch(rows, d, 4, Io::kVector, with_gw, dev);
          ASSERT_EQ(b.kernel, Kernel::kBackwardLooped) << d;
          ASSERT_EQ(b.row.band, Band::kLooped) << d;
          ASSERT_EQ(b.row.chunks, (d + 3) / 4) << d;
          ASSERT_EQ(b.row.threads_per_row, kLoopedThreads) << d;
          ASSERT_EQ(b.sum_tpr, kLoopedThreads) << d;
          ASSERT_EQ(b.row.cta_threads, kLoopedShareThreads) << d;
          ASSERT_EQ(b.grid, std::min<int64_t>(rows, int64_t{dev.sm_count} * kLoopedCtasPerSm)) << d;
          ASSERT_EQ(b.partials, b.grid) << d;
          // One CTA with a one-pass row writes gw itself (no workspace, no finalize).
          const bool direct = with_gw && rows == 1 && d <= 4 * kLoopedThreads;
          ASSERT_EQ(b.direct_gw, direct) << d;
          ASSERT_EQ(b.finalize, with_gw && !direct) << d;
          ASSERT_LE(b.workspace, 2u * static_cast<size_t>(dev.sm_count) * static_cast<size_t>(d) * 4u) << d;
          ASSERT_EQ(b.workspace == 0, !with_gw || direct) << d;
          ASSERT_EQ(b.workspace, mixed_backward_launch(rows, d, 4, Io::kElement, with_gw, dev).workspace) << d;
          // A multi-pass row's partial (D 4097..16384) in shared memory: a float per column of its whole chunks,
          // two CTAs per SM within the SM's memory; none in one pass, without a partial, or past 16384.
          const size_t smem = with_gw && !direct && d > 4 * kLoopedThreads && d <= 16 * kLoopedThreads
                                  ? static_cast<size_t>((d + 3) / 4) * 16u
                                  : 0u;
          ASSERT_EQ(b.smem, smem) << d << " " << rows;
          ASSERT_EQ(f32_shares_gw_smem(b.row.chunks, b.with_gw, b.direct_gw, dev), smem) << d;
          ASSERT_LE(b.smem, dev.max_smem_optin) << d;
          ASSERT_LE(kLoopedCtasPerSm * (b.smem + 1024), dev.smem_per_sm) << d;
          ASSERT_EQ(b.smem, mixed_backward_launch(rows, d, 4, Io::kElement, with_gw, dev).smem) << d;
          // An SM of 100 KiB (99 KiB a CTA, as sm_86 has): two CTAs fit up to 3072 chunks (D 12288), not past.
          Device small = dev;
          small.smem_per_sm = 100 * 1024;
          small.max_smem_optin = 99 * 1024;
          const Launch bs = mixed_backward_launch(rows, d, 4, Io::kVector, with_gw, small);
          ASSERT_EQ(bs.smem, (d + 3) / 4 <= 3072 ? smem : 0u) << d << " " << rows;
          ASSERT_LE(kLoopedCtasPerSm * (bs.smem + 1024), small.smem_per_sm) << d;
        }
      }
    }
  }
}

// fp32 x with a 16-bit y: the looped row in shares up to 2048 chunks of 4 columns (D <= 8192), the 1024-thread looped
// kernel above.
TEST(Plan, Fp32YDtypeForwardInSharesUpTo8192) {
  for (int64_t d = 1; d <= kMaxD; d += d < 16384 ? 1 : 61)
    ASSERT_EQ(y_dtype_forward_in_shares(d), d <= 8192) << d;
}

// The fp32 forms' kernels without element paths (f32_shares_vec; the forward's held rows, f32_shares_forward): a
// one-pass row of whole chunks (D % 4 == 0, D <= 4 kLoopedThreads) whose every access is a whole vector; the forward
// holds it with w' (kHeld) for one wave of its CTAs at most (two per SM), where one CTA per row fits every SM, and
// past that wave with w' loaded after the reduction (kHeldLateW); every other row is read back (kReadBack).
TEST(Plan, Fp32SharesHeldRows) {
  static_assert(kLoopedShareHeldCtasPerSm * kLoopedShareThreads <= kMaxThreadsPerSm, "a wave of held CTAs fits");
  for (const Device& dev : {hopper(), ampere()}) {
    const int64_t wave = int64_t{dev.sm_count} * kLoopedShareHeldCtasPerSm;
    ASSERT_EQ(f32_shares_held_rows(dev), wave);
    for (int64_t d = 1; d <= 3 * 4096; ++d)
      for (Io io : {Io::kVector, Io::kElement, Io::kPaired})
        for (bool quads : {false, true}) {
          const bool vec = io == Io::kVector && quads && d % 4 == 0 && d <= 4 * kLoopedThreads;
          ASSERT_EQ(f32_shares_vec(d, io, quads), vec) << d;
          if (vec) {
            ASSERT_EQ(looped_f32_shares_launch(1, d, io, F32Forward::kHeld, dev).row.chunks, d / 4) << d;  // one pass
            ASSERT_EQ(looped_f32_shares_launch(1, d, io, F32Forward::kHeld, dev).row.cta_threads, kLoopedShareThreads)
                << d;
          }
          // More than one pass of whole vectors, up to four: held across a cluster where the device runs them.
          const bool cluster = io == Io::kVector && quads && d % 4 == 0 && d > 4 * kLoopedThreads &&
                               d <= 16 * kLoopedThreads && dev.max_cluster >= kLoopedShares;
          ASSERT_EQ(f32_cluster_vec(d, io, quads, dev), cluster) << d;
          for (int64_t rows : {int64_t{1}, wave, wave + 1, int64_t{1} << 30}) {
            const F32Forward want = cluster && (d > 8 * kLoopedThreads || rows <= dev.sm_count) ? F32Forward::kCluster
                                    : !vec ? F32Forward::kReadBack
                                    : rows <= wave ? F32Forward::kHeld
                                                   : F32Forward::kHeldLateW;
            ASSERT_EQ(f32_shares_forward(rows, d, io, quads, dev), want) << d << " " << rows;
          }
        }
  }
}

// fp32 x with a 16-bit y (f32_y_dtype_forward): f32_shares_forward's form, except that its read-back rows of two
// passes of whole vectors (D % 4 == 0, 4097..8192, io kVector, quads) take kReadBackVec, on kLoopedShareThreads
// threads at kLoopedShareThreadsPerSm per SM, the rows one per CTA as kReadBack's. Every D to 3 x 4096, every path.
TEST(Plan, Fp32YDtypeForwardReadsTwoPassRowsBackAsVectors) {
  ASSERT_EQ(f32_forward_ctas_per_sm(F32Forward::kReadBackVec, kLoopedShareThreads) * kLoopedShareThreads,
            kLoopedShareThreadsPerSm);
  int64_t taken = 0;
  for (const Device& dev : {hopper(), hopper_without_f32_clusters(), ampere()}) {
    const int64_t wave = int64_t{dev.sm_count} * kLoopedShareHeldCtasPerSm;
    for (int64_t d = 1; d <= 3 * 4096; ++d)
      for (Io io : {Io::kVector, Io::kElement, Io::kPaired, Io::kPairedRows})
        for (bool quads : {false, true}) {
          const bool vec2 = io == Io::kVector && quads && d % 4 == 0 && d > 4096 && d <= 8192;
          ASSERT_EQ(f32_readback_vec(d, io, quads), vec2) << d;
          for (int64_t rows : {int64_t{1}, int64_t{dev.sm_count}, int64_t{dev.sm_count} + 1, wave + 1,
                               int64_t{1} << 30}) {
            const F32Forward shares = f32_shares_forward(rows, d, io, quads, dev);
            const F32Forward want = f32_readback_wide(rows, d, io, quads, dev)         ? F32Forward::kReadBackWide
                                    : shares == F32Forward::kReadBack && vec2 ? F32Forward::kReadBackVec
                                                                              : shares;
            ASSERT_EQ(f32_y_dtype_forward(rows, d, io, quads, dev), want) << d << " " << rows;
            if (want != F32Forward::kReadBackVec) continue;
            ++taken;
            ASSERT_TRUE(y_dtype_forward_in_shares(d)) << d;
            const Launch l = looped_f32_shares_launch(rows, d, io, want, dev);
            const Launch r = looped_f32_shares_launch(rows, d, io, F32Forward::kReadBack, dev);
            ASSERT_EQ(l.row.cta_threads, kLoopedShareThreads) << d;
            ASSERT_EQ(l.row.cluster, 1) << d;
            ASSERT_EQ(l.sum_tpr, kLoopedThreads) << d;
            ASSERT_EQ(l.row.chunks, d / 4) << d;
            ASSERT_GT(l.row.chunks, kLoopedThreads) << d;  // two passes
            ASSERT_EQ(l.grid, r.grid) << d;
          }
        }
  }
  // The 1024 D's of kReadBackVec: on sm_90 with clusters past one row per SM (the cluster takes the rest), else at
  // every row count.
  ASSERT_EQ(taken, 1024 * (3 + 5 + 5));
}

// fp32 x with a 16-bit y on rows of three or four passes of whole vectors (D % 4 == 0, 8193..16384, io kVector,
// quads) from kF32WideMinRowsPerSm rows per SM: kReadBackWide, one row per CTA of kLoopedThreads threads (one
// summing thread each) at kMaxThreadsPerSm per SM, loading its 3 or 4 chunks, every pass but the last whole (what
// forward_f32_wide_kernel and its launch check); fewer rows keep f32_shares_forward's form (the cluster kernel where
// the device runs it). Every D around that range, every path.
TEST(Plan, Fp32YDtypeForwardWideRowsOnAFullCta) {
  ASSERT_EQ(f32_shares_cta(4100, F32Forward::kReadBackWide), kLoopedThreads);
  ASSERT_EQ(f32_forward_ctas_per_sm(F32Forward::kReadBackWide, kLoopedThreads) * kLoopedThreads, kMaxThreadsPerSm);
  int64_t taken = 0;
  for (const Device& dev : {hopper(), hopper_without_f32_clusters(), ampere()}) {
    const int64_t min_rows = kF32WideMinRowsPerSm * dev.sm_count;
    for (int64_t d = 2 * 4096 - 8; d <= 4 * 4096 + 8; ++d)
      for (Io io : {Io::kVector, Io::kElement, Io::kPaired, Io::kPairedRows})
        for (bool quads : {false, true})
          for (int64_t rows : {int64_t{1}, min_rows - 1, min_rows, int64_t{1} << 30}) {
            const bool wide = io == Io::kVector && quads && d % 4 == 0 && d > 8192 && d <= 16384 && rows >= min_rows;
            ASSERT_EQ(f32_readback_wide(rows, d, io, quads, dev), wide) << d << " " << rows;
            const F32Forward form = f32_y_dtype_forward(rows, d, io, quads, dev);
            ASSERT_EQ(form == F32Forward::kReadBackWide, wide) << d << " " << rows;
            if (!wide) {  // as before: f32_shares_forward's, or kReadBackVec at two passes
              const F32Forward shares = f32_shares_forward(rows, d, io, quads, dev);
              ASSERT_EQ(form, shares == F32Forward::kReadBack && f32_readback_vec(d, io, quads) ? F32Forward::kReadBackVec
                                                                                                 : shares)
                  << d << " " << rows;
              continue;
            }
            ++taken;
            const Launch l = looped_f32_shares_launch(rows, d, io, form, dev);
            ASSERT_EQ(l.row.cta_threads, kLoopedThreads) << d;
            ASSERT_EQ(l.row.cluster, 1) << d;
            ASSERT_EQ(l.sum_tpr, kLoopedThreads) << d;
            ASSERT_EQ(l.row.chunks, d / 4) << d;
            ASSERT_EQ(l.row.chunks_per_thread, d <= 3 * 4096 ? 3 : 4) << d;
            ASSERT_EQ(f32_wide_passes(l.row.chunks), l.row.chunks_per_thread) << d;
            ASSERT_GT(l.row.chunks, int64_t{l.row.chunks_per_thread - 1} * kLoopedThreads) << d;
            ASSERT_LE(l.row.chunks, int64_t{l.row.chunks_per_thread} * kLoopedThreads) << d;
            ASSERT_EQ(l.grid, looped_f32_shares_launch(rows, d, io, F32Forward::kReadBack, dev).grid) << d;  // a row per CTA
          }
  }
  ASSERT_EQ(taken, 3 * 2048 * 2);  // 2048 D's, two row counts past the threshold, three devices
}

// F32Forward::kCluster, for every D it takes (4097..16384, D % 4 == 0, every access a whole vector, clusters of
// kLoopedShares; at D <= 8192 for at most one row per SM): a cluster of kLoopedShares CTAs of kLoopedShareThreads
// per row (the looped row's summing threads, one each), each thread holding its 2 chunks (D <= 8192) or 4; one row
// per cluster up to kMaxGrid CTAs; the launch bound at 2048 or kLoopedShareLateThreadsPerSm threads per SM. Not
// where the device runs no clusters of 4 (sm_80, or a build without compute_90 code: max_cluster 1; or none of the
// fp32 forms' kernels: f32_clusters false), nor past 4 passes, nor at one pass (the held forms).
TEST(Plan, Fp32ClusterForwardHoldsTheRowAcrossACluster) {
  static_assert(kLoopedShares * kLoopedShareThreads == kLoopedThreads, "one summing thread per thread");
  static_assert(kF32ClusterMaxPasses == 4, "D <= 16384");
  ASSERT_EQ(f32_cluster_ctas_per_sm(2) * kLoopedShareThreads, kMaxThreadsPerSm);
  ASSERT_EQ(f32_cluster_ctas_per_sm(4) * kLoopedShareThreads, kLoopedShareLateThreadsPerSm);
  ASSERT_EQ(f32_shares_cta(4100 / 4, F32Forward::kCluster), kLoopedShareThreads);
  for (int64_t d = 4 * kLoopedThreads - 8; d <= 16 * kLoopedThreads + 8; ++d) {
    const int64_t chunks = (d + 3) / 4;
    for (const Device& dev : {hopper(), hopper(16), hopper(4), hopper(2), hopper_without_f32_clusters(), ampere()}) {
      const bool vec = d % 4 == 0 && d > 4096 && d <= 16384 && dev.max_cluster >= kLoopedShares && dev.f32_clusters;
      ASSERT_EQ(f32_cluster_vec(d, Io::kVector, true, dev), vec) << d;
      ASSERT_FALSE(f32_cluster_vec(d, Io::kVector, false, dev)) << d;
      ASSERT_FALSE(f32_cluster_vec(d, Io::kElement, true, dev)) << d;
      ASSERT_FALSE(f32_cluster_vec(d, Io::kPaired, true, dev)) << d;
      const int64_t max_rows = d <= 8192 ? int64_t{dev.sm_count} : INT64_MAX;
      for (int64_t rows : {int64_t{1}, int64_t{dev.sm_count}, int64_t{dev.sm_count} + 1, int64_t{4096},
                           (int64_t{1} << 22) - 1, int64_t{1} << 22, int64_t{1} << 30}) {
        const bool want = vec && rows <= max_rows;
        ASSERT_EQ(f32_shares_forward(rows, d, Io::kVector, true, dev) == F32Forward::kCluster, want) << d << " " << rows;
        if (!want) continue;
        const Launch l = looped_f32_shares_launch(rows, d, Io::kVector, F32Forward::kCluster, dev);
        ASSERT_EQ(l.kernel, Kernel::kForwardLooped) << d;
        ASSERT_EQ(l.sum_tpr, kLoopedThreads) << d;
        ASSERT_EQ(l.row.chunks, chunks) << d;
        ASSERT_EQ(l.row.cluster, kLoopedShares) << d;
        ASSERT_EQ(l.row.cta_threads, kLoopedShareThreads) << d;
        ASSERT_EQ(l.row.chunks_per_thread, d <= 8192 ? 2 : 4) << d;
        ASSERT_EQ(l.row.chunks_per_thread, f32_cluster_passes(chunks)) << d;
        // Every chunk is held: summing thread v's chunks v, v + 1024, .. number at most its passes.
        ASSERT_LE(chunks, int64_t{l.row.chunks_per_thread} * kLoopedThreads) << d;
        ASSERT_GT(chunks, int64_t{kLoopedThreads}) << d;
        ASSERT_EQ(l.grid, std::min(rows, int64_t{1} << 22) * kLoopedShares) << d << " " << rows;
        ASSERT_EQ(l.grid % l.row.cluster, 0) << d;
        ASSERT_LE(l.grid, int64_t{1} << 24) << d;
        ASSERT_EQ(l.smem, 0u) << d;
      }
    }
  }
}

// The fp32 forms' backward where f32_cluster_backward holds (every D 4097..16384 of whole vectors; at 2 passes, D <=
// 8192, for at most 4 rows per SM unless the row fills more than 7/8 of the two passes, D > 7168): the shares plan's row
// on a cluster of kLoopedShares CTAs of kLoopedShareThreads, each thread holding its 2 (D <= 8192) or 4 chunks; as
// many clusters as the device runs at once (f32_backward_active_clusters, or its SMs times the launch bound's CTAs
// over kLoopedShares where unknown), at most the rows and the shares plan's partials, one gw partial each; a single
// cluster writes gw itself; the workspace within the shares plan's, which the workspace query returns. No rows: the
// shares plan as it was.
TEST(Plan, Fp32ClusterBackwardHoldsTheRowAcrossACluster) {
  ASSERT_EQ(f32_cluster_backward_ctas_per_sm(2) * kLoopedShareThreads, 1024);  // 64 registers
  ASSERT_EQ(f32_cluster_backward_ctas_per_sm(4) * kLoopedShareThreads, 512);   // 128 registers
  ASSERT_NE(f32_cluster_backward_index(2), f32_cluster_backward_index(kF32ClusterMaxPasses));
  Device known = hopper();
  known.f32_backward_active_clusters[f32_cluster_backward_index(2)] = 120;
  known.f32_backward_active_clusters[f32_cluster_backward_index(4)] = 60;
  for (int64_t d = 4 * kLoopedThreads + 4; d <= 16 * kLoopedThreads; d += 4) {
    const int passes = d <= 8192 ? 2 : 4;
    for (const Device* dev : {static_cast<const Device*>(&known), static_cast<const Device*>(nullptr)}) {
      const Device h = dev != nullptr ? *dev : hopper();
      ASSERT_TRUE(f32_cluster_vec(d, Io::kVector, true, h)) << d;
      const int64_t cap = dev != nullptr ? (passes == 2 ? 120 : 60) : int64_t{h.sm_count} * (passes == 2 ? 4 : 2) / 4;
      for (int64_t rows : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{59}, int64_t{60}, int64_t{61}, int64_t{132},
                           int64_t{133}, int64_t{264}, int64_t{265}, int64_t{528}, int64_t{529}, int64_t{4096},
                           int64_t{1} << 30})
        for (bool with_gw : {false, true}) {
          const bool taken = passes == 4 || d > 7168 || rows <= 4 * int64_t{h.sm_count};
          ASSERT_EQ(f32_cluster_backward(rows, d, Io::kVector, true, h), taken) << d << " " << rows;
          ASSERT_FALSE(f32_cluster_backward(rows, d, Io::kVector, false, h)) << d;
          ASSERT_FALSE(f32_cluster_backward(rows, d, Io::kElement, true, h)) << d;
          ASSERT_FALSE(f32_cluster_backward(rows, d, Io::kVector, true, ampere())) << d;
          ASSERT_FALSE(f32_cluster_backward(rows, d, Io::kVector, true, hopper_without_f32_clusters())) << d;
          ASSERT_FALSE(f32_cluster_backward(rows, d, Io::kVector, true, hopper(2))) << d;
          const Launch shares = mixed_backward_launch(rows, d, 4, Io::kVector, with_gw, h);
          const Launch l = f32_cluster_backward_launch(shares, rows, d, h);
          ASSERT_EQ(l.smem, 0u) << d;  // the shares kernel's partial in shared memory is not this kernel's
          if (rows == 0) {
            ASSERT_EQ(l.grid, 0) << d;
            ASSERT_EQ(l.row.cluster, shares.row.cluster) << d;
            ASSERT_EQ(l.workspace, shares.workspace) << d;
            continue;
          }
          const int64_t clusters = std::min({rows, cap, shares.partials});
          ASSERT_EQ(l.kernel, Kernel::kBackwardLooped) << d;
          ASSERT_EQ(l.sum_tpr, kLoopedThreads) << d;
          ASSERT_EQ(l.row.cluster, kLoopedShares) << d;
          ASSERT_EQ(l.row.cta_threads, kLoopedShareThreads) << d;
          ASSERT_EQ(l.row.chunks, d / 4) << d;
          ASSERT_EQ(l.row.chunks_per_thread, passes) << d;
          // Every chunk is held: summing thread v's chunks v, v + 1024, .. number at most its passes.
          ASSERT_LE(l.row.chunks, int64_t{passes} * kLoopedThreads) << d;
          ASSERT_EQ(l.grid, clusters * kLoopedShares) << d << " " << rows;
          ASSERT_EQ(l.partials, clusters) << d;
          const bool direct = with_gw && clusters == 1;
          ASSERT_EQ(l.direct_gw, direct) << d;
          ASSERT_EQ(l.finalize, with_gw && !direct) << d;
          ASSERT_EQ(l.workspace, l.finalize ? static_cast<size_t>(clusters) * static_cast<size_t>(d) * 4u : 0u) << d;
          ASSERT_LE(l.workspace, shares.workspace) << d;
          ASSERT_EQ(l.finalize_lanes, l.finalize ? finalize_lanes(clusters) : 0) << d;
          ASSERT_EQ(l.finalize_grid, l.finalize ? (d + kFinalizeCols - 1) / kFinalizeCols : 0) << d;
          ASSERT_EQ(l.smem, 0u) << d;
        }
    }
  }
}

// RMSNORM_FLAG_RESIDUAL_F32's forward, for every D: the looped band's row on the fp32 h (its chunks of 4 columns,
// its 1024 summing threads, so rstd is summed as rms_norm(h, out_dtype) and the backward's recompute sum it), run by
// CTAs holding whole shares of them, one row per CTA as the looped forward's grid. The CTA: kLoopedShareThreads for
// kHeld and for rows past 4 * 128 chunks; else the smallest of 64 and 128 threads whose shares hold every chunk of
// the row (the summing threads past them hold none), at the same threads per SM.
TEST(Plan, ResidualF32ForwardIsTheLoopedRowInShares) {
  static_assert(kLoopedThreads % kLoopedShareThreads == 0 && kLoopedShareThreads % 32 == 0, "whole shares of warps");
  static_assert(kLoopedShares * kLoopedShareThreads == kLoopedThreads, "whole shares");
  static_assert(kLoopedShareThreadsPerSm <= kMaxThreadsPerSm && kLoopedShareLateThreadsPerSm <= kMaxThreadsPerSm,
                "the CTAs of a launch bound fit an SM");
  static_assert(kLoopedShareThreadsPerSm / kLoopedShareMinThreads <= 32 &&
                    kLoopedShareLateThreadsPerSm / kLoopedShareMinThreads <= 32,
                "sm_80 and sm_90 hold 32 CTAs per SM");
  for (int cta : {64, 128, 256}) {
    ASSERT_EQ(f32_forward_ctas_per_sm(F32Forward::kReadBack, cta) * cta, kLoopedShareThreadsPerSm);
    ASSERT_EQ(f32_forward_ctas_per_sm(F32Forward::kHeldLateW, cta) * cta, kLoopedShareLateThreadsPerSm);
  }
  ASSERT_EQ(f32_forward_ctas_per_sm(F32Forward::kHeld, kLoopedShareThreads), kLoopedShareHeldCtasPerSm);
  for (const Device& dev : {hopper(), ampere()}) {
    for (int64_t d = 1; d <= kMaxD; d += d < 4096 ? 1 : 61) {
      const int64_t chunks = (d + 3) / 4;
      const int small = chunks <= 4 * 64 ? 64 : chunks <= 4 * 128 ? 128 : kLoopedShareThreads;
      for (Io io : {Io::kVector, Io::kElement}) {
        for (int64_t rows : {int64_t{1}, int64_t{1000}, (int64_t{1} << 25) + 1}) {
          for (F32Forward form : {F32Forward::kReadBack, F32Forward::kHeld, F32Forward::kHeldLateW}) {
            const Launch l = looped_f32_shares_launch(rows, d, io, form, dev);
            const Launch f = looped_forward_launch(rows, d, 4, io, dev);
            ASSERT_EQ(l.kernel, Kernel::kForwardLooped) << d;
            ASSERT_EQ(l.row.band, Band::kLooped) << d;
            ASSERT_EQ(l.row.chunks, chunks) << d;
            ASSERT_EQ(l.row.threads_per_row, kLoopedThreads) << d;
            ASSERT_EQ(l.row.threads_per_row, f.row.threads_per_row) << d;
            ASSERT_EQ(l.sum_tpr, kLoopedThreads) << d;
            ASSERT_EQ(l.row.cta_threads, form == F32Forward::kHeld ? kLoopedShareThreads : small) << d;
            ASSERT_EQ(l.row.cta_threads, f32_shares_cta(chunks, form)) << d;
            // A smaller CTA's shares hold every chunk: the kernel walks one pass of them.
            if (l.row.cta_threads < kLoopedShareThreads) {
              ASSERT_LE(chunks, int64_t{kLoopedShares} * l.row.cta_threads);
            }
            ASSERT_EQ(l.grid, f.grid) << d;
            ASSERT_EQ(l.io, io) << d;
            ASSERT_EQ(l.smem, 0u) << d;
          }
        }
      }
    }
  }
}

// An fp32 weight (16-bit x), for every D: the plain call's plans, forward and backward, in the rows and cluster
// bands (the same geometry, so rstd is summed as in the plain call and the backward's recomputed rstd is the
// forward's), the looped kernels in the looped band, forward and backward alike; the backward's workspace as the
// workspace query computes it (backward_workspace_bytes: the 16-byte plan's).
TEST(Plan, WeightF32IsThePlainPlanBelowTheLoopedBand) {
  for (const Device& dev : {hopper(), ampere()}) {
    for (int64_t d = 1; d <= kMaxD; d += d < 4096 ? 1 : 61) {
      for (Io io : {Io::kVector, Io::kElement}) {
        for (int64_t rows : {int64_t{1}, int64_t{1000}, (int64_t{1} << 25) + 1}) {
          const Launch f = forward_launch(rows, d, 2, io, dev);
          const Launch w = weight_f32_forward_launch(rows, d, 2, io, dev);
          const bool plain_band = f.row.band != Band::kLooped;
          if (plain_band) {
            ASSERT_EQ(w.kernel, f.kernel) << d;
            ASSERT_EQ(w.grid, f.grid) << d;
            ASSERT_EQ(w.groups_per_cta, f.groups_per_cta) << d;
            ASSERT_EQ(w.row.threads_per_row, f.row.threads_per_row) << d;
            ASSERT_EQ(w.row.cta_threads, f.row.cta_threads) << d;
            ASSERT_EQ(w.smem, f.smem) << d;
            ASSERT_EQ(w.row.cluster, f.row.cluster) << d;
            ASSERT_EQ(w.stages, f.stages) << d;
          } else {
            const Launch l = looped_forward_launch(rows, d, 2, io, dev);
            ASSERT_EQ(w.kernel, Kernel::kForwardLooped) << d;
            ASSERT_EQ(w.grid, l.grid) << d;
            ASSERT_EQ(w.row.cta_threads, l.row.cta_threads) << d;
          }
          for (bool with_gw : {false, true}) {
            const Launch b = backward_launch(rows, d, 2, io, with_gw, dev);
            const Launch wb = weight_f32_backward_launch(rows, d, 2, io, with_gw, dev);
            // The band is D's alone, the same for both directions.
            ASSERT_EQ(b.row.band != Band::kLooped, plain_band) << d;
            const Launch& want = plain_band ? b : mixed_backward_launch(rows, d, 2, io, with_gw, dev);
            ASSERT_EQ(wb.kernel, want.kernel) << d;
            ASSERT_EQ(wb.grid, want.grid) << d;
            ASSERT_EQ(wb.row.threads_per_row, want.row.threads_per_row) << d;
            ASSERT_EQ(wb.row.cta_threads, want.row.cta_threads) << d;
            ASSERT_EQ(wb.stages, want.stages) << d;
            ASSERT_EQ(wb.row.cluster, want.row.cluster) << d;
            ASSERT_EQ(wb.smem, want.smem) << d;
            ASSERT_EQ(wb.workspace, want.workspace) << d;
            ASSERT_EQ(wb.finalize, want.finalize) << d;
            ASSERT_EQ(wb.workspace, weight_f32_backward_launch(rows, d, 2, Io::kVector, with_gw, dev).workspace) << d;
            if (!plain_band) {
              ASSERT_EQ(wb.kernel, Kernel::kBackwardLooped) << d;
            }
          }
        }
      }
    }
  }
}

// The rows band's element-I/O forward runs one CTA per row group only with
// many short rows per CTA and many groups per resident CTA; otherwise its
// grid is the resident CTAs.
TEST(Plan, ForwardGridPersistentOrOneGroupPerCta) {
  const Device dev = hopper();
  auto resident = [&](const Launch& f) {
    return int64_t{dev.sm_count} * forward_ctas_per_sm(f.row.threads_per_row, f.row.chunks_per_thread, f.kernel) / f.row.cluster;
  };
  for (int64_t rows : {int64_t{1048576}, int64_t{131072}}) {
    const Launch f = forward_launch(rows, 128, 2, Io::kElement, dev);
    ASSERT_GE(f.row.rows_per_cta, kOneGroupMinRowsPerCta);
    const int64_t groups = rows / f.row.rows_per_cta;
    if (groups >= kOneGroupMinGroupsPerCta * resident(f))
      EXPECT_EQ(f.grid, groups) << rows;
    else
      EXPECT_EQ(f.grid, resident(f)) << rows;
  }
  // D = 128 at 16-bit: 8 threads of 2 chunks per row, so kForwardMinCtaThreads / 8 rows per CTA.
  EXPECT_EQ(forward_launch(1048576, 128, 2, Io::kElement, dev).grid, 1048576 / (kForwardMinCtaThreads / 8));
  EXPECT_EQ(forward_launch(131072, 128, 2, Io::kElement, dev).grid, 132 * forward_ctas_per_sm(8, kFewChunksPerThread, Kernel::kForwardRowsElement));
  // D = 2048: 64 threads per row, under 8 rows per CTA: tiles of consecutive
  // groups where there are enough of them, else persistent.
  const Launch big = forward_launch(int64_t{1} << 24, 2048, 2, Io::kElement, dev);
  EXPECT_EQ(big.row.rows_per_cta, kForwardMinCtaThreads / 64);
  EXPECT_LT(big.row.rows_per_cta, kOneGroupMinRowsPerCta);
  EXPECT_EQ(big.groups_per_cta, kForwardTileGroups);
  EXPECT_EQ(big.grid, (int64_t{1} << 24) / big.row.rows_per_cta / kForwardTileGroups);
  // One group short of kForwardTileMinWaves tiles per resident CTA.
  const Launch few = forward_launch(big.row.rows_per_cta * (kForwardTileMinWaves * kForwardTileGroups * resident(big) - 1),
                                    2048, 2, Io::kElement, dev);
  EXPECT_EQ(few.groups_per_cta, 0);
  EXPECT_EQ(few.grid, resident(few));
}

// fp32 rows of 512 threads of 2 chunks (D 3073..4096): 2048 threads per SM only in the 16-byte direct kernel; the
// paired and element kernels, which spilled at its 32 registers, 1536, and the element path's persistent grid is
// sized by that.
TEST(Plan, WideForwardOnlyInTheDirectKernel) {
  const Device dev = hopper();
  for (int64_t d : {int64_t{3073}, int64_t{4096}}) {
    const Launch v = forward_launch(1000, d, 4, Io::kVector, dev);
    ASSERT_EQ(v.kernel, Kernel::kForwardRows) << d;
    ASSERT_EQ(v.row.threads_per_row, kFewChunksTprF32) << d;
    ASSERT_EQ(v.row.chunks_per_thread, kFewChunksPerThread) << d;
    EXPECT_EQ(forward_threads_per_sm(v.row.threads_per_row, v.row.chunks_per_thread, v.kernel), kForwardWideThreadsPerSm);
    const Launch p = forward_launch(1000, d, 4, Io::kPaired, dev);
    ASSERT_EQ(p.kernel, Kernel::kForwardRowsPaired) << d;
    EXPECT_EQ(forward_threads_per_sm(p.row.threads_per_row, p.row.chunks_per_thread, p.kernel), kForwardFewThreadsPerSm);
    const Launch e = forward_launch(1000, d, 4, Io::kElement, dev);
    ASSERT_EQ(e.kernel, Kernel::kForwardRowsElement) << d;
    EXPECT_EQ(forward_threads_per_sm(e.row.threads_per_row, e.row.chunks_per_thread, e.kernel), kForwardFewThreadsPerSm);
    EXPECT_EQ(e.grid, int64_t{dev.sm_count} * (kForwardFewThreadsPerSm / kFewChunksTprF32)) << d;
  }
  // 16-bit rows keep their rules in every kernel.
  for (Kernel k : {Kernel::kForwardRows, Kernel::kForwardRowsPaired, Kernel::kForwardRowsElement}) {
    EXPECT_EQ(forward_threads_per_sm(kFewChunksTpr, kFewChunksPerThread, k), kForwardFewThreadsPerSm);
    EXPECT_EQ(forward_threads_per_sm(kFewChunksTpr, kMaxChunksPerThread, k), kForwardThreadsPerSm);
  }
}

// Tiled grids: CTA u takes groups [u n, u n + n); together they cover every
// group once, and no CTA is empty.
TEST(Plan, ForwardTilesCoverEveryGroupOnce) {
  const Device dev = hopper();
  int tiled = 0;
  for (int esize : {2, 4}) {
    for (int64_t d : {1, 1000, 1025, 2048, 4096, 7168, 8192, 12288, 16384}) {
      for (int64_t rows : {int64_t{1}, int64_t{4095}, int64_t{8192}, int64_t{16383}, int64_t{1} << 20,
                           (int64_t{1} << 31) + 3}) {
        const Launch l = forward_launch(rows, d, esize, Io::kElement, dev);
        if (l.groups_per_cta == 0) continue;
        ++tiled;
        ASSERT_EQ(l.row.band, Band::kRows);
        const int64_t groups = (rows + l.row.rows_per_cta - 1) / l.row.rows_per_cta;
        ASSERT_GE(l.groups_per_cta, kForwardTileGroups);
        EXPECT_GE(l.grid * l.groups_per_cta, groups) << d << " " << rows;
        EXPECT_LT((l.grid - 1) * l.groups_per_cta, groups) << d << " " << rows;
        EXPECT_LT(l.grid, int64_t{1} << 31);
      }
    }
  }
  EXPECT_GT(tiled, 0);
}

// Persistent cluster grids never ask for more clusters than the device runs
// at once (a second wave would double the time); unknown (0) falls back to
// the SM count.
TEST(Plan, ClusterGridsFitTheCoScheduledClusters) {
  Device dev = hopper(16);
  for (int k = 0; k < 4; ++k) {
    dev.forward_active_clusters[k] = 7 - k;
    dev.backward_active_clusters[k] = 5 - k;
  }
  for (int cs = 2; cs <= 16; cs *= 2) {
    const int64_t d = int64_t{cs} * kClusterTpr * kMaxChunksPerThread * 8;  // 16-bit row needing `cs` CTAs
    const Launch f = forward_launch(1 << 20, d, 2, Io::kVector, dev);
    const Launch b = backward_launch(1 << 20, d, 2, Io::kVector, true, dev);
    ASSERT_EQ(f.row.cluster, cs);
    EXPECT_EQ(f.grid, int64_t{dev.forward_active_clusters[cluster_index(cs)]} * cs);
    EXPECT_EQ(b.grid, int64_t{dev.backward_active_clusters[cluster_index(cs)]} * cs);
    EXPECT_EQ(b.partials, dev.backward_active_clusters[cluster_index(cs)]);
    const Device unknown = hopper(16);
    EXPECT_EQ(forward_launch(1 << 20, d, 2, Io::kVector, unknown).grid,
              int64_t{unknown.sm_count} * forward_ctas_per_sm(kClusterTpr, kMaxChunksPerThread, Kernel::kForwardCluster) / cs * cs);
  }
}

TEST(Plan, ForwardGridCoversAllRows) {
  const Device dev = hopper();
  for (int64_t d : {1, 100, 4096, 8193, 100000, 300000}) {
    for (int64_t rows : {int64_t{1}, int64_t{7}, int64_t{65537}, int64_t{1} << 31}) {
      const Launch l = forward_launch(rows, d, 2, Io::kVector, dev);
      EXPECT_GE(l.grid, 1);
      EXPECT_LT(l.grid, int64_t{1} << 31);
      EXPECT_EQ(l.grid % l.row.cluster, 0);
      // Grid-stride loops: any grid >= 1 covers all rows; it never exceeds the work.
      EXPECT_LE(l.grid / l.row.cluster, (rows + l.row.rows_per_cta - 1) / l.row.rows_per_cta);
    }
  }
}

TEST(Plan, BackwardWorkspaceIsBoundedIndependentlyOfRows) {
  for (const Device& dev : {hopper(8), hopper(16), ampere()}) {
    for (int esize : {2, 4}) {
      for (int64_t d = 1; d <= kMaxD; d = d < 4096 ? d + 1 : d + 4093) {
        for (int64_t rows : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{1000}, int64_t{1} << 20, int64_t{1} << 31}) {
          const Launch l = backward_launch(rows, d, esize, Io::kVector, true, dev);
          ASSERT_LE(l.workspace, size_t{2} * dev.sm_count * static_cast<size_t>(d) * 4) << d << " " << rows;
          ASSERT_LE(l.grid, int64_t{2} * dev.sm_count);
          ASSERT_GE(l.grid, 1);
          ASSERT_LE(l.smem, dev.max_smem_optin);
          ASSERT_EQ(l.grid, l.partials * l.row.cluster);
          ASSERT_EQ(l.direct_gw, l.partials == 1 && l.row.band != Band::kLooped);
          ASSERT_EQ(l.workspace, l.direct_gw ? 0 : static_cast<size_t>(l.partials * d) * 4);
          ASSERT_GE(l.stages, 1);
          ASSERT_LE(l.stages, kMaxStages);
          const size_t combine = l.row.band == Band::kRows ? backward_combine_smem(l.row.threads_per_row, esize, l.row.chunks_per_thread) : 0;
          if (l.kernel == Kernel::kBackwardRowsDirect) {
            // No stages: only the gw slot sum.
            ASSERT_EQ(l.stages, 1);
            ASSERT_EQ(l.smem, combine);
          } else if (l.kernel == Kernel::kBackwardRowsDecode) {
            // One small CTA holding every row: its own slot sum, gw written directly.
            ASSERT_EQ(l.stages, 1);
            ASSERT_EQ(l.row.cta_threads, backward_decode_cta_threads(l.row.threads_per_row));
            ASSERT_LE(rows, l.row.rows_per_cta);
            ASSERT_EQ(l.smem, backward_decode_combine_smem(l.row.threads_per_row, esize, l.row.chunks_per_thread));
            ASSERT_TRUE(l.direct_gw);
          } else if (l.row.band != Band::kLooped) {
            // The stages fit, and so does the gw slot sum (it reuses them).
            ASSERT_GE(l.smem, stage_bytes(l.row.cta_threads, 2, l.row.chunks_per_thread) * static_cast<size_t>(l.stages));
            ASSERT_GE(l.smem, combine);
          }
          // Element I/O: the same geometry, grid and workspace (the workspace query knows no
          // pointers); the rows band stages each row's aligned blocks, one more block per slot
          // and operand; the cluster band's element path stages nothing.
          const Launch e = backward_launch(rows, d, esize, Io::kElement, true, dev);
          ASSERT_EQ(e.grid, l.grid);
          ASSERT_EQ(e.partials, l.partials);
          ASSERT_EQ(e.workspace, l.workspace);
          ASSERT_EQ(e.row.threads_per_row, l.row.threads_per_row);
          // The decode form is the 16-byte path's; the element path keeps the plain CTA.
          if (l.kernel != Kernel::kBackwardRowsDecode) {
            ASSERT_EQ(e.row.cta_threads, l.row.cta_threads);
          } else {
            ASSERT_EQ(e.row.cta_threads, backward_cta_threads(l.row.threads_per_row));
          }
          ASSERT_LE(e.smem, dev.max_smem_optin);
          if (l.row.band == Band::kRows) {
            ASSERT_GE(e.stages, 1);
            ASSERT_LE(e.stages, kMaxStages);
            ASSERT_EQ(e.smem, std::max(shifted_stage_bytes(e.row.cta_threads, e.row.rows_per_cta, 2, e.row.chunks_per_thread) *
                                           static_cast<size_t>(e.stages),
                                       combine));
          } else {
            ASSERT_EQ(e.smem, 0u);  // one slot: no slot sum, no staging
            ASSERT_EQ(e.stages, 1);
          }
          const Launch n = backward_launch(rows, d, esize, Io::kVector, false, dev);
          ASSERT_EQ(n.workspace, 0u);
          if (n.row.band != Band::kRows) {
            ASSERT_EQ(backward_launch(rows, d, esize, Io::kElement, false, dev).smem, 0u);
          }
        }
      }
    }
  }
}

// The workspace query takes any rows >= 0, INT64_MAX included: the plan there is the plan of any row count that
// fills the GPU (no overflow in counting row groups; the sanitizer build reports one).
TEST(Plan, LargestRowsPlanLikeManyRows) {
  const int64_t largest = std::numeric_limits<int64_t>::max(), many = int64_t{1} << 40;
  for (const Device& dev : {hopper(16), ampere()}) {
    for (int esize : {2, 4}) {
      for (int64_t d : {1, 64, 4096, 8193, 40000, 300000}) {
        const Launch b = backward_launch(largest, d, esize, Io::kVector, true, dev);
        const Launch bm = backward_launch(many, d, esize, Io::kVector, true, dev);
        EXPECT_EQ(b.grid, bm.grid) << d;
        EXPECT_EQ(b.workspace, bm.workspace) << d;
        EXPECT_EQ(b.kernel, bm.kernel) << d;
        const Launch f = forward_launch(largest, d, esize, Io::kVector, dev);
        EXPECT_EQ(f.grid, forward_launch(many, d, esize, Io::kVector, dev).grid) << d;
        EXPECT_GE(f.grid, 1);
      }
    }
  }
}

// No rows: gw is the empty sum, written without a workspace, in every band.
TEST(Plan, NoRowsNeedNoWorkspace) {
  for (int64_t d : {1, 64, 4096, 8193, 40000, 300000, 2000000}) {
    for (int esize : {2, 4}) EXPECT_EQ(backward_launch(0, d, esize, Io::kVector, true, hopper()).workspace, 0u) << d;
  }
}

TEST(Plan, PreHopperNeverUsesClustersOfMoreThanOneCta) {
  for (int64_t d = 8000; d <= kMaxD; d += 101) {
    const RowPlan p = row_plan(d, 2, Direction::kBackward, ampere());
    ASSERT_EQ(p.cluster, 1) << d;
  }
}

// The finalize's lanes: a warp's worth at most (its lane sums are added in
// one warp), a whole number of warps per CTA, and the same for the same
// partial count (the gw summation order depends on it).
TEST(Plan, FinalizeLanes) {
  for (int64_t count = 0; count <= 4096; ++count) {
    const int l = finalize_lanes(count);
    ASSERT_TRUE(l == 8 || l == 32) << count;
    ASSERT_LE(l, kFinalizeMaxLanes);
    ASSERT_EQ(kFinalizeCols * l % kWarp, 0);
  }
  EXPECT_EQ(finalize_lanes(132), 32);  // H200 persistent grid
  EXPECT_EQ(finalize_lanes(8), 8);     // a few clusters
}

// The backward's gw slot sum reads its table (plan::combine_index) without
// shared-memory bank conflicts: each warp-wide read of the final loop touches
// 32 distinct banks wherever a warp's 32 elements lie in one chunk column
// (tpr * vec >= 32), and the table fits in the CTA's shared memory.
TEST(Plan, SlotSumTableReadsWithoutBankConflicts) {
  for (int esize : {2, 4}) {
    const int vec = vec_elems(esize);
    // The rows band's (tpr, cpt) pairs (dispatch_rows).
    std::vector<std::pair<int, int>> shapes;
    for (int tpr = 1; tpr <= 64; tpr *= 2) shapes.emplace_back(tpr, kMaxChunksPerThread);
    shapes.emplace_back(8, kFewChunksPerThread);
    shapes.emplace_back(32, kFewChunksPerThread);
    shapes.emplace_back(256, kFewChunksPerThread);
    if (esize == 4) shapes.emplace_back(512, kFewChunksPerThread);
    shapes.emplace_back(256, kMaxChunksPerThread);
    shapes.emplace_back(512, kMaxChunksPerThread);
    for (const auto& [tpr, cpt] : shapes) {
      const int block = backward_cta_threads(tpr), slots = block / tpr;
      if (slots == 1) {
        EXPECT_EQ(backward_combine_smem(tpr, esize, cpt), 0u);
        continue;
      }
      const int elems = cpt * tpr * vec;  // the final loop's e range
      int max_ways = 0;
      for (int e0 = 0; e0 < elems; e0 += kWarp) {
        for (int s = 0; s < slots; ++s) {
          std::map<int, std::set<int>> banks;  // bank -> distinct word addresses
          for (int lane = 0; lane < kWarp && e0 + lane < elems; ++lane) {
            const int e = e0 + lane;
            const int it = e / (tpr * vec), l = (e / vec) % tpr, j = e % vec;
            const int addr = combine_index(it, j, s * tpr + l, block, esize);
            ASSERT_LT(static_cast<size_t>(addr) * sizeof(float), backward_combine_smem(tpr, esize, cpt));
            banks[addr % kWarp].insert(addr);
          }
          for (const auto& b : banks) max_ways = std::max(max_ways, static_cast<int>(b.second.size()));
        }
      }
      if (tpr * vec >= kWarp)
        EXPECT_EQ(max_ways, 1) << "tpr " << tpr << " cpt " << cpt << " esize " << esize;
      else
        EXPECT_LE(max_ways, 4) << "tpr " << tpr << " cpt " << cpt << " esize " << esize;
      // Every thread's writes stay inside the table too.
      EXPECT_LT(static_cast<size_t>(combine_index(cpt - 1, vec - 1, block - 1, block, esize)) * sizeof(float),
                backward_combine_smem(tpr, esize, cpt));
    }
  }
}


// The dispatch table printed at the top of plan.hpp, as data, against the
// planner: for every D in 1..2^20, both element sizes, both I/O paths, both
// directions, on sm_90 with clusters of 16 and of 8 and on sm_80, the band
// and kernel the table names, the tpr / cluster size its formulas give, and
// the finalize it promises.
struct TableEntry {
  Band band;
  Kernel forward_vector, forward_element, backward_vector, backward_element;
};
constexpr TableEntry kTable[] = {
    {Band::kRows, Kernel::kForwardRows, Kernel::kForwardRowsElement, Kernel::kBackwardRows,
     Kernel::kBackwardRowsShifted},
    {Band::kCluster, Kernel::kForwardCluster, Kernel::kForwardClusterElement, Kernel::kBackwardCluster,
     Kernel::kBackwardClusterElement},
    {Band::kLooped, Kernel::kForwardLooped, Kernel::kForwardLooped, Kernel::kBackwardLooped,
     Kernel::kBackwardLooped},
};
// The table's D ranges: kRows up to 16384 (16-bit) / 8192 (fp32); kCluster up
// to 131072 / 65536 with clusters of 8, twice that with 16, none before sm_90.
Band table_band(int64_t d, int esize, const Device& dev) {
  const int64_t rows_max = esize == 2 ? 16384 : 8192;
  if (d <= rows_max) return Band::kRows;
  const int max_cluster = dev.cc_major >= 9 ? dev.max_cluster : 1;
  if (d <= rows_max * max_cluster) return Band::kCluster;
  return Band::kLooped;
}

TEST(Plan, DispatchTableMatchesThePlanner) {
  for (const Device& dev : {hopper(16), hopper(8), ampere()}) {
    for (int esize : {2, 4}) {
      const int vec = 16 / esize;
      for (int64_t d = 1; d <= kMaxD; ++d) {
        const Band band = table_band(d, esize, dev);
        const TableEntry& t = kTable[static_cast<int>(band)];
        ASSERT_EQ(t.band, band);
        for (Io io : {Io::kVector, Io::kElement}) {
          const bool vector = io == Io::kVector;
          const Launch f = forward_launch(1000, d, esize, io, dev);
          const Launch b = backward_launch(1000, d, esize, io, true, dev);
          ASSERT_EQ(f.row.band, band) << "D " << d << " esize " << esize;
          ASSERT_EQ(b.row.band, band) << "D " << d << " esize " << esize;
          ASSERT_EQ(f.kernel, vector ? t.forward_vector : t.forward_element) << "D " << d;
          // The rows band's 16-byte backward without stages where no CTA has a second group.
          const int64_t b_groups = (1000 + b.row.rows_per_cta - 1) / b.row.rows_per_cta;
          const Kernel bv = t.backward_vector == Kernel::kBackwardRows && b_groups <= b.grid
                                ? Kernel::kBackwardRowsDirect
                                : t.backward_vector;
          ASSERT_EQ(b.kernel, vector ? bv : t.backward_element) << "D " << d;
          ASSERT_EQ(f.io, io);
          ASSERT_EQ(b.io, io);
          ASSERT_EQ(f.direction, Direction::kForward);
          ASSERT_EQ(b.direction, Direction::kBackward);
          const int64_t chunks = (d + vec - 1) / vec;
          if (band == Band::kRows) {
            // cpt = 2 at 13..16, 49..64 and 257..512 chunks (and 769..1024 at fp32), else 4; tpr = smallest
            // power of two >= ceil(chunks / cpt); CTAs of max(tpr, 256) / max(tpr, 512).
            const int cpt = few_chunks(chunks, esize) ? 2 : 4;
            int tpr = 1;
            while (int64_t{tpr} * cpt < chunks) tpr *= 2;
            ASSERT_EQ(f.row.chunks_per_thread, cpt) << "D " << d;
            ASSERT_EQ(b.row.chunks_per_thread, cpt) << "D " << d;
            ASSERT_EQ(f.row.threads_per_row, tpr) << "D " << d;
            ASSERT_EQ(b.row.threads_per_row, tpr) << "D " << d;
            ASSERT_EQ(f.row.cta_threads, std::max(tpr, 256));
            ASSERT_EQ(b.row.cta_threads, std::max(tpr, 512));
          } else if (band == Band::kCluster) {
            // cluster = smallest power of two with cluster * 512 * 4 * vec >= D.
            int cluster = 1;
            while (int64_t{cluster} * 512 * 4 * vec < d) cluster *= 2;
            ASSERT_EQ(f.row.cluster, cluster) << "D " << d;
            ASSERT_EQ(b.row.cluster, cluster) << "D " << d;
          }
          // Only the paths that stage through shared memory ask for it.
          if (!vector && band != Band::kRows) {
            ASSERT_EQ(b.smem, 0u) << "D " << d;
          }
          if (!vector || band == Band::kLooped) {
            ASSERT_EQ(f.smem, 0u) << "D " << d;
          }
          ASSERT_EQ(b.finalize, !b.direct_gw);
          ASSERT_EQ(b.finalize_grid, b.finalize ? (d + kFinalizeCols - 1) / kFinalizeCols : 0);
          ASSERT_EQ(b.finalize_lanes, b.finalize ? finalize_lanes(b.partials) : 0);
          const Launch n = backward_launch(1000, d, esize, io, false, dev);
          ASSERT_FALSE(n.finalize);
          ASSERT_EQ(n.workspace, 0u);
        }
      }
    }
  }
}

// The rows band's 16-byte backward: registers only while every CTA has at
// most one row group, the pipelined kernel from the first CTA with two; the
// grid, partials and workspace are the same either way. Where every row fits
// in one CTA of backward_decode_cta_threads (smaller than the plain CTA), the
// decode form of the direct kernel.
TEST(Plan, BackwardRowsDirectWhileEveryCtaHasOneGroup) {
  const Device dev = hopper(16);
  for (int esize : {2, 4}) {
    for (int64_t d : {1, 8, 100, 1000, 4096, 8192, 16384}) {
      const Launch probe = backward_launch(int64_t{1} << 20, d, esize, Io::kVector, true, dev);
      if (probe.row.band != Band::kRows) continue;
      const int64_t slots = probe.row.rows_per_cta;
      const int tpr = probe.row.threads_per_row;
      const int64_t decode_slots = backward_decode_cta_threads(tpr) / tpr;
      const bool has_decode = backward_decode_cta_threads(tpr) < backward_cta_threads(tpr);
      const int64_t last_direct = slots * dev.sm_count * kBackwardCtasPerSm;
      for (int64_t rows : {int64_t{1}, int64_t{2}, decode_slots, decode_slots + 1, slots, last_direct - 1, last_direct,
                           last_direct + 1, 4 * last_direct}) {
        const Launch b = backward_launch(rows, d, esize, Io::kVector, true, dev);
        const int64_t groups = (rows + slots - 1) / slots;
        const bool decode = has_decode && rows <= decode_slots;
        ASSERT_EQ(b.kernel, decode            ? Kernel::kBackwardRowsDecode
                            : groups <= b.grid ? Kernel::kBackwardRowsDirect
                                               : Kernel::kBackwardRows)
            << "D " << d << " rows " << rows;
        ASSERT_EQ(b.kernel == Kernel::kBackwardRowsDirect || decode, rows <= last_direct)
            << "D " << d << " rows " << rows;
        if (decode) {
          ASSERT_EQ(b.grid, 1);
          ASSERT_TRUE(b.direct_gw);
          ASSERT_EQ(b.workspace, 0u);
          ASSERT_EQ(b.row.cta_threads, backward_decode_cta_threads(tpr));
          ASSERT_EQ(b.smem, backward_decode_combine_smem(tpr, esize, b.row.chunks_per_thread));
          ASSERT_EQ(b.row.threads_per_row, tpr);
          // The workspace query's plan (16-byte, the same rows) agrees.
          continue;
        }
        ASSERT_EQ(b.grid, std::min<int64_t>(groups, dev.sm_count * kBackwardCtasPerSm));
        ASSERT_EQ(b.partials, b.grid);
        ASSERT_EQ(b.workspace, b.direct_gw ? 0u : static_cast<size_t>(b.partials) * d * sizeof(float));
        // No stages: only the slot-sum table, where the CTA has more than one slot.
        if (b.kernel == Kernel::kBackwardRowsDirect) {
          ASSERT_EQ(b.stages, 1);
          ASSERT_EQ(b.smem, backward_combine_smem(b.row.threads_per_row, esize, b.row.chunks_per_thread));
        }
        // The element path keeps its staged kernel.
        ASSERT_EQ(backward_launch(rows, d, esize, Io::kElement, true, dev).kernel, Kernel::kBackwardRowsShifted);
      }
    }
  }
}

TEST(Plan, NoRowsLaunchOnlyTheFinalize) {
  for (int64_t d : {1, 4096, 100000, 300000}) {
    const Launch b = backward_launch(0, d, 2, Io::kVector, true, hopper(16));
    EXPECT_EQ(b.grid, 0);
    EXPECT_EQ(b.partials, 0);
    EXPECT_TRUE(b.finalize);
    EXPECT_EQ(b.workspace, 0u);
    EXPECT_FALSE(backward_launch(0, d, 2, Io::kVector, false, hopper(16)).finalize);
  }
}

// forward_io: kVector only where every row of x, y and the weight is 16-byte
// aligned; paired where each row of x starts at the same offset in its
// 16-byte block as the same row of y and the weight is aligned (or none):
// kPaired with one offset for every row, kPairedRows with strides that move it.
TEST(Plan, ForwardIoPairsXAndYAtOneOffset) {
  auto at = [](uintptr_t a) { return reinterpret_cast<const void*>(a); };
  constexpr uintptr_t kBase = 1 << 20;
  for (int esize : {2, 4}) {
    const int vec = vec_elems(esize);
    for (uintptr_t off = 0; off < 16; off += static_cast<uintptr_t>(esize)) {
      for (int64_t pad : {0, 1, 3, vec}) {
        const int64_t stride = 4096 + pad;
        const Io io = forward_io({at(kBase + off), stride}, {at(2 * kBase + off), stride}, at(3 * kBase), esize);
        const bool rows_move = (stride * esize) % 16 != 0;
        const Io want = off == 0 && !rows_move ? Io::kVector : rows_move ? Io::kPairedRows : Io::kPaired;
        ASSERT_EQ(io, want) << esize << " " << off << " " << pad;
        // No weight: the same.
        ASSERT_EQ(forward_io({at(kBase + off), stride}, {at(2 * kBase + off), stride}, nullptr, esize), want);
        // A misaligned weight, x and y at different offsets, or strides whose offsets drift apart: kElement
        // (kVector needs all three aligned).
        if (want != Io::kVector) {
          ASSERT_EQ(forward_io({at(kBase + off), stride}, {at(2 * kBase + off), stride}, at(3 * kBase + esize), esize),
                    Io::kElement);
        }
        ASSERT_EQ(forward_io({at(kBase + off), stride}, {at(2 * kBase + (off + esize) % 16), stride}, at(3 * kBase),
                             esize),
                  Io::kElement);
        ASSERT_EQ(forward_io({at(kBase + off), stride}, {at(2 * kBase + off), stride + 1}, at(3 * kBase), esize),
                  Io::kElement);
      }
    }
  }
}

// The I/O tests' byte arithmetic at any stride a one-row call may pass (up to INT64_MAX: only rows - 1 strides
// must fit an extent), and for the difference of two strides: the remainder mod 16 of the true product, without
// signed overflow (the ASan/UBSan build runs this).
TEST(Plan, WholeChunksAtAnyStride) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_FALSE(whole_chunks(kMax, 2));      // (2^63 - 1) 2 = 2^64 - 2
  EXPECT_FALSE(whole_chunks(kMax, 4));      // 2^65 - 4
  EXPECT_TRUE(whole_chunks(kMax - 7, 2));   // (2^63 - 8) 2 = 2^64 - 16
  EXPECT_TRUE(whole_chunks(kMax - 3, 4));   // 2^65 - 16
  EXPECT_TRUE(whole_chunks(-8, 2));         // a difference of strides: -16 bytes
  EXPECT_FALSE(whole_chunks(-7, 2));
  EXPECT_TRUE(whole_chunks(0, 4));
  const auto* aligned = reinterpret_cast<const void*>(uintptr_t{1} << 20);
  EXPECT_FALSE(rows_aligned16(aligned, kMax, 2));
  EXPECT_EQ(forward_io({aligned, kMax}, {aligned, 8}, nullptr, 2), Io::kElement);
  EXPECT_EQ(forward_io({aligned, kMax - 7}, {aligned, 8}, nullptr, 2), Io::kVector);
  EXPECT_EQ(backward_io({{aligned, kMax}, {aligned, 8}}, nullptr, 2), Io::kElement);
}

// Paired x and y: the rows band's forward runs kForwardRowsPaired with the
// 16-byte rows kernel's geometry and grid, whether every row has one offset
// (kPaired) or the offset moves row by row (kPairedRows); everywhere else (the
// other bands, the backward, an fp32 weight) the launch is kElement's.
TEST(Plan, PairedForwardIsTheRowsBandsPairedKernel) {
  for (const Device& dev : {hopper(16), hopper(8), ampere()}) {
    for (int esize : {2, 4}) {
      for (int64_t d = 1; d <= kMaxD; d += d < 20000 ? 1 : 97) {
        for (int64_t rows : {int64_t{1}, int64_t{1000}, (int64_t{1} << 25) + 1}) {
          const Launch v = forward_launch(rows, d, esize, Io::kVector, dev);
          const Launch e = forward_launch(rows, d, esize, Io::kElement, dev);
          for (Io io : {Io::kPaired, Io::kPairedRows}) {
            const Launch f = forward_launch(rows, d, esize, io, dev);
            const bool paired = f.row.band == Band::kRows;
            ASSERT_EQ(f.io, io);
            if (paired) {
              ASSERT_EQ(f.kernel, Kernel::kForwardRowsPaired) << d;
              ASSERT_EQ(v.kernel, Kernel::kForwardRows) << d;
              ASSERT_EQ(f.grid, v.grid) << d;
              ASSERT_EQ(f.groups_per_cta, 0) << d;
              ASSERT_EQ(f.row.threads_per_row, v.row.threads_per_row) << d;
              ASSERT_EQ(f.row.chunks_per_thread, v.row.chunks_per_thread) << d;
              ASSERT_EQ(f.row.cta_threads, v.row.cta_threads) << d;
              ASSERT_EQ(f.smem, 0u) << d;
            } else {
              ASSERT_EQ(f.kernel, e.kernel) << d;
              ASSERT_EQ(f.grid, e.grid) << d;
              ASSERT_EQ(f.groups_per_cta, e.groups_per_cta) << d;
              ASSERT_EQ(f.smem, e.smem) << d;
            }
            if (esize == 2) {
              const Launch w = weight_f32_forward_launch(rows, d, esize, io, dev);
              const Launch we = weight_f32_forward_launch(rows, d, esize, Io::kElement, dev);
              ASSERT_EQ(w.kernel, we.kernel) << d;
              ASSERT_EQ(w.grid, we.grid) << d;
            }
            if (rows == 1000 && d % 7 == 0) {
              const Launch b = backward_launch(rows, d, esize, io, true, dev);
              const Launch be = backward_launch(rows, d, esize, Io::kElement, true, dev);
              ASSERT_EQ(b.kernel, be.kernel) << d;
              ASSERT_EQ(b.grid, be.grid) << d;
              ASSERT_EQ(b.smem, be.smem) << d;
              ASSERT_EQ(b.workspace, be.workspace) << d;
            }
          }
        }
      }
    }
  }
}

// make_divider / divide: n / d for every n < 2^31 that the paired forward's row order can divide, checked against
// the integer division at each divisor's edges (multiples of d and their neighbours) and across the range.
TEST(Plan, DividerMatchesIntegerDivision) {
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 5000; ++d) divisors.push_back(d);
  for (int b = 12; b <= 30; ++b) {
    for (int64_t e : {-3, -1, 0, 1, 3}) divisors.push_back(static_cast<uint32_t>((int64_t{1} << b) + e));
  }
  for (uint32_t d : {65537u, 100003u, 131071u, 999999937u, 0x7ffffffeu, 0x7fffffffu}) divisors.push_back(d);
  const uint32_t n_max = 0x7fffffffu;
  uint64_t lcg = 12345;
  for (uint32_t d : divisors) {
    const Divider v = make_divider(d);
    // The multiplier fits its 32 bits (the 64-bit ceiling make_divider takes it from).
    ASSERT_LT(((uint64_t{1} << v.shift) + d - 1) / d, uint64_t{1} << 32) << "d " << d;
    std::vector<uint32_t> ns = {0, 1, n_max, n_max - 1, d - 1, d, d + 1};
    for (uint64_t k : {uint64_t{2}, uint64_t{3}, uint64_t{7}, uint64_t{1000}, uint64_t{n_max / d}}) {
      for (int64_t e : {-1, 0, 1}) {
        const int64_t n = static_cast<int64_t>(k * d) + e;
        if (n >= 0 && n <= n_max) ns.push_back(static_cast<uint32_t>(n));
      }
    }
    for (int i = 0; i < 64; ++i) {
      lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
      ns.push_back(static_cast<uint32_t>(lcg >> 33));  // < 2^31
    }
    for (uint32_t n : ns) {
      if (n > n_max) continue;
      ASSERT_EQ(divide(n, v), n / d) << "n " << n << " d " << d;
    }
  }
}

// The paired forward's row order at row offsets that change row by row: a permutation of the rows that takes the
// offset classes (row mod period, period = 16 / gcd(row stride in bytes mod 16, 16)) one after another, each in
// row order; rows in order where the stride is whole 16-byte blocks; positions past the rows unchanged.
TEST(Plan, RowClassOrderTakesTheOffsetClassesInTurn) {
  std::vector<int64_t> row_counts;
  for (int64_t r = 1; r <= 300; ++r) row_counts.push_back(r);
  for (int64_t r : {1023, 1024, 1025, 4095, 8192, 65535, 65536, 100003, 262144}) row_counts.push_back(r);
  for (int64_t stride_bytes = 2; stride_bytes <= 40; stride_bytes += 2) {
    const int64_t period = 16 / std::gcd(stride_bytes % 16, int64_t{16});
    for (int64_t rows : row_counts) {
      const RowClassOrder o = row_class_order(rows, stride_bytes);
      ASSERT_EQ(o.classes, period > 1) << stride_bytes;
      std::vector<char> seen(static_cast<size_t>(rows), 0);
      int64_t prev = -1;
      for (int64_t j = 0; j < rows; ++j) {
        const int64_t row = row_at(o, j, rows);
        ASSERT_GE(row, 0);
        ASSERT_LT(row, rows) << "stride " << stride_bytes << " rows " << rows << " j " << j;
        ASSERT_FALSE(seen[static_cast<size_t>(row)]) << "row " << row << " twice; rows " << rows;
        seen[static_cast<size_t>(row)] = 1;
        if (prev >= 0) {
          // Within a class the next row is period rows on; a new class starts at its first row (the class number).
          const bool same_class = row % period == prev % period;
          if (same_class) {
            ASSERT_EQ(row, prev + period) << "stride " << stride_bytes << " rows " << rows << " j " << j;
          } else {
            ASSERT_EQ(row, prev % period + 1) << "stride " << stride_bytes << " rows " << rows << " j " << j;
            ASSERT_GE(prev + period, rows) << "class left before its last row; rows " << rows << " j " << j;
          }
        } else {
          ASSERT_EQ(row, 0);
        }
        prev = row;
      }
      for (int64_t j = rows; j < rows + 3; ++j) ASSERT_EQ(row_at(o, j, rows), j);
    }
  }
  // The offsets' periods: a stride of 1, 2, 4 or 8 bytes mod 16 (16-bit and fp32 rows).
  EXPECT_EQ(row_class_order(1000, 2).period_log2, 3u);   // 2 bytes: 8 classes
  EXPECT_EQ(row_class_order(1000, 4).period_log2, 2u);   // 4 classes
  EXPECT_EQ(row_class_order(1000, 8).period_log2, 1u);   // 2 classes
  EXPECT_EQ(row_class_order(1000, 2046).period_log2, 3u);  // 1023 16-bit elements
  EXPECT_FALSE(row_class_order(1000, 8192).classes);
  EXPECT_FALSE(row_class_order(int64_t{1} << 31, 2).classes);  // rows kept in order past 2^31 - 1
}

// The paired element form's span store (plan::paired_edge_spans) assumes every row of its instances holds more
// than two chunks (the head whole, the tail ending in chunk `blocks` + 1): at every D and every offset class
// whose launch is paired, and at each threads per row, the fewest columns of any D the plan gives it.
TEST(Plan, PairedEdgeSpans) {
  const Device dev = hopper();
  for (int esize : {2, 4}) {
    const int vec = 16 / esize;
    for (int64_t d = 1; d <= 300000; ++d) {
      for (Io io : {Io::kPaired, Io::kPairedRows}) {
        const Launch f = forward_launch(4096, d, esize, io, dev);
        if (f.kernel != Kernel::kForwardRowsPaired) continue;
        if (paired_edge_spans(f.row.threads_per_row)) {
          ASSERT_GT(d, 2 * vec) << "D " << d << " esize " << esize << " tpr " << f.row.threads_per_row;
          // The whole head: kHead < kN columns, then at least one whole block before the tail.
          for (int o = 1; o < vec; ++o) ASSERT_GE(store_blocks(static_cast<uint32_t>(d), vec - o, esize), 1u) << d;
        }
      }
    }
  }
  EXPECT_FALSE(paired_edge_spans(1));
  EXPECT_TRUE(paired_edge_spans(2));
  EXPECT_TRUE(paired_edge_spans(kWarp));
  EXPECT_TRUE(paired_edge_spans(kMaxRowsTpr));
}

// The paired forward's whole-row form: D a multiple of the chunk width and every warp's lanes at one offset (one
// offset for every row, or with offsets that change row by row a warp inside one row: threads per row >= 32), at
// every D; and at the threads per row that the plan gives a paired launch there.
TEST(Plan, PairedWholeRowsOnlyWithWholeChunksAndAWarpAtOneOffset) {
  const Device dev = hopper();
  for (int esize : {2, 4}) {
    const int vec = 16 / esize;
    for (int64_t d = 1; d <= 20000; ++d) {
      for (int tpr = 1; tpr <= kMaxRowsTpr; tpr *= 2) {
        EXPECT_EQ(paired_whole_rows(Io::kPaired, d, esize, tpr), d % vec == 0) << d;
        // Lanes t and t + 1 of a warp lie in one row exactly where 32 / tpr rows do not share it.
        const bool warp_in_one_row = tpr % kWarp == 0;
        EXPECT_EQ(paired_whole_rows(Io::kPairedRows, d, esize, tpr), d % vec == 0 && warp_in_one_row) << d;
        EXPECT_FALSE(paired_whole_rows(Io::kVector, d, esize, tpr)) << d;
        EXPECT_FALSE(paired_whole_rows(Io::kElement, d, esize, tpr)) << d;
      }
      for (Io io : {Io::kPaired, Io::kPairedRows}) {
        const Launch f = forward_launch(4096, d, esize, io, dev);
        if (f.kernel != Kernel::kForwardRowsPaired) continue;
        const int tpr = f.row.threads_per_row;
        const bool one_offset_per_warp = io == Io::kPaired || tpr % kWarp == 0;
        EXPECT_EQ(paired_whole_rows(io, d, esize, tpr), d % vec == 0 && one_offset_per_warp) << d;
      }
    }
  }
}

// The backward's I/O path: kPaired only where every given operand's rows sit at one offset (a multiple of the
// element size) and every row stride is a whole number of 16-byte blocks, the weight aligned or none; and the
// shifted kernel takes the offset as a constant at every D a multiple of the chunk width, in one kernel per offset
// only at 16-bit D 1025..2048 (every backward geometry of the rows band, at every D, is checked).
TEST(Plan, BackwardPairedIoAndRows) {
  char buf[256];
  char* const a = buf + (16 - reinterpret_cast<uintptr_t>(buf) % 16);  // 16-byte aligned
  for (int esize : {2, 4}) {
    const int vec = 16 / esize;
    for (int o = 0; o < 16; o += esize) {
      const Io want = o == 0 ? Io::kVector : Io::kPaired;
      EXPECT_EQ(backward_io({{a + o, 64}, {a + 16 + o, 64}, {a + 32 + o, 8 * vec}, {nullptr, 3}}, a + 48, esize), want) << o;
      EXPECT_EQ(backward_io({{a + o, 64}, {a + o, 64}, {a + o, 64}, {a + 64 + o, 64}}, nullptr, esize), want) << o;
      // A misaligned weight, another offset, an odd stride: kElement.
      EXPECT_EQ(backward_io({{a + o, 64}, {a + o, 64}, {a + o, 64}}, a + esize, esize), Io::kElement) << o;
      EXPECT_EQ(backward_io({{a + o, 64}, {a + (o + esize) % 16, 64}, {a + o, 64}}, a, esize), Io::kElement) << o;
      EXPECT_EQ(backward_io({{a + o, 64}, {a + o, 65}, {a + o, 64}}, a, esize), Io::kElement) << o;
      EXPECT_EQ(backward_io({{a + o, 64}, {a + o, 64}, {a + o, 64}, {a + o, 64 + vec / 2}}, a, esize), Io::kElement) << o;
    }
    // An offset that is not a multiple of the element size (fp32 rows 2 bytes off).
    if (esize == 4) {
      EXPECT_EQ(backward_io({{a + 2, 64}, {a + 2, 64}, {a + 2, 64}}, a, esize), Io::kElement);
    }
    for (const Device& dev : {hopper(16), hopper(8), ampere()}) {
      for (int64_t d = 1; d <= 20000; ++d) {
        const Launch l = backward_launch(1000, d, esize, Io::kPaired, true, dev);
        const Launch e = backward_launch(1000, d, esize, Io::kElement, true, dev);
        ASSERT_EQ(l.kernel, e.kernel) << d;
        ASSERT_EQ(l.grid, e.grid) << d;
        ASSERT_EQ(l.smem, e.smem) << d;
        ASSERT_EQ(l.stages, e.stages) << d;
        const int tpr = l.row.threads_per_row, cpt = l.row.chunks_per_thread;
        ASSERT_EQ(backward_paired_rows(l.io, d, esize), d % vec == 0) << d;
        // One kernel per offset: the 16-bit rows of D 1025..2048 (64 threads x 4 chunks) and no others.
        const bool per_offset = backward_paired_per_offset(tpr, cpt, esize);
        if (l.kernel == Kernel::kBackwardRowsShifted) {
          ASSERT_EQ(per_offset, esize == 2 && d > 1024 && d <= 2048) << d;
        }
        ASSERT_FALSE(backward_paired_rows(Io::kElement, d, esize)) << d;
        ASSERT_FALSE(backward_paired_rows(Io::kPairedRows, d, esize)) << d;
      }
    }
  }
}

}  // namespace
// Element-I/O forward stores: head, whole aligned blocks, tail cover a row's
// columns exactly once; every block starts on a 16-byte boundary and has an
// owner (block k < chunks); the head lies in chunk 0 and the tail in one
// window of vec columns.
TEST(Plan, AlignedStoreBlocksCoverEveryColumnOnce) {
  for (int esize : {2, 4}) {
    const int vec = vec_elems(esize);
    for (int offset = 0; offset < kChunkBytes; offset += esize) {
      const int head = store_head_cols(offset, esize);
      ASSERT_LT(head, vec);
      ASSERT_EQ((offset + head * esize) % kChunkBytes, 0) << offset;
      for (int64_t cols = 1; cols <= 1100; cols += cols < 300 ? 1 : 97) {
        const int64_t blocks = store_blocks(cols, head, esize);
        // The 32-bit unsigned form the paired forward uses is the same rule.
        ASSERT_EQ(int64_t{store_blocks(static_cast<uint32_t>(cols), head, esize)}, blocks) << cols;
        const int64_t chunks = chunks_of(cols, esize);
        std::vector<int> seen(static_cast<size_t>(cols), 0);
        for (int64_t c = 0; c < std::min<int64_t>(head, cols); ++c) ++seen[static_cast<size_t>(c)];
        for (int64_t k = 0; k < blocks; ++k) {
          ASSERT_LT(k, chunks);
          const int64_t first = head + k * vec;
          ASSERT_EQ((offset + first * esize) % kChunkBytes, 0);
          ASSERT_LE(first + vec, cols);
          for (int64_t c = first; c < first + vec; ++c) ++seen[static_cast<size_t>(c)];
        }
        const int64_t tail = head + blocks * vec;
        if (tail < cols) {
          ASSERT_LT(cols - tail, vec) << esize << " " << offset << " " << cols;
        }
        for (int64_t c = tail; c < cols; ++c) ++seen[static_cast<size_t>(c)];
        for (int64_t c = 0; c < cols; ++c)
          ASSERT_EQ(seen[static_cast<size_t>(c)], 1) << "esize " << esize << " offset " << offset << " cols " << cols
                                                     << " col " << c;
      }
    }
  }
}

}  // namespace rmsnorm::plan
