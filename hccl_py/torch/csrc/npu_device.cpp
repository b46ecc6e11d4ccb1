// hccl-py's `npu` device: torch's PrivateUse1 backend (renamed "npu" from Python), backed by host
// memory, in torch's open-registration pattern. Built by hccl_py/torch/device.py (torch's
// cpp_extension) for the torch it runs under; torch 2.13.x only (these interfaces are private).
//
// - Memory: an allocator that hands out 512-byte-aligned host blocks and books them against the
//   simulated card's HBM (a limit set from Python), with CANN-like pool bookkeeping (reserved grows
//   in whole segments; reserving is bookkeeping, host memory backs live tensors only). Past the
//   card's HBM, or past what the host has free, torch's OutOfMemoryError, never an OOM kill.
// - Modeled time: kernels, the pool's growth and copies between host memory and a card are logged
//   in order; Python charges them to the card (hccl_py/torch/npu.py, charge_kernels).
// - Device guard: N devices (set from Python), a current device and current stream per thread,
//   events whose stamps are the card's *modeled* clock (a Python callable set from Python).
// - Kernels: factories, views, copies and set_ natively; every other op through one boxed
//   fallback that runs torch's CPU kernel on zero-copy CPU aliases of the npu tensors (the bytes
//   are host memory already) and hands the results back as npu tensors without a copy; an op
//   given tensors of two cards is refused, as torch refuses one given two CUDA devices.
//   Convolutions, which torch sends a private-use device as convolution_overrideable, run the
//   CPU's convolution the same way.
#include <torch/extension.h>

#include <ATen/EmptyTensor.h>
#include <ATen/OpMathType.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/core/op_registration/adaption.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/SDPBackend.h>
#include <ATen/TensorUtils.h>
#include <ATen/ops/_fused_sdp_choice_cpu_dispatch.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include <array>
#include <cmath>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

// The device's parts, in the order they build on one another (one translation unit: torch's
// headers are parsed once, so the build takes what a single file took).
#include "state.h"
#include "runtime_allocator.h"
#include "runtime_guard.h"
#include "aten_basics.h"
#include "aten_fallback.h"
#include "aten_kernels.h"
#include "aten_register.h"
#include "amp.h"
#include "module.h"
