// The eager autograd of rms_norm as a C++ node: rmsnorm::forward_autograd(x, weight?, eps, flags) -> y, whose
// backward calls rmsnorm::backward (both operators are _ops.so's, reached through the dispatcher).
//
// Why a second extension, on the regular (version-specific) C++ API: the stable ABI has no way to define an autograd
// node, and a Python torch.autograd.Function costs its forward and, on CUDA, its backward on the autograd engine's
// device thread, a Python call with the GIL taken from that thread. On the H200 machine a no-op Function's
// forward + backward at 1 x 4096 took 164 us per call against 124 for a C++ node (the built-in multiply), about as
// much as F.rms_norm's whole host cost above its kernels. This module is built against the torch it is compiled
// with, and the Python layer loads it only when the running torch is that same version (rmsnorm/_build_info.py);
// otherwise the Python Function (rmsnorm._EagerRMSNorm) is the eager path, with the same arithmetic and bits.
//
// torch.compile, functorch transforms and direct calls of rmsnorm::forward keep its registered Python autograd;
// this operator is for eager calls (with grad mode on and an input that requires grad). Below autograd it is the
// forward's y (CompositeExplicitAutograd).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

const c10::TypedOperatorHandle<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const std::optional<at::Tensor>&,
                                                                  double, int64_t)>&
forward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("rmsnorm::forward", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&,
                                                                       const std::optional<at::Tensor>&, double, int64_t)>();
  return op;
}

const c10::TypedOperatorHandle<std::tuple<at::Tensor, std::optional<at::Tensor>>(
    const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, const at::Tensor&, int64_t,
    std::optional<c10::ScalarType>)>&
backward_op() {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("rmsnorm::backward", "")
          .typed<std::tuple<at::Tensor, std::optional<at::Tensor>>(const at::Tensor&, const at::Tensor&,
                                                                   const std::optional<at::Tensor>&, const at::Tensor&,
                                                                   int64_t, std::optional<c10::ScalarType>)>();
  return op;
}

struct RMSNormFunction : torch::autograd::Function<RMSNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const std::optional<at::Tensor>& weight,
                            double eps, int64_t flags) {
    at::Tensor y, rstd;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      std::tie(y, rstd) = forward_op().call(x, weight, eps, flags);
    }
    const bool has_weight = weight.has_value() && weight->defined();
    ctx->save_for_backward({x, has_weight ? *weight : at::Tensor(), rstd});
    ctx->saved_data["flags"] = flags;
    ctx->saved_data["eps"] = eps;
    return y;
  }

  // The backward under create_graph=True (double backward): rmsnorm._backward_formula's float32 ATen ops, which
  // autograd can differentiate (the kernels' backward cannot). Values match the kernels' to float32 rounding.
  static variable_list differentiable_backward(const at::Tensor& gy, const at::Tensor& x, const at::Tensor& w,
                                               double eps, int64_t flags, bool need_gx, bool need_gw) {
    const at::Tensor xf = x.to(at::kFloat);
    // r over the whole fp32 range, as rmsnorm._formula_rstd computes it: each row scaled by the power of two s that
    // brings its largest |x| into [0.5, 1) (detached), r = s / sqrt(mean((x s)^2) + eps s^2) per row in float64.
    const at::Tensor m = xf.detach().abs().amax(-1, /*keepdim=*/true);
    const at::Tensor s = at::ldexp(at::ones_like(m), -std::get<1>(at::frexp(m)).clamp(-126, 126));
    const at::Tensor ms = (xf * s).pow(2).mean(-1, /*keepdim=*/true).to(at::kDouble);
    const at::Tensor sd = s.to(at::kDouble);
    const at::Tensor r = (sd * (ms + eps * sd * sd).rsqrt()).to(at::kFloat);
    const at::Tensor xh = xf * r;
    at::Tensor g = gy.to(at::kFloat);
    at::Tensor gw;
    if (need_gw) gw = (g * xh).reshape({-1, x.size(-1)}).sum(0).to(w.scalar_type());
    if (w.defined()) {
      const at::Tensor wf = w.to(at::kFloat);
      g = g * ((flags & 1) != 0 ? wf + 1.0 : wf);  // RMSNORM_FLAG_WEIGHT_OFFSET: w' = 1 + w
    }
    const at::Tensor gx = (r * (g - xh * (g * xh).mean(-1, /*keepdim=*/true))).to(x.scalar_type());
    return {need_gx ? gx : at::Tensor(), gw, at::Tensor(), at::Tensor()};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor& rstd = saved[2];
    const int64_t flags = ctx->saved_data["flags"].toInt();
    // Edges exist for the tensor inputs only: x is edge 0, the weight (when given) edge 1.
    const bool need_gx = ctx->needs_input_grad(0);
    const bool need_gw = w.defined() && ctx->needs_input_grad(1);
    if (at::GradMode::is_enabled())
      return differentiable_backward(grads[0], x, w, ctx->saved_data["eps"].toDouble(), flags, need_gx, need_gw);
    std::optional<at::Tensor> w_opt;
    if (w.defined()) w_opt = w;
    // round_xhat changes the forward's rounding only; the gradient is that of the exact formula (as in Python).
    auto [gx, gw] = backward_op().call(grads[0], x, w_opt, rstd, flags,
                                       need_gw ? std::optional<c10::ScalarType>(w.scalar_type()) : std::nullopt);
    return {need_gx ? gx : at::Tensor(), gw.has_value() ? *gw : at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor forward_autograd(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps, int64_t flags) {
  return RMSNormFunction::apply(x, weight, eps, flags);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(rmsnorm, m) {
  m.def("forward_autograd(Tensor x, Tensor? weight, float eps, int flags) -> Tensor");
}

TORCH_LIBRARY_IMPL(rmsnorm, Autograd, m) { m.impl("forward_autograd", &forward_autograd); }

// Below autograd (a caller's _AutoDispatchBelowAutograd, say) the operator is the forward's y.
TORCH_LIBRARY_IMPL(rmsnorm, CompositeExplicitAutograd, m) {
  m.impl("forward_autograd", [](const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                                int64_t flags) { return std::get<0>(forward_op().call(x, weight, eps, flags)); });
}
