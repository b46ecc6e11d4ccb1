// Part of hccl-py's npu device: included once, in order, by npu_device.cpp, its one translation
// unit (after the headers it needs); not a header to include elsewhere.
// AMP: torch.autocast("npu")'s cast policies.
#pragma once

// --- autocast: torch.autocast("npu"), torch.npu.amp.autocast -------------------------------------------
// torch casts under autocast for a private-use device only through kernels that the device registers
// under AutocastPrivateUse1 (torch_npu registers its own on Ascend; without any, autocast on npu ran
// every op in float32). These are torch's own op lists per cast policy (ATen/autocast_mode.h offers
// them for backends to reuse): matmuls, convolutions, linear and RNN cells in the lower precision
// (torch.get_autocast_dtype("npu"), float16 by default), losses, norms, exp/log and reductions in
// float32, mixed-precision ops at the widest input type. Every other op passes through.
namespace hccl_npu_autocast {
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

#define HCCL_NPU_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define HCCL_NPU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define HCCL_NPU_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define HCCL_NPU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(HCCL_NPU_LOWER_PRECISION_FP)
  AT_FORALL_FP32(HCCL_NPU_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(HCCL_NPU_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(HCCL_NPU_PROMOTE)
}
}  // namespace hccl_npu_autocast
