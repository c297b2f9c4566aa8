// Bad input through the C ABI, and the C++ API (rmsnorm.hpp) end to end.
//
// Every rejected call is checked three ways: the named status, a message that
// names the offending argument (as a word: "x" must not be satisfied by
// "x_row_stride"), and not one byte of memory written. For the last, all
// operands of a call live in one arena whose bytes are compared before and
// after; outputs start as a 0x5A pattern, never zeros.
//
// Runs on the CPU backend, so in CI (no GPU). The CUDA cases that need a
// device run only when rmsnorm_cuda_available(); without one, a CUDA backend
// request must say BACKEND_UNAVAILABLE.
#include <gtest/gtest.h>

#include <array>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "rmsnorm/rmsnorm.h"
#include "rmsnorm/rmsnorm.hpp"
#include "rmsnorm_reference.hpp"
#include "test_util.hpp"

namespace {

using rmsnorm::test::dtype_bytes;

constexpr unsigned char kSentinel = 0x5A;

// True when `name` occurs in msg delimited as an identifier: the character
// before is not [A-Za-z0-9_.] and the one after is not [A-Za-z0-9_]. So "x"
// matches "x: overlaps" but not "x_row_stride" or "gx", and "backend"
// matches "backend.kind".
bool names_argument(const std::string& msg, const std::string& name) {
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t pos = msg.find(name); pos != std::string::npos; pos = msg.find(name, pos + 1)) {
    const bool start_ok = pos == 0 || !(ident(msg[pos - 1]) || msg[pos - 1] == '.');
    const size_t end = pos + name.size();
    const bool end_ok = end == msg.size() || !ident(msg[end]);
    if (start_ok && end_ok) return true;
  }
  return false;
}

TEST(ApiTestHelpers, NamesArgument) {
  EXPECT_TRUE(names_argument("x: null", "x"));
  EXPECT_FALSE(names_argument("x_row_stride: 3 is less than cols (4)", "x"));
  EXPECT_TRUE(names_argument("x_row_stride: 3 is less than cols (4)", "x_row_stride"));
  EXPECT_FALSE(names_argument("gx: null", "x"));
  EXPECT_TRUE(names_argument("y: overlaps x (only y == x ...)", "x"));
  EXPECT_TRUE(names_argument("backend.kind: unknown (7)", "backend"));
  EXPECT_TRUE(names_argument("backend.kind: unknown (7)", "backend.kind"));
  EXPECT_FALSE(names_argument("workspace_bytes: 0", "workspace"));
}

// One 64-byte-aligned block of memory that holds every operand of a call, so
// that "wrote nothing" is a single byte comparison.
class Arena {
 public:
  static constexpr size_t kRegion = 256 * 1024;
  enum Slot { kX, kW, kY, kRstdOut, kGy, kRstdIn, kGx, kGw, kWs, kSlots };

  Arena() : storage_(kRegion * kSlots + 64, kSentinel) {
    const auto addr = reinterpret_cast<uintptr_t>(storage_.data());
    base_ = storage_.data() + ((64 - addr % 64) % 64);
  }
  unsigned char* slot(Slot s) { return base_ + kRegion * static_cast<size_t>(s); }
  std::vector<unsigned char> snapshot() const { return storage_; }
  const std::vector<unsigned char>& bytes() const { return storage_; }

  // First differing byte as "slot+offset", or "" when identical.
  std::string first_difference(const std::vector<unsigned char>& before) const {
    static const char* names[] = {"x", "weight", "y", "rstd(out)", "gy", "rstd(in)", "gx", "gw", "workspace"};
    const size_t lead = static_cast<size_t>(base_ - storage_.data());
    for (size_t i = 0; i < storage_.size(); ++i) {
      if (storage_[i] == before[i]) continue;
      if (i < lead || i >= lead + kRegion * kSlots) return "outside the regions at byte " + std::to_string(i);
      const size_t off = i - lead;
      return std::string(names[off / kRegion]) + "+" + std::to_string(off % kRegion);
    }
    return "";
  }

 private:
  std::vector<unsigned char> storage_;
  unsigned char* base_;
};

// Writes a valid, non-zero value of dtype at p[i].
void put(int32_t dtype, void* p, size_t i, float v) {
  unsigned char* b = static_cast<unsigned char*>(p) + i * dtype_bytes(dtype);
  if (dtype == RMSNORM_DTYPE_F32) {
    std::memcpy(b, &v, 4);
  } else {
    const uint16_t h = dtype == RMSNORM_DTYPE_F16 ? rmsnorm::float_to_half(v) : rmsnorm::float_to_bf16(v);
    std::memcpy(b, &h, 2);
  }
}

// A complete, valid forward and backward call on the CPU backend. Each test
// spoils one thing and expects that one thing to be reported.
struct Call {
  Arena arena;
  rmsnorm_problem_t p = rmsnorm_problem_default();
  rmsnorm_backend_t be = rmsnorm_backend_cpu(2);
  const rmsnorm_problem_t* problem = &p;
  const rmsnorm_backend_t* backend = &be;

  const void* x = nullptr;
  int64_t x_stride = 0;
  const void* w = nullptr;
  void* y = nullptr;
  int64_t y_stride = 0;
  float* rstd_out = nullptr;

  const void* gy = nullptr;
  int64_t gy_stride = 0;
  const float* rstd_in = nullptr;
  void* gx = nullptr;
  int64_t gx_stride = 0;
  void* gw = nullptr;
  int32_t gw_mode = RMSNORM_GW_STORE;
  void* ws = nullptr;
  size_t ws_bytes = 0;

  // rows x cols of dtype; row strides cols + pad. Inputs get random values
  // over their whole region (so any stride reads valid data); outputs keep
  // the sentinel.
  explicit Call(int32_t dtype = RMSNORM_DTYPE_F32, int64_t rows = 5, int64_t cols = 8, int64_t pad = 0) {
    p.rows = rows;
    p.cols = cols;
    p.dtype = dtype;
    p.eps = 1e-5f;
    std::mt19937 rng(1234);
    std::uniform_real_distribution<float> u(0.5f, 2.0f);
    const size_t esize = dtype_bytes(dtype);
    for (Arena::Slot s : {Arena::kX, Arena::kW, Arena::kGy}) {
      for (size_t i = 0; i < Arena::kRegion / esize; ++i) put(dtype, arena.slot(s), i, (rng() & 1 ? 1 : -1) * u(rng));
    }
    for (size_t i = 0; i < Arena::kRegion / 4; ++i) put(RMSNORM_DTYPE_F32, arena.slot(Arena::kRstdIn), i, 0.75f);
    x = arena.slot(Arena::kX);
    w = arena.slot(Arena::kW);
    y = arena.slot(Arena::kY);
    rstd_out = reinterpret_cast<float*>(arena.slot(Arena::kRstdOut));
    gy = arena.slot(Arena::kGy);
    rstd_in = reinterpret_cast<const float*>(arena.slot(Arena::kRstdIn));
    gx = arena.slot(Arena::kGx);
    gw = arena.slot(Arena::kGw);
    ws = arena.slot(Arena::kWs);
    x_stride = y_stride = gy_stride = gx_stride = cols + pad;
    set_workspace_to_query();
  }

  // Asks the library for the workspace and passes exactly that much.
  void set_workspace_to_query() {
    size_t bytes = 0;
    if (rmsnorm_backward_workspace_size(&p, gw_mode, &be, &bytes) == RMSNORM_STATUS_SUCCESS) ws_bytes = bytes;
  }

  rmsnorm_status_t forward() { return rmsnorm_forward(problem, x, x_stride, w, y, y_stride, rstd_out, backend); }
  rmsnorm_status_t backward() {
    return rmsnorm_backward(problem, x, x_stride, w, gy, gy_stride, rstd_in, gx, gx_stride, gw, gw_mode, ws, ws_bytes,
                            backend);
  }
};

std::string status_name(rmsnorm_status_t s) { return rmsnorm_status_string(s); }

// The heart of every bad-input test: status, message and untouched memory.
using Entry = rmsnorm_status_t (Call::*)();
constexpr Entry FWD = &Call::forward;
constexpr Entry BWD = &Call::backward;

void expect_rejected(Call& c, Entry entry, rmsnorm_status_t want, std::initializer_list<const char*> names) {
  const std::vector<unsigned char> before = c.arena.snapshot();
  const rmsnorm_status_t got = (c.*entry)();
  EXPECT_EQ(status_name(got), status_name(want));
  const std::string msg = rmsnorm_last_error();
  for (const char* n : names) EXPECT_TRUE(names_argument(msg, n)) << "message \"" << msg << "\" does not name " << n;
  const std::string diff = c.arena.first_difference(before);
  EXPECT_EQ(diff, "") << "a rejected call wrote memory";
}

// Valid calls must succeed, or every rejection below would be meaningless.
TEST(ApiValid, BaselineCallsSucceed) {
  for (int32_t dt : {RMSNORM_DTYPE_F32, RMSNORM_DTYPE_F16, RMSNORM_DTYPE_BF16}) {
    for (int32_t mode : {RMSNORM_GW_NONE, RMSNORM_GW_STORE, RMSNORM_GW_STORE_F32, RMSNORM_GW_ACCUMULATE,
                         RMSNORM_GW_ACCUMULATE_F32}) {
      Call c(dt, 5, 8, 3);
      c.gw_mode = mode;
      c.set_workspace_to_query();
      EXPECT_EQ(status_name(c.forward()), status_name(RMSNORM_STATUS_SUCCESS)) << rmsnorm_last_error();
      EXPECT_STREQ(rmsnorm_last_error(), "");
      EXPECT_EQ(status_name(c.backward()), status_name(RMSNORM_STATUS_SUCCESS)) << rmsnorm_last_error();
      EXPECT_STREQ(rmsnorm_last_error(), "");
    }
  }
}

TEST(ApiValid, LastErrorClearedBySuccess) {
  Call c;
  c.x = nullptr;
  EXPECT_NE(c.forward(), RMSNORM_STATUS_SUCCESS);
  EXPECT_STRNE(rmsnorm_last_error(), "");
  c.x = c.arena.slot(Arena::kX);
  EXPECT_EQ(c.forward(), RMSNORM_STATUS_SUCCESS);
  EXPECT_STREQ(rmsnorm_last_error(), "");
}

// ---- null pointers ------------------------------------------------------------------------------

TEST(ApiNull, Problem) {
  Call c;
  c.problem = nullptr;
  expect_rejected(c, FWD, RMSNORM_STATUS_NULL_POINTER, {"problem"});
  expect_rejected(c, BWD, RMSNORM_STATUS_NULL_POINTER, {"problem"});
}

TEST(ApiNull, Backend) {
  Call c;
  c.backend = nullptr;
  expect_rejected(c, FWD, RMSNORM_STATUS_NULL_POINTER, {"backend"});
  expect_rejected(c, BWD, RMSNORM_STATUS_NULL_POINTER, {"backend"});
}

TEST(ApiNull, X) {
  Call c;
  c.x = nullptr;
  expect_rejected(c, FWD, RMSNORM_STATUS_NULL_POINTER, {"x"});
  expect_rejected(c, BWD, RMSNORM_STATUS_NULL_POINTER, {"x"});
}

TEST(ApiNull, Y) {
  Call c;
  c.y = nullptr;
  expect_rejected(c, FWD, RMSNORM_STATUS_NULL_POINTER, {"y"});
}

TEST(ApiNull, Gy) {
  Call c;
  c.gy = nullptr;
  expect_rejected(c, BWD, RMSNORM_STATUS_NULL_POINTER, {"gy"});
}

TEST(ApiNull, Gx) {
  Call c;
  c.gx = nullptr;
  expect_rejected(c, BWD, RMSNORM_STATUS_NULL_POINTER, {"gx"});
}

TEST(ApiNull, WeightWithGwMode) {
  for (int32_t mode :
       {RMSNORM_GW_STORE, RMSNORM_GW_STORE_F32, RMSNORM_GW_ACCUMULATE, RMSNORM_GW_ACCUMULATE_F32}) {
    SCOPED_TRACE(mode);
    Call c;
    c.gw_mode = mode;
    c.set_workspace_to_query();
    c.w = nullptr;
    expect_rejected(c, BWD, RMSNORM_STATUS_NULL_POINTER, {"weight"});
  }
}

TEST(ApiNull, GwWithGwMode) {
  for (int32_t mode :
       {RMSNORM_GW_STORE, RMSNORM_GW_STORE_F32, RMSNORM_GW_ACCUMULATE, RMSNORM_GW_ACCUMULATE_F32}) {
    SCOPED_TRACE(mode);
    Call c;
    c.gw_mode = mode;
    c.set_workspace_to_query();
    c.gw = nullptr;
    expect_rejected(c, BWD, RMSNORM_STATUS_NULL_POINTER, {"gw"});
  }
}

// The optional pointers really are optional.
TEST(ApiNull, OptionalPointersAccepted) {
  Call c;
  c.w = nullptr;
  c.rstd_out = nullptr;
  EXPECT_EQ(c.forward(), RMSNORM_STATUS_SUCCESS) << rmsnorm_last_error();
  Call b;
  b.gw_mode = RMSNORM_GW_NONE;
  b.set_workspace_to_query();
  EXPECT_EQ(b.ws_bytes, 0u);
  b.w = nullptr;
  b.gw = nullptr;
  b.rstd_in = nullptr;
  b.ws = nullptr;
  EXPECT_EQ(b.backward(), RMSNORM_STATUS_SUCCESS) << rmsnorm_last_error();
}

// ---- shapes and strides --------------------------------------------------------------------------

TEST(ApiShape, NegativeRows) {
  for (int64_t rows : {int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
    Call c;
    c.p.rows = rows;
    expect_rejected(c, FWD, RMSNORM_STATUS_INVALID_SHAPE, {"rows"});
    expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_SHAPE, {"rows"});
  }
}

TEST(ApiShape, NonPositiveCols) {
  for (int64_t cols : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
    Call c;
    c.p.cols = cols;
    expect_rejected(c, FWD, RMSNORM_STATUS_INVALID_SHAPE, {"cols"});
    expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_SHAPE, {"cols"});
  }
}

TEST(ApiShape, RowStrideLessThanCols) {
  // cols - 1 and a negative stride; each operand on its own.
  for (int64_t bad : {int64_t{7}, int64_t{0}, int64_t{-8}}) {
    SCOPED_TRACE(bad);
    {
      Call c;
      c.x_stride = bad;
      expect_rejected(c, FWD, RMSNORM_STATUS_INVALID_STRIDE, {"x_row_stride"});
      expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_STRIDE, {"x_row_stride"});
    }
    {
      Call c;
      c.y_stride = bad;
      expect_rejected(c, FWD, RMSNORM_STATUS_INVALID_STRIDE, {"y_row_stride"});
    }
    {
      Call c;
      c.gy_stride = bad;
      expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_STRIDE, {"gy_row_stride"});
    }
    {
      Call c;
      c.gx_stride = bad;
      expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_STRIDE, {"gx_row_stride"});
    }
  }
}

// ---- eps, dtype, flags, gw mode, backend kind ---------------------------------------------------

TEST(ApiOptions, BadEps) {
  for (float eps : {-1e-6f, -0.0f - 1.0f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE(eps);
    Call c;
    c.p.eps = eps;
    expect_rejected(c, FWD, RMSNORM_STATUS_INVALID_EPS, {"eps"});
    expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_EPS, {"eps"});
  }
}

TEST(ApiOptions, ZeroEpsAccepted) {
  Call c;
  c.p.eps = 0.0f;
  EXPECT_EQ(c.forward(), RMSNORM_STATUS_SUCCESS) << rmsnorm_last_error();
  EXPECT_EQ(c.backward(), RMSNORM_STATUS_SUCCESS) << rmsnorm_last_error();
}

TEST(ApiOptions, UnknownDtype) {
  for (int32_t dt : {3, -1, 1000}) {
    Call c;
    c.p.dtype = dt;
    expect_rejected(c, FWD, RMSNORM_STATUS_INVALID_DTYPE, {"dtype"});
    expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_DTYPE, {"dtype"});
  }
}

TEST(ApiOptions, UnknownFlags) {
  for (uint32_t flags : {32u, 0x80000000u, RMSNORM_FLAG_WEIGHT_OFFSET | 64u}) {
    Call c;
    c.p.flags = flags;
    expect_rejected(c, FWD, RMSNORM_STATUS_INVALID_OPTION, {"flags"});
    expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_OPTION, {"flags"});
  }
}

// RMSNORM_FLAG_NO_PDL is known, and means nothing to the CPU backend: the
// same bits as without it.
TEST(ApiOptions, NoPdlFlagIsAcceptedAndTheCpuIgnoresIt) {
  Call plain, flagged;
  flagged.p.flags = RMSNORM_FLAG_NO_PDL;
  for (Call* c : {&plain, &flagged}) {
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS, c->forward()) << rmsnorm_last_error();
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS, c->backward()) << rmsnorm_last_error();
  }
  for (Arena::Slot s : {Arena::kY, Arena::kRstdOut, Arena::kGx, Arena::kGw})
    EXPECT_EQ(0, std::memcmp(plain.arena.slot(s), flagged.arena.slot(s), Arena::kRegion)) << "slot " << s;
}

// RMSNORM_FLAG_TRUSTED_MEMORY is known and changes no bits; with it every
// check but the memory-space one still runs (a bad stride, here).
TEST(ApiOptions, TrustedMemoryFlagChangesNoBits) {
  Call plain, flagged;
  flagged.p.flags = RMSNORM_FLAG_TRUSTED_MEMORY;
  for (Call* c : {&plain, &flagged}) {
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS, c->forward()) << rmsnorm_last_error();
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS, c->backward()) << rmsnorm_last_error();
  }
  for (Arena::Slot s : {Arena::kY, Arena::kRstdOut, Arena::kGx, Arena::kGw})
    EXPECT_EQ(0, std::memcmp(plain.arena.slot(s), flagged.arena.slot(s), Arena::kRegion)) << "slot " << s;
  Call bad;
  bad.p.flags = RMSNORM_FLAG_TRUSTED_MEMORY;
  bad.x_stride = bad.p.cols - 1;
  expect_rejected(bad, FWD, RMSNORM_STATUS_INVALID_STRIDE, {"x_row_stride"});
}

TEST(ApiOptions, UnknownGwMode) {
  for (int32_t mode : {5, -1, 100}) {
    Call c;
    c.gw_mode = mode;
    expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_OPTION, {"gw_mode"});
  }
}

TEST(ApiOptions, UnknownBackendKind) {
  for (int32_t kind : {2, -1}) {
    Call c;
    c.be.kind = kind;
    expect_rejected(c, FWD, RMSNORM_STATUS_INVALID_OPTION, {"backend.kind"});
    expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_OPTION, {"backend.kind"});
  }
}

// ---- workspace ------------------------------------------------------------------------------------

// Enough rows for several fixed gw partials, so that the CPU backend needs a
// workspace at all.
Call call_needing_workspace(int32_t mode = RMSNORM_GW_STORE) {
  Call c(RMSNORM_DTYPE_F32, 600, 16);
  c.gw_mode = mode;
  c.set_workspace_to_query();
  return c;
}

TEST(ApiWorkspace, QueryBasics) {
  Call c(RMSNORM_DTYPE_F16, 600, 16);
  size_t bytes = 12345;
  ASSERT_EQ(rmsnorm_backward_workspace_size(&c.p, RMSNORM_GW_NONE, &c.be, &bytes), RMSNORM_STATUS_SUCCESS);
  EXPECT_EQ(bytes, 0u) << "no gw, no workspace (header contract)";
  for (int32_t mode : {RMSNORM_GW_STORE, RMSNORM_GW_STORE_F32, RMSNORM_GW_ACCUMULATE, RMSNORM_GW_ACCUMULATE_F32}) {
    bytes = 0;
    ASSERT_EQ(rmsnorm_backward_workspace_size(&c.p, mode, &c.be, &bytes), RMSNORM_STATUS_SUCCESS);
    EXPECT_GT(bytes, 0u) << "mode " << mode << ": 600 rows should need gw partials";
  }
}

// The query takes any rows >= 0: the CPU's partials stop growing at some row count, so rows = INT64_MAX needs what
// a large count needs (the count once overflowed rows + 255: UB that the sanitizer build reports).
TEST(ApiWorkspace, QueryAtTheLargestRows) {
  Call c(RMSNORM_DTYPE_F32, int64_t{1} << 30, 8);
  size_t large = 0, largest = 0;
  ASSERT_EQ(rmsnorm_backward_workspace_size(&c.p, RMSNORM_GW_STORE, &c.be, &large), RMSNORM_STATUS_SUCCESS);
  c.p.rows = std::numeric_limits<int64_t>::max();
  ASSERT_EQ(rmsnorm_backward_workspace_size(&c.p, RMSNORM_GW_STORE, &c.be, &largest), RMSNORM_STATUS_SUCCESS)
      << rmsnorm_last_error();
  EXPECT_EQ(largest, large);
  EXPECT_GT(largest, 0u);
}

TEST(ApiWorkspace, QueryRejectsBadArguments) {
  Call c;
  size_t bytes = 777;
  EXPECT_EQ(rmsnorm_backward_workspace_size(nullptr, RMSNORM_GW_STORE, &c.be, &bytes), RMSNORM_STATUS_NULL_POINTER);
  EXPECT_TRUE(names_argument(rmsnorm_last_error(), "problem")) << rmsnorm_last_error();
  EXPECT_EQ(rmsnorm_backward_workspace_size(&c.p, RMSNORM_GW_STORE, nullptr, &bytes), RMSNORM_STATUS_NULL_POINTER);
  EXPECT_TRUE(names_argument(rmsnorm_last_error(), "backend")) << rmsnorm_last_error();
  EXPECT_EQ(rmsnorm_backward_workspace_size(&c.p, RMSNORM_GW_STORE, &c.be, nullptr), RMSNORM_STATUS_NULL_POINTER);
  EXPECT_NE(std::string(rmsnorm_last_error()).find("bytes"), std::string::npos) << rmsnorm_last_error();
  EXPECT_EQ(rmsnorm_backward_workspace_size(&c.p, 9, &c.be, &bytes), RMSNORM_STATUS_INVALID_OPTION);
  EXPECT_TRUE(names_argument(rmsnorm_last_error(), "gw_mode")) << rmsnorm_last_error();
  c.p.dtype = 7;
  EXPECT_EQ(rmsnorm_backward_workspace_size(&c.p, RMSNORM_GW_STORE, &c.be, &bytes), RMSNORM_STATUS_INVALID_DTYPE);
  EXPECT_TRUE(names_argument(rmsnorm_last_error(), "dtype")) << rmsnorm_last_error();
  c.p.dtype = RMSNORM_DTYPE_F32;
  c.p.cols = 0;
  EXPECT_EQ(rmsnorm_backward_workspace_size(&c.p, RMSNORM_GW_STORE, &c.be, &bytes), RMSNORM_STATUS_INVALID_SHAPE);
  EXPECT_TRUE(names_argument(rmsnorm_last_error(), "cols")) << rmsnorm_last_error();
  c.p.cols = 8;
  c.be.kind = 5;
  EXPECT_EQ(rmsnorm_backward_workspace_size(&c.p, RMSNORM_GW_STORE, &c.be, &bytes), RMSNORM_STATUS_INVALID_OPTION);
  EXPECT_TRUE(names_argument(rmsnorm_last_error(), "backend.kind")) << rmsnorm_last_error();
  EXPECT_EQ(bytes, 777u) << "a failing query must not write *bytes";
}

TEST(ApiWorkspace, TooSmall) {
  Call c = call_needing_workspace();
  ASSERT_GT(c.ws_bytes, 0u);
  c.ws_bytes -= 1;
  expect_rejected(c, BWD, RMSNORM_STATUS_WORKSPACE_TOO_SMALL, {"workspace"});
  c.ws_bytes = 0;
  expect_rejected(c, BWD, RMSNORM_STATUS_WORKSPACE_TOO_SMALL, {"workspace"});
}

TEST(ApiWorkspace, NullWhenNeeded) {
  // A required pointer that is NULL is a null pointer, whatever size comes with it.
  Call c = call_needing_workspace();
  ASSERT_GT(c.ws_bytes, 0u);
  const size_t need = c.ws_bytes;
  c.ws = nullptr;
  c.ws_bytes = 0;
  expect_rejected(c, BWD, RMSNORM_STATUS_NULL_POINTER, {"workspace"});
  c.ws_bytes = need;
  expect_rejected(c, BWD, RMSNORM_STATUS_NULL_POINTER, {"workspace"});
}

TEST(ApiWorkspace, LargerThanNeededAccepted) {
  Call c = call_needing_workspace();
  c.ws_bytes += 4096;
  EXPECT_EQ(c.backward(), RMSNORM_STATUS_SUCCESS) << rmsnorm_last_error();
}

// ---- alignment ---------------------------------------------------------------------------------

TEST(ApiAlign, ForwardOperands) {
  {
    Call c(RMSNORM_DTYPE_F32);
    c.x = c.arena.slot(Arena::kX) + 2;  // 2-aligned, not 4
    expect_rejected(c, FWD, RMSNORM_STATUS_MISALIGNED, {"x"});
    expect_rejected(c, BWD, RMSNORM_STATUS_MISALIGNED, {"x"});
  }
  {
    Call c(RMSNORM_DTYPE_F16);
    c.x = c.arena.slot(Arena::kX) + 1;
    expect_rejected(c, FWD, RMSNORM_STATUS_MISALIGNED, {"x"});
  }
  {
    Call c(RMSNORM_DTYPE_BF16);
    c.y = c.arena.slot(Arena::kY) + 1;
    expect_rejected(c, FWD, RMSNORM_STATUS_MISALIGNED, {"y"});
  }
  {
    Call c(RMSNORM_DTYPE_F16);
    c.w = c.arena.slot(Arena::kW) + 1;
    expect_rejected(c, FWD, RMSNORM_STATUS_MISALIGNED, {"weight"});
    expect_rejected(c, BWD, RMSNORM_STATUS_MISALIGNED, {"weight"});
  }
  {
    Call c(RMSNORM_DTYPE_F16);
    c.rstd_out = reinterpret_cast<float*>(c.arena.slot(Arena::kRstdOut) + 2);
    expect_rejected(c, FWD, RMSNORM_STATUS_MISALIGNED, {"rstd"});
  }
}

TEST(ApiAlign, BackwardOperands) {
  {
    Call c(RMSNORM_DTYPE_F16);
    c.gy = c.arena.slot(Arena::kGy) + 1;
    expect_rejected(c, BWD, RMSNORM_STATUS_MISALIGNED, {"gy"});
  }
  {
    Call c(RMSNORM_DTYPE_F32);
    c.gx = c.arena.slot(Arena::kGx) + 2;
    expect_rejected(c, BWD, RMSNORM_STATUS_MISALIGNED, {"gx"});
  }
  {
    Call c(RMSNORM_DTYPE_F32);
    c.rstd_in = reinterpret_cast<const float*>(c.arena.slot(Arena::kRstdIn) + 1);
    expect_rejected(c, BWD, RMSNORM_STATUS_MISALIGNED, {"rstd"});
  }
  {
    // The F32 modes write float gw whatever the dtype: 2-aligned is not enough.
    Call c(RMSNORM_DTYPE_BF16);
    c.gw_mode = RMSNORM_GW_STORE_F32;
    c.set_workspace_to_query();
    c.gw = c.arena.slot(Arena::kGw) + 2;
    expect_rejected(c, BWD, RMSNORM_STATUS_MISALIGNED, {"gw"});
  }
  {
    Call c(RMSNORM_DTYPE_F16);
    c.gw = c.arena.slot(Arena::kGw) + 1;
    expect_rejected(c, BWD, RMSNORM_STATUS_MISALIGNED, {"gw"});
  }
}

TEST(ApiAlign, WorkspaceNeeds16Bytes) {
  for (size_t off : {4, 8, 12}) {
    Call c = call_needing_workspace();
    ASSERT_GT(c.ws_bytes, 0u);
    c.ws = c.arena.slot(Arena::kWs) + off;
    expect_rejected(c, BWD, RMSNORM_STATUS_MISALIGNED, {"workspace"});
  }
}

// Element-aligned but not vector-aligned bases are legal (the kernels must
// cope): f16 at +2 bytes, f32 at +4.
TEST(ApiAlign, ElementAlignedAccepted) {
  Call h(RMSNORM_DTYPE_F16);
  h.x = h.arena.slot(Arena::kX) + 2;
  h.y = h.arena.slot(Arena::kY) + 6;
  EXPECT_EQ(h.forward(), RMSNORM_STATUS_SUCCESS) << rmsnorm_last_error();
  Call f(RMSNORM_DTYPE_F32);
  f.gx = f.arena.slot(Arena::kGx) + 4;
  f.gy = f.arena.slot(Arena::kGy) + 12;
  EXPECT_EQ(f.backward(), RMSNORM_STATUS_SUCCESS) << rmsnorm_last_error();
}

// ---- extents past the top of the address space, and extents that overflow int64 ------------------

// The address `below` bytes under the top of the address space: an operand
// placed there with more than `below - 1` bytes would wrap to address 0
// (one past its end must be representable, as in C).
void* near_top(size_t below) { return reinterpret_cast<void*>(std::numeric_limits<uintptr_t>::max() - (below - 1)); }

// Validation is arithmetic up to this point, so the CUDA backend (when a
// device is present) must give the same answer as the CPU backend: the
// memory-space query comes after it.
std::vector<rmsnorm_backend_t> backends_to_check() {
  std::vector<rmsnorm_backend_t> b = {rmsnorm_backend_cpu(2)};
  if (rmsnorm_cuda_available()) b.push_back(rmsnorm_backend_cuda(-1, nullptr));
  return b;
}

// 5 rows x 16 cols: every matrix is at least 160 bytes, weight and gw 32 or
// 64, rstd 20; each operand is placed so that its extent passes the top.
TEST(ApiWrap, ForwardOperands) {
  for (const rmsnorm_backend_t& be : backends_to_check())
    for (int32_t dt : {RMSNORM_DTYPE_F32, RMSNORM_DTYPE_BF16}) {
      SCOPED_TRACE(testing::Message() << "backend " << be.kind << " dtype " << dt);
      const size_t w_bytes = 16 * dtype_bytes(dt);
      {
        Call c(dt, 5, 16);
        c.be = be;
        c.x = near_top(64);
        expect_rejected(c, FWD, RMSNORM_STATUS_INVALID_SHAPE, {"x"});
        expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_SHAPE, {"x"});
      }
      {
        Call c(dt, 5, 16);
        c.be = be;
        c.y = near_top(32);  // the brief's example: UINTPTR_MAX - 31
        expect_rejected(c, FWD, RMSNORM_STATUS_INVALID_SHAPE, {"y"});
      }
      {
        Call c(dt, 5, 16);
        c.be = be;
        c.w = near_top(w_bytes);  // ends exactly at the top: one past the end would be address 0
        expect_rejected(c, FWD, RMSNORM_STATUS_INVALID_SHAPE, {"weight"});
        expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_SHAPE, {"weight"});
      }
      {
        Call c(dt, 5, 16);
        c.be = be;
        c.rstd_out = static_cast<float*>(near_top(16));
        expect_rejected(c, FWD, RMSNORM_STATUS_INVALID_SHAPE, {"rstd"});
      }
    }
}

TEST(ApiWrap, BackwardOperands) {
  for (const rmsnorm_backend_t& be : backends_to_check())
    for (int32_t dt : {RMSNORM_DTYPE_F32, RMSNORM_DTYPE_F16}) {
      SCOPED_TRACE(testing::Message() << "backend " << be.kind << " dtype " << dt);
      {
        Call c(dt, 5, 16);
        c.be = be;
        c.gy = near_top(128);
        expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_SHAPE, {"gy"});
      }
      {
        Call c(dt, 5, 16);
        c.be = be;
        c.gx = near_top(32);
        expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_SHAPE, {"gx"});
      }
      {
        Call c(dt, 5, 16);
        c.be = be;
        c.rstd_in = static_cast<const float*>(near_top(16));
        expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_SHAPE, {"rstd"});
      }
      for (int32_t mode : {RMSNORM_GW_STORE, RMSNORM_GW_STORE_F32, RMSNORM_GW_ACCUMULATE_F32}) {
        SCOPED_TRACE(mode);
        Call c(dt, 5, 16);
        c.be = be;
        c.gw_mode = mode;
        c.set_workspace_to_query();
        c.gw = near_top(32);  // gw is 32 bytes at 16-bit, 64 in fp32
        expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_SHAPE, {"gw"});
      }
    }
  // The workspace, with rows enough for the CPU backend to need one (192 bytes).
  Call c = call_needing_workspace();
  ASSERT_GT(c.ws_bytes, 64u);
  c.ws = near_top(64);
  expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_SHAPE, {"workspace"});
  // rows == 0 still writes gw (the store modes): its extent is checked too.
  Call empty;
  empty.p.rows = 0;
  empty.gw = near_top(16);
  expect_rejected(empty, BWD, RMSNORM_STATUS_INVALID_SHAPE, {"gw"});
}

// rows * stride * element size beyond int64: the byte count itself must not
// wrap before it is compared with anything. Each operand on its own.
TEST(ApiWrap, ExtentsOverflowingInt64) {
  const int64_t huge_rows = int64_t{1} << 62;
  for (const rmsnorm_backend_t& be : backends_to_check()) {
    SCOPED_TRACE(testing::Message() << "backend " << be.kind);
    {
      Call c(RMSNORM_DTYPE_F32, 5, 8);
      c.be = be;
      c.p.rows = huge_rows;  // (2^62 - 1) * 8 + 8 elements of 4 bytes = 2^67 bytes
      c.set_workspace_to_query();  // 256 gw partials
      expect_rejected(c, FWD, RMSNORM_STATUS_INVALID_SHAPE, {"x"});
      expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_SHAPE, {"x"});
    }
    {
      Call c(RMSNORM_DTYPE_F16, 5, 8);
      c.be = be;
      c.y_stride = int64_t{1} << 61;
      expect_rejected(c, FWD, RMSNORM_STATUS_INVALID_SHAPE, {"y"});
    }
    {
      Call c(RMSNORM_DTYPE_BF16, 5, 8);
      c.be = be;
      c.gy_stride = std::numeric_limits<int64_t>::max();
      expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_SHAPE, {"gy"});
    }
    {
      Call c(RMSNORM_DTYPE_F32, 5, 8);
      c.be = be;
      c.gx_stride = (std::numeric_limits<int64_t>::max() / 4 - 8) / 4 + 1;  // the first stride that overflows
      expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_SHAPE, {"gx"});
    }
    {
      // x fits (2^62 + 2 bytes of f16, cols 1), but rstd's rows * 4 bytes do not.
      Call c(RMSNORM_DTYPE_F16, 5, 1);
      c.be = be;
      c.p.rows = (int64_t{1} << 61) + 1;
      expect_rejected(c, FWD, RMSNORM_STATUS_INVALID_SHAPE, {"rstd"});
      c.gw_mode = RMSNORM_GW_NONE;
      c.ws_bytes = 0;
      expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_SHAPE, {"rstd"});
    }
  }
}

// ---- overlap -----------------------------------------------------------------------------------

TEST(ApiOverlap, YPartiallyOverlapsX) {
  for (int64_t shift_elems : {1, 8, 4 * 8 + 7}) {  // last one: y starts in x's last row
    Call c;
    c.y = c.arena.slot(Arena::kX) + 4 * shift_elems;
    expect_rejected(c, FWD, RMSNORM_STATUS_OVERLAP, {"y", "x"});
  }
  Call c;  // y ends inside x's first row
  const int64_t y_elems = (c.p.rows - 1) * c.y_stride + c.p.cols;
  c.x = static_cast<unsigned char*>(c.y) + 4 * (y_elems - 1);
  expect_rejected(c, FWD, RMSNORM_STATUS_OVERLAP, {"y", "x"});
}

TEST(ApiOverlap, YEqualsXNeedsEqualStrides) {
  Call c(RMSNORM_DTYPE_F32, 5, 8, 4);
  c.y = c.arena.slot(Arena::kX);
  c.y_stride = c.x_stride + 1;
  expect_rejected(c, FWD, RMSNORM_STATUS_OVERLAP, {"y", "x"});
}

TEST(ApiOverlap, YOverlapsWeight) {
  Call c;
  c.w = static_cast<unsigned char*>(c.y) + 4 * 12;
  expect_rejected(c, FWD, RMSNORM_STATUS_OVERLAP, {"y", "weight"});
}

TEST(ApiOverlap, RstdOverlapsY) {
  Call c;
  c.rstd_out = reinterpret_cast<float*>(static_cast<unsigned char*>(c.y) + 4 * 9);
  expect_rejected(c, FWD, RMSNORM_STATUS_OVERLAP, {"rstd", "y"});
}

TEST(ApiOverlap, RstdOverlapsX) {
  Call c;
  c.rstd_out = reinterpret_cast<float*>(c.arena.slot(Arena::kX) + 4 * 3);
  expect_rejected(c, FWD, RMSNORM_STATUS_OVERLAP, {"rstd", "x"});
}

TEST(ApiOverlap, GxOverlapsX) {
  Call c;
  c.gx = c.arena.slot(Arena::kX);  // even exactly: x is still needed after gx is written
  expect_rejected(c, BWD, RMSNORM_STATUS_OVERLAP, {"gx", "x"});
  c.gx = c.arena.slot(Arena::kX) + 4 * 3;
  expect_rejected(c, BWD, RMSNORM_STATUS_OVERLAP, {"gx", "x"});
}

TEST(ApiOverlap, GxEqualsGyNeedsEqualStrides) {
  Call c(RMSNORM_DTYPE_F16, 5, 8, 2);
  c.gx = c.arena.slot(Arena::kGy);
  c.gx_stride = c.gy_stride + 2;
  expect_rejected(c, BWD, RMSNORM_STATUS_OVERLAP, {"gx", "gy"});
  c.gx_stride = c.gy_stride;
  c.gx = c.arena.slot(Arena::kGy) + 2 * 3;
  expect_rejected(c, BWD, RMSNORM_STATUS_OVERLAP, {"gx", "gy"});
}

TEST(ApiOverlap, GxOverlapsRstdOrWeight) {
  Call c;
  c.gx = const_cast<float*>(c.rstd_in) + 2;
  expect_rejected(c, BWD, RMSNORM_STATUS_OVERLAP, {"gx", "rstd"});
  Call d;
  d.gx = const_cast<void*>(d.w);
  expect_rejected(d, BWD, RMSNORM_STATUS_OVERLAP, {"gx", "weight"});
}

TEST(ApiOverlap, GwOverlapsGx) {
  Call c;
  c.gw = static_cast<unsigned char*>(c.gx) + 4 * 20;
  expect_rejected(c, BWD, RMSNORM_STATUS_OVERLAP, {"gw", "gx"});
}

TEST(ApiOverlap, GwOverlapsAnInput) {
  Call c;
  c.gw = c.arena.slot(Arena::kX) + 4 * 8;
  expect_rejected(c, BWD, RMSNORM_STATUS_OVERLAP, {"gw", "x"});
  Call d;
  d.gw = const_cast<void*>(d.w);  // gw over w: the gradient would overwrite the weight it is computed from
  expect_rejected(d, BWD, RMSNORM_STATUS_OVERLAP, {"gw", "weight"});
}

TEST(ApiOverlap, WorkspaceOverlapsGx) {
  Call c = call_needing_workspace();
  ASSERT_GT(c.ws_bytes, 0u);
  c.ws = c.gx;  // gx is 64-aligned, so only the overlap is wrong
  expect_rejected(c, BWD, RMSNORM_STATUS_OVERLAP, {"workspace", "gx"});
}

TEST(ApiOverlap, WorkspaceOverlapsGw) {
  Call c = call_needing_workspace();
  ASSERT_GT(c.ws_bytes, 0u);
  c.ws = c.gw;
  expect_rejected(c, BWD, RMSNORM_STATUS_OVERLAP, {"workspace", "gw"});
}

// Touching is not overlapping: y may start right after x's last element.
TEST(ApiOverlap, AdjacentIsNotOverlap) {
  Call c;
  const int64_t x_elems = (c.p.rows - 1) * c.x_stride + c.p.cols;
  c.y = c.arena.slot(Arena::kX) + 4 * x_elems;
  EXPECT_EQ(c.forward(), RMSNORM_STATUS_SUCCESS) << rmsnorm_last_error();
}

// ---- in-place uses that the contract allows -------------------------------------------------------

// Bytes of the rows x cols elements of a strided matrix, row by row.
std::vector<unsigned char> elements(const void* base, int64_t rows, int64_t cols, int64_t stride, size_t esize) {
  const size_t row_bytes = static_cast<size_t>(cols) * esize;
  std::vector<unsigned char> out(static_cast<size_t>(rows) * row_bytes);
  const auto* p = static_cast<const unsigned char*>(base);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(out.data() + r * row_bytes, p + r * stride * esize, row_bytes);
  return out;
}

TEST(ApiInPlace, ForwardYEqualsX) {
  for (int32_t dt : {RMSNORM_DTYPE_F32, RMSNORM_DTYPE_F16, RMSNORM_DTYPE_BF16}) {
    Call c(dt, 6, 24, 5);
    ASSERT_EQ(c.forward(), RMSNORM_STATUS_SUCCESS) << rmsnorm_last_error();
    const size_t es = dtype_bytes(dt);
    const auto expect = elements(c.y, 6, 24, c.y_stride, es);
    // The gaps between y's rows belong to the caller: still the sentinel.
    const auto* yb = static_cast<const unsigned char*>(c.y);
    for (int64_t r = 0; r + 1 < 6; ++r)
      for (size_t b = 24 * es; b < static_cast<size_t>(c.y_stride) * es; ++b)
        ASSERT_EQ(yb[r * c.y_stride * es + b], kSentinel) << "row gap written, row " << r;
    c.y = c.arena.slot(Arena::kX);
    ASSERT_EQ(c.forward(), RMSNORM_STATUS_SUCCESS) << rmsnorm_last_error();
    EXPECT_EQ(elements(c.x, 6, 24, c.x_stride, es), expect) << "in-place forward differs, dtype " << dt;
  }
}

TEST(ApiInPlace, BackwardGxEqualsGy) {
  for (int32_t dt : {RMSNORM_DTYPE_F32, RMSNORM_DTYPE_F16, RMSNORM_DTYPE_BF16}) {
    Call c(dt, 6, 24, 3);
    c.gw_mode = RMSNORM_GW_STORE_F32;
    c.set_workspace_to_query();
    ASSERT_EQ(c.backward(), RMSNORM_STATUS_SUCCESS) << rmsnorm_last_error();
    const size_t es = dtype_bytes(dt);
    const auto expect_gx = elements(c.gx, 6, 24, c.gx_stride, es);
    const auto expect_gw = elements(c.gw, 1, 24, 24, 4);
    std::memset(c.gw, kSentinel, 24 * 4);
    c.gx = c.arena.slot(Arena::kGy);
    ASSERT_EQ(c.backward(), RMSNORM_STATUS_SUCCESS) << rmsnorm_last_error();
    EXPECT_EQ(elements(c.gy, 6, 24, c.gy_stride, es), expect_gx) << "in-place gx differs, dtype " << dt;
    EXPECT_EQ(elements(c.gw, 1, 24, 24, 4), expect_gw) << "gw differs when gx == gy, dtype " << dt;
  }
}

// ---- rows == 0 ------------------------------------------------------------------------------------

TEST(ApiEmpty, ForwardWritesNothing) {
  Call c;
  c.p.rows = 0;
  const auto before = c.arena.snapshot();
  EXPECT_EQ(c.forward(), RMSNORM_STATUS_SUCCESS) << rmsnorm_last_error();
  EXPECT_EQ(c.arena.first_difference(before), "");
}

TEST(ApiEmpty, Backward) {
  // The header: with rows == 0 the store modes write the empty sum (zeros) to
  // gw, the accumulate modes leave it unchanged; nothing else may change.
  for (int32_t dt : {RMSNORM_DTYPE_F32, RMSNORM_DTYPE_F16}) {
    for (int32_t mode : {RMSNORM_GW_NONE, RMSNORM_GW_STORE, RMSNORM_GW_STORE_F32, RMSNORM_GW_ACCUMULATE,
                         RMSNORM_GW_ACCUMULATE_F32}) {
      SCOPED_TRACE(testing::Message() << "dtype " << dt << " mode " << mode);
      Call c(dt);
      c.p.rows = 0;
      c.gw_mode = mode;
      c.set_workspace_to_query();
      const auto before = c.arena.snapshot();
      ASSERT_EQ(c.backward(), RMSNORM_STATUS_SUCCESS) << rmsnorm_last_error();
      const size_t gw_bytes = static_cast<size_t>(c.p.cols) *
                              (mode == RMSNORM_GW_STORE_F32 || mode == RMSNORM_GW_ACCUMULATE_F32 ? 4 : dtype_bytes(dt));
      auto* gw = static_cast<unsigned char*>(c.gw);
      bool gw_zero = true, gw_same = true;
      for (size_t i = 0; i < gw_bytes; ++i) {
        gw_zero = gw_zero && gw[i] == 0;
        gw_same = gw_same && gw[i] == kSentinel;
      }
      const bool store = mode == RMSNORM_GW_STORE || mode == RMSNORM_GW_STORE_F32;
      if (store)
        EXPECT_TRUE(gw_zero) << "gw (store modes) must be zeros";
      else
        EXPECT_TRUE(gw_same) << "gw changed (none / accumulate modes)";
      std::memset(gw, kSentinel, gw_bytes);  // compare the rest
      EXPECT_EQ(c.arena.first_difference(before), "");
    }
  }
}

// ---- CUDA backend requests --------------------------------------------------------------------------

TEST(ApiCuda, UnavailableOrWrongMemory) {
  Call c;
  c.be = rmsnorm_backend_cuda(-1, nullptr);
  if (!rmsnorm_cuda_available()) {
    expect_rejected(c, FWD, RMSNORM_STATUS_BACKEND_UNAVAILABLE, {"backend"});
    expect_rejected(c, BWD, RMSNORM_STATUS_BACKEND_UNAVAILABLE, {"backend"});
    size_t bytes = 99;
    EXPECT_EQ(rmsnorm_backward_workspace_size(&c.p, RMSNORM_GW_STORE, &c.be, &bytes),
              RMSNORM_STATUS_BACKEND_UNAVAILABLE);
    EXPECT_EQ(bytes, 99u);
    return;
  }
  // A GPU is present: host (pageable, unregistered) memory handed to the CUDA
  // backend is detectable and must be refused before any kernel runs.
  expect_rejected(c, FWD, RMSNORM_STATUS_WRONG_MEMORY_SPACE, {"x"});
  c.be.device = 1 << 20;
  expect_rejected(c, FWD, RMSNORM_STATUS_BACKEND_UNAVAILABLE, {"backend.device"});
}

// Backend fields outside their documented range are refused whether or not a
// GPU is present (the device check comes before the availability check).
TEST(ApiBackend, NegativeThreadsOrDevice) {
  Call c;
  c.be = rmsnorm_backend_cpu(-2);
  expect_rejected(c, FWD, RMSNORM_STATUS_INVALID_OPTION, {"backend.num_threads"});
  expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_OPTION, {"backend.num_threads"});
  c.be = rmsnorm_backend_cuda(-5, nullptr);
  expect_rejected(c, FWD, RMSNORM_STATUS_INVALID_OPTION, {"backend.device"});
  expect_rejected(c, BWD, RMSNORM_STATUS_INVALID_OPTION, {"backend.device"});
}

// ---- small ABI functions ----------------------------------------------------------------------------

TEST(ApiMisc, StatusStrings) {
  const std::array<std::pair<rmsnorm_status_t, const char*>, 14> names = {{
      {RMSNORM_STATUS_SUCCESS, "RMSNORM_STATUS_SUCCESS"},
      {RMSNORM_STATUS_NULL_POINTER, "RMSNORM_STATUS_NULL_POINTER"},
      {RMSNORM_STATUS_INVALID_SHAPE, "RMSNORM_STATUS_INVALID_SHAPE"},
      {RMSNORM_STATUS_INVALID_STRIDE, "RMSNORM_STATUS_INVALID_STRIDE"},
      {RMSNORM_STATUS_INVALID_EPS, "RMSNORM_STATUS_INVALID_EPS"},
      {RMSNORM_STATUS_INVALID_DTYPE, "RMSNORM_STATUS_INVALID_DTYPE"},
      {RMSNORM_STATUS_INVALID_OPTION, "RMSNORM_STATUS_INVALID_OPTION"},
      {RMSNORM_STATUS_MISALIGNED, "RMSNORM_STATUS_MISALIGNED"},
      {RMSNORM_STATUS_WORKSPACE_TOO_SMALL, "RMSNORM_STATUS_WORKSPACE_TOO_SMALL"},
      {RMSNORM_STATUS_OVERLAP, "RMSNORM_STATUS_OVERLAP"},
      {RMSNORM_STATUS_WRONG_MEMORY_SPACE, "RMSNORM_STATUS_WRONG_MEMORY_SPACE"},
      {RMSNORM_STATUS_BACKEND_UNAVAILABLE, "RMSNORM_STATUS_BACKEND_UNAVAILABLE"},
      {RMSNORM_STATUS_CUDA_ERROR, "RMSNORM_STATUS_CUDA_ERROR"},
      {RMSNORM_STATUS_INTERNAL_ERROR, "RMSNORM_STATUS_INTERNAL_ERROR"},
  }};
  for (const auto& [s, name] : names) {
    ASSERT_NE(rmsnorm_status_string(s), nullptr);
    EXPECT_STREQ(rmsnorm_status_string(s), name);
    EXPECT_STREQ(rmsnorm::to_string(static_cast<rmsnorm::Status>(s)), name);
  }
  for (int bad : {-1, 14, 1000}) {
    const char* s = rmsnorm_status_string(static_cast<rmsnorm_status_t>(bad));
    ASSERT_NE(s, nullptr) << bad;
    EXPECT_STRNE(s, "") << bad;
  }
}

TEST(ApiMisc, Version) {
  EXPECT_EQ(rmsnorm_version(), RMSNORM_VERSION);
  EXPECT_EQ(RMSNORM_VERSION, RMSNORM_VERSION_MAJOR * 10000 + RMSNORM_VERSION_MINOR * 100 + RMSNORM_VERSION_PATCH);
  EXPECT_LT(RMSNORM_VERSION_MINOR, 100);
  EXPECT_LT(RMSNORM_VERSION_PATCH, 100);
}

TEST(ApiMisc, DtypeSize) {
  EXPECT_EQ(rmsnorm_dtype_size(RMSNORM_DTYPE_F32), 4u);
  EXPECT_EQ(rmsnorm_dtype_size(RMSNORM_DTYPE_F16), 2u);
  EXPECT_EQ(rmsnorm_dtype_size(RMSNORM_DTYPE_BF16), 2u);
  EXPECT_EQ(rmsnorm_dtype_size(3), 0u);
  EXPECT_EQ(rmsnorm_dtype_size(-1), 0u);
}

TEST(ApiMisc, Defaults) {
  const rmsnorm_problem_t p = rmsnorm_problem_default();
  EXPECT_EQ(p.rows, 0);
  EXPECT_EQ(p.cols, 0);
  EXPECT_EQ(p.dtype, RMSNORM_DTYPE_F32);
  EXPECT_EQ(p.flags, 0u);
  EXPECT_EQ(p.eps, 1e-5f);
  const rmsnorm_backend_t cpu = rmsnorm_backend_cpu(3);
  EXPECT_EQ(cpu.kind, RMSNORM_BACKEND_CPU);
  EXPECT_EQ(cpu.num_threads, 3);
  int dummy = 0;
  const rmsnorm_backend_t gpu = rmsnorm_backend_cuda(1, &dummy);
  EXPECT_EQ(gpu.kind, RMSNORM_BACKEND_CUDA);
  EXPECT_EQ(gpu.device, 1);
  EXPECT_EQ(gpu.stream, &dummy);
}

// ---- C++ API ------------------------------------------------------------------------------------------

// Misuse that must not compile.
static_assert(std::is_convertible<rmsnorm::MatrixView<float>, rmsnorm::MatrixView<const float>>::value, "");
static_assert(!std::is_convertible<rmsnorm::MatrixView<const float>, rmsnorm::MatrixView<float>>::value, "");
static_assert(!std::is_convertible<rmsnorm::MatrixView<float>, rmsnorm::MatrixView<const rmsnorm::half>>::value, "");
static_assert(!std::is_convertible<rmsnorm::VectorView<rmsnorm::half>, rmsnorm::VectorView<const rmsnorm::bfloat16>>::value,
              "");
static_assert(rmsnorm::dtype_of_v<rmsnorm::bfloat16> == RMSNORM_DTYPE_BF16, "");
static_assert(rmsnorm::dtype_of_v<const rmsnorm::half> == RMSNORM_DTYPE_F16, "");
static_assert(sizeof(rmsnorm::half) == 2 && sizeof(rmsnorm::bfloat16) == 2, "");

template <class T>
T from_float(float v);
template <>
float from_float<float>(float v) {
  return v;
}
template <>
rmsnorm::half from_float<rmsnorm::half>(float v) {
  return {rmsnorm::float_to_half(v)};
}
template <>
rmsnorm::bfloat16 from_float<rmsnorm::bfloat16>(float v) {
  return {rmsnorm::float_to_bf16(v)};
}
double to_double(float v) { return v; }
double to_double(rmsnorm::half v) { return rmsnorm::half_to_float(v.bits); }
double to_double(rmsnorm::bfloat16 v) { return rmsnorm::bf16_to_float(v.bits); }

template <class T>
struct CppTest : ::testing::Test {};
using ElementTypes = ::testing::Types<float, rmsnorm::half, rmsnorm::bfloat16>;
TYPED_TEST_SUITE(CppTest, ElementTypes);

// add_forward / add_backward through rmsnorm.hpp give the C ABI's bits (the
// values themselves are checked in fused_test), and check shapes first.
TYPED_TEST(CppTest, AddForwardAndBackwardAreTheCAbis) {
  using T = TypeParam;
  constexpr int32_t dt = rmsnorm::dtype_of_v<T>;
  const int64_t rows = 5, cols = 24;
  std::mt19937_64 rng(43);
  std::normal_distribution<float> n01(0.f, 1.f);
  std::vector<T> x(rows * cols), res(rows * cols), w(cols), gy(rows * cols), gh(rows * cols);
  for (auto* v : {&x, &res, &gy, &gh})
    for (auto& e : *v) e = from_float<T>(n01(rng) + 0.01f);
  for (auto& e : w) e = from_float<T>(1.0f + 0.25f * n01(rng));
  const rmsnorm::Backend be = rmsnorm::Backend::cpu(1);
  const rmsnorm::Options opt;
  std::vector<T> h(rows * cols), y(rows * cols), h_c(rows * cols), y_c(rows * cols), gx(rows * cols), gx_c(rows * cols);
  std::vector<float> r(rows), r_c(rows);
  const auto xv = rmsnorm::make_matrix(x.data(), rows, cols), rv = rmsnorm::make_matrix(res.data(), rows, cols);
  ASSERT_EQ(rmsnorm::Status::kSuccess,
            rmsnorm::add_forward(xv, rv, rmsnorm::make_vector(w.data(), cols), rmsnorm::make_matrix(h.data(), rows, cols),
                                 rmsnorm::make_matrix(y.data(), rows, cols), rmsnorm::make_vector(r.data(), rows), opt,
                                 be))
      << rmsnorm::last_error();
  rmsnorm_problem_t p = rmsnorm_problem_default();
  p.rows = rows;
  p.cols = cols;
  p.dtype = dt;
  const rmsnorm_backend_t cbe = rmsnorm_backend_cpu(1);
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_add_forward(&p, x.data(), cols, res.data(), cols, w.data(), h_c.data(), cols,
                                                         y_c.data(), cols, r_c.data(), &cbe));
  EXPECT_EQ(0, std::memcmp(h.data(), h_c.data(), h.size() * sizeof(T)));
  EXPECT_EQ(0, std::memcmp(y.data(), y_c.data(), y.size() * sizeof(T)));
  EXPECT_EQ(0, std::memcmp(r.data(), r_c.data(), r.size() * sizeof(float)));
  const auto hv = rmsnorm::make_matrix(static_cast<const T*>(h.data()), rows, cols);
  ASSERT_EQ(rmsnorm::Status::kSuccess,
            rmsnorm::add_backward(hv, rmsnorm::make_vector(w.data(), cols), rmsnorm::make_matrix(gy.data(), rows, cols),
                                  rmsnorm::make_vector(r.data(), rows), rmsnorm::make_matrix(gh.data(), rows, cols),
                                  rmsnorm::make_matrix(gx.data(), rows, cols), rmsnorm::GradWeight<T>::none(), {}, opt,
                                  be))
      << rmsnorm::last_error();
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_add_backward(&p, h.data(), cols, w.data(), gy.data(), cols, r.data(),
                                                          gh.data(), cols, gx_c.data(), cols, nullptr, RMSNORM_GW_NONE,
                                                          nullptr, 0, &cbe));
  EXPECT_EQ(0, std::memcmp(gx.data(), gx_c.data(), gx.size() * sizeof(T)));
  // A g_h of the wrong shape is refused by the C++ layer, naming it.
  EXPECT_EQ(rmsnorm::Status::kInvalidShape,
            rmsnorm::add_backward(hv, rmsnorm::make_vector(w.data(), cols), rmsnorm::make_matrix(gy.data(), rows, cols),
                                  rmsnorm::make_vector(r.data(), rows),
                                  rmsnorm::make_matrix(gh.data(), rows - 1, cols),
                                  rmsnorm::make_matrix(gx.data(), rows, cols), rmsnorm::GradWeight<T>::none(), {}, opt,
                                  be));
  EXPECT_NE(std::string(rmsnorm::last_error()).find("g_h"), std::string::npos) << rmsnorm::last_error();
}

// forward_quant / add_forward_quant through rmsnorm.hpp give the C ABI's bits for every scale rule (the values
// themselves are checked in fused_test), padding included, and check the shapes first.
TYPED_TEST(CppTest, QuantizedForwardsAreTheCAbis) {
  using T = TypeParam;
  constexpr int32_t dt = rmsnorm::dtype_of_v<T>;
  const int64_t rows = 5, cols = 200;
  std::mt19937_64 rng(44);
  std::normal_distribution<float> n01(0.f, 1.f);
  std::vector<T> x(rows * cols), res(rows * cols), w(cols);
  for (auto* v : {&x, &res})
    for (auto& e : *v) e = from_float<T>(n01(rng) + 0.01f);
  for (auto& e : w) e = from_float<T>(1.0f + 0.25f * n01(rng));
  const rmsnorm::Backend be = rmsnorm::Backend::cpu(1);
  const rmsnorm::Options opt;
  rmsnorm_problem_t p = rmsnorm_problem_default();
  p.rows = rows;
  p.cols = cols;
  p.dtype = dt;
  const rmsnorm_backend_t cbe = rmsnorm_backend_cpu(1);
  const float scale = 0.05f, ub = 0.5f;
  const auto xv = rmsnorm::make_matrix(static_cast<const T*>(x.data()), rows, cols);
  const auto wv = rmsnorm::make_vector(static_cast<const T*>(w.data()), cols);
  struct Out {
    std::vector<uint8_t> q = std::vector<uint8_t>(5 * 200, 0xAB);
    std::vector<float> scales = std::vector<float>(64, std::nanf(""));
    std::vector<float> rstd = std::vector<float>(5, std::nanf(""));
    std::vector<T> h = std::vector<T>(5 * 200);
  };
  auto expect_same = [](const Out& a, const Out& b, const char* what) {
    EXPECT_EQ(a.q, b.q) << what;
    EXPECT_EQ(0, std::memcmp(a.scales.data(), b.scales.data(), a.scales.size() * sizeof(float))) << what;
    EXPECT_EQ(0, std::memcmp(a.rstd.data(), b.rstd.data(), a.rstd.size() * sizeof(float))) << what;
    EXPECT_EQ(0, std::memcmp(a.h.data(), b.h.data(), a.h.size() * sizeof(T))) << what;
  };
  auto qv = [&](Out& o) { return rmsnorm::make_matrix(o.q.data(), rows, cols); };
  auto rv = [&](Out& o) { return rmsnorm::make_vector(o.rstd.data(), rows); };
  {  // static fp8
    Out a, b;
    ASSERT_EQ(rmsnorm::Status::kSuccess,
              rmsnorm::forward_quant(xv, wv, rmsnorm::QuantKind::kFp8E4m3, rmsnorm::QuantScales::fixed(&scale), qv(a),
                                     rv(a), opt, be))
        << rmsnorm::last_error();
    const rmsnorm_quant_t qt{RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_STATIC, &scale, nullptr, nullptr};
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
              rmsnorm_forward_quant(&p, x.data(), cols, w.data(), &qt, b.q.data(), cols, b.rstd.data(), &cbe));
    expect_same(a, b, "static");
  }
  {  // int8 per row
    Out a, b;
    ASSERT_EQ(rmsnorm::Status::kSuccess,
              rmsnorm::forward_quant(xv, wv, rmsnorm::QuantKind::kInt8,
                                     rmsnorm::QuantScales::per_row(rmsnorm::make_vector(a.scales.data(), rows)), qv(a),
                                     rv(a), opt, be))
        << rmsnorm::last_error();
    const rmsnorm_quant_t qt{RMSNORM_QUANT_INT8, RMSNORM_QUANT_PER_ROW, nullptr, b.scales.data(), nullptr};
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
              rmsnorm_forward_quant(&p, x.data(), cols, w.data(), &qt, b.q.data(), cols, b.rstd.data(), &cbe));
    expect_same(a, b, "per row");
  }
  {  // fp8 blocks of 64, row-major with a padding float per row, scale_ub
    Out a, b;
    const int64_t nb = 4;
    ASSERT_EQ(rmsnorm::Status::kSuccess,
              rmsnorm::forward_quant(xv, wv, rmsnorm::QuantKind::kFp8E4m3,
                                     rmsnorm::QuantScales::per_block(
                                         64, rmsnorm::make_matrix(a.scales.data(), rows, nb, nb + 1), &ub),
                                     qv(a), rv(a), opt, be))
        << rmsnorm::last_error();
    const rmsnorm_block_quant_t bq{RMSNORM_QUANT_FP8_E4M3, 64, b.scales.data(), nb + 1, 1, &ub};
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
              rmsnorm_forward_block_quant(&p, x.data(), cols, w.data(), &bq, b.q.data(), cols, b.rstd.data(), &cbe));
    expect_same(a, b, "blocks, row-major");
  }
  {  // int8 blocks of 128 transposed (blocks x rows, two padding floats per block), then the add form
    Out a, b;
    const int64_t nb = 2;
    const auto sc = rmsnorm::QuantScales::per_block_transposed(
        128, rmsnorm::make_matrix(a.scales.data(), nb, rows, rows + 2));
    ASSERT_EQ(rmsnorm::Status::kSuccess,
              rmsnorm::forward_quant(xv, wv, rmsnorm::QuantKind::kInt8, sc, qv(a), rv(a), opt, be))
        << rmsnorm::last_error();
    const rmsnorm_block_quant_t bq{RMSNORM_QUANT_INT8, 128, b.scales.data(), 1, rows + 2, nullptr};
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
              rmsnorm_forward_block_quant(&p, x.data(), cols, w.data(), &bq, b.q.data(), cols, b.rstd.data(), &cbe));
    expect_same(a, b, "blocks, transposed");
    Out c, d;
    ASSERT_EQ(rmsnorm::Status::kSuccess,
              rmsnorm::add_forward_quant(xv, rmsnorm::make_matrix(static_cast<const T*>(res.data()), rows, cols), wv,
                                         rmsnorm::make_matrix(c.h.data(), rows, cols), rmsnorm::QuantKind::kInt8,
                                         rmsnorm::QuantScales::per_block_transposed(
                                             128, rmsnorm::make_matrix(c.scales.data(), nb, rows, rows + 2)),
                                         qv(c), rv(c), opt, be))
        << rmsnorm::last_error();
    const rmsnorm_block_quant_t bq2{RMSNORM_QUANT_INT8, 128, d.scales.data(), 1, rows + 2, nullptr};
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
              rmsnorm_add_forward_block_quant(&p, x.data(), cols, res.data(), cols, w.data(), d.h.data(), cols, &bq2,
                                              d.q.data(), cols, d.rstd.data(), &cbe));
    expect_same(c, d, "add, blocks, transposed");
  }
  {  // static fp8 after the add
    Out a, b;
    ASSERT_EQ(rmsnorm::Status::kSuccess,
              rmsnorm::add_forward_quant(xv, rmsnorm::make_matrix(static_cast<const T*>(res.data()), rows, cols), wv,
                                         rmsnorm::make_matrix(a.h.data(), rows, cols), rmsnorm::QuantKind::kFp8E4m3,
                                         rmsnorm::QuantScales::fixed(&scale), qv(a), rv(a), opt, be))
        << rmsnorm::last_error();
    const rmsnorm_quant_t qt{RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_STATIC, &scale, nullptr, nullptr};
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
              rmsnorm_add_forward_quant(&p, x.data(), cols, res.data(), cols, w.data(), b.h.data(), cols, &qt,
                                        b.q.data(), cols, b.rstd.data(), &cbe));
    expect_same(a, b, "add, static");
  }
  // Shapes first, each refusal naming the operand and writing nothing.
  Out o;
  const Out untouched;
  auto refused = [&](rmsnorm::Status got, const char* name) {
    EXPECT_EQ(rmsnorm::Status::kInvalidShape, got) << name;
    EXPECT_NE(std::string(rmsnorm::last_error()).find(name), std::string::npos) << rmsnorm::last_error();
    expect_same(o, untouched, name);
  };
  refused(rmsnorm::forward_quant(xv, wv, rmsnorm::QuantKind::kFp8E4m3, rmsnorm::QuantScales::fixed(&scale),
                                 rmsnorm::make_matrix(o.q.data(), rows, cols - 1), rv(o), opt, be),
          "q");
  refused(rmsnorm::forward_quant(xv, wv, rmsnorm::QuantKind::kInt8,
                                 rmsnorm::QuantScales::per_row(rmsnorm::make_vector(o.scales.data(), rows - 1)), qv(o),
                                 rv(o), opt, be),
          "row_scales");
  refused(rmsnorm::forward_quant(xv, wv, rmsnorm::QuantKind::kInt8,
                                 rmsnorm::QuantScales::per_block(64, rmsnorm::make_matrix(o.scales.data(), rows, 3)),
                                 qv(o), rv(o), opt, be),
          "scales (blocks)");
  refused(rmsnorm::forward_quant(xv, wv, rmsnorm::QuantKind::kInt8,
                                 rmsnorm::QuantScales::per_block_transposed(
                                     128, rmsnorm::make_matrix(o.scales.data(), 2, rows + 1, rows + 2)),
                                 qv(o), rv(o), opt, be),
          "scales (rows)");
  refused(rmsnorm::add_forward_quant(xv, rmsnorm::make_matrix(static_cast<const T*>(res.data()), rows, cols), wv,
                                     rmsnorm::make_matrix(o.h.data(), rows - 1, cols), rmsnorm::QuantKind::kInt8,
                                     rmsnorm::QuantScales::fixed(&scale), qv(o), rv(o), opt, be),
          "h");
  // A block size the library refuses reaches it (its message names the field).
  EXPECT_EQ(rmsnorm::Status::kInvalidOption,
            rmsnorm::forward_quant(xv, wv, rmsnorm::QuantKind::kInt8,
                                   rmsnorm::QuantScales::per_block(32, rmsnorm::make_matrix(o.scales.data(), rows, 7)),
                                   qv(o), rv(o), opt, be));
  EXPECT_NE(std::string(rmsnorm::last_error()).find("block_cols"), std::string::npos) << rmsnorm::last_error();
  expect_same(o, untouched, "block_cols 32");
  // Another block size whose scales have ceil(cols / 96) blocks, or not: the library's refusal either way.
  for (int64_t nb : {2, 3}) {
    EXPECT_EQ(rmsnorm::Status::kInvalidOption,
              rmsnorm::forward_quant(xv, wv, rmsnorm::QuantKind::kInt8,
                                     rmsnorm::QuantScales::per_block(96, rmsnorm::make_matrix(o.scales.data(), rows, nb)),
                                     qv(o), rv(o), opt, be));
    EXPECT_NE(std::string(rmsnorm::last_error()).find("block_cols"), std::string::npos) << rmsnorm::last_error();
  }
  // cols = INT64_MAX: INVALID_SHAPE, the block count computed without overflow (ceil as a quotient and a carry;
  // (cols + 63) / 64 overflowed, undefined behaviour that UBSan reported).
  EXPECT_EQ(rmsnorm::Status::kInvalidShape,
            rmsnorm::forward_quant(rmsnorm::MatrixView<const T>{x.data(), 1, INT64_MAX, INT64_MAX}, {},
                                   rmsnorm::QuantKind::kInt8,
                                   rmsnorm::QuantScales::per_block(64, rmsnorm::make_matrix(o.scales.data(), 1, 1)),
                                   rmsnorm::MatrixView<uint8_t>{o.q.data(), 1, INT64_MAX, INT64_MAX}, {}, opt, be));
  EXPECT_NE(std::string(rmsnorm::last_error()).find("cols"), std::string::npos) << rmsnorm::last_error();
  // The add form is the add form whatever its pointers: residual or h with null data is the C ABI's NULL_POINTER
  // (a view of the right shape over no memory), never the plain forward.
  const rmsnorm::MatrixView<const T> no_residual{nullptr, rows, cols, cols};
  const rmsnorm::MatrixView<T> no_h{nullptr, rows, cols, cols};
  for (int which = 0; which < 3; ++which) {
    const auto r = which == 1 ? rmsnorm::make_matrix(static_cast<const T*>(res.data()), rows, cols) : no_residual;
    const auto h = which == 2 ? rmsnorm::make_matrix(o.h.data(), rows, cols) : no_h;
    EXPECT_EQ(rmsnorm::Status::kNullPointer,
              rmsnorm::add_forward_quant(xv, r, wv, h, rmsnorm::QuantKind::kInt8,
                                         rmsnorm::QuantScales::per_row(rmsnorm::make_vector(o.scales.data(), rows)),
                                         qv(o), rv(o), opt, be))
        << which;
    expect_same(o, untouched, "null residual or h");
  }
}

// forward_quant and add_forward_quant take x's element type from x alone; their second template parameter is the
// weight's type, x's or (16-bit x) float, and naming any other does not compile (it read x's memory as that type).
template <class X, class T, class = void>
struct QuantNamesOtherType : std::false_type {};
template <class X, class T>
struct QuantNamesOtherType<X, T,
                           std::void_t<decltype(rmsnorm::forward_quant<X, T>(
                               std::declval<rmsnorm::MatrixView<X>>(), {}, rmsnorm::QuantKind::kInt8,
                               rmsnorm::QuantScales::fixed(nullptr), std::declval<rmsnorm::MatrixView<uint8_t>>(), {},
                               rmsnorm::Options{}, std::declval<const rmsnorm::Backend&>()))>> : std::true_type {};
template <class X, class = void>
struct QuantTakesX : std::false_type {};
template <class X>
struct QuantTakesX<X, std::void_t<decltype(rmsnorm::forward_quant(
                          std::declval<rmsnorm::MatrixView<X>>(), {}, rmsnorm::QuantKind::kInt8,
                          rmsnorm::QuantScales::fixed(nullptr), std::declval<rmsnorm::MatrixView<uint8_t>>(), {},
                          rmsnorm::Options{}, std::declval<const rmsnorm::Backend&>()))>> : std::true_type {};
static_assert(QuantTakesX<const float>::value && QuantTakesX<rmsnorm::half>::value, "the deduced form compiles");
static_assert(!QuantNamesOtherType<const float, rmsnorm::half>::value, "x's element type cannot be overridden");
static_assert(!QuantNamesOtherType<rmsnorm::half, rmsnorm::bfloat16>::value, "nor another 16-bit weight named");
static_assert(QuantNamesOtherType<const rmsnorm::bfloat16, float>::value, "an fp32 weight with 16-bit x");

// Forward with rstd, then backward (rstd given, gw as f32 and in T, and
// accumulated) through rmsnorm.hpp, against the float64 reference. The
// tolerance is loose on purpose (a few units of T): the per-element bounds
// live in cpu_test; this checks that the C++ layer passes the right things.
TYPED_TEST(CppTest, ForwardBackwardMatchReference) {
  using T = TypeParam;
  constexpr int32_t dt = rmsnorm::dtype_of_v<T>;
  const int64_t rows = 7, cols = 40, xs = 43;
  std::mt19937_64 rng(42);
  std::normal_distribution<float> n01(0.f, 1.f);
  auto nonzero = [&] {
    float v = n01(rng);
    return std::fabs(v) < 1e-2f ? 0.5f : v;
  };
  std::vector<T> x(rows * xs), gy(rows * cols), w(cols);
  for (auto& v : x) v = from_float<T>(nonzero());
  for (auto& v : gy) v = from_float<T>(nonzero());
  for (auto& v : w) v = from_float<T>(1.0f + 0.25f * nonzero());
  std::vector<T> y(rows * cols, from_float<T>(NAN)), gx(rows * cols, from_float<T>(NAN));
  std::vector<T> gw_t(cols, from_float<T>(NAN));
  std::vector<float> rstd(rows, NAN), gw32(cols, NAN), gw_acc(cols, 0.0f);

  const rmsnorm::Backend be = rmsnorm::Backend::cpu(2);
  rmsnorm::Options opt;
  opt.eps = 1e-6f;
  const auto xv = rmsnorm::make_matrix(x.data(), rows, cols, xs);
  const auto wv = rmsnorm::make_vector(w.data(), cols);
  ASSERT_EQ(rmsnorm::forward(xv, wv, rmsnorm::make_matrix(y.data(), rows, cols), rmsnorm::make_vector(rstd.data(), rows),
                             opt, be),
            rmsnorm::Status::kSuccess)
      << rmsnorm::last_error();

  const size_t ws_bytes = rmsnorm::backward_workspace_size_or_throw<T>(rows, cols, rmsnorm::GwMode::kStoreF32, be);
  std::vector<double> ws_storage(ws_bytes / sizeof(double) + 2);  // 16-aligned on every mainstream allocator
  const rmsnorm::Workspace ws{ws_storage.data(), ws_bytes};
  const auto gyv = rmsnorm::make_matrix(gy.data(), rows, cols);
  const auto gxv = rmsnorm::make_matrix(gx.data(), rows, cols);
  rmsnorm::backward_or_throw(xv, wv, gyv, rmsnorm::make_vector(rstd.data(), rows), gxv,
                             rmsnorm::GradWeight<T>::store_f32(rmsnorm::make_vector(gw32.data(), cols)), ws, opt, be);
  // The other modes: the dtype store, and two accumulations of 0 + s + s,
  // which is 2s exactly in fp32 when the backward is deterministic.
  const size_t ws2 = rmsnorm::backward_workspace_size_or_throw<T>(rows, cols, rmsnorm::GwMode::kStore, be);
  ASSERT_LE(ws2, ws_storage.size() * sizeof(double));
  rmsnorm::backward_or_throw(xv, wv, gyv, {}, gxv, rmsnorm::GradWeight<T>::store(rmsnorm::make_vector(gw_t.data(), cols)),
                             rmsnorm::Workspace{ws_storage.data(), ws2}, opt, be);
  for (int i = 0; i < 2; ++i)
    rmsnorm::backward_or_throw(xv, wv, gyv, rmsnorm::make_vector(rstd.data(), rows), gxv,
                               rmsnorm::GradWeight<T>::accumulate_f32(rmsnorm::make_vector(gw_acc.data(), cols)), ws,
                               opt, be);

  std::vector<double> xd(rows * cols), gyd(rows * cols), wd(cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      xd[r * cols + c] = to_double(x[r * xs + c]);
      gyd[r * cols + c] = to_double(gy[r * cols + c]);
    }
  for (int64_t c = 0; c < cols; ++c) wd[c] = to_double(w[c]);
  rmsnorm::reference::Options ropt;
  ropt.eps = opt.eps;
  std::vector<double> yr(rows * cols), rr(rows), gxr(rows * cols), gwr(cols), gxs(rows * cols), gws(cols);
  rmsnorm::reference::forward(rows, cols, xd.data(), wd.data(), ropt, yr.data(), rr.data(), nullptr);
  rmsnorm::reference::backward(rows, cols, xd.data(), wd.data(), gyd.data(), ropt, gxr.data(), gwr.data(), gxs.data(),
                               gws.data());

  const double u = rmsnorm::test::ulp(dt, 1.0);  // relative unit of T
  for (int64_t i = 0; i < rows * cols; ++i) {
    EXPECT_NEAR(to_double(y[i]), yr[i], 2 * u * std::fabs(yr[i]) + 1e-6) << "y " << i;
    EXPECT_NEAR(to_double(gx[i]), gxr[i], 2 * u * std::fabs(gxr[i]) + 1e-4 * gxs[i] + 1e-6) << "gx " << i;
  }
  for (int64_t r = 0; r < rows; ++r) EXPECT_NEAR(rstd[r], rr[r], 1e-5 * rr[r]) << "rstd " << r;
  for (int64_t c = 0; c < cols; ++c) {
    EXPECT_NEAR(gw32[c], gwr[c], 1e-4 * gws[c] + 1e-6) << "gw f32 " << c;
    EXPECT_NEAR(to_double(gw_t[c]), gwr[c], 2 * u * std::fabs(gwr[c]) + 1e-4 * gws[c] + 1e-6) << "gw " << c;
    EXPECT_EQ(gw_acc[c], 2.0f * gw32[c]) << "gw accumulate " << c;
  }
}

TYPED_TEST(CppTest, ShapeMismatchIsReportedAndWritesNothing) {
  using T = TypeParam;
  const int64_t rows = 4, cols = 16;
  std::vector<T> x(rows * cols, from_float<T>(1.5f)), w(cols, from_float<T>(0.5f)), gy(rows * cols, from_float<T>(-2.f));
  std::vector<T> out((rows + 1) * cols, from_float<T>(3.0f)), gw(cols + 1, from_float<T>(3.0f));
  std::vector<float> rstd(rows + 1, 7.0f);
  const auto out_before = out;
  const auto rstd_before = rstd;
  const auto gw_before = gw;
  const rmsnorm::Backend be = rmsnorm::Backend::cpu();
  const rmsnorm::Options opt;
  const auto xv = rmsnorm::make_matrix(x.data(), rows, cols);
  const auto wv = rmsnorm::make_vector(w.data(), cols);
  const auto gyv = rmsnorm::make_matrix(gy.data(), rows, cols);
  auto unchanged = [&] {
    return std::memcmp(out.data(), out_before.data(), out.size() * sizeof(T)) == 0 &&
           std::memcmp(rstd.data(), rstd_before.data(), rstd.size() * sizeof(float)) == 0;
  };
  auto expect = [&](rmsnorm::Status got, rmsnorm::Status want, const char* name) {
    EXPECT_EQ(rmsnorm::to_string(got), std::string(rmsnorm::to_string(want)));
    EXPECT_TRUE(names_argument(rmsnorm::last_error(), name)) << rmsnorm::last_error();
    EXPECT_TRUE(unchanged()) << name;
  };
  using rmsnorm::Status;
  expect(rmsnorm::forward(xv, wv, rmsnorm::make_matrix(out.data(), rows + 1, cols), {}, opt, be),
         Status::kInvalidShape, "y");
  expect(rmsnorm::forward(xv, wv, rmsnorm::make_matrix(out.data(), rows, cols - 1, cols), {}, opt, be),
         Status::kInvalidShape, "y");
  expect(rmsnorm::forward(xv, rmsnorm::make_vector(w.data(), cols - 1), rmsnorm::make_matrix(out.data(), rows, cols), {},
                          opt, be),
         Status::kInvalidShape, "weight");
  expect(rmsnorm::forward(xv, {nullptr, cols}, rmsnorm::make_matrix(out.data(), rows, cols), {}, opt, be),
         Status::kNullPointer, "weight");
  expect(rmsnorm::forward(xv, wv, rmsnorm::make_matrix(out.data(), rows, cols), rmsnorm::make_vector(rstd.data(), rows + 1),
                          opt, be),
         Status::kInvalidShape, "rstd");

  const rmsnorm::Workspace ws{};
  const auto gw_none = rmsnorm::GradWeight<T>::none();
  expect(rmsnorm::backward(xv, wv, rmsnorm::make_matrix(gy.data(), rows - 1, cols), {},
                           rmsnorm::make_matrix(out.data(), rows, cols), gw_none, ws, opt, be),
         Status::kInvalidShape, "gy");
  expect(rmsnorm::backward(xv, wv, gyv, {}, rmsnorm::make_matrix(out.data(), rows + 1, cols), gw_none, ws, opt, be),
         Status::kInvalidShape, "gx");
  expect(rmsnorm::backward(xv, wv, gyv, rmsnorm::make_vector(rstd.data(), rows - 1),
                           rmsnorm::make_matrix(out.data(), rows, cols), gw_none, ws, opt, be),
         Status::kInvalidShape, "rstd");
  expect(rmsnorm::backward(xv, wv, gyv, {}, rmsnorm::make_matrix(out.data(), rows, cols),
                           rmsnorm::GradWeight<T>::store(rmsnorm::make_vector(gw.data(), cols + 1)), ws, opt, be),
         Status::kInvalidShape, "gw");
  EXPECT_EQ(std::memcmp(gw.data(), gw_before.data(), gw.size() * sizeof(T)), 0) << "gw written";

  // A C++ failure is followed by the C library's own messages and by "" after success.
  rmsnorm::Options bad = opt;
  bad.eps = -1.0f;
  expect(rmsnorm::forward(xv, wv, rmsnorm::make_matrix(out.data(), rows, cols), {}, bad, be), Status::kInvalidEps,
         "eps");
  EXPECT_EQ(rmsnorm::forward(xv, wv, rmsnorm::make_matrix(out.data(), rows, cols), {}, opt, be), Status::kSuccess);
  EXPECT_STREQ(rmsnorm::last_error(), "");
}

TEST(CppApi, CheckThrowsWithStatusAndMessage) {
  std::vector<float> x(8, 1.0f), y(8, 0.0f);
  try {
    rmsnorm::forward_or_throw(rmsnorm::make_matrix(x.data(), 2, 4), {}, rmsnorm::make_matrix(y.data(), 2, 4, 3), {},
                              rmsnorm::Options{}, rmsnorm::Backend::cpu());
    FAIL() << "no exception";
  } catch (const rmsnorm::Error& e) {
    EXPECT_EQ(e.status(), rmsnorm::Status::kInvalidStride);
    EXPECT_NE(std::string(e.what()).find("RMSNORM_STATUS_INVALID_STRIDE"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("y_row_stride"), std::string::npos) << e.what();
  }
  try {
    rmsnorm::forward_or_throw(rmsnorm::make_matrix(x.data(), 2, 4), {}, rmsnorm::make_matrix(y.data(), 1, 4), {},
                              rmsnorm::Options{}, rmsnorm::Backend::cpu());
    FAIL() << "no exception";
  } catch (const rmsnorm::Error& e) {
    EXPECT_EQ(e.status(), rmsnorm::Status::kInvalidShape);
    EXPECT_TRUE(names_argument(e.what(), "y")) << e.what();
  }
  EXPECT_NO_THROW(rmsnorm::check(rmsnorm::Status::kSuccess));
}

TEST(CppApi, InPlaceThroughViews) {
  std::vector<float> x(3 * 8), y(3 * 8);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>(i + 1);
  const rmsnorm::Backend be = rmsnorm::Backend::cpu(1);
  rmsnorm::check(rmsnorm::forward(rmsnorm::make_matrix(x.data(), 3, 8), {}, rmsnorm::make_matrix(y.data(), 3, 8), {},
                                  rmsnorm::Options{}, be));
  auto xv = rmsnorm::make_matrix(x.data(), 3, 8);
  rmsnorm::check(rmsnorm::forward(xv, {}, xv, {}, rmsnorm::Options{}, be));
  EXPECT_EQ(x, y);
}

}  // namespace
