// Part of hccl-py's npu device: included once, in order, by npu_device.cpp, its one translation
// unit (after the headers it needs); not a header to include elsewhere.
// Module: the functions Python calls (hccl_py/torch/device.py and npu.py) and their bindings.
#pragma once

namespace hccl_npu {

// --- Python ---------------------------------------------------------------------------------------
void set_device_count(int n) {
  TORCH_CHECK(n >= 0 && n <= kMaxDevices, "npu device count must be 0..", kMaxDevices, ", got ", n);
  g_device_count = n;
}

void set_pool(int device, int64_t limit, bool expandable) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "no npu device ", device);
  Pool& pool = g_pool[device];
  std::lock_guard<std::mutex> lock(pool.mu);
  pool.limit = limit > 0 ? limit : INT64_MAX;
  pool.expandable = expandable;
}

void check_device(int device) {
  TORCH_CHECK(device >= 0 && device < g_device_count.load(), "Invalid device id: npu:", device, " (this host shows ",
              g_device_count.load(), " NPUs)");
}

py::dict memory_stats(int device) {
  check_device(device);
  Pool& pool = g_pool[device];
  std::lock_guard<std::mutex> lock(pool.mu);
  py::dict d;
  d["allocated_bytes.all.current"] = pool.allocated;
  d["allocated_bytes.all.peak"] = pool.peak_allocated;
  d["reserved_bytes.all.current"] = pool.reserved;
  d["reserved_bytes.all.peak"] = pool.peak_reserved;
  d["num_alloc_retries"] = 0;
  d["num_ooms"] = pool.ooms;
  d["allocation.all.allocated"] = pool.allocs;
  d["allocation.all.freed"] = pool.frees;
  d["segment.all.allocated"] = pool.grows;
  d["limit_bytes"] = pool.limit == INT64_MAX ? int64_t(0) : pool.limit;
  return d;
}

void reset_peak(int device) {
  check_device(device);
  Pool& pool = g_pool[device];
  std::lock_guard<std::mutex> lock(pool.mu);
  pool.peak_allocated = pool.allocated;
  pool.peak_reserved = pool.reserved;
}

int64_t empty_cache(int device) {  // what the pool gives back: reserved shrinks to the segments in use
  check_device(device);
  Pool& pool = g_pool[device];
  std::lock_guard<std::mutex> lock(pool.mu);
  int64_t kept = round_up(pool.allocated, kSmallSegment);
  int64_t released = std::max<int64_t>(0, pool.reserved - kept);
  pool.reserved = std::min(pool.reserved, kept);
  return released;
}

py::list drain_kernels() {
  std::vector<Kernel> taken;
  {
    std::lock_guard<std::mutex> lock(g_kernels_mu);
    taken.swap(g_kernels);
  }
  py::list out;
  for (const Kernel& k : taken)
    out.append(py::make_tuple(k.name, k.m, k.n, k.k, k.batch, k.nbytes, k.dtype, k.kind));
  return out;
}

// Set a Python callback the device calls (None: none). The old one is dropped before it is freed,
// so a thread that reads the slot never sees a freed object.
void set_callback(py::object*& slot, py::object callback) {
  if (slot != nullptr) {
    py::object* old = slot;
    slot = nullptr;
    delete old;
  }
  if (!callback.is_none()) slot = new py::object(std::move(callback));
}

void set_flush(py::object flush) { set_callback(g_flush, std::move(flush)); }

void set_clock(py::object clock) { set_callback(g_clock, std::move(clock)); }

// The storage format of an npu tensor's storage (its views share it, as on Ascend).
Block* block_of(const at::Tensor& t) {
  TORCH_CHECK(is_npu(t), "expected an npu tensor, got one on ", t.device());
  const c10::DataPtr& data = t.storage().data_ptr();
  return data.get_deleter() == &release ? static_cast<Block*>(data.get_context()) : nullptr;
}

void set_format(const at::Tensor& t, int format) {
  Block* block = block_of(t);
  TORCH_CHECK(block != nullptr, "this npu tensor's storage carries no format");
  block->format = format;
}

int get_format(const at::Tensor& t) {
  Block* block = block_of(t);
  return block == nullptr ? -1 : block->format;
}

// torch.multiprocessing (hccl_py/torch/ipc.py): the card memory of a storage shared between the
// processes of a host, as torch_npu's IPC shares it. The sender's storage moves, in place, into
// `shared` (POSIX shared memory made by the caller): every tensor on it keeps its storage, now
// over the shared bytes, and stays booked as it was.
void move_into_shared(const at::Tensor& npu, const at::Tensor& shared) {
  TORCH_CHECK(is_npu(npu) && shared.device().is_cpu(), "move_into_shared: an npu tensor and a CPU tensor");
  c10::StorageImpl* impl = npu.storage().unsafeGetStorageImpl();
  TORCH_CHECK(impl->data_ptr().get_deleter() == &release, "this npu storage is not the card's memory");
  auto* block = static_cast<Block*>(impl->data_ptr().get_context());
  const c10::Storage& target = shared.storage();
  TORCH_CHECK(int64_t(target.nbytes()) >= block->nbytes && int64_t(impl->nbytes()) <= block->nbytes,
              "move_into_shared: ", target.nbytes(), " shared bytes for a block of ", block->nbytes);
  void* bytes = target.nbytes() == 0 ? nullptr : target.mutable_data();
  if (block->nbytes > 0) std::memcpy(bytes, block->data, block->nbytes);
  forget(block);
  void* old = block->data;
  const bool owned = !block->keep;
  block->data = bytes;
  block->keep = target;  // drops a zero-copy block's previous CPU storage
  noted(block);
  at::DataPtr previous = impl->set_data_ptr(c10::DataPtr(bytes, block, &release, npu.device()));
  previous.release_context();  // the block lives on in the new DataPtr: not released
  if (owned) free(old);
}

// The CPU bytes an npu storage shows, as a uint8 tensor, when it shows a CPU storage's (a shared
// one after move_into_shared, a zero-copy result's); else None.
py::object cpu_backing(const at::Tensor& npu) {
  Block* block = block_of(npu);
  if (block == nullptr || !block->keep) return py::none();
  auto cpu = at::empty({0}, at::TensorOptions().dtype(at::kByte));
  cpu.unsafeGetTensorImpl()->set_storage_keep_dtype(block->keep);
  cpu.unsafeGetTensorImpl()->set_sizes_contiguous({int64_t(block->keep.nbytes())});
  return py::cast(cpu);
}

// The receiver's side: an npu uint8 tensor on card `device` over the shared CPU bytes of `shared`,
// not booked here (the sender's card holds them, as an opened IPC handle is not the receiver's).
at::Tensor opened_shared(const at::Tensor& shared, int device) {
  TORCH_CHECK(shared.device().is_cpu() && device >= 0 && device < g_device_count.load(),
              "opened_shared: card ", device, " of ", g_device_count.load());
  const c10::Storage& cpu = shared.storage();
  int64_t nbytes = cpu.nbytes();
  void* data = nbytes == 0 ? nullptr : cpu.mutable_data();
  auto* block = new Block{data, nbytes, c10::DeviceIndex(device), cpu, -1};
  block->booked = false;
  noted(block);
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                       c10::DataPtr(data, block, &release, c10::Device(kNpu, c10::DeviceIndex(device))), &g_allocator,
                       /*resizable=*/false);
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), kNpuKeys, caffe2::TypeMeta::Make<uint8_t>());
  t.unsafeGetTensorImpl()->set_sizes_contiguous({nbytes});
  return t;
}

// The factor of a premul-sum ReduceOp (torch.distributed._make_nccl_premul_sum(f), torch_npu's
// _make_hccl_premul_sum): torch keeps it in C++ only.
double premul_factor(const c10d::ReduceOp& op) {
  TORCH_CHECK(op.op_ == c10d::ReduceOp::PREMUL_SUM, "not a premul-sum ReduceOp");
  auto* supplement = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(supplement != nullptr, "premul-sum ReduceOp without its factor");
  return supplement->tensor_factor.defined() ? supplement->tensor_factor.item<double>() : supplement->double_factor;
}

bool g_hooks_registered = false;

// Ops the CPU runs with a kernel of its own but a device without one runs as a composite (a
// CompositeExplicitAutograd or CompositeImplicitAutograd decomposition: native_layer_norm,
// native_group_norm, addr, silu_backward, ...) are sent to the fallback, so the npu runs the CPU's
// kernel and gets the CPU's numbers (a decomposition rounds differently). Found by asking the
// dispatcher, so ops a later torch adds are covered too.
std::unique_ptr<torch::Library> g_cpu_kernels;

int route_composites_to_cpu_kernels() {
  g_cpu_kernels = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                                   __FILE__, __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  int routed = 0;
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = dispatcher.findOp(name);
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1))
      continue;
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd))
      continue;
    std::string qualified = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    g_cpu_kernels->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
    ++routed;
  }
  return routed;
}

void register_hooks() {
  if (g_hooks_registered) return;
  at::RegisterPrivateUse1HooksInterface(new NpuHooks());
  route_composites_to_cpu_kernels();
  g_hooks_registered = true;
}

}  // namespace hccl_npu

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // The kernel log's entry as Python reads it (drain_kernels' tuples): its fields in order, and
  // its kinds, from the one definition of each (state.h's Kernel and EntryKind).
  m.attr("ENTRY_FIELDS") = py::make_tuple("name", "m", "n", "k", "batch", "nbytes", "dtype", "kind");
  py::dict kinds;
  kinds["kernel"] = int(hccl_npu::kKernelRun);
  kinds["segment"] = int(hccl_npu::kSegmentAlloc);
  kinds["host_to_device"] = int(hccl_npu::kHostToDevice);
  kinds["device_to_host"] = int(hccl_npu::kDeviceToHost);
  m.attr("ENTRY_KINDS") = kinds;
  m.def("register_hooks", &hccl_npu::register_hooks, "register the npu device's hooks (after the rename)");
  m.def("set_device_count", &hccl_npu::set_device_count);
  m.def("device_count", []() { return hccl_npu::g_device_count.load(); });
  m.def("current_device", []() { return int(hccl_npu::t_device); });
  m.def("set_device", [](int d) {
    hccl_npu::NpuGuard::check_index(d);  // before the cast to c10's 8-bit index (256 would be card 0)
    hccl_npu::NpuGuard().setDevice(c10::Device(hccl_npu::kNpu, c10::DeviceIndex(d)));
  });
  m.def("set_pool", &hccl_npu::set_pool);
  m.def("block_at", &hccl_npu::block_at, "the (card, start, bytes) of the npu block holding nbytes at an address, or None");
  m.def("event_stamp", &hccl_npu::event_stamp, "(card, modeled seconds) of the recorded event at an address, or None");
  m.def("set_event_stamp", &hccl_npu::set_event_stamp, "stamp the event at an address; false if there is none");
  m.def("memory_stats", &hccl_npu::memory_stats);
  m.def("reset_peak", &hccl_npu::reset_peak);
  m.def("empty_cache", &hccl_npu::empty_cache);
  m.def("set_clock", &hccl_npu::set_clock);
  m.def("set_flush", &hccl_npu::set_flush);
  m.def("set_recording", [](bool on) { hccl_npu::g_recording = on; });
  m.def("set_device_checks", &hccl_npu::set_device_checks,
        "the ops that refuse tensors on two devices: {'aten::mm': wrapper name for the message, ...}");
  m.def("drain_kernels", &hccl_npu::drain_kernels,
        "what ran on npu tensors since the last drain: a tuple of ENTRY_FIELDS each, its kind one of ENTRY_KINDS "
        "(a kernel, the pool's growth with nbytes the segment, a host-to-npu or an npu-to-host copy)");
  m.def("premul_factor", &hccl_npu::premul_factor);
  m.def("move_into_shared", &hccl_npu::move_into_shared, "move an npu storage's bytes into a shared CPU storage, in place");
  m.def("cpu_backing", &hccl_npu::cpu_backing, "the CPU bytes an npu storage shows, or None");
  m.def("opened_shared", &hccl_npu::opened_shared, "an npu tensor over a shared CPU storage's bytes, unbooked");
  m.def("set_format", &hccl_npu::set_format);
  m.def("get_format", &hccl_npu::get_format);
  m.def("as_cpu", [](const at::Tensor& t) { return hccl_npu::as_cpu(t); }, "the CPU tensor showing an npu tensor's bytes, without a copy");
}
