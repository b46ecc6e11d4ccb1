// Part of hccl-py's npu device: included once, in order, by npu_device.cpp, its one translation
// unit (after the headers it needs); not a header to include elsewhere.
// ATen: the kernels a backend serves itself (resize_, set_, copies), the device checks every
// op passes, and the kernel log's recording.
#pragma once

namespace hccl_npu {

// --- kernels ------------------------------------------------------------------------------------
constexpr c10::DispatchKeySet kNpuKeys(c10::DispatchKey::PrivateUse1);

c10::DeviceIndex index_of(std::optional<at::Device> device) {
  return device.has_value() && device->has_index() ? device->index() : t_device;
}

at::Tensor npu_empty(at::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                     std::optional<at::Device> device, std::optional<bool>, std::optional<at::MemoryFormat> format) {
  c10::DeviceGuard guard(c10::Device(kNpu, index_of(device)));
  return at::detail::empty_generic(size, &g_allocator, kNpuKeys, c10::dtype_or_default(dtype), format);
}

at::Tensor npu_empty_strided(at::IntArrayRef size, at::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                             std::optional<at::Layout>, std::optional<at::Device> device, std::optional<bool>) {
  c10::DeviceGuard guard(c10::Device(kNpu, index_of(device)));
  return at::detail::empty_strided_generic(size, stride, &g_allocator, kNpuKeys, c10::dtype_or_default(dtype));
}

// Grow a storage to `nbytes` (contents kept): a new block from the pool.
void grow_storage(const c10::Storage& storage, size_t nbytes) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  if (nbytes <= impl->nbytes() && impl->data() != nullptr) return;
  TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");  // e.g. one opened_shared
  c10::DeviceGuard guard(storage.device());
  at::DataPtr fresh = g_allocator.allocate(nbytes);
  if (impl->nbytes() > 0 && impl->data() != nullptr) std::memcpy(fresh.get(), impl->data(), std::min(nbytes, impl->nbytes()));
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(nbytes);
}

// Storage.resize_ (Python's untyped_storage().resize_(n), as FSDP frees a parameter with resize_(0)):
// as CUDA's, a block of exactly `newsize` bytes (contents kept up to the smaller size), and the old
// block goes back to the pool, so a storage shrunk or freed this way is booked as freed.
void NpuHooks::resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
  if (newsize == impl->nbytes() && (newsize == 0 || impl->data() != nullptr)) return;
  c10::DeviceGuard guard(storage.device());
  at::DataPtr fresh = g_allocator.allocate(newsize);
  size_t kept = std::min(newsize, impl->nbytes());
  if (kept > 0 && impl->data() != nullptr) std::memcpy(fresh.get(), impl->data(), kept);
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(newsize);
}

const at::Tensor& npu_resize_(const at::Tensor& self, at::IntArrayRef size, std::optional<at::MemoryFormat> format) {
  if (self.sizes() == size && (!format.has_value() || *format == at::MemoryFormat::Preserve)) return self;  // as CPU's
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  if (format.has_value() && *format != at::MemoryFormat::Preserve) impl->empty_tensor_restride(*format);
  size_t needed = at::detail::computeStorageNbytes(size, self.strides(), self.dtype().itemsize(), self.storage_offset());
  if (self.numel() > 0) grow_storage(self.storage(), needed);
  return self;
}

at::Tensor& npu_set_storage(at::Tensor& self, c10::Storage source, int64_t offset, at::IntArrayRef size,
                            at::IntArrayRef stride) {
  // torch's checkSetStorage, as CPU's and CUDA's set_ run it: a tensor never shows another
  // device's storage (a card's tensor over CPU bytes, or over another card's HBM).
  TORCH_CHECK(self.storage().device() == source.device(), "Attempted to set the storage of a tensor on device \"",
              self.storage().device(), "\" to a storage on different device \"", source.device(),
              "\".  This is no longer allowed; the devices must match.");
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  impl->set_sizes_and_strides(size, stride, offset);
  size_t needed = self.numel() == 0 ? 0 : at::detail::computeStorageNbytes(size, stride, self.dtype().itemsize(), offset);
  if (needed > 0) grow_storage(self.storage(), needed);
  return self;
}

at::Tensor& npu_set_source_storage(at::Tensor& self, c10::Storage source) {
  int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return npu_set_storage(self, source, 0, {n}, {1});
}

at::Tensor& npu_set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  return npu_set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& npu_set_empty(at::Tensor& self) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, g_allocator.allocate(0), &g_allocator, true);
  return npu_set_storage(self, empty, 0, {0}, {});
}

void record_kernel(Kernel kernel);

// A copy: the bytes move through the CPU aliases (the card's HBM is host memory here). A copy
// between host memory and a card (.to("npu"), .cpu(), copy_ either way, non_blocking or not) is
// logged for the card's modeled clock, which charges it the card's host route (its PCIe link).
at::Tensor npu_copy_from(const at::Tensor& self, const at::Tensor& dst, bool) {
  if (is_npu(self) != is_npu(dst) && g_recording.load(std::memory_order_relaxed)) {
    const at::Tensor& card_side = is_npu(dst) ? dst : self;  // the bytes that land in or leave HBM
    int64_t nbytes = card_side.numel() * card_side.element_size();
    if (nbytes > 0)
      record_kernel({"aclrtMemcpy", 0, 0, 0, 1, nbytes, c10::toString(card_side.scalar_type()),
                     is_npu(dst) ? kHostToDevice : kDeviceToHost});
  }
  SharedStorages shared;
  at::Tensor src_view = is_npu(self) ? as_cpu(self, &shared) : self;
  at::Tensor dst_view = is_npu(dst) ? as_cpu(dst, &shared) : dst;
  // A lazily conjugated or negated npu view: its CPU alias shows the bytes, so apply the flag here.
  if (is_npu(self) && self.is_conj()) src_view = src_view.conj();
  if (is_npu(self) && self.is_neg()) src_view = src_view._neg_view();
  TORCH_CHECK(!(is_npu(dst) && (dst.is_conj() || dst.is_neg())),
              "copy into a conjugated or negated npu view is not supported: resolve_conj()/resolve_neg() it first");
  dst_view.copy_(src_view);
  return dst;
}

at::Tensor npu_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return npu_copy_from(self, dst, false);
}

// Whether `param.data = other` may keep `param` and swap its contents (torch asks before
// Module.to / .npu() and when FSDP moves a parameter). torch's own answer knows only its built-in
// dense devices, so a CPU parameter moved to npu became a new Parameter object, and an optimizer
// built before `model.to(rank)` (as most training scripts do) updated the old CPU tensors while
// the model trained on untouched npu ones. Dense CPU and npu tensors are compatible, as CPU and
// CUDA ones are (torch's TensorImpl comment points backends here).
bool npu_has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && !t.is_quantized() && (t.device().is_cpu() || is_npu(t));
  };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) || (dense(self) && dense(from));
}

void npu_record_stream(at::Tensor&, c10::Stream) {}  // nothing to keep: blocks are freed when their tensor is

int64_t tensor_bytes(const c10::IValue& value) {
  int64_t total = 0;
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (t.defined()) total += t.numel() * t.element_size();
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList()) total += t.defined() ? t.numel() * t.element_size() : 0;
  }
  return total;
}

// The two operands of the matmul family (mm, bmm, addmm, baddbmm, mv, dot, ...), or -1.
int matmul_operand(const std::string& name) {
  static const std::unordered_map<std::string, int> first = {
      {"aten::mm", 0}, {"aten::bmm", 0}, {"aten::mv", 0}, {"aten::dot", 0}, {"aten::vdot", 0},
      {"aten::addmm", 1}, {"aten::addmm_", 1}, {"aten::baddbmm", 1}, {"aten::baddbmm_", 1}, {"aten::addbmm", 1},
      {"aten::addbmm_", 1}, {"aten::addmv", 1}, {"aten::addmv_", 1}, {"aten::_addmm_activation", 1}};
  auto found = first.find(name);
  return found == first.end() ? -1 : found->second;
}

// Attention's fused kernel (the CPU's, which npu attention runs): its matmuls as `passes` products
// of L x E by E x S per batch and head, the query and key at `query`, `query` + 1. Forward: Q.K^T
// and P.V; backward: Q.K^T again, then dP, dV, dQ and dK. Returns the pass count, or 0.
int64_t attention_passes(const std::string& name, int* query) {
  static const std::unordered_map<std::string, std::pair<int, int64_t>> ops = {
      {"aten::_scaled_dot_product_flash_attention_for_cpu", {0, 2}},
      {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", {1, 5}}};
  auto found = ops.find(name);
  if (found == ops.end()) return 0;
  *query = found->second.first;
  return found->second.second;
}

// The card an op runs on: every npu tensor it is given must be on one card, as torch asks of CUDA
// tensors (with torch's message), since a card reads only its own HBM. CPU tensors are let through
// (the CPU kernels here take them). Copies between cards (copy_, .to("npu:1")) do not come here.
struct OneCard {
  const char* method;
  std::optional<c10::Device> common;
  void check(const char* arg, const at::Tensor& t) {
    if (!is_npu(t)) return;
    if (!common) {
      common = t.device();
      return;
    }
    TORCH_CHECK(t.device() == *common, "Expected all tensors to be on the same device, but got ", arg, " is on ",
                t.device(), ", different from other tensors on ", *common, " (when checking argument in method ",
                method, ")");
  }
};

// Ops whose CUDA kernels are a TensorIterator over all their tensors (where: native_functions.yaml
// gives it `device_check: NoCheck` for that reason): the iterator lets a CPU tensor beside a card's
// through only as a 0-dim scalar, and refuses any other with its own message.
bool iterates_devices(const std::string& name) { return name == "aten::where"; }

void check_cpu_scalars_only(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t begin) {
  // The iterator's device is the output's; without out= torch makes it on the first card given.
  std::optional<c10::Device> common;
  const auto& args = schema.arguments();
  for (int pass = 0; pass < 2 && !common; ++pass) {
    for (size_t i = 0; i < args.size() && !common; ++i) {
      const auto& value = stack[begin + i];
      if ((pass == 0) == args[i].is_out() && value.isTensor() && is_npu(value.toTensor())) common = value.toTensor().device();
    }
  }
  if (!common) return;
  for (int pass = 0; pass < 2; ++pass) {  // outputs first, as the iterator adds them
    for (size_t i = 0; i < args.size(); ++i) {
      if ((pass == 0) != args[i].is_out() || !stack[begin + i].isTensor()) continue;
      const at::Tensor& t = stack[begin + i].toTensor();
      if (!t.defined() || (t.device().is_cpu() && t.dim() == 0)) continue;
      TORCH_CHECK(t.device() == *common, "Expected all tensors to be on the same device, but found at least two devices, ",
                  *common, " and ", t.device(), "!");
    }
  }
}

// Ops whose tensors may sit on several cards, as on CUDA: the _foreach_ family takes lists that
// torch groups by device only on its fast path.
bool spans_cards(const std::string& name) {
  return name.rfind("aten::_foreach_", 0) == 0 || name.rfind("aten::_amp_foreach_", 0) == 0;
}

// The ops whose kernels torch generates with a device check (native_functions.yaml without
// `device_check: NoCheck`), by "aten::name[.overload]", each with its wrapper's name for the
// message; set from Python (device.device_checked_ops) when the device is installed. On CUDA, and on
// Ascend, such an op refuses any two tensors on different devices, a CPU tensor beside a card's
// included (mm(npu, cpu) fails on the card): the same check runs here before the CPU kernel, which
// would take them, so a program that mixes them fails here as it will on the cluster.
std::unordered_map<std::string, std::string> g_device_checked;

void set_device_checks(std::unordered_map<std::string, std::string> ops) { g_device_checked = std::move(ops); }

// torch's generated check: the out= arguments, then the positional ones (not the keyword-only),
// every defined tensor on one device, with torch's own message naming the first that is not.
const char* checked_method(const std::string& op) {  // nullptr: the op checks no devices
  auto found = g_device_checked.find(op);
  return found == g_device_checked.end() ? nullptr : found->second.c_str();
}

void check_common_device(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t begin) {
  if (g_device_checked.empty()) return;
  const char* method =
      checked_method(schema.overload_name().empty() ? schema.name() : schema.name() + "." + schema.overload_name());
  if (method == nullptr) return;
  std::optional<c10::Device> common;
  const auto& args = schema.arguments();
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < args.size(); ++i) {
      const bool out = args[i].is_out();
      if (pass == 0 ? !out : (out || args[i].kwarg_only())) continue;
      const auto& value = stack[begin + i];
      const char* name = args[i].name().c_str();
      if (value.isTensor()) {
        c10::impl::check_and_update_common_device(common, value.toTensor(), method, name);
      } else if (value.isTensorList()) {
        for (const at::Tensor& t : value.toTensorList()) c10::impl::check_and_update_common_device(common, t, method, name);
      } else if (value.isOptionalTensorList()) {
        for (const std::optional<at::Tensor>& t : value.toOptionalTensorList())
          if (t.has_value()) c10::impl::check_and_update_common_device(common, *t, method, name);
      }
    }
  }
}

// The same check for an op this file registers a kernel of directly (the fallback never sees it):
// its tensor arguments in the schema's order, undefined ones (an absent optional) skipped.
void check_devices(const char* op, std::initializer_list<std::pair<const char*, at::Tensor>> tensors) {
  const char* method = checked_method(op);
  if (method == nullptr) return;
  std::optional<c10::Device> common;
  for (const auto& [name, t] : tensors) c10::impl::check_and_update_common_device(common, t, method, name);
}

at::Tensor or_undefined(const std::optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }

// Log a kernel for the card's modeled compute clock (charged from Python when the log fills or
// the clock is read).
void record_kernel(Kernel kernel) {
  size_t logged;
  {
    std::lock_guard<std::mutex> lock(g_kernels_mu);
    g_kernels.push_back(std::move(kernel));
    logged = g_kernels.size();
  }
  if (logged >= kKernelLogFlush && g_flush != nullptr && python_usable()) {
    py::gil_scoped_acquire gil;
    if (g_flush != nullptr) g_flush->operator()();
  }
}

}  // namespace hccl_npu
