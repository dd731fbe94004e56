// ts_runtime.cu: the host side of tilescale's NVSHMEM runtime, loaded by tilescale/runtime/__init__.py through
// ctypes. Host-only (no kernels, no libnvshmem_device): built once per NVSHMEM install by nvcc into
// tilescale's cache directory. Every function returns a status instead of exiting the process.
#include <cuda.h>
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>

#include <atomic>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <ctime>
#include <deque>
#include <mutex>
#include <new>

namespace {
template <typename F>
F driver_entry(const char* name, int version) {
  void* fp = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &fp, version, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<F>(fp);
}

long long monotonic_ns() {   // CLOCK_MONOTONIC: the clock of Python's time.monotonic_ns / perf_counter_ns on Linux
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

struct DriverOps {
  CUresult (*write)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
  CUresult (*wait)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
  CUresult (*copy)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*zero)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*record)(CUevent, CUstream);
  CUresult (*wait_event)(CUstream, CUevent, unsigned int);
  CUresult (*is_capturing)(CUstream, CUstreamCaptureStatus*);
};
const DriverOps& driver_ops() {  // looked up once (a C++11 static: thread-safe)
  static const DriverOps d = {
      driver_entry<decltype(DriverOps::write)>("cuStreamWriteValue64", 12000),
      driver_entry<decltype(DriverOps::wait)>("cuStreamWaitValue64", 12000),
      driver_entry<decltype(DriverOps::copy)>("cuMemcpyAsync", 12000),
      driver_entry<decltype(DriverOps::zero)>("cuMemsetD8Async", 12000),
      driver_entry<decltype(DriverOps::record)>("cuEventRecord", 12000),
      driver_entry<decltype(DriverOps::wait_event)>("cuStreamWaitEvent", 12000),
      driver_entry<decltype(DriverOps::is_capturing)>("cuStreamIsCapturing", 12000)};
  return d;
}

// A watched stream wait's slot (tilescale/runtime/stream_waits.py): pinned host memory, in the wait's `n` field.
struct ts_watch {
  unsigned long long done;     // the GPU's: the number of the last call that passed the wait
  unsigned long long issued;   // this host's: the number of the last call issued
  long long issued_ns;         // when (monotonic_ns)
  long long bound_ns;          // the table's; read by the watchdog only
};
static_assert(sizeof(ts_watch) == 32, "ts_watch: 4 words (tilescale/runtime/stream_waits.py WORDS)");

// After a wait was queued on `s`: count the call in its slot and queue a write of its number into `done` behind the
// wait, so the watchdog sees a call that never passes it. Nothing while `s` captures a CUDA graph: a replay would
// write a number the host never issued. The write takes the default flags: the driver's stream memory operations
// of CUDA 12 (the "_v2" entry points cuGetProcAddress returns) refuse CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER
// with CUDA_ERROR_INVALID_VALUE, which failed every AG+GEMM call on 2 H200s. A write the driver refuses leaves
// the wait unwatched (counted in ts_watch_failures) rather than failing the op's call. Returns a CUresult.
unsigned long long g_watch_failures = 0;
int watch_wait(const DriverOps& d, CUstream s, ts_watch* w) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  if (d.is_capturing == nullptr || d.write == nullptr) return -1;
  int rc = (int)d.is_capturing(s, &st);
  if (rc != 0 || st != CU_STREAM_CAPTURE_STATUS_NONE) return rc;
  unsigned long long k = w->issued + 1;
  if (d.write(s, (CUdeviceptr)&w->done, (cuuint64_t)k, CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS) {
    __atomic_add_fetch(&g_watch_failures, 1ULL, __ATOMIC_RELAXED);
    return 0;
  }
  __atomic_store_n(&w->issued_ns, monotonic_ns(), __ATOMIC_RELAXED);
  __atomic_store_n(&w->issued, k, __ATOMIC_RELEASE);   // issued_ns first: a reader that sees k sees its time
  return 0;
}
}  // namespace

extern "C" {

// Watched waits whose `done` write the driver refused (watch_wait): those waits are not bounded by the watchdog.
unsigned long long ts_watch_failures() { return __atomic_load_n(&g_watch_failures, __ATOMIC_RELAXED); }

int ts_version() {
  return NVSHMEM_VENDOR_MAJOR_VERSION * 10000 + NVSHMEM_VENDOR_MINOR_VERSION * 100 + NVSHMEM_VENDOR_PATCH_VERSION;
}

int ts_uid_size() { return (int)sizeof(nvshmemx_uniqueid_t); }

int ts_get_uid(void* out) {
  nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
  int rc = nvshmemx_get_uniqueid(&id);
  std::memcpy(out, &id, sizeof(id));
  return rc;
}

// Call after cudaSetDevice(local_rank) in this thread. Returns 0 on success.
int ts_init_uid(int rank, int nranks, const void* uid) {
  nvshmemx_uniqueid_t id;
  std::memcpy(&id, uid, sizeof(id));
  nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
  int rc = nvshmemx_set_attr_uniqueid_args(rank, nranks, &id, &attr);
  if (rc != 0) return 1000 + rc;
  rc = nvshmemx_hostlib_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr);
  return rc == 0 ? 0 : 2000 + rc;
}

int ts_init_status() { return nvshmemx_init_status(); }
int ts_my_pe() { return nvshmem_my_pe(); }
int ts_n_pes() { return nvshmem_n_pes(); }
int ts_team_node_size() { return nvshmem_team_n_pes(NVSHMEMX_TEAM_NODE); }

void* ts_malloc(size_t n) { return nvshmem_malloc(n); }  // collective
// Collective: n symmetric bytes, zero on every PE before any PE returns (the runtime's barrier words).
void* ts_malloc_zeroed(size_t n) {
  void* p = nvshmem_malloc(n);
  if (p == nullptr) return nullptr;
  if (cudaMemset(p, 0, n) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) return nullptr;
  nvshmem_barrier_all();
  return p;
}
void ts_free(void* p) { nvshmem_free(p); }               // collective
void* ts_ptr(const void* p, int pe) { return nvshmem_ptr(p, pe); }

void ts_barrier_all() { nvshmem_barrier_all(); }
void ts_barrier_all_on_stream(void* stream) { nvshmemx_barrier_all_on_stream((cudaStream_t)stream); }
void ts_quiet_on_stream(void* stream) { nvshmemx_quiet_on_stream((cudaStream_t)stream); }
// `n` bytes of symmetric `src` as they are on PE `pe` into local `dst` (symmetric, or registered: a network
// reads into it), ordered on `stream`: work queued on `stream` after it sees the data. Source first.
void ts_getmem_on_stream(const void* src, void* dst, size_t n, int pe, void* stream) {
  nvshmemx_getmem_on_stream(dst, src, n, pe, (cudaStream_t)stream);
}

// `*sig_addr += value` on PE `pe` (symmetric `sig_addr`), ordered on `stream`: NVSHMEM's signal, which
// reaches a PE of another node (a small kernel of NVSHMEM's; an add, never its host-memory copy for a set).
void ts_signal_add_on_stream(void* sig_addr, unsigned long long value, int pe, void* stream) {
  nvshmemx_signal_op_on_stream((uint64_t*)sig_addr, (uint64_t)value, NVSHMEM_SIGNAL_ADD, pe, (cudaStream_t)stream);
}

// Stream memory operations (no SM time): a 64-bit store, and a wait for a 64-bit value >= `value`, watched through
// `watch` (a ts_watch slot; null: not watched). Return a CUresult (-1: a driver entry point is missing).
int ts_stream_write_u64(void* stream, void* addr, unsigned long long value) {
  const DriverOps& d = driver_ops();
  if (d.write == nullptr) return -1;
  return (int)d.write((CUstream)stream, (CUdeviceptr)addr, (cuuint64_t)value, CU_STREAM_WRITE_VALUE_DEFAULT);
}
int ts_stream_wait_geq_u64(void* stream, void* addr, unsigned long long value, void* watch) {
  const DriverOps& d = driver_ops();
  if (d.wait == nullptr) return -1;
  int rc = (int)d.wait((CUstream)stream, (CUdeviceptr)addr, (cuuint64_t)value, CU_STREAM_WAIT_VALUE_GEQ);
  if (rc == 0 && watch != nullptr) rc = watch_wait(d, (CUstream)stream, (ts_watch*)watch);
  return rc;
}

// A program of stream operations, issued in array order by one call (AG+GEMM's host steps: one ctypes call
// instead of one per operation). Each op names its stream by an index into `streams` (the caller's current
// stream changes from call to call; the op's other streams do not). Kinds (TS_OP_*, tilescale/ops/stream_ops.py
// packs them): a 64-bit stream write `*a = b` and a stream wait `*a >= b`, watched through its slot `n` (as
// ts_stream_write_u64 / ts_stream_wait_geq_u64); a copy of `n` bytes from `b` to `a` (cuMemcpyAsync, what
// torch's copy_ of contiguous tensors of one device issues); NVSHMEM's on-stream get of `n` bytes of symmetric
// `b` on PE `pe` into `a` (as ts_getmem_on_stream); NVSHMEM's signal add `*a += b` on PE `pe` (as
// ts_signal_add_on_stream); an event record and an event wait (`a`: the CUevent, as torch's Event.record /
// Stream.wait_event); `n` zero bytes at `a` (cuMemsetD8Async). Returns 0, or the failing op's CUresult (-1: a
// driver entry point is missing) with its index in `*failed`; the ops before it were issued.
struct ts_stream_op {
  unsigned long long a, b, n;
  int kind, stream, pe, pad;
};
static_assert(sizeof(ts_stream_op) == 40, "ts_stream_op: 40 bytes (tilescale/ops/stream_ops.py's StreamOp)");
enum { TS_OP_WRITE = 1, TS_OP_WAIT_GEQ = 2, TS_OP_COPY = 3, TS_OP_GET = 4, TS_OP_SIGNAL_ADD = 5,
       TS_OP_EVENT_RECORD = 6, TS_OP_EVENT_WAIT = 7, TS_OP_ZERO = 8 };

int ts_stream_ops(void* const* streams, const ts_stream_op* ops, int n, int* failed) {
  const DriverOps& d = driver_ops();
  for (int i = 0; i < n; ++i) {
    const ts_stream_op& o = ops[i];
    CUstream s = (CUstream)streams[o.stream];
    int rc = -1;
    switch (o.kind) {
      case TS_OP_WRITE:
        if (d.write) rc = (int)d.write(s, (CUdeviceptr)o.a, (cuuint64_t)o.b, CU_STREAM_WRITE_VALUE_DEFAULT);
        break;
      case TS_OP_WAIT_GEQ:   // `n`: its ts_watch slot (0: not watched)
        if (d.wait) rc = (int)d.wait(s, (CUdeviceptr)o.a, (cuuint64_t)o.b, CU_STREAM_WAIT_VALUE_GEQ);
        if (rc == 0 && o.n) rc = watch_wait(d, s, (ts_watch*)o.n);
        break;
      case TS_OP_COPY:
        if (d.copy) rc = (int)d.copy((CUdeviceptr)o.a, (CUdeviceptr)o.b, (size_t)o.n, s);
        break;
      case TS_OP_GET:
        nvshmemx_getmem_on_stream((void*)o.a, (const void*)o.b, (size_t)o.n, o.pe, (cudaStream_t)s);
        rc = 0;
        break;
      case TS_OP_SIGNAL_ADD:
        nvshmemx_signal_op_on_stream((uint64_t*)o.a, (uint64_t)o.b, NVSHMEM_SIGNAL_ADD, o.pe, (cudaStream_t)s);
        rc = 0;
        break;
      case TS_OP_EVENT_RECORD:
        if (d.record) rc = (int)d.record((CUevent)o.a, s);
        break;
      case TS_OP_EVENT_WAIT:
        if (d.wait_event) rc = (int)d.wait_event(s, (CUevent)o.a, 0);
        break;
      case TS_OP_ZERO:
        if (d.zero) rc = (int)d.zero((CUdeviceptr)o.a, 0, (size_t)o.n, s);
        break;
      default:
        rc = -2;
    }
    if (rc != 0) {
      if (failed) *failed = i;
      return rc;
    }
  }
  return 0;
}

void ts_finalize() { nvshmemx_hostlib_finalize(); }

// ---------------------------------------------------------------------------------------------- timed calls
// The profiler's record of an op call made here instead of in Python (issue 15: a Python record costs more than the
// 2% of a 1 MiB AllGather call that the profiler may add). tilescale/profiler/session.py (ShimCalls) drives it:
//   1. ts_timed_reset when a session starts: no records, group 0;
//   2. ts_timed_call(call, a, b) for each call of an op: its 6 arguments are call->args with the two that change from
//      call to call (the input and the stream) put in at call->vary; CLOCK_MONOTONIC (the clock of Python's
//      time.perf_counter_ns on Linux) read before and after the op's C entry point `call->fn(args)`; when it returns
//      0, the session's quick record (call->record, group, t0, t1) is appended to the buffer; returns its result (a
//      failed launch leaves no record: the op raises, as before its Python record). Two arguments through ctypes
//      instead of six: the profiled call costs the host less than the op's own direct launch;
//   3. ts_timed_group(top) whenever a session's group opens or closes: the parent of the records made from now on;
//   4. ts_timed_take(out, limit) moves the oldest records (at most `limit`) to `out` (4 words each), before the
//      session appends a record of its own and when it flushes: every record keeps its place. `ts_timed_pending`
//      counts the records waiting (read by the session without a call), `ts_timed_lost` those that could not be
//      stored (no memory).
// The entry is called through a pointer typed with 6 word-sized integers: the kernels' `call` takes pointers, an int
// and the stream, all INTEGER-class arguments, passed in the first six integer registers on x86-64 SysV (rdi..r9)
// and aarch64 (x0..x5), an int in the low half of its register; so the call is ABI-compatible.
// Threads: ctypes releases the GIL around these calls, so several threads may record at once; a mutex guards the
// buffer (the records of concurrent calls land in the order their calls ended) and the group (one for the process,
// as the session's).
struct ts_timed_fn {   // an op's timed call (session.timed_call): its C entry point, record and arguments
  int (*fn)(uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t);
  long long record;
  uintptr_t args[6];   // the arguments that stay the same from call to call (those at `vary`: anything)
  int vary[2];         // where ts_timed_call's a and b go in args
};
static_assert(sizeof(ts_timed_fn) == 72, "ts_timed_fn: 9 words (tilescale/profiler/session.py TimedFn)");

namespace {
struct TimedRecord {
  long long record, group, t0, t1;
};
static_assert(sizeof(TimedRecord) == 32, "a record is 4 words (tilescale/profiler/session.py ShimCalls)");
std::mutex timed_mutex;
std::deque<TimedRecord> timed_records;   // oldest first (a deque grows without copying: a record costs no more later)
long long timed_group = 0;
}  // namespace

std::atomic<long long> ts_timed_pending{0}, ts_timed_lost{0};
static_assert(sizeof(std::atomic<long long>) == 8 && std::atomic<long long>::is_always_lock_free,
              "ts_timed_pending / ts_timed_lost: read by Python as plain 8-byte words");

int ts_timed_call(const ts_timed_fn* call, uintptr_t a, uintptr_t b) {
  uintptr_t v[6];
  std::memcpy(v, call->args, sizeof v);
  v[call->vary[0]] = a;
  v[call->vary[1]] = b;
  long long t0 = monotonic_ns();
  int rc = call->fn(v[0], v[1], v[2], v[3], v[4], v[5]);
  long long t1 = monotonic_ns();
  if (rc != 0) return rc;
  std::lock_guard<std::mutex> lock(timed_mutex);
  try {
    timed_records.push_back({call->record, timed_group, t0, t1});
    ts_timed_pending.store((long long)timed_records.size(), std::memory_order_relaxed);
  } catch (const std::bad_alloc&) {
    ts_timed_lost.fetch_add(1, std::memory_order_relaxed);
  }
  return rc;
}

void ts_timed_group(long long group) {
  std::lock_guard<std::mutex> lock(timed_mutex);
  timed_group = group;
}

long long ts_timed_take(void* out, long long limit) {
  std::lock_guard<std::mutex> lock(timed_mutex);
  size_t n = std::min(timed_records.size(), (size_t)std::max(limit, 0LL));
  std::copy_n(timed_records.begin(), n, static_cast<TimedRecord*>(out));
  timed_records.erase(timed_records.begin(), timed_records.begin() + n);
  ts_timed_pending.store((long long)timed_records.size(), std::memory_order_relaxed);
  return (long long)n;
}

void ts_timed_reset() {
  std::lock_guard<std::mutex> lock(timed_mutex);
  std::deque<TimedRecord>().swap(timed_records);   // the memory of the last session's records too
  timed_group = 0;
  ts_timed_pending.store(0);
  ts_timed_lost.store(0);
}

}  // extern "C"
