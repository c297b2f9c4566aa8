#include "harness/check.hpp"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>

#include "common/parallel.hpp"
#include "harness/tolerance.hpp"

namespace rmsnorm::harness {

double err_over_tol(double got, double expected, double tol) {
  if (!std::isfinite(got)) return INFINITY;
  const double err = std::fabs(got - expected);
  const double q = tol > 0 ? err / tol : (err == 0 ? 0.0 : INFINITY);
  return std::isnan(q) ? INFINITY : q;
}

void Worst::merge(const Worst& o) {
  count += o.count;
  bad += o.bad;
  if (o.row >= 0 && (row < 0 || o.ratio > ratio || (o.ratio == ratio && o.row < row))) {
    ratio = o.ratio;
    row = o.row;
    col = o.col;
    got = o.got;
    expected = o.expected;
    tol = o.tol;
  }
}

std::string Worst::describe(const std::string& name, bool vector, const std::string& context) const {
  char where[64];
  if (vector)
    std::snprintf(where, sizeof where, "col %" PRId64, col);
  else
    std::snprintf(where, sizeof where, "row %" PRId64 " col %" PRId64, row, col);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%" PRId64 " of %" PRId64 " elements out of tolerance%s; worst at %s: got %.9g expected %.9g tol %.3g "
                "(err/tol %.3g)",
                bad, count, context.c_str(), where, got, expected, tol, ratio);
  return name + ": " + buf;
}

namespace {

// Rows per chunk (about 2^16 elements), chunks and worker threads of a check.
struct CheckGeometry {
  int64_t chunk, chunks;
  int threads;
};
CheckGeometry check_geometry(int64_t rows, int64_t cols) {
  CheckGeometry g;
  g.chunk = std::max<int64_t>(1, (int64_t{1} << 16) / cols);
  g.chunks = (rows + g.chunk - 1) / g.chunk;
  g.threads = threads_for(0, g.chunks, rows * cols);
  return g;
}

}  // namespace

size_t check_host_bytes(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  const CheckGeometry g = check_geometry(rows, cols);
  const double cap = static_cast<double>(g.chunk) * static_cast<double>(cols);
  // Per thread: five chunk buffers (x, y, gy, gx and its scale) and four gw
  // vectors, of doubles; and the weight as doubles once.
  const double bytes = 8.0 * (static_cast<double>(g.threads) * (5.0 * cap + 4.0 * static_cast<double>(cols)) +
                              static_cast<double>(cols));
  return bytes >= 1.8e19 ? SIZE_MAX : static_cast<size_t>(bytes);
}

std::vector<CheckResult> check_against_reference(const HostMatrix& x, const HostMatrix* w, const HostMatrix* gy,
                                                 const reference::Options& opt, const Outputs& out) {
  const int64_t rows = x.rows, cols = x.cols;
  const bool backward = !out.gx.empty() || !out.gw.empty();
  std::vector<double> wd;
  if (w != nullptr) wd = w->to_double();
  const double* wp = w != nullptr ? wd.data() : nullptr;

  const CheckGeometry g = check_geometry(rows, cols);
  const int64_t chunk = g.chunk, chunks = g.chunks;
  const int threads = g.threads;
  const size_t ngx = out.gx.size(), cap = static_cast<size_t>(chunk * cols), vec = static_cast<size_t>(cols);

  // Everything the workers use is allocated here: a worker that threw would
  // end the process.
  struct Part {
    Worst y;
    std::vector<Worst> gx;
    std::vector<double> gw, gw_scale;
    std::vector<double> xd, gyd, yr, gxr, gxs, gwc, gwsc;
  };
  std::vector<Part> parts(static_cast<size_t>(threads));
  for (Part& p : parts) {
    p.gx.resize(ngx);
    p.xd.resize(cap);
    if (out.y != nullptr) p.yr.resize(cap);
    if (backward) {
      p.gyd.resize(cap);
      p.gxr.resize(cap);
      p.gxs.resize(cap);
      p.gw.assign(vec, 0.0);
      p.gw_scale.assign(vec, 0.0);
      p.gwc.resize(vec);
      p.gwsc.resize(vec);
    }
  }

  parallel_for(chunks, threads, [&](int t, int64_t k0, int64_t k1) {
    Part& p = parts[static_cast<size_t>(t)];
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t r0 = k * chunk, n = std::min(chunk, rows - r0);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          p.xd[static_cast<size_t>(r * cols + c)] = x.get(r0 + r, c);
          if (backward) p.gyd[static_cast<size_t>(r * cols + c)] = gy->get(r0 + r, c);
        }
      if (out.y != nullptr) {
        reference::forward(n, cols, p.xd.data(), wp, opt, p.yr.data(), nullptr, nullptr);
        for (int64_t r = 0; r < n; ++r)
          for (int64_t c = 0; c < cols; ++c) {
            const double e = p.yr[static_cast<size_t>(r * cols + c)];
            p.y.add(r0 + r, c, out.y->get(r0 + r, c), e, y_tol(out.y->dtype, e, cols));
          }
      }
      if (!backward) continue;
      reference::backward(n, cols, p.xd.data(), wp, p.gyd.data(), opt, p.gxr.data(), p.gwc.data(), p.gxs.data(),
                          p.gwsc.data());
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const size_t i = static_cast<size_t>(r * cols + c);
          const double e = p.gxr[i];
          for (size_t g = 0; g < ngx; ++g)
            p.gx[g].add(r0 + r, c, out.gx[g].values->get(r0 + r, c), e,
                        gx_tol(out.gx[g].values->dtype, e, p.gxs[i], cols));
        }
      for (size_t c = 0; c < vec; ++c) {
        p.gw[c] += p.gwc[c];
        p.gw_scale[c] += p.gwsc[c];
      }
    }
  });

  std::vector<CheckResult> result;
  if (out.y != nullptr) {
    CheckResult y;
    y.name = out.y_name;
    for (const Part& p : parts) y.worst.merge(p.y);
    result.push_back(y);
  }
  for (size_t g = 0; g < ngx; ++g) {
    CheckResult r;
    r.name = out.gx[g].name;
    for (const Part& p : parts) r.worst.merge(p.gx[g]);
    result.push_back(r);
  }
  if (out.gw.empty()) return result;
  std::vector<double> gw(vec, 0.0), gw_scale(vec, 0.0);
  for (const Part& p : parts)
    for (size_t c = 0; c < vec; ++c) {
      gw[c] += p.gw[c];
      gw_scale[c] += p.gw_scale[c];
    }
  for (const Outputs::Gw& g : out.gw) {
    CheckResult r;
    r.name = g.name;
    r.vector = true;
    for (int64_t c = 0; c < cols; ++c) {
      const double e = gw[static_cast<size_t>(c)];
      r.worst.add(0, c, g.values->get(0, c), e,
                  gw_tol(g.values->dtype, e, gw_scale[static_cast<size_t>(c)], rows, cols, g.term_rel));
    }
    result.push_back(r);
  }
  return result;
}

}  // namespace rmsnorm::harness
