// Part of hccl-py's npu device: included once, in order, by npu_device.cpp, its one translation
// unit (after the headers it needs); not a header to include elsewhere.
// What every part shares: the card limits, each thread's current card and stream, the
// per-card pools, the Python callbacks, and the kernel log's entry (EntryKind, Kernel) and log.
#pragma once

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

}  // namespace hccl_npu
