// Part of hccl-py's npu device: included once, in order, by npu_device.cpp, its one translation
// unit (after the headers it needs); not a header to include elsewhere.
// ATen: the boxed fallback (torch's CPU kernel on zero-copy CPU aliases), attention and
// convolutions.
#pragma once

namespace hccl_npu {

// Every other op: torch's CPU kernel on zero-copy CPU aliases, results handed back as npu tensors.
void npu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto num_args = schema.arguments().size();
  const auto begin = stack->size() - num_args;
  std::optional<c10::DeviceIndex> device;
  std::unordered_map<c10::StorageImpl*, c10::Storage> npu_of;  // CPU alias storage -> the npu storage it shows
  struct Written { at::Tensor npu, cpu; };
  std::vector<Written> written;
  SharedStorages shared;
  check_common_device(schema, *stack, begin);
  if (iterates_devices(schema.name())) check_cpu_scalars_only(schema, *stack, begin);
  OneCard card{schema.name().c_str(), std::nullopt};
  const bool any_card = spans_cards(schema.name());
  auto alias = [&](const at::Tensor& t, bool write, const char* arg) -> at::Tensor {
    if (!is_npu(t)) return t;
    if (!any_card) card.check(arg, t);
    TORCH_CHECK(!t.is_conj() && !t.is_neg(), op.schema().name(), " on a lazily conjugated or negated npu tensor is not "
                "supported by hccl-py's npu device: call .resolve_conj() / .resolve_neg() on it first");
    if (!device) device = t.device().index();
    at::Tensor c = as_cpu(t, &shared);
    npu_of.emplace(c.storage().unsafeGetStorageImpl(), t.storage());
    if (write) written.push_back({t, c});
    return c;
  };
  for (size_t i = 0; i < num_args; ++i) {
    auto& value = (*stack)[begin + i];
    const auto* info = schema.arguments()[i].alias_info();
    const bool write = info != nullptr && info->isWrite();
    const char* arg = schema.arguments()[i].name().c_str();
    if (value.isTensor()) {
      value = alias(value.toTensor(), write, arg);
    } else if (value.isTensorList()) {
      auto list = value.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(list.size());
      for (const at::Tensor& t : list) out.push_back(alias(t, write, arg));
      value = out;
    } else if (value.isOptionalTensorList()) {
      auto list = value.toOptionalTensorList();
      c10::List<std::optional<at::Tensor>> out;
      for (const std::optional<at::Tensor>& t : list)
        out.push_back(t.has_value() ? std::optional<at::Tensor>(alias(*t, write, arg)) : t);
      value = out;
    } else if (value.isDevice() && value.toDevice().type() == kNpu) {
      if (!device) device = index_of(value.toDevice());
      value = c10::IValue(c10::Device(c10::kCPU));
    }
  }
  const c10::DeviceIndex where = device.value_or(t_device);
  c10::DeviceGuard guard(c10::Device(kNpu, where));
  // What the kernel reads (its arguments) is measured before it runs; what it writes after.
  int64_t in_bytes = 0;
  std::string dtype;
  const bool recording = device.has_value() && g_recording.load(std::memory_order_relaxed);
  if (recording) {
    for (size_t i = 0; i < num_args; ++i) {
      const auto& value = (*stack)[begin + i];
      in_bytes += tensor_bytes(value);
      if (dtype.empty() && value.isTensor() && value.toTensor().defined())
        dtype = c10::toString(value.toTensor().scalar_type());
    }
  }
  Kernel matmul_dims{"", 0, 0, 0, 1, 0, ""};
  if (recording) {
    int first = matmul_operand(schema.name());
    if (first >= 0 && num_args > size_t(first + 1) && (*stack)[begin + first].isTensor() &&
        (*stack)[begin + first + 1].isTensor()) {
      const at::Tensor& a = (*stack)[begin + first].toTensor();
      const at::Tensor& b = (*stack)[begin + first + 1].toTensor();
      matmul_dims = {"", a.dim() >= 2 ? a.size(-2) : 1, b.dim() >= 2 ? b.size(-1) : 1, a.dim() >= 1 ? a.size(-1) : 1,
                     a.dim() >= 3 ? a.size(0) : 1, 0, ""};
    }
    int query = 0;
    int64_t passes = attention_passes(schema.name(), &query);
    if (passes > 0 && (*stack)[begin + query].isTensor() && (*stack)[begin + query + 1].isTensor()) {
      const at::Tensor& q = (*stack)[begin + query].toTensor();
      const at::Tensor& k = (*stack)[begin + query + 1].toTensor();
      if (q.dim() >= 2 && k.dim() >= 2 && q.size(-2) * q.size(-1) > 0) {
        matmul_dims = {"", q.size(-2), k.size(-2), q.size(-1), q.numel() / (q.size(-2) * q.size(-1)) * passes, 0, ""};
      }
    }
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  // Arguments the kernel wrote and resized into new memory: the npu tensor now shows that memory.
  for (auto& w : written) {
    if (w.cpu.storage().unsafeGetStorageImpl() != nullptr && w.cpu.storage().data() != w.npu.storage().data()) {
      auto storage = npu_storage_of(w.cpu.storage(), where);
      w.npu.unsafeGetTensorImpl()->set_storage_keep_dtype(storage);
    }
    if (w.npu.sizes() != w.cpu.sizes() || w.npu.strides() != w.cpu.strides() ||
        w.npu.storage_offset() != w.cpu.storage_offset()) {
      w.npu.unsafeGetTensorImpl()->set_sizes_and_strides(w.cpu.sizes(), w.cpu.strides(), w.cpu.storage_offset());
    }
  }
  std::unordered_map<c10::TensorImpl*, at::Tensor> npu_tensor_of;
  for (auto& w : written) npu_tensor_of.emplace(w.cpu.unsafeGetTensorImpl(), w.npu);
  auto back = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || t.device().type() != c10::kCPU) return t;
    auto same = npu_tensor_of.find(t.unsafeGetTensorImpl());
    if (same != npu_tensor_of.end()) return same->second;  // in-place and out= ops return their argument
    auto shown = npu_of.find(t.storage().unsafeGetStorageImpl());
    c10::Storage storage = shown != npu_of.end() ? shown->second : npu_storage_of(t.storage(), where);
    auto result = with_storage(storage, kNpuKeys, t);
    return result;
  };
  const auto num_returns = schema.returns().size();
  const auto rbegin = stack->size() - num_returns;
  int64_t out_bytes = 0;  // results the kernel made (those that are its arguments were counted as read)
  if (recording) {
    for (size_t i = 0; i < num_returns; ++i) {
      const auto& value = (*stack)[rbegin + i];
      if (value.isTensor() && npu_tensor_of.count(value.toTensor().unsafeGetTensorImpl())) continue;
      out_bytes += tensor_bytes(value);
    }
  }
  // The results are booked on the card first (a pool that grows for them does so before the
  // kernel runs, as a real allocator's would), then the kernel is logged.
  for (size_t i = 0; i < num_returns; ++i) {
    auto& value = (*stack)[rbegin + i];
    if (value.isTensor()) {
      value = back(value.toTensor());
    } else if (value.isTensorList()) {
      auto list = value.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(list.size());
      for (const at::Tensor& t : list) out.push_back(back(t));
      value = out;
    }
  }
  if (recording)
    record_kernel({schema.name(), matmul_dims.m, matmul_dims.n, matmul_dims.k, matmul_dims.batch, in_bytes + out_bytes,
                   dtype});
}

// Attention. scaled_dot_product_attention picks its kernel through a dispatch stub, not the
// dispatcher, and a device without a stub gets the math decomposition (other numbers than the
// CPU's). npu takes the CPU's choice (it reads only shapes, dtypes and the sdpa_kernel flags), and
// runs the CPU's fused flash kernel where the CPU would. That kernel is served to torch as the
// efficient-attention op, because DTensor shards that op (by heads or by batch) and has no rule
// for the CPU's own op, so tensor-parallel attention runs on npu (it does not on CPU/gloo). The
// numbers are the CPU kernel's; torch's contract for the op (its meta kernel) is kept: the
// logsumexp's last dim rounded up to 32 (0 when not asked for), 0-dim philox seed and offset.
int64_t npu_fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                             const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                             std::optional<double> scale, bool enable_gqa) {
  int64_t choice = at::cpu::_fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
  bool plain = !attn_mask.has_value() && dropout_p == 0.0 && query.dim() == 4 && key.dim() == 4 &&
               value.dim() == 4 && query.size(1) == key.size(1) && key.size(1) == value.size(1);
  if (choice == static_cast<int64_t>(at::SDPBackend::flash_attention) && plain)
    return static_cast<int64_t>(at::SDPBackend::efficient_attention);
  return choice;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> npu_efficient_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const std::optional<at::Tensor>& attn_bias,
    bool compute_log_sumexp, double dropout_p, bool is_causal, std::optional<double> scale) {
  TORCH_CHECK(!attn_bias.has_value() && dropout_p == 0.0, "hccl-py's npu attention kernel takes no mask and no dropout "
              "(scaled_dot_product_attention sends those to another kernel)");
  // On npu tensors this op goes to the fallback: the CPU's kernel on the same bytes.
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, attn_bias,
                                                                     scale);
  int64_t length = query.size(2);
  at::Tensor logsumexp = at::zeros({query.size(0), query.size(1), compute_log_sumexp ? round_up(length, 32) : 0},
                                   query.options().dtype(at::kFloat));
  if (compute_log_sumexp) logsumexp.narrow(2, 0, length).copy_(lse);
  auto scalar = query.options().dtype(at::kLong);
  return {out, logsumexp, at::zeros({}, scalar), at::zeros({}, scalar)};  // philox seed and offset: no dropout here
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> npu_efficient_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& attn_bias, const at::Tensor& out, const at::Tensor& logsumexp, const at::Tensor& /*seed*/,
    const at::Tensor& /*offset*/, double dropout_p, std::array<bool, 4>, bool is_causal, std::optional<double> scale) {
  TORCH_CHECK(!attn_bias.defined() && dropout_p == 0.0, "hccl-py's npu attention kernel takes no mask and no dropout");
  at::Tensor lse = logsumexp.narrow(2, 0, query.size(2)).contiguous();
  auto [grad_q, grad_k, grad_v] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      grad_out, query, key, value, out, lse, dropout_p, is_causal, std::nullopt, scale);
  return {grad_q, grad_k, grad_v, at::Tensor()};
}

// Convolutions. torch sends a private-use device's convolutions to convolution_overrideable and
// convolution_backward_overrideable (no CPU kernel of those names exists, so the fallback cannot
// serve them): the CPU's convolution runs on zero-copy CPU aliases of the npu tensors, so the
// numbers are the CPU's, and the results come back as npu tensors without a copy. The card's
// compute is charged as the matmul family's: a convolution is its implicit GEMM (im2col) on the
// cube, per group m = N x output positions, n = out_channels / groups, k = in_channels / groups x
// kernel size (2 x output elements x in_channels / groups x kernel size FLOPs before the cube's
// tiles round it up); a transposed convolution the same GEMM with input and output exchanged. Its
// backward charges that GEMM once for the input's gradient and once for the weight's (the bias's
// is a sum: bytes only).
at::Tensor npu_result(const at::Tensor& cpu, c10::DeviceIndex device) {
  if (!cpu.defined()) return cpu;
  return with_storage(npu_storage_of(cpu.storage(), device), kNpuKeys, cpu);
}

Kernel conv_kernel(const char* name, const at::Tensor& input, const at::Tensor& weight, const at::Tensor& output,
                   bool transposed, int64_t groups, int64_t passes, int64_t nbytes) {
  Kernel kernel{name, 0, 0, 0, 1, nbytes, c10::toString(input.scalar_type())};
  const at::Tensor& rows = transposed ? input : output;  // the GEMM's m runs over these positions
  if (passes == 0 || groups <= 0 || rows.dim() < 2 || rows.numel() == 0 || weight.numel() == 0) return kernel;
  int64_t per_filter = weight.numel() / weight.size(0);  // (in or out) channels / groups x kernel size
  int64_t kernel_size = per_filter / weight.size(1);
  kernel.m = rows.numel() / rows.size(1);
  kernel.n = transposed ? per_filter : weight.size(0) / groups;
  kernel.k = transposed ? weight.size(0) / groups : weight.size(1) * kernel_size;
  kernel.batch = groups * passes;
  return kernel;
}

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

at::Tensor npu_convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                           at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                           at::IntArrayRef output_padding, int64_t groups) {
  const bool has_bias = bias.has_value() && bias->defined();
  check_devices("aten::convolution_overrideable", {{"input", input}, {"weight", weight}, {"bias", or_undefined(bias)}});
  c10::DeviceGuard guard(input.device());
  SharedStorages shared;
  std::optional<at::Tensor> cpu_bias;
  if (has_bias) cpu_bias = as_cpu(*bias, &shared);
  at::Tensor out = at::convolution(as_cpu(input, &shared), as_cpu(weight, &shared), cpu_bias, stride, padding, dilation,
                                   transposed, output_padding, groups);
  at::Tensor result = npu_result(out, input.device().index());  // booked before the kernel is logged
  if (g_recording.load(std::memory_order_relaxed)) {
    int64_t nbytes = bytes_of(input) + bytes_of(weight) + (has_bias ? bytes_of(*bias) : 0) + bytes_of(out);
    record_kernel(conv_kernel("aten::convolution_overrideable", input, weight, out, transposed, groups, 1, nbytes));
  }
  return result;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> npu_convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed, at::IntArrayRef output_padding, int64_t groups,
    std::array<bool, 3> output_mask) {
  check_devices("aten::convolution_backward_overrideable",
                {{"grad_output", grad_output}, {"input", input}, {"weight", weight}});
  c10::DeviceGuard guard(input.device());
  SharedStorages shared;
  std::vector<int64_t> bias_sizes{grad_output.size(1)};
  auto [grad_input, grad_weight, grad_bias] =
      at::convolution_backward(as_cpu(grad_output, &shared), as_cpu(input, &shared), as_cpu(weight, &shared),
                               bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask);
  auto device = input.device().index();  // the results are booked before the kernel is logged
  std::tuple<at::Tensor, at::Tensor, at::Tensor> results{npu_result(grad_input, device), npu_result(grad_weight, device),
                                                         npu_result(grad_bias, device)};
  if (g_recording.load(std::memory_order_relaxed)) {
    int64_t nbytes = bytes_of(grad_output) + bytes_of(input) + bytes_of(weight) + bytes_of(grad_input) +
                     bytes_of(grad_weight) + bytes_of(grad_bias);
    int64_t passes = int64_t(output_mask[0]) + int64_t(output_mask[1]);
    record_kernel(conv_kernel("aten::convolution_backward_overrideable", input, weight, grad_output, transposed, groups,
                              passes, nbytes));
  }
  return results;
}

}  // namespace hccl_npu
