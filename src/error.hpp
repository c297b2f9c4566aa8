// Per-thread error message behind rmsnorm_last_error().
#pragma once

#include <string>

#include "rmsnorm/rmsnorm.h"

namespace rmsnorm {

void set_last_error(std::string message);
void clear_last_error();

// Records "<what>: <why>" and returns status, so validation reads as
// `return fail(RMSNORM_STATUS_INVALID_EPS, "eps", "must be finite and >= 0");`
rmsnorm_status_t fail(rmsnorm_status_t status, const std::string& what, const std::string& why);

}  // namespace rmsnorm
