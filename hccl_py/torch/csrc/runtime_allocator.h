// Part of hccl-py's npu device: included once, in order, by npu_device.cpp, its one translation
// unit (after the headers it needs); not a header to include elsewhere.
// Runtime: HBM booking against each card's pool, the npu allocator's blocks, the pinned host
// allocator, and CPU/npu views of one storage.
#pragma once

namespace hccl_npu {

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

}  // namespace hccl_npu
