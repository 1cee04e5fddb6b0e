// RMSNorm over the last dim of a (rows, D) float32 matrix, forward and backward, one pass over the rows each
// (PyTorch's eager ops make ~13 passes for the two). phasekv/kernels/__init__.py builds and loads this file;
// phasekv.attention.norm.reference_rms_norm is the definition the tests hold it to:
//   y = w * x * rstd,  rstd = 1 / sqrt(mean(x^2) + eps)
//   dx = rstd * (dy * w - x * rstd^2 * mean(dy * w * x)),  dw = sum over rows of dy * x * rstd
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>  // not torch/extension.h (all of libtorch's C++ API): a build in ~15 s, not ~25

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

constexpr int64_t kRowsPerPartial = 256;  // dw is summed in float over this many rows, then in double

void check(const at::Tensor& t, int64_t dim, const char* name) {
  TORCH_CHECK(t.dim() == dim && t.is_contiguous() && t.scalar_type() == at::kFloat && t.device().is_cpu(), name,
              ": a contiguous float32 CPU tensor of ", dim, " dims expected");
}

}  // namespace

std::vector<at::Tensor> rms_norm_forward(const at::Tensor& x, const at::Tensor& w, double eps) {
  check(x, 2, "x");
  check(w, 1, "w");
  TORCH_CHECK(w.size(0) == x.size(1), "w has ", w.size(0), " elements for rows of ", x.size(1));
  const int64_t R = x.size(0), D = x.size(1);
  at::Tensor y = at::empty_like(x), rstd = at::empty({R}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  float* rp = rstd.data_ptr<float>();
  const float e = static_cast<float>(eps);
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = xp + r * D;
    float* yr = yp + r * D;
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < D; ++i) s += xr[i] * xr[i];
    const float k = 1.f / std::sqrt(s / static_cast<float>(D) + e);
    rp[r] = k;
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) yr[i] = wp[i] * (xr[i] * k);
  }
  return {y, rstd};
}

std::vector<at::Tensor> rms_norm_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                                          const at::Tensor& rstd) {
  check(dy, 2, "dy");
  check(x, 2, "x");
  check(w, 1, "w");
  check(rstd, 1, "rstd");
  TORCH_CHECK(dy.sizes() == x.sizes() && rstd.size(0) == x.size(0) && w.size(0) == x.size(1), "shapes disagree");
  const int64_t R = x.size(0), D = x.size(1);
  at::Tensor dx = at::empty_like(x);
  const float* gp = dy.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  const float* rp = rstd.data_ptr<float>();
  float* dxp = dx.data_ptr<float>();
  at::Tensor dw = at::zeros({D}, x.options().dtype(at::kDouble));
  double* dwp = dw.data_ptr<double>();
  std::vector<float> part(static_cast<size_t>(D));  // dw of a chunk of rows, in float; chunks add up in double
  float* pp = part.data();
  for (int64_t r0 = 0; r0 < R; r0 += kRowsPerPartial) {
    std::fill(part.begin(), part.end(), 0.f);
    for (int64_t r = r0; r < std::min(R, r0 + kRowsPerPartial); ++r) {
      const float* gr = gp + r * D;
      const float* xr = xp + r * D;
      float* dr = dxp + r * D;
      const float k = rp[r];
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < D; ++i) s += gr[i] * wp[i] * xr[i];
      const float a = s * k * k / static_cast<float>(D);
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) {
        dr[i] = k * (gr[i] * wp[i] - xr[i] * a);
        pp[i] += gr[i] * xr[i] * k;
      }
    }
    for (int64_t i = 0; i < D; ++i) dwp[i] += pp[i];
  }
  return {dx, dw.to(at::kFloat)};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm_forward", &rms_norm_forward, "RMSNorm forward: (y, rstd) of x (rows, D), w (D,)");
  m.def("rms_norm_backward", &rms_norm_backward, "RMSNorm backward: (dx, dw) of dy, x (rows, D), w (D,), rstd (rows,)");
}
