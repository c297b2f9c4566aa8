// Host planner; see plan.hpp for the work split, the bands and the dispatch
// table.
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

// rows / n rounded up, for any rows >= 0 (the workspace query takes rows up to INT64_MAX, where rows + n - 1
// overflows).
int64_t row_groups(int64_t rows, int n) { return rows / n + (rows % n != 0); }

// Deepest pipeline (<= kMaxStages) whose stages fit `ctas_per_sm` CTAs per
// SM and one CTA's opt-in limit; at least 1 (no lookahead).
int stages_that_fit(size_t per_stage, size_t fixed, int ctas_per_sm, const Device& dev) {
  for (int s = kMaxStages; s > 1; --s) {
    const size_t cta = per_stage * s > fixed ? per_stage * s : fixed;
    if (cta <= dev.max_smem_optin && (cta + kRuntimeSmemPerCta) * ctas_per_sm <= dev.smem_per_sm) return s;
  }
  return 1;
}

Kernel kernel_of(Direction direction, Band band, Io io) {
  const bool vec = io == Io::kVector;
  if (direction == Direction::kForward) {
    switch (band) {
      case Band::kRows: return vec ? Kernel::kForwardRows : Kernel::kForwardRowsElement;
      case Band::kCluster: return vec ? Kernel::kForwardCluster : Kernel::kForwardClusterElement;
      case Band::kLooped: return Kernel::kForwardLooped;
    }
  }
  switch (band) {
    case Band::kRows: return vec ? Kernel::kBackwardRows : Kernel::kBackwardRowsShifted;
    case Band::kCluster: return vec ? Kernel::kBackwardCluster : Kernel::kBackwardClusterElement;
    case Band::kLooped: break;
  }
  return Kernel::kBackwardLooped;
}

// The looped band's geometry for p's chunks.
RowPlan looped_row_plan(RowPlan p) {
  p.band = Band::kLooped;
  p.threads_per_row = kLoopedThreads;
  p.chunks_per_thread = static_cast<int>((p.chunks + kLoopedThreads - 1) / kLoopedThreads);
  p.cluster = 1;
  p.cta_threads = kLoopedThreads;
  p.rows_per_cta = 1;
  return p;
}

}  // namespace

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::kForwardRows: return "forward rows";
    case Kernel::kForwardRowsElement: return "forward rows, element I/O";
    case Kernel::kForwardRowsPaired: return "forward rows, x and y at one offset (one row group per CTA)";
    case Kernel::kForwardCluster: return "forward cluster";
    case Kernel::kForwardClusterElement: return "forward cluster, element I/O";
    case Kernel::kForwardLooped: return "forward looped";
    case Kernel::kBackwardRows: return "backward rows";
    case Kernel::kBackwardRowsShifted: return "backward rows, shifted blocks";
    case Kernel::kBackwardRowsDirect: return "backward rows, one group per CTA";
    case Kernel::kBackwardRowsDecode: return "backward rows, decode (one CTA of max(tpr, 32) threads)";
    case Kernel::kBackwardRowsSplit: return "backward rows, gx by row CTAs and gw by column CTAs (rstd given)";
    case Kernel::kBackwardCluster: return "backward cluster";
    case Kernel::kBackwardClusterElement: return "backward cluster, element I/O";
    case Kernel::kBackwardLooped: return "backward looped";
  }
  return "unknown";
}

RowPlan row_plan(int64_t cols, int esize, Direction direction, const Device& dev) {
  RowPlan p;
  p.esize = esize;
  p.vec = vec_elems(esize);
  p.chunks = chunks_of(cols, esize);
  const int64_t rows_capacity = int64_t{kMaxRowsTpr} * kMaxChunksPerThread;
  const int64_t cta_capacity = int64_t{kClusterTpr} * kMaxChunksPerThread;
  if (p.chunks <= rows_capacity) {
    p.band = Band::kRows;
    const int cpt = rows_chunks_per_thread(p.chunks, esize);
    p.threads_per_row = next_pow2_at_least((p.chunks + cpt - 1) / cpt);
    p.chunks_per_thread = cpt;
    p.cluster = 1;
    p.cta_threads = direction == Direction::kBackward ? backward_cta_threads(p.threads_per_row)
                                                      : forward_cta_threads(p.threads_per_row);
    p.rows_per_cta = p.cta_threads / p.threads_per_row;
    return p;
  }
  const int cluster = next_pow2_at_least((p.chunks + cta_capacity - 1) / cta_capacity);
  const int max_cluster = dev.cc_major >= 9 ? dev.max_cluster : 1;
  if (cluster <= max_cluster) {
    p.band = Band::kCluster;
    p.threads_per_row = kClusterTpr;
    p.chunks_per_thread = kMaxChunksPerThread;
    p.cluster = cluster;
    p.cta_threads = kClusterTpr;
    p.rows_per_cta = 1;
    return p;
  }
  return looped_row_plan(p);
}

Launch forward_launch(int64_t rows, int64_t cols, int esize, Io io, const Device& dev) {
  Launch l;
  l.direction = Direction::kForward;
  l.io = io;
  l.row = row_plan(cols, esize, Direction::kForward, dev);
  l.kernel = kernel_of(l.direction, l.row.band, io);
  // Paired x and y: at one offset for every row, or (kPairedRows) at an offset that changes row by row, the
  // kernel then taking the rows offset by offset (forward_rows_paired_kernel): run in row order, the eight
  // offsets' code ran at once on an SM and lost to the element path; offset by offset it took 0.895x the element
  // path's time at 8192 x 4095 bf16 (docs/performance.md, "Misaligned forward: the offset as a constant").
  if (l.row.band == Band::kRows && (io == Io::kPaired || io == Io::kPairedRows)) l.kernel = Kernel::kForwardRowsPaired;
  const int64_t groups = row_groups(rows, l.row.rows_per_cta);
  if (l.kernel == Kernel::kForwardRows || l.kernel == Kernel::kForwardRowsPaired || l.row.band == Band::kLooped) {
    // One row group (kLooped: one row) per CTA, the hardware's CTA scheduler
    // filling the SMs; past kMaxGrid the CTAs loop.
    l.grid = std::max<int64_t>(1, std::min(groups, kMaxGrid));
    return l;
  }
  // The persistent kernels (the cluster band, the rows band's element path):
  // as many CTAs as fit at once, forward_threads_per_sm(tpr, cpt, kernel) threads per SM; except
  // where forward_one_group_per_cta says the hardware's own CTA scheduling wins.
  const int64_t resident =
      std::max<int64_t>(1, int64_t{dev.sm_count} *
                                   forward_ctas_per_sm(l.row.threads_per_row, l.row.chunks_per_thread, l.kernel) / l.row.cluster);
  int64_t cap = forward_one_group_per_cta(l.row, groups, resident) ? kMaxGrid : resident;
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
  // Only the cluster band's 16-byte path stages x through shared memory.
  if (l.kernel == Kernel::kForwardCluster) {
    const size_t per_stage = stage_bytes(l.row.cta_threads, 1, l.row.chunks_per_thread);
    l.stages = stages_that_fit(per_stage, 0, forward_ctas_per_sm(l.row.threads_per_row, l.row.chunks_per_thread, l.kernel), dev);
    l.smem = per_stage * static_cast<size_t>(l.stages);
  }
  return l;
}

Launch quant_launch(int64_t rows, int64_t cols, int esize, Io io, bool q_aligned, const Device& dev, int block_chunks) {
  Launch l = forward_launch(rows, cols, esize, io, dev);
  if (!quant_fused(l, q_aligned, block_chunks)) return looped_forward_launch(rows, cols, esize, io, dev);
  if (quant_sum_pairs(l, rows, block_chunks)) {
    l.sum_tpr = l.row.threads_per_row;
    l.row.threads_per_row /= 2;
    l.row.chunks_per_thread = kMaxChunksPerThread;
    l.row.cta_threads = forward_cta_threads(l.row.threads_per_row);
    l.row.rows_per_cta = l.row.cta_threads / l.row.threads_per_row;
    l.grid = std::max<int64_t>(1, std::min((rows + l.row.rows_per_cta - 1) / l.row.rows_per_cta, kMaxGrid));
  }
  return l;
}

Launch add_launch(int64_t rows, const Device& dev) {
  Launch l;
  l.direction = Direction::kForward;
  l.io = Io::kElement;
  l.row.cta_threads = kAddThreads;
  l.grid = std::max<int64_t>(1, std::min<int64_t>(rows, int64_t{dev.sm_count} * kAddMaxCtasPerSm));
  return l;
}

Launch looped_f32_shares_launch(int64_t rows, int64_t cols, Io io, F32Forward form, const Device& dev) {
  Launch l = looped_forward_launch(rows, cols, static_cast<int>(sizeof(float)), io, dev);
  l.sum_tpr = kLoopedThreads;
  l.row.cta_threads = f32_shares_cta(l.row.chunks, form);
  if (form == F32Forward::kReadBackWide) l.row.chunks_per_thread = f32_wide_passes(l.row.chunks);
  if (form == F32Forward::kCluster) {
    l.row.cluster = kLoopedShares;
    l.row.chunks_per_thread = f32_cluster_passes(l.row.chunks);
    l.grid = std::max<int64_t>(1, std::min(rows, kMaxGrid / kLoopedShares)) * kLoopedShares;
  }
  return l;
}

Launch weight_f32_forward_launch(int64_t rows, int64_t cols, int esize, Io io, const Device& dev) {
  // kForwardRowsPaired reads the weight in x's dtype: an fp32 weight takes the element path.
  const Launch l = forward_launch(rows, cols, esize, io == Io::kVector ? io : Io::kElement, dev);
  return l.row.band != Band::kLooped ? l : looped_forward_launch(rows, cols, esize, io, dev);
}

namespace {
Launch backward_launch_for(const RowPlan& row, int64_t rows, int64_t cols, int esize, Io io, bool with_gw,
                           const Device& dev);
}  // namespace

Launch backward_launch(int64_t rows, int64_t cols, int esize, Io io, bool with_gw, const Device& dev) {
  return backward_launch_for(row_plan(cols, esize, Direction::kBackward, dev), rows, cols, esize, io, with_gw, dev);
}

Launch mixed_backward_launch(int64_t rows, int64_t cols, int esize, Io io, bool with_gw, const Device& dev) {
  Launch l = backward_launch_for(looped_row_plan(row_plan(cols, esize, Direction::kBackward, dev)), rows, cols, esize,
                                 io, with_gw, dev);
  if (esize == 4) {  // fp32 x (its gy 16-bit): the looped row in shares, on the same grid
    l.sum_tpr = kLoopedThreads;
    l.row.cta_threads = kLoopedShareThreads;
    // One CTA whose row is one pass of the summing threads holds its gw sums in registers: it writes gw itself.
    if (l.with_gw && l.partials == 1 && l.row.chunks <= kLoopedThreads) {
      l.direct_gw = true;
      l.workspace = 0;
      l.finalize = false;
      l.finalize_grid = 0;
      l.finalize_lanes = 0;
    }
    l.smem = f32_shares_gw_smem(l.row.chunks, l.with_gw, l.direct_gw, dev);
  }
  return l;
}

Launch f32_cluster_backward_launch(const Launch& shares, int64_t rows, int64_t cols, const Device& dev) {
  Launch l = shares;
  l.smem = 0;  // its gw sums in registers
  if (rows <= 0) return l;
  l.row.cluster = kLoopedShares;
  const int passes = f32_cluster_passes(l.row.chunks);
  l.row.chunks_per_thread = passes;
  const int known = dev.f32_backward_active_clusters[f32_cluster_backward_index(passes)];
  const int64_t cap = known > 0 ? int64_t{known}
                                : int64_t{dev.sm_count} * f32_cluster_backward_ctas_per_sm(passes) / kLoopedShares;
  // At most the shares plan's partials: the workspace query returns that plan's size.
  const int64_t clusters = std::max<int64_t>(1, std::min({rows, cap, shares.partials}));
  l.grid = clusters * kLoopedShares;
  l.partials = clusters;
  l.direct_gw = l.with_gw && clusters == 1;
  l.finalize = l.with_gw && !l.direct_gw;
  l.workspace = l.finalize ? static_cast<size_t>(clusters) * static_cast<size_t>(cols) * sizeof(float) : 0;
  l.finalize_grid = l.finalize ? (cols + kFinalizeCols - 1) / kFinalizeCols : 0;
  l.finalize_lanes = l.finalize ? finalize_lanes(clusters) : 0;
  return l;
}

Launch weight_f32_backward_launch(int64_t rows, int64_t cols, int esize, Io io, bool with_gw, const Device& dev) {
  const Launch l = backward_launch(rows, cols, esize, io, with_gw, dev);
  return l.row.band != Band::kLooped ? l : mixed_backward_launch(rows, cols, esize, io, with_gw, dev);
}

Launch split_backward_launch(const Launch& direct, int64_t rows, const Device& dev) {
  if (direct.kernel != Kernel::kBackwardRowsDirect || !direct.with_gw || direct.direct_gw || rows <= 0)
    return direct;
  const int lanes = finalize_lanes(direct.partials);
  const int64_t batches = (direct.partials + lanes - 1) / lanes;  // a gw thread's partials
  if (direct.row.rows_per_cta > kSplitMaxSlots || int64_t{direct.row.rows_per_cta} * batches > kSplitMaxRowsPerThread)
    return direct;
  const int64_t gw_ctas = split_gw_ctas(direct.row.chunks, direct.row.cta_threads, lanes);
  if (direct.grid + gw_ctas > int64_t{dev.sm_count} * kBackwardCtasPerSm) return direct;
  Launch l = direct;
  l.kernel = Kernel::kBackwardRowsSplit;
  l.grid = direct.grid + gw_ctas;
  l.smem = split_gw_smem(direct.row.cta_threads, lanes, direct.row.esize);
  l.direct_gw = true;  // partials stays the direct kernel's count: the order of gw's sums
  l.workspace = 0;
  l.finalize = false;
  l.finalize_grid = 0;
  l.finalize_lanes = lanes;
  return l;
}

Launch looped_forward_launch(int64_t rows, int64_t cols, int esize, Io io, const Device& dev) {
  Launch q;
  q.direction = Direction::kForward;
  q.io = io;
  q.row = looped_row_plan(row_plan(cols, esize, Direction::kForward, dev));
  q.kernel = Kernel::kForwardLooped;
  q.grid = std::max<int64_t>(1, std::min(rows, kMaxGrid));
  return q;
}

namespace {
Launch backward_launch_for(const RowPlan& row, int64_t rows, int64_t cols, int esize, Io io, bool with_gw,
                           const Device& dev) {
  Launch l;
  l.direction = Direction::kBackward;
  l.io = io;
  l.with_gw = with_gw;
  l.row = row;
  l.kernel = kernel_of(l.direction, l.row.band, io);
  const int64_t groups = row_groups(rows, l.row.rows_per_cta);
  switch (l.row.band) {
    case Band::kRows: {
      l.grid = std::max<int64_t>(1, std::min<int64_t>(groups, int64_t{dev.sm_count} * kBackwardCtasPerSm));
      l.partials = l.grid;
      break;
    }
    case Band::kCluster: {
      // One CTA per SM; a cluster needs `cluster` SMs.
      int64_t cap = dev.sm_count * kBackwardCtasPerSm / l.row.cluster;
      if (dev.backward_active_clusters[cluster_index(l.row.cluster)] > 0)
        cap = std::min<int64_t>(cap, dev.backward_active_clusters[cluster_index(l.row.cluster)]);
      const int64_t clusters = std::max<int64_t>(1, std::min<int64_t>(rows, cap));
      l.grid = clusters * l.row.cluster;
      l.partials = clusters;
      break;
    }
    case Band::kLooped: {
      l.grid = std::max<int64_t>(1, std::min<int64_t>(rows, int64_t{dev.sm_count} * kLoopedCtasPerSm));
      l.partials = l.grid;
      break;
    }
  }
  // Rows band, 16-byte I/O, at most one group per CTA: nothing to pipeline
  // (backward_rows_direct_kernel); the same grid and partials.
  if (l.kernel == Kernel::kBackwardRows && groups <= l.grid) l.kernel = Kernel::kBackwardRowsDirect;
  // The rows band adds its row slots' gw sums through shared memory at the
  // end (the stages' memory, reused).
  const size_t combine =
      with_gw && l.row.band == Band::kRows
          ? backward_combine_smem(l.row.threads_per_row, esize, l.row.chunks_per_thread)
          : 0;
  if (l.kernel == Kernel::kBackwardRowsDirect) {
    l.smem = combine;
    const int decode_threads = backward_decode_cta_threads(l.row.threads_per_row);
    const int64_t decode_slots = decode_threads / l.row.threads_per_row;
    if (rows <= decode_slots && decode_threads < l.row.cta_threads) {
      // Every row in one small CTA: the same per-row work, one partial (gw written directly).
      l.kernel = Kernel::kBackwardRowsDecode;
      l.row.cta_threads = decode_threads;
      l.row.rows_per_cta = decode_slots;
      l.smem = with_gw ? backward_decode_combine_smem(l.row.threads_per_row, esize, l.row.chunks_per_thread) : 0;
    }
  } else if (l.row.band != Band::kLooped) {
    // The cluster band's element path stages nothing.
    const bool staged = io == Io::kVector || l.row.band == Band::kRows;
    const int cpt = l.row.chunks_per_thread;
    const size_t per_stage = io == Io::kVector ? stage_bytes(l.row.cta_threads, 2, cpt)
                                               : shifted_stage_bytes(l.row.cta_threads, l.row.rows_per_cta, 2, cpt);
    if (staged) {
      l.stages = stages_that_fit(per_stage, combine, kBackwardCtasPerSm, dev);
      l.smem = std::max(per_stage * static_cast<size_t>(l.stages), combine);
    } else {
      l.smem = combine;
    }
  }
  // A single CTA (or cluster) writes gw itself; the looped band accumulates
  // its partial in the workspace, so it always has one.
  l.direct_gw = with_gw && l.partials == 1 && l.row.band != Band::kLooped;
  // One fp32 partial row of `cols` floats per CTA (or cluster).
  // No rows: no main kernel; gw is the empty sum, written by the finalize
  // alone (the store modes) without touching a workspace.
  l.workspace = (with_gw && !l.direct_gw && rows > 0)
                    ? static_cast<size_t>(l.partials) * static_cast<size_t>(cols) * sizeof(float)
                    : 0;
  if (rows == 0) {
    l.grid = 0;
    l.partials = 0;
    l.direct_gw = false;
  }
  l.finalize = with_gw && !l.direct_gw;
  if (l.finalize) {
    l.finalize_grid = (cols + kFinalizeCols - 1) / kFinalizeCols;
    l.finalize_lanes = finalize_lanes(l.partials);
  }
  return l;
}
}  // namespace

}  // namespace rmsnorm::plan
