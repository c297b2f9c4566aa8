// rmsnorm::GwMode, the C++ name of rmsnorm_gw_mode_t: its own header so that
// code needing only the enum (the library's internals) does not pull in the
// whole C++ API of rmsnorm.hpp, which includes it.
#pragma once

#include <cstdint>

#include "rmsnorm/rmsnorm.h"

namespace rmsnorm {

// Same values as rmsnorm_gw_mode_t.
enum class GwMode : int32_t {
  kNone = RMSNORM_GW_NONE,
  kStore = RMSNORM_GW_STORE,
  kStoreF32 = RMSNORM_GW_STORE_F32,
  kAccumulate = RMSNORM_GW_ACCUMULATE,
  kAccumulateF32 = RMSNORM_GW_ACCUMULATE_F32,
};

}  // namespace rmsnorm
