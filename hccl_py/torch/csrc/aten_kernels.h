// Part of hccl-py's npu device: included once, in order, by npu_device.cpp, its one translation
// unit (after the headers it needs); not a header to include elsewhere.
// ATen: the kernels only CUDA has in torch (fused RNN cells, SyncBatchNorm's), and DDP's timer.
#pragma once

namespace hccl_npu {

// Fused recurrent cells. torch's nn.LSTM and nn.GRU run their cells as _thnn_fused_lstm_cell and
// _thnn_fused_gru_cell on a private-use device, as on CUDA, and only CUDA has kernels of these (torch_npu
// has its own on Ascend), so an LSTM on npu failed ("Could not run 'aten::_thnn_fused_lstm_cell' with
// arguments from the 'CPU' backend"). Here each cell is its arithmetic in torch ops on the card, which
// the fallback runs (the CPU's numbers) and charges. The workspace kept for the backward holds what it
// reads: the LSTM's activated gates (input, forget, cell, output); the GRU's reset, update and new
// gates, the hidden state and the hidden part of the new gate.
at::Tensor with_bias(at::Tensor gates, const std::optional<at::Tensor>& bias) {
  return bias.has_value() && bias->defined() ? gates + *bias : gates;
}

// What torch's CUDA cells check before they compute (a wrong size would otherwise broadcast): the
// gates [batch, factor x hidden] twice, the biases [factor x hidden], the state [batch, hidden]; and
// every tensor on one device.
void check_cell(const char* op, const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& state,
                const char* state_name, const std::optional<at::Tensor>& input_bias,
                const std::optional<at::Tensor>& hidden_bias, int64_t factor) {
  check_devices(op, {{"input_gates", input_gates}, {"hidden_gates", hidden_gates}, {state_name, state},
                     {"input_bias", or_undefined(input_bias)}, {"hidden_bias", or_undefined(hidden_bias)}});
  at::CheckedFrom c = op;
  at::TensorArg gates_arg{input_gates, "input_gates", 1}, hidden_arg{hidden_gates, "hidden_gates", 2},
      state_arg{state, state_name, 3};
  at::checkDim(c, gates_arg, 2);
  at::checkSameSize(c, gates_arg, hidden_arg);
  const int64_t gates_size = input_gates.size(1);
  TORCH_CHECK(gates_size % factor == 0, op, ": input_gates has ", gates_size, " columns, not a multiple of ", factor);
  const at::Tensor in_bias = or_undefined(input_bias), hid_bias = or_undefined(hidden_bias);
  TORCH_CHECK(in_bias.defined() == hid_bias.defined(), op, ": give both biases or neither");
  if (in_bias.defined()) {
    at::TensorArg in_bias_arg{in_bias, "input_bias", 4}, hid_bias_arg{hid_bias, "hidden_bias", 5};
    at::checkDim(c, in_bias_arg, 1);
    at::checkNumel(c, in_bias_arg, gates_size);
    at::checkSameSize(c, in_bias_arg, hid_bias_arg);
  }
  at::checkDim(c, state_arg, 2);
  at::checkNumel(c, state_arg, input_gates.size(0) * gates_size / factor);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> npu_fused_lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  check_cell("aten::_thnn_fused_lstm_cell", input_gates, hidden_gates, cx, "cx", input_bias, hidden_bias, 4);
  auto gates = with_bias(with_bias(input_gates + hidden_gates, input_bias), hidden_bias).chunk(4, 1);
  at::Tensor in = gates[0].sigmoid(), forget = gates[1].sigmoid(), cell = gates[2].tanh(), out = gates[3].sigmoid();
  at::Tensor cy = forget * cx + in * cell;
  at::Tensor hy = out * cy.tanh();
  return {hy, cy, at::cat({in, forget, cell, out}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> npu_fused_lstm_cell_backward(
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy, const at::Tensor& cx,
    const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  check_devices("aten::_thnn_fused_lstm_cell_backward_impl", {{"grad_hy", or_undefined(grad_hy)},
                {"grad_cy", or_undefined(grad_cy)}, {"cx", cx}, {"cy", cy}, {"workspace", workspace}});
  auto gates = workspace.chunk(4, 1);
  const at::Tensor &in = gates[0], &forget = gates[1], &cell = gates[2], &out = gates[3];
  at::Tensor tanh_cy = cy.tanh();
  const bool has_grad_hy = grad_hy.has_value() && grad_hy->defined();
  at::Tensor d_hy = has_grad_hy ? *grad_hy : at::zeros_like(cy);
  at::Tensor d_cy = d_hy * out * (1 - tanh_cy * tanh_cy);  // through hy = out * tanh(cy)
  if (grad_cy.has_value() && grad_cy->defined()) d_cy = d_cy + *grad_cy;
  at::Tensor grad_gates = at::cat({d_cy * cell * in * (1 - in), d_cy * cx * forget * (1 - forget),
                                   d_cy * in * (1 - cell * cell), d_hy * tanh_cy * out * (1 - out)},
                                  1);
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {grad_gates, d_cy * forget, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> npu_fused_gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                      const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
                                                      const std::optional<at::Tensor>& hidden_bias) {
  check_cell("aten::_thnn_fused_gru_cell", input_gates, hidden_gates, hx, "hx", input_bias, hidden_bias, 3);
  auto in = with_bias(input_gates, input_bias).chunk(3, 1);
  auto hidden = with_bias(hidden_gates, hidden_bias).chunk(3, 1);
  at::Tensor reset = (in[0] + hidden[0]).sigmoid(), update = (in[1] + hidden[1]).sigmoid();
  at::Tensor fresh = (in[2] + reset * hidden[2]).tanh();
  at::Tensor hy = fresh + update * (hx - fresh);  // (1 - update) * fresh + update * hx
  return {hy, at::cat({reset, update, fresh, hx, hidden[2]}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> npu_fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  check_devices("aten::_thnn_fused_gru_cell_backward", {{"grad_hy", grad_hy}, {"workspace", workspace}});
  auto saved = workspace.chunk(5, 1);
  const at::Tensor &reset = saved[0], &update = saved[1], &fresh = saved[2], &hx = saved[3], &hidden_new = saved[4];
  at::Tensor d_fresh = grad_hy * (1 - update) * (1 - fresh * fresh);  // before the tanh
  at::Tensor d_update = grad_hy * (hx - fresh) * update * (1 - update);
  at::Tensor d_reset = d_fresh * hidden_new * reset * (1 - reset);
  at::Tensor grad_input_gates = at::cat({d_reset, d_update, d_fresh}, 1);
  at::Tensor grad_hidden_gates = at::cat({d_reset, d_update, d_fresh * reset}, 1);
  at::Tensor grad_input_bias = has_bias ? grad_input_gates.sum(0) : at::Tensor();
  at::Tensor grad_hidden_bias = has_bias ? grad_hidden_gates.sum(0) : at::Tensor();
  return {grad_input_gates, grad_hidden_gates, grad_hy * update, grad_input_bias, grad_hidden_bias};
}

// SyncBatchNorm's kernels. nn.SyncBatchNorm computes its statistics per card, all-gathers them over its
// group and normalises with the combined ones, through six ops that only CUDA has kernels for (torch_npu
// has its own on Ascend): on npu it failed with "Could not run 'aten::batch_norm_stats' with arguments
// from the 'CPU' backend". Here each is its arithmetic in torch ops on the card (the fallback runs and
// charges them), over every dim but the channels (dim 1). Statistics are kept in the input's
// accumulation type (float32 for float16 and bfloat16 inputs), as torch's CUDA kernels keep them.
std::vector<int64_t> non_channel_dims(const at::Tensor& t) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (d != 1) dims.push_back(d);
  return dims;
}

// Every batch-norm op's input is (N, C, ...): checked on entry, as the shapes below assume it.
void check_nc(const char* op, const at::Tensor& input) {
  TORCH_CHECK(input.dim() >= 2, op, ": expected an input of at least 2 dims (N, C, ...), got ", input.dim());
}

at::Tensor per_channel(const at::Tensor& v, const at::Tensor& like) {  // [C] -> [1, C, 1, ...]
  TORCH_INTERNAL_ASSERT(like.dim() >= 2);
  std::vector<int64_t> shape(like.dim(), 1);
  shape[1] = v.numel();
  return v.reshape(shape);
}

at::ScalarType stats_type(const at::Tensor& input) { return at::toOpMathType(input.scalar_type()); }

std::tuple<at::Tensor, at::Tensor> npu_batch_norm_stats(const at::Tensor& input, double eps) {
  check_devices("aten::batch_norm_stats", {{"input", input}});
  check_nc("batch_norm_stats", input);
  at::Tensor x = input.to(stats_type(input));
  auto dims = non_channel_dims(x);
  at::Tensor mean = x.mean(dims);
  at::Tensor var = (x - per_channel(mean, x)).square().mean(dims);  // biased, as batch norm's
  return {mean, (var + eps).rsqrt()};
}

std::tuple<at::Tensor, at::Tensor> npu_batch_norm_gather_stats_with_counts(
    const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, double momentum,
    double eps, const at::Tensor& counts) {
  check_devices("aten::batch_norm_gather_stats_with_counts",
                {{"input", input}, {"mean", mean}, {"invstd", invstd}, {"running_mean", or_undefined(running_mean)},
                 {"running_var", or_undefined(running_var)}, {"counts", counts}});
  TORCH_CHECK(mean.dim() == 2 && invstd.sizes() == mean.sizes(), "batch_norm_gather_stats_with_counts: expected mean "
              "and invstd of one shape (ranks, channels), got ", mean.sizes(), " and ", invstd.sizes());
  TORCH_CHECK(counts.numel() == mean.size(0), "batch_norm_gather_stats_with_counts: ", counts.numel(),
              " counts for the statistics of ", mean.size(0), " ranks");
  // The ranks' (mean, biased variance, count) combined: the count-weighted mean, and the variance
  // about it, sum of n_i (var_i + (mean_i - mean)^2) over the total count.
  at::Tensor n = counts.to(mean.scalar_type()).reshape({-1, 1});
  at::Tensor total = n.sum();
  at::Tensor var_each = invstd.square().reciprocal() - eps;
  at::Tensor global_mean = (n * mean).sum(0) / total;
  at::Tensor global_var = (n * (var_each + (mean - global_mean).square())).sum(0) / total;
  if (running_mean.has_value() && running_mean->defined()) {
    at::NoGradGuard no_grad;
    running_mean->mul_(1 - momentum).add_(global_mean.to(running_mean->scalar_type()), momentum);
  }
  if (running_var.has_value() && running_var->defined()) {  // the running variance is the unbiased one
    at::NoGradGuard no_grad;
    at::Tensor unbiased = global_var * total / (total - 1);
    running_var->mul_(1 - momentum).add_(unbiased.to(running_var->scalar_type()), momentum);
  }
  return {global_mean, (global_var + eps).rsqrt()};
}

std::tuple<at::Tensor, at::Tensor> npu_batch_norm_gather_stats(
    const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, double momentum,
    double eps, int64_t count) {
  check_devices("aten::batch_norm_gather_stats", {{"input", input}, {"mean", mean}, {"invstd", invstd},
                {"running_mean", or_undefined(running_mean)}, {"running_var", or_undefined(running_var)}});
  TORCH_CHECK(mean.dim() == 2, "batch_norm_gather_stats: expected mean of shape (ranks, channels), got ", mean.sizes());
  at::Tensor counts = at::full({mean.size(0)}, double(count), mean.options());
  return npu_batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps, counts);
}

at::Tensor npu_batch_norm_elemt(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                const std::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& invstd,
                                double /*eps: in invstd already*/) {
  check_devices("aten::batch_norm_elemt", {{"input", input}, {"weight", or_undefined(weight)},
                {"bias", or_undefined(bias)}, {"mean", mean}, {"invstd", invstd}});
  check_nc("batch_norm_elemt", input);
  at::Tensor scale = invstd;
  if (weight.has_value() && weight->defined()) scale = scale * weight->to(invstd.scalar_type());
  at::Tensor out = (input.to(mean.scalar_type()) - per_channel(mean, input)) * per_channel(scale, input);
  if (bias.has_value() && bias->defined()) out = out + per_channel(bias->to(mean.scalar_type()), input);
  return out.to(input.scalar_type());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> npu_batch_norm_backward_reduce(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& weight, bool input_g, bool weight_g, bool bias_g) {
  check_devices("aten::batch_norm_backward_reduce", {{"grad_out", grad_out}, {"input", input}, {"mean", mean},
                {"invstd", invstd}, {"weight", or_undefined(weight)}});
  check_nc("batch_norm_backward_reduce", input);
  auto dims = non_channel_dims(input);
  at::Tensor dy = grad_out.to(mean.scalar_type());
  at::Tensor sum_dy = dy.sum(dims);
  at::Tensor sum_dy_xmu = (dy * (input.to(mean.scalar_type()) - per_channel(mean, input))).sum(dims);
  const bool has_weight = weight.has_value() && weight->defined();
  at::ScalarType param_type = has_weight ? weight->scalar_type() : mean.scalar_type();
  at::Tensor grad_weight = weight_g ? (sum_dy_xmu * invstd).to(param_type) : at::Tensor();
  at::Tensor grad_bias = bias_g ? sum_dy.to(param_type) : at::Tensor();
  if (!input_g) return {at::Tensor(), at::Tensor(), grad_weight, grad_bias};
  return {sum_dy, sum_dy_xmu, grad_weight, grad_bias};
}

at::Tensor npu_batch_norm_backward_elemt(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
                                         const at::Tensor& invstd, const std::optional<at::Tensor>& weight,
                                         const at::Tensor& sum_dy, const at::Tensor& sum_dy_xmu,
                                         const at::Tensor& count) {
  check_devices("aten::batch_norm_backward_elemt", {{"grad_out", grad_out}, {"input", input}, {"mean", mean},
                {"invstd", invstd}, {"weight", or_undefined(weight)}, {"sum_dy", sum_dy}, {"sum_dy_xmu", sum_dy_xmu},
                {"count", count}});
  check_nc("batch_norm_backward_elemt", input);
  at::Tensor total = count.to(mean.scalar_type()).sum();  // the group's elements per channel
  at::Tensor mean_dy = sum_dy / total, mean_dy_xmu = sum_dy_xmu / total;
  at::Tensor scale = invstd;
  if (weight.has_value() && weight->defined()) scale = scale * weight->to(invstd.scalar_type());
  at::Tensor xmu = input.to(mean.scalar_type()) - per_channel(mean, input);
  at::Tensor grad = grad_out.to(mean.scalar_type()) - per_channel(mean_dy, input) -
                    xmu * per_channel(invstd.square() * mean_dy_xmu, input);
  return (grad * per_channel(scale, input)).to(input.scalar_type());
}

// DDP's timing statistics (forward, backward compute and communication times in its logging data)
// ask torch's timer registry for a timer of the parameters' device; npu's stamps the card's modeled
// clock, as its events do, so the statistics are modeled nanoseconds.
struct NpuTimer final : c10d::Timer {
  explicit NpuTimer(c10::Device) {}
  void record(Event event) override { getTimeRef(event) = int64_t(std::llround(modeled_clock() * 1e9)); }
  std::optional<int64_t> measureDifference(Event start, Event end) override {
    auto from = getTimestamp(start), to = getTimestamp(end);
    if (!from || !to || *to < *from) return std::nullopt;
    return *to - *from;
  }
};

}  // namespace hccl_npu
