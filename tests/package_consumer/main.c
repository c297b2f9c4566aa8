/* Downstream smoke test: the installed C header and library, from C99.
 * Normalizes a 2 x 4 f32 matrix on the CPU and checks one row by hand:
 * x = (1, 2, 3, 4), mean(x^2) = 7.5, so y = x / sqrt(7.5 + eps) * w. */
#include <math.h>
#include <stdio.h>

#include <rmsnorm/rmsnorm.h>

int main(void) {
  const float x[8] = {1, 2, 3, 4, -4, -3, -2, -1};
  const float w[4] = {1.0f, 0.5f, 2.0f, 1.0f};
  float y[8];
  float rstd[2];
  rmsnorm_problem_t p = rmsnorm_problem_default();
  rmsnorm_backend_t be = rmsnorm_backend_cpu(1);
  rmsnorm_status_t s;
  int i;
  const double r = 1.0 / sqrt(7.5 + 1e-5);

  p.rows = 2;
  p.cols = 4;
  p.dtype = RMSNORM_DTYPE_F32;
  s = rmsnorm_forward(&p, x, 4, w, y, 4, rstd, &be);
  if (s != RMSNORM_STATUS_SUCCESS) {
    fprintf(stderr, "rmsnorm_forward: %s: %s\n", rmsnorm_status_string(s), rmsnorm_last_error());
    return 1;
  }
  for (i = 0; i < 4; ++i) {
    const double want = x[i] * r * w[i];
    if (fabs(y[i] - want) > 1e-6 * fabs(want) + 1e-7) {
      fprintf(stderr, "y[%d] = %.9g, expected %.9g\n", i, y[i], want);
      return 1;
    }
  }
  if (fabs(rstd[0] - r) > 1e-6 * r) {
    fprintf(stderr, "rstd[0] = %.9g, expected %.9g\n", rstd[0], r);
    return 1;
  }
  /* A bad argument comes back as a status, with the argument named. */
  p.eps = -1.0f;
  s = rmsnorm_forward(&p, x, 4, w, y, 4, rstd, &be);
  if (s != RMSNORM_STATUS_INVALID_EPS) {
    fprintf(stderr, "negative eps gave %s\n", rmsnorm_status_string(s));
    return 1;
  }
  /* The library linked is the one the header describes. */
  if (rmsnorm_version() != RMSNORM_VERSION) {
    fprintf(stderr, "library version %d, header %d\n", (int)rmsnorm_version(), RMSNORM_VERSION);
    return 1;
  }
  printf("rmsnorm consumer: ok (rmsnorm %d.%d.%d, CUDA available: %d)\n", RMSNORM_VERSION_MAJOR,
         RMSNORM_VERSION_MINOR, RMSNORM_VERSION_PATCH, rmsnorm_cuda_available());
  return 0;
}
