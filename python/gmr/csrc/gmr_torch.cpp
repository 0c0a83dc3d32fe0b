/* gmr_torch.cpp: PyTorch's CUDA allocator, served by gmr.
 *
 * GmrAllocator is a c10::cuda::CUDACachingAllocator::CUDAAllocator, the
 * interface of PyTorch's own caching allocator, so that every torch.cuda
 * memory call (memory_stats, memory_summary, _snapshot, CUDA graphs, MemPool,
 * torch.compile's cudagraph trees, IPC) reaches gmr instead of raising as it
 * does under CUDAPluggableAllocator.  Each device is served by
 * gmr_default_runtime(device), the runtime CuPy and the interposer share.
 * python/gmr/_torch.py compiles this file against the installed torch on
 * first use and calls gmr_torch_native_install() before the first CUDA
 * allocation.  Every virtual of the interface is implemented, or refuses
 * with a sentence saying why and what to use instead.
 */
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "gmr.h"

namespace {

namespace CCA = c10::cuda::CUDACachingAllocator;
using c10::MempoolId_t;
using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::TraceEntry;

constexpr int kMaxDevices = 64; /* as lib/adapters/hooks.c */

/* PyTorch's IPC handle: [version][type]['c': cudaIpcMemHandle_t].  Version 2
 * is torch 2.11's (c10/cuda/CUDACachingAllocator.cpp SHAREABLE_HANDLE_VERSION);
 * a reader refuses a version newer than its own. */
constexpr char kIpcVersion = 2;
constexpr char kIpcCudaMalloc = 'c';
constexpr char kIpcExpandable = 'e';

std::string gmr_error_text(gmr_runtime_t *rt, int rc) {
  const char *why = rt ? gmr_last_error(rt) : gmr_thread_last_error();
  if (why == nullptr || why[0] == '\0') why = gmr_thread_last_error();
  std::string s = gmr_strerror(rc);
  if (why != nullptr && why[0] != '\0') s = std::string(why);
  return s;
}

bool is_default_pool(const MempoolId_t &id) {
  return id.first == 0 && id.second == 0;
}

/* One private pool as PyTorch names it (MempoolId_t) and as gmr holds it. */
struct PoolEntry {
  MempoolId_t id;
  gmr_pool_t *pool = nullptr;
  int device = 0;
  int torch_uses = 0;      /* PyTorch's use count (createOrIncref, beginAllocateToPool) */
  bool freeable = false;   /* torch_uses reached 0: released at the next emptyCache */
  bool use_on_oom = false; /* MemPool(use_on_oom=True) */
};

/* A route of allocations to a pool: PyTorch's captures_underway entry. */
struct Route {
  MempoolId_t id;
  int device;
  gmr_pool_t *pool;
  std::function<bool(cudaStream_t)> filter;
};

/* What the history keeps of a live block (Note [History]). */
struct BlockCtx {
  std::shared_ptr<c10::GatheredContext> ctx;
  size_t size = 0;
  cudaStream_t stream = nullptr;
  MempoolId_t pool{0, 0};
  int device = 0;
};

/* A ring of trace entries, as PyTorch's RingBuffer. */
struct TraceRing {
  size_t max = 0;
  size_t next = 0; /* where the next entry goes once the ring is full */
  std::vector<TraceEntry> v;
  void push(TraceEntry te) {
    if (max == 0) return;
    if (v.size() < max) {
      v.push_back(std::move(te));
    } else {
      v[next] = std::move(te);
      next = (next + 1) % max;
    }
  }
  std::vector<TraceEntry> ordered() const {
    std::vector<TraceEntry> out;
    out.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      out.push_back(v[(next + i) % v.size()]);
    return out;
  }
  void clear() {
    v.clear();
    next = 0;
  }
  void set_max(size_t m) {
    std::vector<TraceEntry> keep = ordered();
    if (keep.size() > m) keep.erase(keep.begin(), keep.end() - static_cast<ptrdiff_t>(m));
    v = std::move(keep);
    next = 0;
    max = m;
  }
};

struct GmrPoolState : CCA::AllocatorState {
  MempoolId_t id;
  std::vector<std::pair<void *, size_t>> live;
};

/* Set by the allocating thread around a gmr call, read by the history
 * observer that gmr calls on the same thread (Note [History]). */
thread_local const std::shared_ptr<c10::GatheredContext> *tls_ctx = nullptr;
thread_local MempoolId_t tls_pool{0, 0};
thread_local std::vector<std::string> tls_compile_context;

void gmr_native_delete(void *ptr);

class GmrAllocator final : public CCA::CUDAAllocator {
public:
  /* ---- runtimes ------------------------------------------------------- */

  gmr_runtime_t *runtime(int device) {
    TORCH_CHECK(device >= 0 && device < kMaxDevices, "gmr: CUDA device ", device,
                " is out of range [0, ", kMaxDevices, ")");
    gmr_runtime_t *rt = rts_[device].load(std::memory_order_acquire);
    if (C10_LIKELY(rt != nullptr)) return rt;
    int rc = gmr_default_runtime(device, &rt);
    TORCH_CHECK(rc == 0, "gmr: no runtime for CUDA device ", device, ": ",
                gmr_error_text(nullptr, rc));
    rts_[device].store(rt, std::memory_order_release);
    std::lock_guard<std::mutex> lock(obs_mu_);
    if (observing_) observe(device, true);
    return rt;
  }

  gmr_runtime_t *runtime_if_any(int device) const {
    if (device < 0 || device >= kMaxDevices) return nullptr;
    return rts_[device].load(std::memory_order_acquire);
  }

  /* ---- allocation ----------------------------------------------------- */

  c10::DataPtr allocate(size_t size) override {
    c10::DeviceIndex device = c10::cuda::current_device();
    c10::Device dev(c10::DeviceType::CUDA, device);
    if (size == 0) return {nullptr, nullptr, &gmr_native_delete, dev};
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    void *p = malloc_on(device, size, stream);
    return {p, p, &gmr_native_delete, dev};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &gmr_native_delete; }

  void *raw_alloc(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    c10::DeviceIndex device = c10::cuda::current_device();
    return malloc_on(device, nbytes, c10::cuda::getCurrentCUDAStream(device).stream());
  }

  void *raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    if (nbytes == 0) return nullptr;
    return malloc_on(c10::cuda::current_device(), nbytes, stream);
  }

  void raw_delete(void *ptr) override {
    if (ptr == nullptr) return;
    TORCH_CHECK(free_ptr(ptr), "gmr: invalid device pointer ", ptr,
                ": no gmr runtime holds it (freed twice, or allocated elsewhere)");
  }

  /* Called by the DataPtr's deleter: never throws (a destructor calls it). */
  bool free_ptr(void *ptr) {
    if (C10_UNLIKELY(history_active_.load(std::memory_order_relaxed))) note_free(ptr);
    bool profiling = c10::memoryProfilingEnabled();
    for (int d = 0; d < kMaxDevices; ++d) {
      gmr_runtime_t *rt = runtime_if_any(d);
      if (rt == nullptr) continue;
      size_t req = 0, got = 0;
      if (C10_UNLIKELY(profiling) && gmr_alloc_size(rt, ptr, &req, &got) != 0) continue;
      if (gmr_free(rt, ptr) == 0) {
        if (C10_UNLIKELY(profiling)) report_usage(rt, d, ptr, got, false);
        return true;
      }
    }
    return false;
  }

  /* torch.profiler(profile_memory=True), as PyTorch's allocator reports. */
  void report_usage(gmr_runtime_t *rt, int device, void *ptr, size_t size, bool alloc) {
    gmr_stats_t st;
    if (gmr_stats(rt, &st) != 0) return;
    int64_t n = static_cast<int64_t>(size);
    c10::reportMemoryUsageToProfiler(
        ptr, alloc ? n : -n, st.allocated_bytes, st.reserved_bytes,
        c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
  }

  void copy_data(void *dest, const void *src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  /* ---- setup ------------------------------------------------------------ */

  void init(int device_count) override {
    device_count_ = device_count;
    initialized_ = true;
  }

  bool initialized() override { return initialized_; }

  std::string name() override {
    gmr_runtime_t *rt = runtime_if_any(0);
    if (rt == nullptr) {
      try {
        rt = runtime(0);
      } catch (const c10::Error &) {
        return "gmr";
      }
    }
    return std::string("gmr:") + gmr_runtime_policy(rt);
  }

  /* caching_allocator_enable(False) makes PyTorch's allocator call cudaMalloc
   * directly; gmr's `direct` policy is that. */
  void enable(bool value) override {
    TORCH_CHECK(value,
                "gmr: the allocator cannot be disabled because every allocation goes through "
                "gmr's policy; use gmr's `direct` policy (GMR_CONFIG=config/direct.yaml) for "
                "uncached allocations instead");
  }
  bool isEnabled() const override { return true; }

  /* ---- the cache ------------------------------------------------------ */

  void emptyCache(MempoolId_t mempool_id) override {
    if (is_default_pool(mempool_id)) {
      release_freeable_pools(nullptr);
      for (int d = 0; d < kMaxDevices; ++d) {
        gmr_runtime_t *rt = runtime_if_any(d);
        if (rt != nullptr) gmr_empty_cache(rt);
      }
      return;
    }
    std::lock_guard<std::mutex> lock(pmu_);
    auto it = pools_.find(mempool_id);
    if (it == pools_.end()) return; /* already given back */
    gmr_pool_empty_cache(it->second.pool);
    if (it->second.freeable) drop_pool_locked(it);
  }

  /* The largest block an allocation could get without freeing anything:
   * PyTorch starts from the device's free memory and takes the largest cached
   * block when larger (cuDNN's benchmark sizes its workspace by it).  Under a
   * gmr limit or memory fraction, the device's free memory is capped by what
   * the limit leaves. */
  void cacheInfo(c10::DeviceIndex device, size_t *largestBlock) override {
    gmr_runtime_t *rt = runtime(device);
    gmr_stats_t st;
    int rc = gmr_stats(rt, &st);
    TORCH_CHECK(rc == 0, "gmr: cacheInfo: ", gmr_error_text(rt, rc));
    if (*largestBlock == 0) {
      size_t free_b = 0, total_b = 0;
      if (gmr_mem_info(rt, &free_b, &total_b) == 0) *largestBlock = free_b;
      uint64_t cap = st.limit_bytes;
      double frac = gmr_memory_fraction(rt);
      if (frac < 1.0) {
        uint64_t fcap = static_cast<uint64_t>(frac * static_cast<double>(total_b));
        if (cap == 0 || fcap < cap) cap = fcap;
      }
      if (cap != 0) {
        uint64_t left = cap > st.reserved_bytes ? cap - st.reserved_bytes : 0;
        if (left < *largestBlock) *largestBlock = static_cast<size_t>(left);
      }
    }
    if (st.largest_free_block > *largestBlock) *largestBlock = st.largest_free_block;
  }

  void *getBaseAllocation(void *ptr, size_t *size) override {
    gmr_segment_info_t seg = segment_of(ptr, "getBaseAllocation");
    TORCH_CHECK(!(seg.flags & GMR_SEGMENT_EXPANDABLE), "gmr: getBaseAllocation: ", ptr,
                " lies in a segment that grows by mapping pages (this policy's segments are not "
                "cudaMalloc ranges), so it has no base allocation to share; use gmr's `caching` "
                "policy for tensors shared between processes");
    if (size != nullptr) *size = seg.size;
    return reinterpret_cast<void *>(seg.base);
  }

  using CCA::CUDAAllocator::recordStream;
  void recordStream(const c10::DataPtr &ptr, c10::cuda::CUDAStream stream) override {
    if (!ptr.get()) return;
    /* As PyTorch's: a pointer that is not ours (an IPC import) is skipped. */
    if (ptr.get_deleter() != &gmr_native_delete) return;
    gmr_runtime_t *rt = runtime(ptr.device().index());
    int rc = gmr_record_stream(rt, ptr.get(), stream.stream());
    TORCH_CHECK(rc == 0, "gmr: recordStream(", ptr.get(), "): ", gmr_error_text(rt, rc));
  }

  /* ---- statistics ----------------------------------------------------- */

  /* Note [Statistics]
   * Under `caching` (alone or under a limit) gmr_stats_foreach yields PyTorch's
   * own memory_stats keys, kept by the policy exactly as PyTorch keeps them:
   * they are copied key by key ("allocated_bytes.small_pool.freed" ->
   * allocated_bytes[SMALL_POOL].freed).  Under the other policies (bfc,
   * stitch, direct) the figures come from gmr_stats_t, which has no small and
   * large pools: "all" and "large_pool" both carry the totals, "small_pool"
   * is 0; allocated_bytes, reserved_bytes, active_bytes and requested_bytes
   * have current and peak (allocated/freed totals are 0: gmr_stats_t counts
   * no bytes through), allocation counts num_allocs/num_frees, segment counts
   * device_allocs/device_frees, inactive_split is 0, max_split_size -1 (no
   * limit). */
  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    gmr_runtime_t *rt = runtime(device);
    DeviceStats s;
    StatFill fill{&s, false};
    int rc = gmr_stats_foreach(rt, &GmrAllocator::stat_cb, &fill);
    TORCH_CHECK(rc == 0, "gmr: getDeviceStats: ", gmr_error_text(rt, rc));
    if (fill.caching) return s;
    gmr_stats_t st;
    rc = gmr_stats(rt, &st);
    TORCH_CHECK(rc == 0, "gmr: getDeviceStats: ", gmr_error_text(rt, rc));
    s = DeviceStats();
    auto put = [](StatArray &a, uint64_t cur, uint64_t peak, uint64_t alloc, uint64_t freed) {
      for (size_t t : {size_t(0), size_t(2)}) {
        a[t].current = static_cast<int64_t>(cur);
        a[t].peak = static_cast<int64_t>(peak);
        a[t].allocated = static_cast<int64_t>(alloc);
        a[t].freed = static_cast<int64_t>(freed);
      }
    };
    put(s.allocated_bytes, st.allocated_bytes, st.peak_allocated_bytes, 0, 0);
    put(s.reserved_bytes, st.reserved_bytes, st.peak_reserved_bytes, 0, 0);
    put(s.active_bytes, st.active_bytes, st.peak_active_bytes, 0, 0);
    put(s.requested_bytes, st.requested_bytes, st.peak_requested_bytes, 0, 0);
    put(s.allocation, st.allocations, st.peak_allocations, st.num_allocs, st.num_frees);
    put(s.active, st.allocations, st.peak_allocations, st.num_allocs, st.num_frees);
    put(s.segment, st.segments, st.peak_segments, st.device_allocs, st.device_frees);
    s.num_alloc_retries = static_cast<int64_t>(st.alloc_retries);
    s.num_ooms = static_cast<int64_t>(st.ooms);
    s.num_device_alloc = static_cast<int64_t>(st.device_allocs);
    s.num_device_free = static_cast<int64_t>(st.device_frees);
    s.max_split_size = -1;
    return s;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    gmr_stats_reset_accumulated(runtime(device));
  }
  void resetPeakStats(c10::DeviceIndex device) override { gmr_stats_reset_peak(runtime(device)); }

  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    gmr_runtime_t *rt = runtime(device);
    int rc = gmr_set_memory_fraction(rt, fraction);
    TORCH_CHECK(rc == 0, "gmr: set_per_process_memory_fraction(", fraction,
                "): ", gmr_error_text(rt, rc));
  }
  double getMemoryFraction(c10::DeviceIndex device) override {
    return gmr_memory_fraction(runtime(device));
  }

  std::vector<CCA::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override {
    std::vector<CCA::StreamSegmentSize> out;
    for (const gmr_walk_entry_t &e : walk(device))
      if (e.is_segment && e.is_expandable)
        out.emplace_back(static_cast<cudaStream_t>(e.stream),
                         e.pool != nullptr && std::strcmp(e.pool, "small") == 0, e.size);
    return out;
  }

  /* ---- private pools -------------------------------------------------- */

  /* Note [Pools]
   * A MempoolId_t maps to one gmr_pool_t.  The adapter holds one gmr use of
   * its own on top of PyTorch's uses, so that a pool whose PyTorch count
   * reaches 0 (releasePool) stays valid until its cache is given back: at the
   * next emptyCache (global, or of that id, as MemPool's destructor calls) or
   * when an allocation runs out of memory, as PyTorch frees its
   * graph_pools_freeable then.  Only then is the adapter's use dropped, after
   * which gmr destroys the pool once its last block is freed.
   * Routes (beginAllocateToPool) are PyTorch's captures_underway: a filter on
   * the allocating stream, the newest first; a match allocates with
   * gmr_alloc_in.  Each begin calls gmr_capture_begin and each end
   * gmr_capture_end, since PyTorch defers its event processing whenever a
   * route exists (MemPool's too): no event is queried during a capture. */

  void createOrIncrefPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                          std::shared_ptr<CCA::CUDAAllocator> allocator) override {
    TORCH_CHECK(allocator == nullptr || allocator.get() == this,
                "gmr: a MemPool with its own allocator is not supported because gmr's pools "
                "reserve memory through gmr's backend; create torch.cuda.MemPool() without "
                "an allocator");
    std::lock_guard<std::mutex> lock(pmu_);
    incref_locked(device, mempool_id);
  }

  void releasePool(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    (void)device;
    std::lock_guard<std::mutex> lock(pmu_);
    auto it = pools_.find(mempool_id);
    TORCH_CHECK(it != pools_.end() && it->second.torch_uses > 0, "gmr: releasePool: pool (",
                mempool_id.first, ", ", mempool_id.second, ") is not in use");
    gmr_pool_release(it->second.pool); /* one of PyTorch's uses; the adapter's remains */
    if (--it->second.torch_uses == 0) it->second.freeable = true;
  }

  int getPoolUseCount(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    (void)device;
    std::lock_guard<std::mutex> lock(pmu_);
    auto it = pools_.find(mempool_id);
    return it == pools_.end() ? 0 : it->second.torch_uses;
  }

  void setUseOnOOM(c10::DeviceIndex device, MempoolId_t mempool_id, bool use_on_oom) override {
    (void)device;
    std::lock_guard<std::mutex> lock(pmu_);
    auto it = pools_.find(mempool_id);
    TORCH_CHECK(it != pools_.end(), "gmr: setUseOnOOM: no pool (", mempool_id.first, ", ",
                mempool_id.second, ")");
    it->second.use_on_oom = use_on_oom;
  }

  void setNoSplit(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    (void)device;
    (void)mempool_id;
    TORCH_CHECK(false, "gmr: MemPool(no_split=True) is not supported because a gmr pool splits its "
                       "segments as its policy does; use gmr's `direct` policy for one segment per "
                       "allocation, or a MemPool without no_split");
  }

  void beginAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override {
    gmr_runtime_t *rt = runtime(device);
    {
      std::lock_guard<std::mutex> lock(pmu_);
      for (const Route &r : routes_)
        TORCH_CHECK(!(r.id == mempool_id && r.device == device),
                    "beginAllocateToPool: already recording to mempool_id");
      PoolEntry &e = incref_locked(device, mempool_id);
      int rc = gmr_capture_begin(rt);
      TORCH_CHECK(rc == 0, "gmr: beginAllocateToPool: ", gmr_error_text(rt, rc));
      routes_.push_back(Route{mempool_id, device, e.pool, std::move(filter)});
      nroutes_.store(static_cast<int>(routes_.size()), std::memory_order_release);
    }
  }

  void endAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    gmr_runtime_t *rt = runtime(device);
    std::lock_guard<std::mutex> lock(pmu_);
    for (auto it = routes_.begin(); it != routes_.end(); ++it) {
      if (it->id == mempool_id && it->device == device) {
        routes_.erase(it);
        nroutes_.store(static_cast<int>(routes_.size()), std::memory_order_release);
        int rc = gmr_capture_end(rt);
        TORCH_CHECK(rc == 0, "gmr: endAllocateToPool: ", gmr_error_text(rt, rc));
        return;
      }
    }
    TORCH_CHECK(false, "endAllocatePool: not currently recording to mempool_id");
  }

  bool checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId_t mempool_id,
                                const std::unordered_set<void *> &expected) override {
    (void)device;
    std::vector<std::pair<void *, size_t>> live;
    if (!pool_live(mempool_id, &live)) return expected.empty();
    for (const auto &b : live)
      if (expected.count(b.first) == 0) return false;
    return live.size() == expected.size();
  }

  /* Note [Checkpoints]
   * cudagraph trees take a checkpoint of a graph pool after each recording
   * (getCheckpointState) and, when they warm up or record another graph while
   * a path of graphs is live, restore it (setCheckpointPoolState): every
   * block of the checkpoint is made allocated again at its address, with a
   * deleter.  The checkpoint is the pool's live blocks (gmr_pool_foreach_live).
   * Restoring needs a block allocated at a given address, which gmr's C API
   * does not offer, so setCheckpointPoolState refuses; the plain path of
   * torch.compile(mode="reduce-overhead") (warm up, record, replay) needs only
   * the checkpoint. */
  std::shared_ptr<CCA::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                          MempoolId_t id) override {
    (void)device;
    auto st = std::make_shared<GmrPoolState>();
    st->id = id;
    pool_live(id, &st->live);
    return st;
  }

  CCA::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<CCA::AllocatorState> pps) override {
    (void)device;
    (void)pps;
    TORCH_CHECK(false,
                "gmr: setCheckpointPoolState is not supported because gmr's C API cannot "
                "allocate a block at a given address, which restoring a cudagraph-trees "
                "checkpoint needs; this happens when torch.compile(mode=\"reduce-overhead\") "
                "records or warms up a graph while another graph path is live: use "
                "mode=\"max-autotune-no-cudagraphs\", or PyTorch's own allocator, for such "
                "programs");
  }

  /* ---- history and snapshots ------------------------------------------ */

  /* Note [History]
   * PyTorch's recorder (CapturedTraceback::gather) is kept as given and
   * called by the allocating thread before gmr is called, never under a gmr
   * lock.  Per live block the adapter keeps its context (for the snapshot's
   * frames).  alloc and free_requested entries are the adapter's own;
   * segment_alloc/free/map/unmap, free_completed and oom come from gmr's
   * history observer (gmr_history_observe), which gmr calls on the thread of
   * the call that caused them, under gmr's history lock: it takes the
   * adapter's history lock only (the adapter never calls gmr under that
   * lock), and finds the context and the pool of the allocation underway in
   * thread-local variables.  free_completed is kept only for a block that
   * PyTorch freed (gmr also serves CuPy and the interposer). */

  void recordHistory(bool enabled, CCA::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, CCA::RecordContext when, bool clearHistory,
                     const std::vector<std::string> &skip_actions) override {
    std::unique_lock<std::recursive_mutex> lock(hmu_);
    record_history_ = enabled;
    recorder_ = enabled ? context_recorder : nullptr;
    when_ = enabled ? when : CCA::RecordContext::NEVER;
    skip_.clear();
    for (const std::string &a : skip_actions)
      skip_.insert(c10::CachingDeviceAllocator::parseTraceEntryAction(a));
    for (TraceRing &r : rings_) {
      if (enabled) r.set_max(std::max<size_t>(alloc_trace_max_entries, 1));
      if (clearHistory) r.clear();
    }
    if (enabled) ring_max_ = std::max<size_t>(alloc_trace_max_entries, 1);
    if (clearHistory) annotations_.clear();
    if (!enabled) {
      blocks_.clear(); /* frees are no longer followed: the contexts would go stale */
      pending_free_.clear();
    }
    bool want = record_history_ || !trackers_.empty();
    lock.unlock();
    update_observing(want);
  }

  bool isHistoryEnabled() override {
    std::lock_guard<std::recursive_mutex> lock(hmu_);
    return record_history_;
  }

  void recordAnnotation(const std::vector<std::pair<std::string, std::string>> &md) override {
    std::lock_guard<std::recursive_mutex> lock(hmu_);
    if (!record_history_) return;
    c10::CachingDeviceAllocator::AnnotationEntry ae(c10::cuda::current_device(),
                                                    c10::getApproximateTime());
    for (const auto &kv : md)
      ae.recordUserMetadata(kv.first, kv.second);
    annotations_.push_back(std::move(ae));
  }

  void pushCompileContext(std::string &md) override { tls_compile_context.push_back(md); }
  void popCompileContext() override {
    if (!tls_compile_context.empty()) tls_compile_context.pop_back();
  }
  void setUserMetadata(const std::string &metadata) override {
    std::lock_guard<std::recursive_mutex> lock(hmu_);
    user_metadata_ = metadata;
  }
  std::string getUserMetadata() override {
    std::lock_guard<std::recursive_mutex> lock(hmu_);
    return user_metadata_;
  }

  void attachOutOfMemoryObserver(CCA::OutOfMemoryObserver observer) override {
    std::lock_guard<std::recursive_mutex> lock(hmu_);
    oom_observers_.push_back(std::move(observer));
  }

  void attachAllocatorTraceTracker(CCA::AllocatorTraceTracker tracker) override {
    {
      std::lock_guard<std::recursive_mutex> lock(hmu_);
      trackers_.push_back(std::move(tracker));
    }
    update_observing(true);
  }

  /* Segments and blocks from gmr_walk; each run of mapped blocks is a
   * segment (an unmapped range ends one, as PyTorch reports expandable
   * segments); blocks are laid end to end from the segment's start, as
   * torch's snapshot reader assumes, with a gap shown as an inactive block. */
  CCA::SnapshotInfo snapshot(MempoolId_t mempool_id, bool include_traces) override {
    CCA::SnapshotInfo out;
    std::map<uint64_t, MempoolId_t> ids = pool_ids();
    auto to_ns = clock_.makeConverter(); /* approximate clock -> Unix ns */
    int ndev = std::min(std::max(device_count_, 1), kMaxDevices);
    for (int d = 0; d < ndev; ++d) {
      if (runtime_if_any(d) == nullptr) {
        out.device_traces.emplace_back();
        continue;
      }
      std::vector<gmr_walk_entry_t> entries = walk(d);
      std::lock_guard<std::recursive_mutex> lock(hmu_);
      if (include_traces && record_history_)
        add_trace(d, TraceEntry::SNAPSHOT, 0, 0, nullptr, {0, 0}, nullptr);
      add_segments(d, entries, ids, mempool_id, &out.segments);
      std::vector<TraceEntry> tr;
      if (include_traces && d < static_cast<int>(rings_.size())) {
        for (TraceEntry &te : rings_[d].ordered()) {
          if (!is_default_pool(mempool_id) && te.mempool_ != mempool_id) continue;
          te.time_.t_ = to_ns(te.time_.approx_t_) / 1000;
          tr.push_back(std::move(te));
        }
      }
      out.device_traces.push_back(std::move(tr));
    }
    if (include_traces) {
      std::lock_guard<std::recursive_mutex> lock(hmu_);
      for (auto ae : annotations_) {
        ae.time_.t_ = to_ns(ae.time_.approx_t_) / 1000;
        out.external_annotations.push_back(std::move(ae));
      }
    }
    CCA::AllocatorConfigInfo &md = out.config_metadata;
    md.garbage_collection_threshold = 0;
    md.max_split_size = SIZE_MAX;
    md.pinned_num_register_threads = 1;
    md.expandable_segments = false;
    md.release_lock_on_malloc = false;
    md.pinned_use_host_register = false;
    md.graph_capture_record_stream_reuse = false;
    md.last_allocator_settings = name();
    return out;
  }

  /* ---- IPC and peers -------------------------------------------------- */

  /* PyTorch's format for a cudaMalloc'd segment: [version]['c'][handle of the
   * segment's base], and the offset of ptr in it.  Segments that map pages
   * (stitch, expandable segments, a tag that can sleep) are refused with one
   * sentence: gmr cannot export their pages. */
  static void refuse_ipc(uintptr_t base, const char *why) {
    TORCH_CHECK(false, "gmr: a CUDA tensor cannot be shared with another process under this "
                "policy: its segment at 0x", std::hex, base, std::dec, " is ", why,
                ", not a cudaMalloc range; use gmr's `caching` (without expandable segments) or "
                "`bfc` policy, outside gmr.region, for tensors shared between processes");
  }

  CCA::ShareableHandle shareIpcHandle(void *ptr) override {
    gmr_segment_info_t seg = segment_of(ptr, "shareIpcHandle");
    if (seg.flags & GMR_SEGMENT_EXPANDABLE) refuse_ipc(seg.base, "mapped pages");
    cudaIpcMemHandle_t h;
    cudaError_t err = cudaIpcGetMemHandle(&h, reinterpret_cast<void *>(seg.base));
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      std::string why = std::string("memory the policy maps itself (cudaIpcGetMemHandle: ") +
                        cudaGetErrorString(err) + ")";
      refuse_ipc(seg.base, why.c_str());
    }
    std::string s;
    s.push_back(kIpcVersion);
    s.push_back(kIpcCudaMalloc);
    s.append(reinterpret_cast<const char *>(&h), CUDA_IPC_HANDLE_SIZE);
    return CCA::ShareableHandle{static_cast<ptrdiff_t>(reinterpret_cast<uintptr_t>(ptr) - seg.base),
                                s};
  }

  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    std::lock_guard<std::mutex> lock(ipc_mu_);
    auto it = ipc_.find(handle);
    if (it != ipc_.end()) {
      std::shared_ptr<void> sp = it->second.lock();
      if (sp) return sp;
      ipc_.erase(it);
    }
    TORCH_CHECK(handle.size() >= 2, "gmr: getIpcDevPtr: a handle of ", handle.size(),
                " bytes is not PyTorch's");
    TORCH_CHECK(handle[0] <= kIpcVersion,
                "received sharable handle from a future version of torch that this version "
                "does not know how to handle");
    TORCH_CHECK(handle[1] != kIpcExpandable,
                "gmr: getIpcDevPtr: the handle is of an expandable segment, which gmr cannot "
                "import; share tensors from a process whose allocator uses cudaMalloc segments");
    TORCH_CHECK(handle[1] == kIpcCudaMalloc && handle.size() == 2 + CUDA_IPC_HANDLE_SIZE,
                "gmr: getIpcDevPtr: unexpected or ill-formed shareable handle");
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data() + 2, CUDA_IPC_HANDLE_SIZE);
    c10::DeviceIndex device = c10::cuda::current_device();
    void *dev_ptr = nullptr;
    C10_CUDA_CHECK(cudaIpcOpenMemHandle(&dev_ptr, h, cudaIpcMemLazyEnablePeerAccess));
    std::shared_ptr<void> sp(dev_ptr, [device, handle, this](void *p) {
      c10::cuda::CUDAGuard guard(device);
      (void)cudaIpcCloseMemHandle(p);
      std::lock_guard<std::mutex> l(ipc_mu_);
      auto e = ipc_.find(handle);
      if (e != ipc_.end() && e->second.expired()) ipc_.erase(e);
    });
    ipc_[handle] = sp;
    return sp;
  }

  /* Peer access for cudaMalloc'd memory.  Pages a policy maps itself (stitch)
   * would need cuMemSetAccess for the peer, which gmr does not expose: copies
   * then go through cudaMemcpyPeerAsync (memcpyAsync). */
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    c10::cuda::CUDAGuard guard(dev);
    cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else {
      C10_CUDA_CHECK(err);
    }
  }

  cudaError_t memcpyAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override {
    if (p2p_enabled || srcDevice == dstDevice)
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    /* Without peer access only the Peer copy handles memory that is not a
     * cudaMalloc range; it works for cudaMalloc ranges too. */
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }

  /* ---- the history observer (called by gmr) --------------------------- */

  void on_event(int device, const gmr_history_event_t *ev) {
    std::lock_guard<std::recursive_mutex> lock(hmu_);
    TraceEntry::Action a;
    switch (ev->action) {
    case GMR_HISTORY_SEGMENT_ALLOC:
      a = TraceEntry::SEGMENT_ALLOC;
      break;
    case GMR_HISTORY_SEGMENT_FREE:
      a = TraceEntry::SEGMENT_FREE;
      break;
    case GMR_HISTORY_SEGMENT_MAP:
      a = TraceEntry::SEGMENT_MAP;
      break;
    case GMR_HISTORY_SEGMENT_UNMAP:
      a = TraceEntry::SEGMENT_UNMAP;
      break;
    case GMR_HISTORY_OOM:
      a = TraceEntry::OOM;
      break;
    case GMR_HISTORY_FREE_COMPLETED: {
      auto it = pending_free_.find(reinterpret_cast<void *>(ev->address));
      if (it == pending_free_.end()) return;
      BlockCtx b = std::move(it->second);
      pending_free_.erase(it);
      add_trace(device, TraceEntry::FREE_COMPLETED, ev->address, b.size, b.stream, b.pool,
                when_ >= CCA::RecordContext::ALL ? b.ctx : nullptr);
      return;
    }
    default:
      return; /* alloc and free_requested are the adapter's own; snapshot too */
    }
    std::shared_ptr<c10::GatheredContext> ctx;
    if (tls_ctx != nullptr) ctx = *tls_ctx;
    if (a == TraceEntry::SEGMENT_ALLOC && record_history_) seg_ctx_[ev->address] = ctx;
    if (a == TraceEntry::SEGMENT_FREE) seg_ctx_.erase(ev->address);
    add_trace(device, a, ev->address, ev->size, static_cast<cudaStream_t>(ev->stream), tls_pool,
              ctx);
  }

private:
  struct StatFill {
    DeviceStats *s;
    bool caching;
  };

  static int stat_cb(const char *key, int64_t value, void *ud) {
    auto *f = static_cast<StatFill *>(ud);
    static const std::pair<const char *, StatArray DeviceStats::*> arrays[] = {
        {"allocation", &DeviceStats::allocation},
        {"segment", &DeviceStats::segment},
        {"active", &DeviceStats::active},
        {"inactive_split", &DeviceStats::inactive_split},
        {"allocated_bytes", &DeviceStats::allocated_bytes},
        {"reserved_bytes", &DeviceStats::reserved_bytes},
        {"active_bytes", &DeviceStats::active_bytes},
        {"inactive_split_bytes", &DeviceStats::inactive_split_bytes},
        {"requested_bytes", &DeviceStats::requested_bytes},
    };
    static const std::pair<const char *, Stat DeviceStats::*> stats[] = {
        {"oversize_allocations", &DeviceStats::oversize_allocations},
        {"oversize_segments", &DeviceStats::oversize_segments},
    };
    static const std::pair<const char *, int64_t DeviceStats::*> scalars[] = {
        {"num_alloc_retries", &DeviceStats::num_alloc_retries},
        {"num_ooms", &DeviceStats::num_ooms},
        {"num_sync_all_streams", &DeviceStats::num_sync_all_streams},
        {"num_device_alloc", &DeviceStats::num_device_alloc},
        {"num_device_free", &DeviceStats::num_device_free},
        {"max_split_size", &DeviceStats::max_split_size},
    };
    std::string k(key);
    if (k == "allocated_bytes.all.current") f->caching = true;
    for (const auto &s : scalars)
      if (k == s.first) {
        f->s->*(s.second) = value;
        return 0;
      }
    size_t dot1 = k.find('.');
    if (dot1 == std::string::npos) return 0;
    std::string name = k.substr(0, dot1), rest = k.substr(dot1 + 1);
    auto metric = [&](Stat &st, const std::string &m) {
      if (m == "current")
        st.current = value;
      else if (m == "peak")
        st.peak = value;
      else if (m == "allocated")
        st.allocated = value;
      else if (m == "freed")
        st.freed = value;
    };
    for (const auto &s : stats)
      if (name == s.first) {
        metric(f->s->*(s.second), rest);
        return 0;
      }
    size_t dot2 = rest.find('.');
    if (dot2 == std::string::npos) return 0;
    std::string pool = rest.substr(0, dot2), m = rest.substr(dot2 + 1);
    size_t t = pool == "all" ? 0 : pool == "small_pool" ? 1 : pool == "large_pool" ? 2 : 3;
    if (t == 3) return 0;
    for (const auto &a : arrays)
      if (name == a.first) {
        metric((f->s->*(a.second))[t], m);
        return 0;
      }
    return 0;
  }

  /* The allocation itself: routes, history, out of memory. */
  void *malloc_on(c10::DeviceIndex device, size_t size, cudaStream_t stream) {
    gmr_runtime_t *rt = runtime(device);
    gmr_pool_t *pool = nullptr;
    MempoolId_t pid{0, 0};
    if (C10_UNLIKELY(nroutes_.load(std::memory_order_acquire) > 0)) {
      std::lock_guard<std::mutex> lock(pmu_);
      for (auto it = routes_.rbegin(); it != routes_.rend(); ++it)
        if (it->device == device && it->filter(stream)) {
          pool = it->pool;
          pid = it->id;
          break;
        }
    }
    std::shared_ptr<c10::GatheredContext> ctx;
    bool hist = history_active_.load(std::memory_order_relaxed);
    if (C10_UNLIKELY(hist)) ctx = gather(CCA::RecordContext::STATE);
    tls_ctx = &ctx;
    tls_pool = pid;
    void *p = nullptr;
    int rc = pool ? gmr_alloc_in(rt, pool, size, stream, &p) : gmr_alloc(rt, size, stream, &p);
    if (C10_UNLIKELY(rc == GMR_ENOMEM)) rc = retry_after_oom(rt, device, pool, size, stream, &p);
    tls_ctx = nullptr;
    tls_pool = {0, 0};
    if (C10_UNLIKELY(rc != 0)) fail_alloc(rt, device, size, rc);
    if (C10_UNLIKELY(hist)) note_alloc(device, p, size, stream, pid, std::move(ctx));
    if (C10_UNLIKELY(c10::memoryProfilingEnabled())) report_usage(rt, device, p, size, true);
    return p;
  }

  /* As PyTorch on a failed cudaMalloc: give back the pools nobody uses any
   * more, then try once more; then the pools that accept allocations on
   * out-of-memory (MemPool(use_on_oom=True)). */
  int retry_after_oom(gmr_runtime_t *rt, c10::DeviceIndex device, gmr_pool_t *pool, size_t size,
                      cudaStream_t stream, void **p) {
    int rc = GMR_ENOMEM;
    if (release_freeable_pools(rt))
      rc = pool ? gmr_alloc_in(rt, pool, size, stream, p) : gmr_alloc(rt, size, stream, p);
    if (rc != GMR_ENOMEM || pool != nullptr) return rc;
    std::vector<std::pair<gmr_pool_t *, MempoolId_t>> oom_pools;
    {
      std::lock_guard<std::mutex> lock(pmu_);
      for (auto &kv : pools_)
        if (kv.second.use_on_oom && !kv.second.freeable && kv.second.device == device)
          oom_pools.emplace_back(kv.second.pool, kv.first);
    }
    for (auto &op : oom_pools) {
      tls_pool = op.second;
      if (gmr_alloc_in(rt, op.first, size, stream, p) == 0) return 0;
    }
    return rc;
  }

  [[noreturn]] void fail_alloc(gmr_runtime_t *rt, c10::DeviceIndex device, size_t size, int rc) {
    std::string why = gmr_error_text(rt, rc);
    TORCH_CHECK(rc == GMR_ENOMEM, "gmr: allocating ", size, " bytes on CUDA device ", device,
                " failed: ", why);
    size_t dev_free = 0, dev_total = 0;
    gmr_mem_info(rt, &dev_free, &dev_total);
    double frac = gmr_memory_fraction(rt);
    size_t allowed =
        frac < 1.0 ? static_cast<size_t>(frac * static_cast<double>(dev_total)) : dev_total;
    std::vector<CCA::OutOfMemoryObserver> obs;
    {
      std::lock_guard<std::recursive_mutex> lock(hmu_);
      obs = oom_observers_;
    }
    for (const auto &o : obs)
      o(device, size, allowed, dev_free);
    gmr_stats_t st;
    if (gmr_stats(rt, &st) == 0)
      c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(size), st.allocated_bytes,
                                       st.reserved_bytes,
                                       c10::Device(c10::DeviceType::CUDA, device));
    TORCH_CHECK_WITH(OutOfMemoryError, false, why);
  }

  std::shared_ptr<c10::GatheredContext> gather(CCA::RecordContext at_least) {
    CCA::CreateContextFn rec;
    {
      std::lock_guard<std::recursive_mutex> lock(hmu_);
      if (when_ < at_least || recorder_ == nullptr) return nullptr;
      rec = recorder_;
    }
    return rec(); /* outside every lock: it may take the GIL */
  }

  void note_alloc(int device, void *p, size_t size, cudaStream_t stream, MempoolId_t pid,
                  std::shared_ptr<c10::GatheredContext> ctx) {
    std::lock_guard<std::recursive_mutex> lock(hmu_);
    add_trace(device, TraceEntry::ALLOC, reinterpret_cast<uintptr_t>(p), size, stream, pid,
              when_ >= CCA::RecordContext::ALLOC ? ctx : nullptr);
    if (!record_history_) return;
    BlockCtx &b = blocks_[p];
    b.ctx = std::move(ctx);
    b.size = size;
    b.stream = stream;
    b.pool = pid;
    b.device = device;
  }

  void note_free(void *p) {
    std::shared_ptr<c10::GatheredContext> fctx = gather(CCA::RecordContext::ALL);
    std::lock_guard<std::recursive_mutex> lock(hmu_);
    auto it = blocks_.find(p);
    BlockCtx b;
    if (it != blocks_.end()) {
      b = std::move(it->second);
      blocks_.erase(it);
    } else {
      /* allocated before the history started: its size from gmr would need
       * a gmr call, which this lock forbids; the trace shows 0 */
      b.device = c10::cuda::current_device();
    }
    if (fctx) b.ctx = fctx;
    add_trace(b.device, TraceEntry::FREE_REQUESTED, reinterpret_cast<uintptr_t>(p), b.size,
              b.stream, b.pool, when_ >= CCA::RecordContext::ALL ? b.ctx : nullptr);
    /* gmr reports free_completed for it (Note [History]); a bound in case
     * a policy never does */
    if (pending_free_.size() > (1u << 16)) pending_free_.clear();
    pending_free_[p] = std::move(b);
  }

  /* Called with hmu_ held. */
  void add_trace(int device, TraceEntry::Action a, uintptr_t addr, size_t size, cudaStream_t stream,
                 MempoolId_t pool, std::shared_ptr<c10::GatheredContext> ctx) {
    if (!record_history_ && trackers_.empty()) return;
    if (skip_.count(a)) return;
    std::string cc = tls_compile_context.empty() ? std::string() : tls_compile_context.back();
    TraceEntry te(a, static_cast<c10::DeviceIndex>(device), addr, size, stream, pool,
                  c10::getApproximateTime(), std::move(ctx), cc, user_metadata_);
    for (const auto &cb : trackers_)
      cb(te);
    if (!record_history_) return;
    if (device >= static_cast<int>(rings_.size())) {
      rings_.resize(static_cast<size_t>(device) + 1);
      for (TraceRing &r : rings_)
        if (r.max == 0) r.max = ring_max_;
    }
    rings_[static_cast<size_t>(device)].push(std::move(te));
  }

  static void observer(const gmr_history_event_t *ev, void *ud);

  /* Start or stop gmr's observer on every runtime.  Called without hmu_:
   * gmr_history_observe takes gmr's history lock, under which gmr calls
   * on_event, which takes hmu_ (so hmu_ is never held around a gmr call). */
  void update_observing(bool want) {
    std::lock_guard<std::mutex> lock(obs_mu_);
    history_active_.store(want, std::memory_order_relaxed);
    if (want == observing_) return;
    observing_ = want;
    for (int d = 0; d < kMaxDevices; ++d)
      if (runtime_if_any(d) != nullptr) observe(d, want);
  }

  void observe(int device, bool on) {
    gmr_runtime_t *rt = runtime_if_any(device);
    if (rt == nullptr) return;
    int rc = on ? gmr_history_observe(rt, &GmrAllocator::observer, &obs_ud_[device])
                : gmr_history_observe(rt, nullptr, nullptr);
    TORCH_CHECK(rc == 0, "gmr: recording the memory history of device ", device, ": ",
                gmr_error_text(rt, rc));
  }

  std::vector<gmr_walk_entry_t> walk(int device) {
    std::vector<gmr_walk_entry_t> v;
    gmr_runtime_t *rt = runtime(device);
    int rc = gmr_walk(
        rt,
        [](const gmr_walk_entry_t *e, void *ud) -> int {
          static_cast<std::vector<gmr_walk_entry_t> *>(ud)->push_back(*e);
          return 0;
        },
        &v);
    if (rc == GMR_ENOTSUP) return {}; /* the policy keeps no segments (direct) */
    TORCH_CHECK(rc == 0, "gmr: walking the segments of device ", device, ": ",
                gmr_error_text(rt, rc));
    return v;
  }

  /* hmu_ held. */
  void add_segments(int device, const std::vector<gmr_walk_entry_t> &entries,
                    const std::map<uint64_t, MempoolId_t> &ids, MempoolId_t only,
                    std::vector<c10::CachingDeviceAllocator::SegmentInfo> *out) {
    c10::CachingDeviceAllocator::SegmentInfo cur;
    bool open = false;
    uintptr_t at = 0, seg_end = 0;
    const gmr_walk_entry_t *seg = nullptr;
    auto close = [&]() {
      if (!open) return;
      if (at < seg_end) {
        c10::CachingDeviceAllocator::BlockInfo gap;
        gap.size = seg_end - at;
        cur.blocks.push_back(gap);
        at = seg_end;
      }
      cur.total_size = at - cur.address;
      if (cur.total_size > 0 && (is_default_pool(only) || cur.owner_private_pool_id == only))
        out->push_back(std::move(cur));
      cur = c10::CachingDeviceAllocator::SegmentInfo();
      open = false;
    };
    auto start = [&](uintptr_t addr) {
      cur = c10::CachingDeviceAllocator::SegmentInfo();
      cur.device = static_cast<c10::DeviceIndex>(device);
      cur.address = addr;
      cur.stream = seg->stream;
      cur.is_large = seg->pool == nullptr || std::strcmp(seg->pool, "small") != 0;
      cur.is_expandable = seg->is_expandable != 0;
      auto idit = ids.find(seg->pool_id);
      if (seg->pool_id != 0 && idit != ids.end()) cur.owner_private_pool_id = idit->second;
      auto c = seg_ctx_.find(addr);
      if (c != seg_ctx_.end()) cur.context_when_allocated = c->second;
      open = true;
      at = addr;
    };
    for (const gmr_walk_entry_t &e : entries) {
      if (e.is_segment) {
        close();
        seg = &e;
        seg_end = e.address + e.size;
        start(e.address);
        continue;
      }
      if (seg == nullptr) continue;
      if (e.state == GMR_BLOCK_UNMAPPED) {
        seg_end = e.address; /* a run ends here */
        close();
        seg_end = seg->address + seg->size;
        continue;
      }
      if (!open) start(e.address);
      if (e.address > at) {
        c10::CachingDeviceAllocator::BlockInfo gap;
        gap.size = e.address - at;
        cur.blocks.push_back(gap);
        at = e.address;
      }
      uintptr_t end = e.address + e.size;
      if (end <= at) continue; /* wholly inside the last block (a shared page) */
      c10::CachingDeviceAllocator::BlockInfo b;
      b.size = end - at;
      b.requested_size = e.requested;
      b.allocated = e.state == GMR_BLOCK_ALLOCATED;
      b.active = b.allocated || e.state == GMR_BLOCK_PENDING_FREE;
      if (b.allocated) {
        auto bc = blocks_.find(reinterpret_cast<void *>(e.address));
        if (bc != blocks_.end()) b.context_when_allocated = bc->second.ctx;
        cur.allocated_size += b.size;
        cur.requested_size += b.requested_size;
      }
      if (b.active) cur.active_size += b.size;
      cur.blocks.push_back(std::move(b));
      at = end;
    }
    close();
  }

  gmr_segment_info_t segment_of(void *ptr, const char *what) {
    for (int d = 0; d < kMaxDevices; ++d) {
      gmr_runtime_t *rt = runtime_if_any(d);
      if (rt == nullptr) continue;
      gmr_segment_info_t seg;
      int rc = gmr_segment_of(rt, ptr, &seg);
      if (rc == 0) {
        TORCH_CHECK(std::strcmp(gmr_runtime_backend(rt), "cuda") == 0, "gmr: ", what,
                    ": the runtime of device ", d, " runs on the ", gmr_runtime_backend(rt),
                    " backend, whose memory is not CUDA memory");
        return seg;
      }
      TORCH_CHECK(rc != GMR_ENOTSUP, "gmr: ", what, ": the policy ", gmr_runtime_policy(rt),
                  " keeps no segments, so the allocation holding ", ptr,
                  " cannot be found; use gmr's `caching` policy for this");
    }
    TORCH_CHECK(false, "gmr: ", what, ": invalid device pointer ", ptr,
                ": it lies in no gmr segment");
  }

  /* ---- pools (pmu_ held where said) ----------------------------------- */

  PoolEntry &incref_locked(int device, MempoolId_t id) {
    auto it = pools_.find(id);
    if (it != pools_.end() && !it->second.freeable) {
      TORCH_CHECK(gmr_pool_retain(it->second.pool) == 0, "gmr: pool retain failed");
      it->second.torch_uses++;
      return it->second;
    }
    TORCH_CHECK(it == pools_.end(), "gmr: pool (", id.first, ", ", id.second,
                ") was released and is waiting to be given back; use a new id");
    gmr_runtime_t *rt = runtime(device);
    gmr_pool_t *pool = nullptr;
    int rc = gmr_pool_create(rt, &pool);
    TORCH_CHECK(rc == 0, "gmr: creating a private pool: ", gmr_error_text(rt, rc));
    if (gmr_pool_retain(pool) != 0) { /* the adapter's own use (Note [Pools]) */
      gmr_pool_release(pool);
      TORCH_CHECK(false, "gmr: retaining a new private pool failed");
    }
    PoolEntry e;
    e.id = id;
    e.pool = pool;
    e.device = device;
    e.torch_uses = 1;
    return pools_.emplace(id, e).first->second;
  }

  void drop_pool_locked(std::map<MempoolId_t, PoolEntry>::iterator it) {
    gmr_pool_empty_cache(it->second.pool);
    gmr_pool_release(it->second.pool); /* the adapter's use: gmr may destroy it now */
    pools_.erase(it);
  }

  /* Give back every freeable pool (of rt's device, or all): true if any. */
  bool release_freeable_pools(gmr_runtime_t *rt) {
    std::lock_guard<std::mutex> lock(pmu_);
    bool any = false;
    for (auto it = pools_.begin(); it != pools_.end();) {
      auto next = std::next(it);
      if (it->second.freeable && (rt == nullptr || runtime_if_any(it->second.device) == rt)) {
        drop_pool_locked(it);
        any = true;
      }
      it = next;
    }
    return any;
  }

  bool pool_live(MempoolId_t id, std::vector<std::pair<void *, size_t>> *live) {
    std::lock_guard<std::mutex> lock(pmu_);
    auto it = pools_.find(id);
    if (it == pools_.end()) return false;
    int rc = gmr_pool_foreach_live(
        it->second.pool,
        [](void *p, size_t n, void *ud) -> int {
          static_cast<std::vector<std::pair<void *, size_t>> *>(ud)->emplace_back(p, n);
          return 0;
        },
        live);
    TORCH_CHECK(rc == 0, "gmr: listing the live blocks of pool (", id.first, ", ", id.second,
                "): ", gmr_strerror(rc));
    return true;
  }

  std::map<uint64_t, MempoolId_t> pool_ids() {
    std::lock_guard<std::mutex> lock(pmu_);
    std::map<uint64_t, MempoolId_t> m;
    for (auto &kv : pools_)
      m[gmr_pool_id(kv.second.pool)] = kv.first;
    return m;
  }

  /* ---- state ---------------------------------------------------------- */

  std::array<std::atomic<gmr_runtime_t *>, kMaxDevices> rts_{};
  int device_count_ = 0;
  bool initialized_ = false;

  std::mutex pmu_; /* pools_ and routes_ */
  std::map<MempoolId_t, PoolEntry> pools_;
  std::vector<Route> routes_;
  std::atomic<int> nroutes_{0};

  std::mutex obs_mu_; /* observing_: gmr's observer is set on every runtime */
  bool observing_ = false;
  std::recursive_mutex hmu_; /* everything of the history below */
  std::atomic<bool> history_active_{false};
  bool record_history_ = false;
  CCA::CreateContextFn recorder_ = nullptr;
  CCA::RecordContext when_ = CCA::RecordContext::NEVER;
  std::set<TraceEntry::Action> skip_;
  size_t ring_max_ = 1;
  std::vector<TraceRing> rings_;
  std::unordered_map<void *, BlockCtx> blocks_;
  std::unordered_map<void *, BlockCtx> pending_free_;
  std::unordered_map<uintptr_t, std::shared_ptr<c10::GatheredContext>> seg_ctx_;
  std::vector<c10::CachingDeviceAllocator::AnnotationEntry> annotations_;
  std::string user_metadata_;
  std::vector<CCA::OutOfMemoryObserver> oom_observers_;
  std::vector<CCA::AllocatorTraceTracker> trackers_;
  c10::ApproximateClockToUnixTimeConverter clock_;

  struct ObsUd {
    GmrAllocator *a;
    int device;
  };
  std::array<ObsUd, kMaxDevices> obs_ud_ = make_obs_ud();
  std::array<ObsUd, kMaxDevices> make_obs_ud() {
    std::array<ObsUd, kMaxDevices> u{};
    for (int d = 0; d < kMaxDevices; ++d)
      u[d] = ObsUd{this, d};
    return u;
  }

  std::mutex ipc_mu_;
  std::unordered_map<std::string, std::weak_ptr<void>> ipc_;
};

void GmrAllocator::observer(const gmr_history_event_t *ev, void *ud) {
  auto *o = static_cast<ObsUd *>(ud);
  try {
    o->a->on_event(o->device, ev);
  } catch (...) {
    /* gmr is C: nothing may unwind through it */
  }
}

/* The process's one adapter: never destroyed (tensors may outlive main). */
GmrAllocator *g_alloc = nullptr;

void gmr_native_delete(void *ptr) {
  if (ptr == nullptr) return;
  if (!g_alloc->free_ptr(ptr))
    TORCH_WARN("gmr: freeing ", ptr, ": no gmr runtime holds it (freed twice?)");
}

void fill_err(char *err, size_t errlen, const std::string &msg) {
  if (err == nullptr || errlen == 0) return;
  std::snprintf(err, errlen, "%s", msg.c_str());
}

} // namespace

extern "C" {

/* Install gmr as PyTorch's CUDA allocator, as torch's own
 * change_current_allocator does (the CUDACachingAllocator `allocator` atomic
 * and c10::SetAllocator for CUDA).  Refused once torch's current allocator
 * holds CUDA memory.  @return 0 (installed, or already), -1 with err set. */
__attribute__((visibility("default"))) int gmr_torch_native_install(char *err, size_t errlen) {
  try {
    CCA::CUDAAllocator *cur = CCA::allocator.load();
    if (g_alloc != nullptr && cur == g_alloc) return 0;
    bool need_init = false;
    if (cur != nullptr && cur->initialized()) {
      int n = c10::cuda::device_count();
      for (int d = 0; d < n; ++d) {
        int64_t held = 0;
        try {
          held = cur->getDeviceStats(static_cast<c10::DeviceIndex>(d)).reserved_bytes[0].current;
        } catch (const c10::Error &) {
          fill_err(err, errlen,
                   "gmr: another CUDA allocator (" + cur->name() +
                       ") is installed and in use; call gmr.use_in_torch() before anything "
                       "else touches CUDA");
          return -1;
        }
        if (held > 0) {
          fill_err(err, errlen,
                   "gmr: torch's CUDA allocator already holds " + std::to_string(held) +
                       " bytes on device " + std::to_string(d) +
                       "; call gmr.use_in_torch() before the first CUDA tensor");
          return -1;
        }
      }
      need_init = true;
    }
    if (g_alloc == nullptr) g_alloc = new GmrAllocator();
    if (need_init) g_alloc->init(c10::cuda::device_count());
    CCA::allocator.store(g_alloc);
    c10::SetAllocator(c10::DeviceType::CUDA, g_alloc, 0);
    if (c10::GetAllocator(c10::DeviceType::CUDA) != g_alloc)
      c10::SetAllocator(c10::DeviceType::CUDA, g_alloc, UINT8_MAX);
    return 0;
  } catch (const std::exception &e) {
    fill_err(err, errlen, std::string("gmr: installing the allocator failed: ") + e.what());
    return -1;
  }
}

/* 1 when gmr's adapter is torch's current CUDA allocator. */
__attribute__((visibility("default"))) int gmr_torch_native_installed(void) {
  return g_alloc != nullptr && CCA::allocator.load() == g_alloc ? 1 : 0;
}

} // extern "C"
