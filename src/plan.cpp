// Host planner; see plan.hpp for the work split and the bands.
#include "plan.hpp"

#include <algorithm>

namespace rmsnorm::plan {

namespace {

int next_pow2_at_least(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// Upper bound on CTAs of a grid-stride launch; past it CTAs loop over rows.
constexpr int64_t kMaxGrid = int64_t{1} << 24;

// Deepest pipeline (<= kMaxStages) whose stages fit `blocks_per_sm` CTAs
// per SM and one CTA's opt-in limit; at least 1 (no lookahead).
int stages_that_fit(size_t per_stage, size_t fixed, int blocks_per_sm, const Device& dev) {
  constexpr size_t kReservedPerCta = 1024;  // the runtime's own shared memory per CTA
  for (int s = kMaxStages; s > 1; --s) {
    const size_t cta = per_stage * s > fixed ? per_stage * s : fixed;
    if (cta <= dev.max_smem_optin && (cta + kReservedPerCta) * blocks_per_sm <= dev.smem_per_sm) return s;
  }
  return 1;
}

}  // namespace

RowPlan row_plan(int64_t cols, int esize, bool backward, const Device& dev) {
  RowPlan p;
  p.esize = esize;
  p.vec = vec_elems(esize);
  p.chunks = chunks_of(cols, esize);
  const int64_t rows_capacity = int64_t{kMaxRowsTpr} * kChunksPerThread;
  const int64_t cta_capacity = int64_t{kClusterTpr} * kChunksPerThread;
  if (p.chunks <= rows_capacity) {
    p.band = Band::kRows;
    p.threads_per_row = next_pow2_at_least((p.chunks + kChunksPerThread - 1) / kChunksPerThread);
    p.chunks_per_thread = kChunksPerThread;
    p.cluster = 1;
    p.block = backward ? backward_block(p.threads_per_row) : forward_block(p.threads_per_row);
    p.rows_per_block = p.block / p.threads_per_row;
    return p;
  }
  const int cluster = next_pow2_at_least((p.chunks + cta_capacity - 1) / cta_capacity);
  const int max_cluster = dev.cc_major >= 9 ? dev.max_cluster : 1;
  if (cluster <= max_cluster) {
    p.band = Band::kCluster;
    p.threads_per_row = kClusterTpr;
    p.chunks_per_thread = kChunksPerThread;
    p.cluster = cluster;
    p.block = kClusterTpr;
    p.rows_per_block = 1;
    return p;
  }
  p.band = Band::kLooped;
  p.threads_per_row = kLoopedThreads;
  p.chunks_per_thread = static_cast<int>((p.chunks + kLoopedThreads - 1) / kLoopedThreads);
  p.cluster = 1;
  p.block = kLoopedThreads;
  p.rows_per_block = 1;
  return p;
}

ForwardLaunch forward_launch(int64_t rows, int64_t cols, int esize, const Device& dev) {
  ForwardLaunch l;
  l.row = row_plan(cols, esize, /*backward=*/false, dev);
  const int64_t groups = (rows + l.row.rows_per_block - 1) / l.row.rows_per_block;
  // kRows and kCluster are persistent (they prefetch the next row group):
  // as many CTAs as fit at once, kForwardThreadsPerSm threads per SM; except
  // where forward_one_group_per_cta says the hardware's own CTA scheduling wins.
  int64_t cap = kMaxGrid;
  if (l.row.band != Band::kLooped) {
    const int64_t resident =
        std::max<int64_t>(1, int64_t{dev.sm_count} * forward_blocks_per_sm(l.row.threads_per_row) / l.row.cluster);
    if (!forward_one_group_per_cta(l.row, groups, resident)) cap = resident;
  }
  // Clusters must be co-scheduled inside one GPC: a persistent grid of more
  // clusters than run at once would leave the rest for a second wave.
  if (l.row.band == Band::kCluster && dev.forward_active_clusters[cluster_index(l.row.cluster)] > 0)
    cap = std::min<int64_t>(cap, dev.forward_active_clusters[cluster_index(l.row.cluster)]);
  l.grid = std::max<int64_t>(1, std::min(groups, cap)) * l.row.cluster;
  if (l.row.band == Band::kRows && cap < kMaxGrid && groups >= kForwardTileMinWaves * kForwardTileGroups * cap) {
    // Tiles of consecutive groups; the grid stays below kMaxGrid.
    l.groups_per_cta = std::max<int64_t>(kForwardTileGroups, (groups + kMaxGrid - 1) / kMaxGrid);
    l.grid = (groups + l.groups_per_cta - 1) / l.groups_per_cta;
  }
  if (l.row.band != Band::kLooped) {
    const size_t per_stage = stage_bytes(l.row.block, 1);
    l.stages = stages_that_fit(per_stage, 0, forward_blocks_per_sm(l.row.threads_per_row), dev);
    l.smem = per_stage * static_cast<size_t>(l.stages);
  }
  return l;
}

BackwardLaunch backward_launch(int64_t rows, int64_t cols, int esize, bool with_gw, const Device& dev) {
  BackwardLaunch l;
  l.row = row_plan(cols, esize, /*backward=*/true, dev);
  const int64_t groups = (rows + l.row.rows_per_block - 1) / l.row.rows_per_block;
  switch (l.row.band) {
    case Band::kRows: {
      l.grid = std::max<int64_t>(1, std::min<int64_t>(groups, int64_t{dev.sm_count} * kBackwardBlocksPerSm));
      l.partials = l.grid;
      if (with_gw) l.smem_elementwise = backward_combine_smem(l.row.threads_per_row, esize);
      break;
    }
    case Band::kCluster: {
      // One CTA per SM; a cluster needs `cluster` SMs.
      int64_t cap = dev.sm_count * kBackwardBlocksPerSm / l.row.cluster;
      if (dev.backward_active_clusters[cluster_index(l.row.cluster)] > 0)
        cap = std::min<int64_t>(cap, dev.backward_active_clusters[cluster_index(l.row.cluster)]);
      const int64_t clusters = std::max<int64_t>(1, std::min<int64_t>(rows, cap));
      l.grid = clusters * l.row.cluster;
      l.partials = clusters;
      break;
    }
    case Band::kLooped: {
      l.grid = std::max<int64_t>(1, std::min<int64_t>(rows, int64_t{dev.sm_count} * kLoopedBlocksPerSm));
      l.partials = l.grid;
      break;
    }
  }
  if (l.row.band != Band::kLooped) {
    const size_t per_stage = stage_bytes(l.row.block, 2);
    l.stages = stages_that_fit(per_stage, l.smem_elementwise, kBackwardBlocksPerSm, dev);
    l.smem = std::max(per_stage * static_cast<size_t>(l.stages), l.smem_elementwise);
  }
  if (l.row.band == Band::kRows) {
    const size_t per_stage = shifted_stage_bytes(l.row.block, l.row.rows_per_block, 2);
    l.stages_elementwise = stages_that_fit(per_stage, l.smem_elementwise, kBackwardBlocksPerSm, dev);
    l.smem_elementwise = std::max(per_stage * static_cast<size_t>(l.stages_elementwise), l.smem_elementwise);
  }
  // A single CTA (or cluster) writes gw itself; the looped band accumulates
  // its partial in the workspace, so it always has one.
  l.direct_gw = with_gw && l.partials == 1 && l.row.band != Band::kLooped;
  // One fp32 partial row of `cols` floats per CTA (or cluster).
  // No rows: gw is written as the empty sum without touching a workspace.
  l.workspace = (with_gw && !l.direct_gw && rows > 0)
                    ? static_cast<size_t>(l.partials) * static_cast<size_t>(cols) * sizeof(float)
                    : 0;
  return l;
}

}  // namespace rmsnorm::plan
