// ts_runtime.cu: the host side of tilescale's NVSHMEM runtime, loaded by tilescale/runtime.py through
// ctypes. Host-only (no kernels, no libnvshmem_device): built once per NVSHMEM install by nvcc into
// tilescale's cache directory. Every function returns a status instead of exiting the process.
#include <cuda.h>
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>

#include <cstring>

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
}  // namespace

extern "C" {

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

// Stream memory operations (no SM time): a 64-bit store, and a wait for a 64-bit value >= `value`.
int ts_stream_write_u64(void* stream, void* addr, unsigned long long value) {
  auto fn = driver_entry<CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int)>("cuStreamWriteValue64", 12000);
  if (fn == nullptr) return -1;
  return (int)fn((CUstream)stream, (CUdeviceptr)addr, (cuuint64_t)value, CU_STREAM_WRITE_VALUE_DEFAULT);
}
int ts_stream_wait_geq_u64(void* stream, void* addr, unsigned long long value) {
  auto fn = driver_entry<CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int)>("cuStreamWaitValue64", 12000);
  if (fn == nullptr) return -1;
  return (int)fn((CUstream)stream, (CUdeviceptr)addr, (cuuint64_t)value, CU_STREAM_WAIT_VALUE_GEQ);
}

void ts_finalize() { nvshmemx_hostlib_finalize(); }

}  // extern "C"
