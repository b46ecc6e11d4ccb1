// Part of hccl-py's npu device: included once, in order, by npu_device.cpp, its one translation
// unit (after the headers it needs); not a header to include elsewhere.
// Runtime: the device guard (current card and stream per thread), events stamped with the
// card's modeled clock, and torch's PrivateUse1 hooks.
#pragma once

namespace hccl_npu {

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

}  // namespace hccl_npu
