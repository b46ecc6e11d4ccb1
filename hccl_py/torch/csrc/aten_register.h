// Part of hccl-py's npu device: included once, in order, by npu_device.cpp, its one translation
// unit (after the headers it needs); not a header to include elsewhere.
// ATen: the registrations (the dispatcher's PrivateUse1 kernels and fallback, the timer, the
// attention stub).
#pragma once

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, hccl_npu::NpuTimer);
}  // namespace c10d

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &hccl_npu::npu_fused_sdp_choice)
}  // namespace at::native

namespace hccl_npu {
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", &npu_empty);
  m.impl("empty_strided", &npu_empty_strided);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("resize_", &npu_resize_);
  m.impl("set_.source_Storage", &npu_set_source_storage);
  m.impl("set_.source_Storage_storage_offset", &npu_set_storage);
  m.impl("set_.source_Tensor", &npu_set_source_tensor);
  m.impl("set_", &npu_set_empty);
  m.impl("_copy_from", &npu_copy_from);
  m.impl("_copy_from_and_resize", &npu_copy_from_and_resize);
  m.impl("record_stream", &npu_record_stream);
  m.impl("_has_compatible_shallow_copy_type", &npu_has_compatible_shallow_copy_type);
  m.impl("_scaled_dot_product_efficient_attention", &npu_efficient_attention);
  m.impl("_scaled_dot_product_efficient_attention_backward", &npu_efficient_attention_backward);
  m.impl("convolution_overrideable", &npu_convolution);
  m.impl("convolution_backward_overrideable", &npu_convolution_backward);
  m.impl("_thnn_fused_lstm_cell", &npu_fused_lstm_cell);
  m.impl("_thnn_fused_lstm_cell_backward_impl", &npu_fused_lstm_cell_backward);
  m.impl("_thnn_fused_gru_cell", &npu_fused_gru_cell);
  m.impl("_thnn_fused_gru_cell_backward", &npu_fused_gru_cell_backward);
  // mse_loss and smooth_l1_loss: a device without its own kernel gets torch's default functional
  // (CompositeExplicitAutogradNonFunctional), which makes the reduced 0-dim result and calls the
  // out= form, whose meta builds an elementwise iterator over that result first: the CPU's out=
  // kernel then warns "An output with one or more elements was resized since it had shape []" on
  // every call (it does on the CPU too when given such an out=). The CPU's functional kernel
  // through the fallback computes the same without the warning, as CUDA's own kernel does.
  m.impl("mse_loss", torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
  m.impl("smooth_l1_loss", torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
  m.impl("batch_norm_stats", &npu_batch_norm_stats);
  m.impl("batch_norm_gather_stats", &npu_batch_norm_gather_stats);
  m.impl("batch_norm_gather_stats_with_counts", &npu_batch_norm_gather_stats_with_counts);
  m.impl("batch_norm_elemt", &npu_batch_norm_elemt);
  m.impl("batch_norm_backward_reduce", &npu_batch_norm_backward_reduce);
  m.impl("batch_norm_backward_elemt", &npu_batch_norm_backward_elemt);
}

// A lazily conjugated or negated npu tensor copied anywhere (t.conj().cpu(), and every op on one,
// which torch's conjugate fallback materialises with a copy): torch's fallbacks for these views
// would materialise _copy_from's source with a clone, which copies through _copy_from again, without
// end (a stack overflow). npu_copy_from resolves the view itself, so these keys pass it through.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
}
}  // namespace hccl_npu
