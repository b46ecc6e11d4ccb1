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

namespace hccl_npu {

constexpr c10::DeviceType kNpu = c10::DeviceType::PrivateUse1;
constexpr int kMaxDevices = 64;
constexpr size_t kAlign = 512;                       // CANN's device-memory alignment (SOURCE-FACTS: Memory)
constexpr int64_t kSmallSegment = 2 << 20;           // the pool grows in 2 MiB segments for small blocks,
constexpr int64_t kLargeSegment = 20 << 20;          // 20 MiB for blocks of 1 MiB and more (torch_npu's
constexpr int64_t kLargeBlock = 1 << 20;             // caching allocator, as CUDA's: an estimate of CANN's)
constexpr int64_t kHostCheckFloor = 64 << 20;        // allocations from here on are checked against the host

std::atomic<int> g_device_count{1};
thread_local c10::DeviceIndex t_device = 0;
thread_local std::array<c10::StreamId, kMaxDevices> t_stream{};  // 0: the default stream
std::atomic<c10::StreamId> g_next_stream{1};

struct Pool {
  std::mutex mu;
  int64_t allocated = 0, peak_allocated = 0, reserved = 0, peak_reserved = 0;
  int64_t limit = INT64_MAX;            // the card's HBM bytes
  bool expandable = false;              // expandable_segments: reserved grows by exactly what is needed
  int64_t allocs = 0, frees = 0, grows = 0, ooms = 0;
};
std::array<Pool, kMaxDevices> g_pool;

py::object* g_clock = nullptr;  // () -> modeled seconds of this process's card (events' stamps)
py::object* g_flush = nullptr;  // () -> None: charges the recorded kernels to the card (when the log fills)

// What ran on npu tensors, in order, for the card's modeled clock: the cost formulas live in
// Python (hccl_py/modeled/cost_model.py, as for hccl-py's own device ops); this only records what ran.
// Besides kernels: the pool's growth (a new segment) and copies between host memory and a card.
enum EntryKind : int { kKernelRun = 0, kSegmentAlloc = 1, kHostToDevice = 2, kDeviceToHost = 3 };

struct Kernel {
  std::string name;
  int64_t m, n, k, batch;  // the matmul family's dimensions (m = 0: not a matmul)
  int64_t nbytes;          // bytes its tensors move through HBM (a segment's size; a copy's bytes)
  std::string dtype;
  int kind = kKernelRun;
};
std::mutex g_kernels_mu;
std::vector<Kernel> g_kernels;
std::atomic<bool> g_recording{false};
constexpr size_t kKernelLogFlush = 4096;

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

std::string mib(int64_t bytes) {
  char buf[64];
  if (bytes >= (int64_t(1) << 30)) snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(1 << 30));
  else snprintf(buf, sizeof buf, "%.2f MiB", bytes / double(1 << 20));
  return buf;
}

int64_t host_available() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return INT64_MAX;
}

[[noreturn]] void out_of_memory(c10::DeviceIndex device, int64_t requested, Pool& pool, const char* why) {
  pool.ooms++;
  int64_t free = pool.limit == INT64_MAX ? 0 : pool.limit - pool.allocated;
  TORCH_CHECK_WITH(OutOfMemoryError, false, "NPU out of memory. Tried to allocate ", mib(requested), " (NPU ",
                   int(device), "; ", pool.limit == INT64_MAX ? std::string("unlimited") : mib(pool.limit),
                   " total capacity; ", mib(pool.allocated), " already allocated; ", mib(free), " free; ",
                   mib(pool.reserved), " reserved in total by PyTorch)", why,
                   ". requested_bytes=", requested, " free_bytes=", free, " reserved_bytes=", pool.reserved);
}

// Book `nbytes` on `device`'s pool; raises OutOfMemoryError past the card's HBM. A pool that grows
// (a new segment) is logged for the card's modeled clock: a device synchronisation, then the
// segment's allocation (charged from Python; not flushed from here, inside an allocation).
void book(c10::DeviceIndex device, int64_t nbytes) {
  Pool& pool = g_pool[device];
  int64_t grown = 0;
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    int64_t rounded = round_up(nbytes, kAlign);
    if (pool.allocated + rounded > pool.limit) out_of_memory(device, nbytes, pool, "");
    pool.allocated += rounded;
    pool.allocs++;
    pool.peak_allocated = std::max(pool.peak_allocated, pool.allocated);
    if (pool.allocated > pool.reserved) {  // the pool grows: a new segment (a synchronisation on the card)
      int64_t need = pool.allocated - pool.reserved;
      int64_t segment = pool.expandable ? round_up(need, kSmallSegment)
                        : (rounded < kLargeBlock ? round_up(need, kSmallSegment) : round_up(need, kLargeSegment));
      int64_t before = pool.reserved;
      pool.reserved = std::min(pool.reserved + segment, std::max(pool.limit, pool.allocated));
      pool.grows++;
      pool.peak_reserved = std::max(pool.peak_reserved, pool.reserved);
      grown = pool.reserved - before;
    }
  }
  if (grown > 0 && g_recording.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(g_kernels_mu);
    g_kernels.push_back({"aclrtMalloc", 0, 0, 0, 1, grown, "", kSegmentAlloc});
  }
}

void unbook(c10::DeviceIndex device, int64_t nbytes) {
  Pool& pool = g_pool[device];
  std::lock_guard<std::mutex> lock(pool.mu);
  pool.allocated -= round_up(nbytes, kAlign);
  pool.frees++;
}

struct Block {  // what an npu DataPtr's context holds
  void* data;
  int64_t nbytes;
  c10::DeviceIndex device;
  c10::Storage keep;  // a CPU storage whose bytes this npu storage shows (zero-copy results), else empty
  int format = -1;    // torch_npu's ACL storage format, as metadata (-1: the tensor's base format)
  bool booked = true; // on this process's pool; not a block another process's card owns (opened_shared)
};

// Every live npu block by address, so that HCCL's C API can tell a card's memory (and which card)
// from any other pointer a ctypes client passes (vLLM's pyhccl hands it tensors' data_ptr()).
// Zero-copy blocks may share an address with another: a multimap.
std::mutex g_blocks_mu;
std::multimap<uintptr_t, std::pair<int64_t, c10::DeviceIndex>> g_blocks;  // start -> (bytes, card)

Block* noted(Block* block) {
  std::lock_guard<std::mutex> lock(g_blocks_mu);
  g_blocks.emplace(reinterpret_cast<uintptr_t>(block->data), std::make_pair(block->nbytes, block->device));
  return block;
}

void forget(const Block* block) {
  std::lock_guard<std::mutex> lock(g_blocks_mu);
  auto [first, last] = g_blocks.equal_range(reinterpret_cast<uintptr_t>(block->data));
  for (auto it = first; it != last; ++it) {
    if (it->second.first == block->nbytes && it->second.second == block->device) {
      g_blocks.erase(it);
      return;
    }
  }
}

// The card and the block (start, bytes) holding `nbytes` at `address` whole, or None.
py::object block_at(uintptr_t address, int64_t nbytes) {
  std::lock_guard<std::mutex> lock(g_blocks_mu);
  auto after = g_blocks.upper_bound(address);
  if (after == g_blocks.begin()) return py::none();
  auto [first, last] = g_blocks.equal_range(std::prev(after)->first);  // blocks do not overlap, but share a start
  for (auto it = first; it != last; ++it) {
    if (address + nbytes <= it->first + it->second.first) {
      return py::make_tuple(int(it->second.second), it->first, it->second.first);
    }
  }
  return py::none();
}

void release(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  forget(block);
  if (block->booked) unbook(block->device, block->nbytes);
  if (!block->keep) free(block->data);
  delete block;
}

struct NpuAllocator final : at::Allocator {
  at::DataPtr allocate(size_t nbytes) override {
    c10::DeviceIndex device = t_device;
    book(device, nbytes);  // the card's HBM first: a request past it is the card's OOM, whatever the host has
    if (int64_t(nbytes) >= kHostCheckFloor && int64_t(nbytes) > host_available()) {
      unbook(device, nbytes);
      Pool& pool = g_pool[device];
      std::lock_guard<std::mutex> lock(pool.mu);
      out_of_memory(device, nbytes, pool, "; the host running this card has less memory available");
    }
    void* data = nullptr;
    if (nbytes > 0 && posix_memalign(&data, kAlign, round_up(nbytes, kAlign)) != 0) {
      unbook(device, nbytes);
      Pool& pool = g_pool[device];
      std::lock_guard<std::mutex> lock(pool.mu);
      out_of_memory(device, nbytes, pool, "; the host refused the memory");
    }
    auto* block = noted(new Block{data, int64_t(nbytes), device, c10::Storage(), -1});
    return {data, block, &release, c10::Device(kNpu, device)};
  }
  at::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const final { default_copy_data(dest, src, count); }
};
NpuAllocator g_allocator;
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);  // storages made by device (torch.load, .npu())

bool is_npu(const at::Tensor& t) { return t.defined() && t.device().type() == kNpu; }

// Pinned host memory (CANN's aclrtMallocHost): host memory the device knows as pinned, so torch's
// is_pinned() / pin_memory("npu") hold and DDP's reducer, which asserts that its staging tensor for
// unused parameters is pinned on a non-CPU device, runs. Interior pointers (views) count too.
std::mutex g_pinned_mu;
std::map<uintptr_t, size_t> g_pinned;  // start -> bytes

void free_pinned(void* data) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mu);
    g_pinned.erase(reinterpret_cast<uintptr_t>(data));
  }
  free(data);
}

bool is_pinned_ptr(const void* ptr) {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(g_pinned_mu);
  auto after = g_pinned.upper_bound(address);
  if (after == g_pinned.begin()) return false;
  --after;
  return address < after->first + after->second;
}

struct PinnedAllocator final : at::Allocator {
  at::DataPtr allocate(size_t nbytes) override {
    const size_t bytes = std::max<size_t>(nbytes, 1);  // an empty pinned tensor is pinned too
    void* data = nullptr;
    if (posix_memalign(&data, kAlign, round_up(bytes, kAlign)) != 0) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "NPU out of memory. Tried to allocate ", nbytes,
                       " bytes of pinned host memory; the host refused it");
    }
    {
      std::lock_guard<std::mutex> lock(g_pinned_mu);
      g_pinned[reinterpret_cast<uintptr_t>(data)] = bytes;
    }
    return {data, data, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  at::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const final { default_copy_data(dest, src, count); }
};
PinnedAllocator g_pinned_allocator;


// A CPU storage over an npu storage's bytes (keeps the npu storage alive).
void drop_npu_ref(void* ctx) { delete static_cast<c10::Storage*>(ctx); }

c10::Storage cpu_storage_of(const c10::Storage& npu) {
  void* data = npu.mutable_data();
  auto* keep = new c10::Storage(npu);
  return c10::Storage(c10::Storage::use_byte_size_t(), npu.nbytes(),
                      c10::DataPtr(data, keep, &drop_npu_ref, c10::Device(c10::kCPU)), at::getCPUAllocator(),
                      /*resizable=*/true);
}

// An npu storage over a CPU storage's bytes (booked on `device`'s pool; keeps the CPU storage alive).
c10::Storage npu_storage_of(const c10::Storage& cpu, c10::DeviceIndex device) {
  int64_t nbytes = cpu.nbytes();
  book(device, nbytes);
  void* data = cpu.mutable_data();
  auto* block = noted(new Block{data, nbytes, device, cpu, -1});
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes, c10::DataPtr(data, block, &release, c10::Device(kNpu, device)),
                      &g_allocator, /*resizable=*/true);
}

at::Tensor with_storage(c10::Storage storage, c10::DispatchKeySet keys, const at::Tensor& like) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), keys, like.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  return t;
}

// The CPU tensor showing `t`'s bytes (same sizes, strides, offset), without a copy. Within one op,
// tensors sharing an npu storage share one CPU storage (`shared`), so torch's overlap checks
// see them as the aliases they are.
using SharedStorages = std::unordered_map<c10::StorageImpl*, c10::Storage>;

at::Tensor as_cpu(const at::Tensor& t, SharedStorages* shared = nullptr) {
  TORCH_CHECK(is_npu(t), "as_cpu: expected an npu tensor, got one on ", t.device());
  if (shared == nullptr) return with_storage(cpu_storage_of(t.storage()), c10::DispatchKeySet(c10::DispatchKey::CPU), t);
  auto found = shared->find(t.storage().unsafeGetStorageImpl());
  if (found == shared->end())
    found = shared->emplace(t.storage().unsafeGetStorageImpl(), cpu_storage_of(t.storage())).first;
  return with_storage(found->second, c10::DispatchKeySet(c10::DispatchKey::CPU), t);
}

// --- the device guard -------------------------------------------------------------------------
struct Stamp {
  double modeled_s = -1.0;
  int device = 0;
};

// The live stamps, so that an event's address (torch_npu's ``Event.npu_event``, an aclrtEvent for C)
// can be read and recorded through HCCL's C API without trusting an arbitrary pointer.
std::mutex g_stamps_mu;
std::unordered_set<Stamp*> g_stamps;

Stamp* new_stamp() {
  auto* stamp = new Stamp();
  std::lock_guard<std::mutex> lock(g_stamps_mu);
  g_stamps.insert(stamp);
  return stamp;
}

void delete_stamp(Stamp* stamp) {
  {
    std::lock_guard<std::mutex> lock(g_stamps_mu);
    g_stamps.erase(stamp);
  }
  delete stamp;
}

// (card, modeled seconds) of the event at `address`, or None when no live event is there.
py::object event_stamp(uintptr_t address) {
  std::lock_guard<std::mutex> lock(g_stamps_mu);
  auto found = g_stamps.find(reinterpret_cast<Stamp*>(address));
  if (found == g_stamps.end()) return py::none();
  return py::make_tuple((*found)->device, (*found)->modeled_s);
}

// Stamps the live event at `address` with `modeled_s` (C's aclrtRecordEvent); false if there is none.
bool set_event_stamp(uintptr_t address, double modeled_s) {
  std::lock_guard<std::mutex> lock(g_stamps_mu);
  auto found = g_stamps.find(reinterpret_cast<Stamp*>(address));
  if (found == g_stamps.end()) return false;
  (*found)->modeled_s = modeled_s;
  return true;
}

// Whether Python can be called back: not while the interpreter shuts down (a thread that asks for
// the GIL then is ended by the interpreter, which kills the process from a C++ frame).
bool python_usable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

double modeled_clock() {
  if (g_clock == nullptr || !python_usable()) return 0.0;
  py::gil_scoped_acquire gil;
  if (g_clock == nullptr) return 0.0;  // detached while this thread waited for the GIL
  return g_clock->operator()().cast<double>();
}

struct NpuGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNpu; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old(kNpu, t_device);
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kNpu, t_device); }
  // Every index that reaches a per-card array, checked first (never a read past it).
  static void check_index(int index) {
    TORCH_CHECK(index >= 0 && index < g_device_count.load() && index < kMaxDevices, "Invalid device id: npu:", index,
                " (this host shows ", g_device_count.load(), " NPUs; hccl-npu --devices N sets how many)");
  }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kNpu, "expected an npu device, got ", d);
    if (d.index() < 0) return;
    TORCH_CHECK(d.index() < g_device_count.load(), "Invalid device id: npu:", int(d.index()), " (this host shows ",
                g_device_count.load(), " NPUs; hccl-npu --devices N sets how many)");
    t_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < kMaxDevices) t_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const override {
    auto index = d.index() < 0 ? t_device : d.index();
    check_index(index);
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNpu, index), t_stream[index]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kNpu, d.index() < 0 ? t_device : d.index()));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return getNewStream(d, 0); }
  c10::Stream getNewStream(c10::Device d, int) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNpu, d.index() < 0 ? t_device : d.index()), g_next_stream++);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto old = getStream(s.device());
    check_index(s.device_index());
    t_stream[s.device_index()] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return c10::DeviceIndex(g_device_count.load()); }
  // Events: work on this device has finished when its call returns (results are computed at
  // once), so an event is only a stamp of the card's modeled clock.
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex, const c10::EventFlag) const override {
    if (*event == nullptr) *event = new_stamp();
    static_cast<Stamp*>(*event)->device = stream.device_index();
    static_cast<Stamp*>(*event)->modeled_s = modeled_clock();
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override { delete_stamp(static_cast<Stamp*>(event)); }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr, "Both events must be recorded before calculating elapsed time.");
    return (static_cast<Stamp*>(end)->modeled_s - static_cast<Stamp*>(start)->modeled_s) * 1e3;
  }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, NpuGuard);

struct NpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return g_device_count.load() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return c10::DeviceIndex(g_device_count.load()); }
  void setCurrentDevice(c10::DeviceIndex d) const override { NpuGuard().setDevice(c10::Device(kNpu, d)); }
  c10::DeviceIndex getCurrentDevice() const override { return t_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    return NpuGuard().exchangeDevice(c10::Device(kNpu, d)).index();
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  // npu random numbers come from torch's CPU generator (the kernels are the CPU's), so a seed
  // gives the same numbers on npu as on the CPU.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Generator getNewGenerator(c10::DeviceIndex) const override { return at::detail::createCPUGenerator(); }
  at::Device getDeviceFromPtr(void*) const override { return c10::Device(kNpu, t_device); }
  bool isPinnedPtr(const void* ptr) const override { return is_pinned_ptr(ptr); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override;
};

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
        "what ran on npu tensors since the last drain: (name, m, n, k, batch, nbytes, dtype, kind) each, kind 0 a "
        "kernel, 1 the pool's growth (nbytes: the segment), 2 a host-to-npu copy, 3 an npu-to-host copy");
  m.def("premul_factor", &hccl_npu::premul_factor);
  m.def("move_into_shared", &hccl_npu::move_into_shared, "move an npu storage's bytes into a shared CPU storage, in place");
  m.def("cpu_backing", &hccl_npu::cpu_backing, "the CPU bytes an npu storage shows, or None");
  m.def("opened_shared", &hccl_npu::opened_shared, "an npu tensor over a shared CPU storage's bytes, unbooked");
  m.def("set_format", &hccl_npu::set_format);
  m.def("get_format", &hccl_npu::get_format);
  m.def("as_cpu", [](const at::Tensor& t) { return hccl_npu::as_cpu(t); }, "the CPU tensor showing an npu tensor's bytes, without a copy");
}
