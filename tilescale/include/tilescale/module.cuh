// tilescale/module.cuh: included at the top of every distributed kernel that tilescale builds.
//
// It pulls in NVSHMEM for one of the two build modes and gives the module (the .so that tilelang's
// cython backend builds) the entry points tilescale calls through ctypes after loading it:
//
//   tilescale_module_init(diag, barrier_words)  once per loaded module, after NVSHMEM is initialised:
//                                  1. loads every kernel of the module now (CUDA lazy loading would
//                                     otherwise load a kernel at its first launch, which deadlocks
//                                     when another kernel of the process is spinning on the GPU);
//                                  2. fills this module's NVSHMEM device state;
//                                  3. stores the addresses of the diagnostics record used by bounded
//                                     waits and of the runtime's barrier words (bounded barriers).
//   tilescale_module_barrier(stream, complete_puts)  a bounded barrier of all PEs on `stream` (ops.cuh).
//   tilescale_module_mode()      'I' inlined (non-RDC) or 'R' relocatable device code.
//   tilescale_module_probe(out)  runs a one-thread kernel that reads my_pe / n_pes as device code sees them.
//
// Build modes (one row each in tilescale/build_modes.py, which defines the mode's macro with -D):
//   TILESCALE_BUILD_MODE_INLINED (default): no -rdc; NVSHMEM_ENABLE_ALL_DEVICE_INLINING makes every NVSHMEM
//     device function inline and gives this translation unit its own __constant__ nvshmemi_device_state_d,
//     filled by nvshmemx_cumodule_init(). Code identical to a plain build (setmaxnreg and wgmma kept).
//   TILESCALE_BUILD_MODE_RDC: -rdc=true + libnvshmem_device.a, as in the TileScale seed; the state is
//     registered through nvshmemi_init_thread(). tilescale's code generator re-aligns dynamic shared memory
//     in this mode.
#pragma once

#if defined(TILESCALE_BUILD_MODE_INLINED) == defined(TILESCALE_BUILD_MODE_RDC)
#error "tilescale/module.cuh: define exactly one of TILESCALE_BUILD_MODE_INLINED, TILESCALE_BUILD_MODE_RDC (tilescale/build_modes.py)"
#endif
#if defined(TILESCALE_BUILD_MODE_RDC) != defined(__CUDACC_RDC__)
#error "tilescale/module.cuh: TILESCALE_BUILD_MODE_RDC goes with nvcc -rdc=true, and only with it (tilescale/build_modes.py)"
#endif

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <utility>

#if defined(TILESCALE_BUILD_MODE_INLINED)
#define TILESCALE_MODE_CHAR 'I'
#ifndef NVSHMEM_ENABLE_ALL_DEVICE_INLINING
#define NVSHMEM_ENABLE_ALL_DEVICE_INLINING
#endif
#include <non_abi/nvshmem_build_options.h>
#include <non_abi/nvshmem_version.h>
// The GPU-initiated InfiniBand transports (IBGDA, GPUNetIO) need device state that the inlined mode of
// NVSHMEM 3.4 does not declare (and <infiniband/mlx5dv.h>): compile them out of this module. NVLink
// P2P and the proxy-based transports remain; kernels that need IBGDA use the rdc build mode.
#undef NVSHMEM_IBGDA_SUPPORT
#undef NVSHMEM_IBGDA_SUPPORT_GPUMEM_ONLY
#undef NVSHMEM_GPUNETIO_SUPPORT
// nvshmemx_cumodule_init() looks up "nvshmemi_device_lib_version_d" in the module. NVSHMEM 3.8 headers
// define it for non-RDC units, 3.4 headers do not: rename whatever the headers define, define our own.
#define nvshmemi_device_lib_version_d tilescale_hdr_device_lib_version_d
// TILESCALE_NVSHMEM_NO_COLLECTIVES (defined by codegen.py for a kernel that calls no NVSHMEM collective, with
// NVSHMEM headers of the layout checked by discovery.NvshmemInstall.collectives_separable): NVSHMEM's collective API
// is left out, by its include guards. In this mode its headers define one inline function per collective, type and
// operation, and the C++ front end instantiates the templates behind every one of them, called or not: half of
// cicc's time for an AG+GEMM kernel, and the host pass parses the headers too. What ops.cuh uses of it (the barrier
// without the runtime's barrier words) is defined below as NVSHMEM defines it, on its barrier templates.
#if defined(TILESCALE_NVSHMEM_NO_COLLECTIVES)
#define _NVSHMEM_COLL_DEFINES_CUH_
#define _NVSHMEMX_COLL_DEFINES_CUH_
#define _NVSHMEMI_DEVICE_COLL_DEFINES_H_
#endif
#include <nvshmem.h>
#include <nvshmemx.h>
#if defined(TILESCALE_NVSHMEM_NO_COLLECTIVES)
#include <non_abi/device/coll/barrier.cuh>
#if defined(__CUDA_ARCH__)
extern "C" {
NVSHMEMI_STATIC NVSHMEMI_DEVICE_PREFIX NVSHMEMI_DEVICE_INLINE void nvshmem_barrier_all() {
  nvshmemi_barrier_threadgroup<nvshmemi_threadgroup_thread>(NVSHMEM_TEAM_WORLD);
}
NVSHMEMI_STATIC NVSHMEMI_DEVICE_PREFIX NVSHMEMI_DEVICE_INLINE void nvshmem_sync_all() {
  nvshmemi_sync_threadgroup<nvshmemi_threadgroup_thread>(NVSHMEM_TEAM_WORLD);
}
}
#endif
#endif
#undef nvshmemi_device_lib_version_d
__constant__ nvshmemi_version_t nvshmemi_device_lib_version_d = {
    NVSHMEM_VENDOR_MAJOR_VERSION, NVSHMEM_VENDOR_MINOR_VERSION, NVSHMEM_VENDOR_PATCH_VERSION};
#else
#define TILESCALE_MODE_CHAR 'R'
#include <nvshmem.h>
#include <nvshmemx.h>
#endif

namespace tilescale {

// What a bounded wait writes before it stops the kernel (mapped host memory, readable after a trap).
struct WaitDiag {
  unsigned long long flag;  // 0 = empty; set to 1 by the first thread that times out
  int rank, block, thread, site;
  int cmp, bits, pad0, pad1;
  unsigned long long addr, expected, observed, elapsed_ns;
};

static __device__ WaitDiag* g_wait_diag = nullptr;
// The module's first wait to give up, in device memory (wait_timed_out): 0, then 1 while its thread writes the
// record, then 2 once it is written. Every other thread that gives up waits on this word, not on the record in
// host memory: when tens of thousands of threads gave up at once (a GEMM grid whose tiles all waited) and polled the
// record over PCIe, the kernel stopped with no record (most likely the writer was held past the others' bound);
// with this gate the same failure leaves its record.
static __device__ unsigned int g_wait_gate = 0;
// The runtime's barrier words (symmetric, n_pes + 1 of them, zero at start): word p holds the last barrier
// epoch PE p announced to this PE; word n_pes counts this PE's barriers (see tilescale::barrier_all).
static __device__ unsigned long long* g_barrier = nullptr;

}  // namespace tilescale

// Anchor: a kernel of this module, used to find the module's CUmodule and as a device-side probe.
extern "C" __global__ void tilescale_module_anchor(int* out) {
  if (out != nullptr) {
    out[0] = nvshmem_my_pe();
    out[1] = nvshmem_n_pes();
  }
}

namespace tilescale {
namespace detail {

template <typename F>
static F driver_entry(const char* name, int version) {
  void* fp = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &fp, version, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<F>(fp);
}

// The CUmodule holding this translation unit (driver API resolved at run time: no link-time libcuda).
static int this_module(CUmodule* mod) {
  cudaFunction_t f;
  if (cudaGetFuncBySymbol(&f, (const void*)tilescale_module_anchor) != cudaSuccess) return -2;
  auto get_module = driver_entry<CUresult (*)(CUmodule*, CUfunction)>("cuFuncGetModule", 12000);
  if (get_module == nullptr) return -3;
  if (get_module(mod, (CUfunction)f) != CUDA_SUCCESS) return -4;
  return 0;
}

// Load every kernel of the module now (CUDA >= 12.4 driver); returns the number loaded, or < 0.
static int load_all_functions(CUmodule mod) {
  auto count_fn = driver_entry<CUresult (*)(unsigned int*, CUmodule)>("cuModuleGetFunctionCount", 12040);
  auto enum_fn = driver_entry<CUresult (*)(CUfunction*, unsigned int, CUmodule)>("cuModuleEnumerateFunctions", 12040);
  auto load_fn = driver_entry<CUresult (*)(CUfunction)>("cuFuncLoad", 12040);
  if (!count_fn || !enum_fn || !load_fn) return -5;
  unsigned int n = 0;
  if (count_fn(&n, mod) != CUDA_SUCCESS) return -6;
  CUfunction fns[64];
  if (n > 64) n = 64;
  if (enum_fn(fns, n, mod) != CUDA_SUCCESS) return -7;
  for (unsigned int i = 0; i < n; ++i)
    if (load_fn(fns[i]) != CUDA_SUCCESS) return -8;
  return (int)n;
}

}  // namespace detail
}  // namespace tilescale

#if defined(TILESCALE_BUILD_MODE_RDC)
// nvshmemi_init_thread (libnvshmem_device.a) == the inline nvshmem_init() minus exit(): registers THIS
// module's nvshmemi_device_state_d with the already initialised host library, which fills it.
static int tilescale_fill_device_state(CUmodule) {
  int provided = 0;
  nvshmemi_version_t v = {NVSHMEM_VENDOR_MAJOR_VERSION, NVSHMEM_VENDOR_MINOR_VERSION, NVSHMEM_VENDOR_PATCH_VERSION};
  return nvshmemi_init_thread(NVSHMEM_THREAD_SERIALIZED, &provided, 0, nullptr, v);
}
#else
static int tilescale_fill_device_state(CUmodule mod) { return nvshmemx_cumodule_init(mod); }
#endif

extern "C" int tilescale_module_mode() { return TILESCALE_MODE_CHAR; }

extern "C" int tilescale_module_nvshmem_version() {
  return NVSHMEM_VENDOR_MAJOR_VERSION * 10000 + NVSHMEM_VENDOR_MINOR_VERSION * 100 + NVSHMEM_VENDOR_PATCH_VERSION;
}

// Returns >= 0 (number of kernels loaded eagerly) on success; -1 NVSHMEM not initialised; other < 0: error.
extern "C" int tilescale_module_init(void* diag, void* barrier_words) {
  if (nvshmemx_init_status() < NVSHMEM_STATUS_IS_INITIALIZED) return -1;
  CUmodule mod = nullptr;
  int rc = tilescale::detail::this_module(&mod);
  if (rc != 0) return rc;
  int loaded = tilescale::detail::load_all_functions(mod);
  if (loaded < 0) loaded = 0;  // old driver: lazy loading stays (launch.sh sets CUDA_MODULE_LOADING=EAGER)
  rc = tilescale_fill_device_state(mod);
  if (rc != 0) return -100 - (rc < 0 ? -rc : rc);
  tilescale::WaitDiag* d = static_cast<tilescale::WaitDiag*>(diag);
  if (cudaMemcpyToSymbol(tilescale::g_wait_diag, &d, sizeof(d)) != cudaSuccess) return -9;
  unsigned long long* b = static_cast<unsigned long long*>(barrier_words);
  if (cudaMemcpyToSymbol(tilescale::g_barrier, &b, sizeof(b)) != cudaSuccess) return -10;
  return loaded;
}

// Before NVSHMEM shuts down: release this module's registration (inlined mode).
extern "C" int tilescale_module_finalize() {
#if defined(TILESCALE_BUILD_MODE_RDC)
  return 0;
#else
  CUmodule mod = nullptr;
  if (tilescale::detail::this_module(&mod) != 0) return -2;
  return nvshmemx_cumodule_finalize(mod);
#endif
}

extern "C" int tilescale_module_probe(int* host_out) {
  int* d = nullptr;
  if (cudaMalloc(&d, 2 * sizeof(int)) != cudaSuccess) return -1;
  cudaMemset(d, 0xff, 2 * sizeof(int));
  tilescale_module_anchor<<<1, 1>>>(d);
  cudaError_t e = cudaMemcpy(host_out, d, 2 * sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d);
  return e == cudaSuccess ? 0 : -(int)e;
}

#if defined(TILESCALE_BUILD_MODE_RDC)
// RDC mode: relocatable code loses the 1024-byte alignment of dynamic shared memory that swizzled TMA
// tiles need. tilescale's code generator re-bases `buf_dyn_shmem` at run time (align_dyn_smem) and
// routes the wrapper's launch calls through these helpers, which ask for kDynSmemPad more bytes.
namespace tilescale {
constexpr int kDynSmemPad = 1024;
__device__ __forceinline__ unsigned char* align_dyn_smem(unsigned char* raw) {
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
}
static inline cudaError_t rdc_set_attr(const void* f, cudaFuncAttribute a, int v) {
  if (a == cudaFuncAttributeMaxDynamicSharedMemorySize && v > 0) v += kDynSmemPad;
  return ::cudaFuncSetAttribute(f, a, v);
}
template <typename... Exp, typename... Act>
static inline cudaError_t rdc_launch_ex(const cudaLaunchConfig_t* config, void (*kernel)(Exp...), Act&&... args) {
  cudaLaunchConfig_t c = *config;
  if (c.dynamicSmemBytes > 0) c.dynamicSmemBytes += kDynSmemPad;
  return ::cudaLaunchKernelEx(&c, kernel, std::forward<Act>(args)...);
}
static inline cudaError_t rdc_launch_coop(const void* f, dim3 g, dim3 b, void** a, size_t s, cudaStream_t st) {
  return ::cudaLaunchCooperativeKernel(f, g, b, a, s > 0 ? s + kDynSmemPad : 0, st);
}
}  // namespace tilescale
#endif
