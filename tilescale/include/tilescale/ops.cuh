// tilescale/ops.cuh: the device functions behind tilescale.language's distributed ops.
//
// Every function here is reached from one op in tilescale/language/ (distributed.py, tiles.py); the Python side
// validates arguments and documents the semantics, this side implements them. Operand order: what is read
// first, then the destination (as T.copy(src, dst): a store takes its value, then its address), then modifiers;
// peers are NVSHMEM PE numbers.
#pragma once

#include <stdint.h>
#include <stdio.h>
#include <type_traits>

#ifndef TILESCALE_WAIT_TIMEOUT_NS
#define TILESCALE_WAIT_TIMEOUT_NS 0ull
#endif
// Ranks per node (tilescale.topology; backend.py passes TILESCALE_NODE_SIZE): K > 0 groups the PEs in nodes of K
// consecutive PEs, and a PE of another node is reached only through NVSHMEM's API, even where NVSHMEM maps it
// (one host standing in for several nodes; K = 1: every peer but this PE). 0: NVSHMEM's mappings decide.
#ifndef TILESCALE_NODE_SIZE
#define TILESCALE_NODE_SIZE 0
#endif

namespace tilescale {

enum Group : int { kThread = 0, kWarp = 1, kBlock = 2 };
enum Cmp : int { kEq = 0, kNe = 1, kGt = 2, kGe = 3, kLt = 4, kLe = 5 };
enum SignalOp : int { kSignalSet = 0, kSignalAdd = 1 };

// ------------------------------------------------------------------------------------------ groups
__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

template <int G>
__device__ __forceinline__ bool group_leader() {
  if constexpr (G == kBlock) return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
  else if constexpr (G == kWarp) return (threadIdx.x & 31) == 0;
  else return true;
}
template <int G>
__device__ __forceinline__ void group_sync() {
  if constexpr (G == kBlock) __syncthreads();
  else if constexpr (G == kWarp) __syncwarp();
}
template <int G>
__device__ __forceinline__ void group_rank_size(int& r, int& n) {
  if constexpr (G == kBlock) {
    r = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    n = blockDim.x * blockDim.y * blockDim.z;
  } else if constexpr (G == kWarp) {
    r = threadIdx.x & 31;
    n = 32;
  } else {
    r = 0;
    n = 1;
  }
}

// -------------------------------------------------------------------------------- peer pointers
// Whether PE `pe` is on this PE's node (always, without TILESCALE_NODE_SIZE).
__device__ __forceinline__ bool same_node(int pe) {
  if constexpr (TILESCALE_NODE_SIZE > 0) return pe / TILESCALE_NODE_SIZE == nvshmem_my_pe() / TILESCALE_NODE_SIZE;
  else return true;
}
// Address of `p` (symmetric) in PE `pe`'s memory, mapped into this GPU (NVLink / PCIe P2P), or null: a PE
// of another node (or one NVSHMEM has no mapping to). Every op that has a load/store path asks this first
// and takes its NVSHMEM API path on null.
__device__ __forceinline__ void* peer_ptr_or_null(const void* p, int pe) {
  return same_node(pe) ? nvshmem_ptr(p, pe) : nullptr;
}
__device__ __forceinline__ bool peer_reachable(const void* p, int pe) { return peer_ptr_or_null(p, pe) != nullptr; }
// peer_ptr_or_null, for the callers that have no other path (T.remote views): stops the kernel on null.
template <typename T>
__device__ __forceinline__ T* peer_ptr(T* p, int pe) {
  void* q = peer_ptr_or_null(reinterpret_cast<const void*>(p), pe);
  if (q == nullptr) {
    printf("tilescale: T.remote: PE %d has no load/store path to PE %d (another node%s, or %p is not "
           "symmetric): move the data with put/get (T.get_block, T.put_block ...), or test T.peer_reachable "
           "first\n", nvshmem_my_pe(), pe, TILESCALE_NODE_SIZE > 0 ? " under TILESCALE_NODE_SIZE" : "",
           (const void*)p);
    __trap();
  }
  return reinterpret_cast<T*>(q);
}
__device__ __forceinline__ void* peer_ptr(const void* p, int pe) { return peer_ptr(const_cast<void*>(p), pe); }

// --------------------------------------------------------------- contiguous copies over P2P mappings
// Group-cooperative byte copy; 16-byte vectors when both pointers allow it. Loads bypass L1 (.cg) so
// data that a peer wrote during this kernel is never read stale.
template <int G>
__device__ __forceinline__ void copy_bytes(const void* src, void* dst, size_t n) {
  int r, g;
  group_rank_size<G>(r, g);
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  if (((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s)) & 15) == 0) {
    const size_t nv = n / 16;
    uint4* dv = reinterpret_cast<uint4*>(d);
    const uint4* sv = reinterpret_cast<const uint4*>(s);
    const bool global_src = __isGlobal(s);  // a shared-memory source cannot use ld.global
    size_t i = r;
    constexpr int U = 4;
    for (; i + (U - 1) * (size_t)g < nv; i += U * (size_t)g) {
      uint4 v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = global_src ? __ldcg(sv + i + u * (size_t)g) : sv[i + u * (size_t)g];
#pragma unroll
      for (int u = 0; u < U; ++u) dv[i + u * (size_t)g] = v[u];
    }
    for (; i < nv; i += g) dv[i] = global_src ? __ldcg(sv + i) : sv[i];
    for (size_t j = nv * 16 + r; j < n; j += g) d[j] = s[j];
  } else {
    for (size_t j = r; j < n; j += g) d[j] = s[j];
  }
}

// ------------------------------------------------------------------------------------ put / get
template <int G, bool NBI>
__device__ __forceinline__ void nvshmem_put_bytes(const void* s, void* d, size_t n, int pe) {
  if constexpr (G == kBlock) {
    if constexpr (NBI) nvshmemx_putmem_nbi_block(d, s, n, pe); else nvshmemx_putmem_block(d, s, n, pe);
  } else if constexpr (G == kWarp) {
    if constexpr (NBI) nvshmemx_putmem_nbi_warp(d, s, n, pe); else nvshmemx_putmem_warp(d, s, n, pe);
  } else {
    if constexpr (NBI) nvshmem_putmem_nbi(d, s, n, pe); else nvshmem_putmem(d, s, n, pe);
  }
}
template <int G, bool NBI>
__device__ __forceinline__ void nvshmem_get_bytes(const void* s, void* d, size_t n, int pe) {
  if constexpr (G == kBlock) {
    if constexpr (NBI) nvshmemx_getmem_nbi_block(d, s, n, pe); else nvshmemx_getmem_block(d, s, n, pe);
  } else if constexpr (G == kWarp) {
    if constexpr (NBI) nvshmemx_getmem_nbi_warp(d, s, n, pe); else nvshmemx_getmem_warp(d, s, n, pe);
  } else {
    if constexpr (NBI) nvshmem_getmem_nbi(d, s, n, pe); else nvshmem_getmem(d, s, n, pe);
  }
}

// put: a tile of `rows` rows of `row_bytes` bytes (row strides in bytes) from local `src` to symmetric
// `dst` on PE `pe`. Intra-node peers are written with vector stores through the P2P mapping, others
// through NVSHMEM. Blocking: returns when `src` may be reused (group-wide for warp/block groups).
template <int G, bool NBI>
__device__ __forceinline__ void put(const void* src, void* dst, long rows, long row_bytes, long src_ld, long dst_ld,
                                    int pe) {
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  char* peer = static_cast<char*>(peer_ptr_or_null(dst, pe));
  const bool flat = rows == 1 || (row_bytes == src_ld && row_bytes == dst_ld);
  if (peer != nullptr) {
    if (flat) {
      copy_bytes<G>(s, peer, (size_t)rows * row_bytes);
    } else {
      for (long r = 0; r < rows; ++r) copy_bytes<G>(s + r * src_ld, peer + r * dst_ld, row_bytes);
    }
    if constexpr (G != kThread) group_sync<G>();
  } else if (flat) {
    nvshmem_put_bytes<G, NBI>(s, d, (size_t)rows * row_bytes, pe);
  } else {
    for (long r = 0; r < rows; ++r) nvshmem_put_bytes<G, NBI>(s + r * src_ld, d + r * dst_ld, row_bytes, pe);
  }
}

// get: a tile from symmetric `src` on PE `pe` to local `dst` (same layout rules as put).
template <int G, bool NBI>
__device__ __forceinline__ void get(const void* src, void* dst, long rows, long row_bytes, long src_ld, long dst_ld,
                                    int pe) {
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  const char* peer = static_cast<const char*>(peer_ptr_or_null(const_cast<void*>(src), pe));
  const bool flat = rows == 1 || (row_bytes == src_ld && row_bytes == dst_ld);
  if (peer != nullptr) {
    if (flat) {
      copy_bytes<G>(peer, d, (size_t)rows * row_bytes);
    } else {
      for (long r = 0; r < rows; ++r) copy_bytes<G>(peer + r * src_ld, d + r * dst_ld, row_bytes);
    }
    if constexpr (G != kThread) group_sync<G>();
  } else {
    if (flat) {
      nvshmem_get_bytes<G, NBI>(s, d, (size_t)rows * row_bytes, pe);
    } else {
      for (long r = 0; r < rows; ++r) nvshmem_get_bytes<G, NBI>(s + r * src_ld, d + r * dst_ld, row_bytes, pe);
    }
    if constexpr (G != kThread && !NBI) group_sync<G>();   // the whole tile is in `dst` for every thread
  }
}

// --------------------------------------------------------------------------------------- signals
__device__ __forceinline__ void signal_op(uint64_t value, void* sig, int op, int pe) {
  nvshmemx_signal_op(static_cast<uint64_t*>(sig), value, op == kSignalAdd ? NVSHMEM_SIGNAL_ADD : NVSHMEM_SIGNAL_SET, pe);
}

// put_signal: the tile, then (ordered after it, by one thread of the group) the signal update.
template <int G>
__device__ __forceinline__ void put_signal(const void* src, void* dst, long rows, long row_bytes, long src_ld,
                                           long dst_ld, uint64_t value, void* sig, int op, int pe) {
  put<G, false>(src, dst, rows, row_bytes, src_ld, dst_ld, pe);
  group_sync<G>();
  if (group_leader<G>()) {
    __threadfence_system();
    nvshmem_fence();
    signal_op(value, sig, op, pe);
  }
  group_sync<G>();
}

// ------------------------------------------------------------------------ scoped loads and stores
#define TS_LD(NAME, QUAL, BITS, REG, CT)                                                         \
  __device__ __forceinline__ CT NAME(const void* p) {                                           \
    CT v;                                                                                       \
    asm volatile("ld" QUAL ".global.b" #BITS " %0, [%1];" : "=" REG(v) : "l"(p) : "memory"); \
    return v;                                                                                   \
  }
#define TS_ST(NAME, QUAL, BITS, REG, CT)                                                        \
  __device__ __forceinline__ void NAME(void* p, CT v) {                                         \
    asm volatile("st" QUAL ".global.b" #BITS " [%0], %1;" ::"l"(p), REG(v) : "memory");       \
  }
#define TS_LDST_SCOPES(SEMNAME, SEM)                                                              \
  TS_LD(ld32_##SEMNAME##_cta, "." SEM ".cta", 32, "r", uint32_t)                                  \
  TS_LD(ld32_##SEMNAME##_gpu, "." SEM ".gpu", 32, "r", uint32_t)                                  \
  TS_LD(ld32_##SEMNAME##_sys, "." SEM ".sys", 32, "r", uint32_t)                                  \
  TS_LD(ld64_##SEMNAME##_cta, "." SEM ".cta", 64, "l", uint64_t)                                  \
  TS_LD(ld64_##SEMNAME##_gpu, "." SEM ".gpu", 64, "l", uint64_t)                                  \
  TS_LD(ld64_##SEMNAME##_sys, "." SEM ".sys", 64, "l", uint64_t)
TS_LDST_SCOPES(relaxed, "relaxed")
TS_LDST_SCOPES(acquire, "acquire")
TS_LD(ld32_volatile, ".volatile", 32, "r", uint32_t)
TS_LD(ld64_volatile, ".volatile", 64, "l", uint64_t)
#define TS_ST_SCOPES(SEMNAME, SEM)                                                                \
  TS_ST(st32_##SEMNAME##_cta, "." SEM ".cta", 32, "r", uint32_t)                                  \
  TS_ST(st32_##SEMNAME##_gpu, "." SEM ".gpu", 32, "r", uint32_t)                                  \
  TS_ST(st32_##SEMNAME##_sys, "." SEM ".sys", 32, "r", uint32_t)                                  \
  TS_ST(st64_##SEMNAME##_cta, "." SEM ".cta", 64, "l", uint64_t)                                  \
  TS_ST(st64_##SEMNAME##_gpu, "." SEM ".gpu", 64, "l", uint64_t)                                  \
  TS_ST(st64_##SEMNAME##_sys, "." SEM ".sys", 64, "l", uint64_t)
TS_ST_SCOPES(relaxed, "relaxed")
TS_ST_SCOPES(release, "release")
TS_ST(st32_volatile, ".volatile", 32, "r", uint32_t)
TS_ST(st64_volatile, ".volatile", 64, "l", uint64_t)
#undef TS_LD
#undef TS_ST
#undef TS_LDST_SCOPES
#undef TS_ST_SCOPES

enum Sem : int { kRelaxed = 0, kAcquire = 1, kRelease = 2, kAcqRel = 3, kVolatile = 4 };
enum MemScope : int { kCta = 0, kGpu = 1, kSys = 2 };

template <typename T>
__device__ __forceinline__ T from_bits(uint64_t b) {
  if constexpr (sizeof(T) == 4) {
    uint32_t x = (uint32_t)b;
    return *reinterpret_cast<T*>(&x);
  } else {
    return *reinterpret_cast<T*>(&b);
  }
}
template <typename T>
__device__ __forceinline__ uint64_t to_bits(T v) {
  if constexpr (sizeof(T) == 4) return *reinterpret_cast<uint32_t*>(&v);
  else return *reinterpret_cast<uint64_t*>(&v);
}

template <int SEM, int SCOPE, typename T>
__device__ __forceinline__ T ld(const void* p) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "tilescale::ld supports 32- and 64-bit types");
  uint64_t b;
  if constexpr (sizeof(T) == 4) {
    if constexpr (SEM == kVolatile) b = ld32_volatile(p);
    else if constexpr (SEM == kAcquire) b = SCOPE == kCta ? ld32_acquire_cta(p) : SCOPE == kGpu ? ld32_acquire_gpu(p) : ld32_acquire_sys(p);
    else b = SCOPE == kCta ? ld32_relaxed_cta(p) : SCOPE == kGpu ? ld32_relaxed_gpu(p) : ld32_relaxed_sys(p);
  } else {
    if constexpr (SEM == kVolatile) b = ld64_volatile(p);
    else if constexpr (SEM == kAcquire) b = SCOPE == kCta ? ld64_acquire_cta(p) : SCOPE == kGpu ? ld64_acquire_gpu(p) : ld64_acquire_sys(p);
    else b = SCOPE == kCta ? ld64_relaxed_cta(p) : SCOPE == kGpu ? ld64_relaxed_gpu(p) : ld64_relaxed_sys(p);
  }
  return from_bits<T>(b);
}

template <int SEM, int SCOPE, typename T>
__device__ __forceinline__ void st(T v, void* p) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "tilescale::st supports 32- and 64-bit types");
  const uint64_t b = to_bits(v);
  if constexpr (sizeof(T) == 4) {
    if constexpr (SEM == kVolatile) st32_volatile(p, (uint32_t)b);
    else if constexpr (SEM == kRelease) { if (SCOPE == kCta) st32_release_cta(p, (uint32_t)b); else if (SCOPE == kGpu) st32_release_gpu(p, (uint32_t)b); else st32_release_sys(p, (uint32_t)b); }
    else { if (SCOPE == kCta) st32_relaxed_cta(p, (uint32_t)b); else if (SCOPE == kGpu) st32_relaxed_gpu(p, (uint32_t)b); else st32_relaxed_sys(p, (uint32_t)b); }
  } else {
    if constexpr (SEM == kVolatile) st64_volatile(p, b);
    else if constexpr (SEM == kRelease) { if (SCOPE == kCta) st64_release_cta(p, b); else if (SCOPE == kGpu) st64_release_gpu(p, b); else st64_release_sys(p, b); }
    else { if (SCOPE == kCta) st64_relaxed_cta(p, b); else if (SCOPE == kGpu) st64_relaxed_gpu(p, b); else st64_relaxed_sys(p, b); }
  }
}

// ------------------------------------------------------------------------------------ atomics
#define TS_ATOM_SEM_SCOPE(SEM, SCOPE, BODY)                                                                   \
  if constexpr (SEM == kRelaxed && SCOPE == kCta) { BODY(".relaxed.cta") } else if constexpr (SEM == kRelaxed && SCOPE == kGpu) { BODY(".relaxed.gpu") } \
  else if constexpr (SEM == kRelaxed) { BODY(".relaxed.sys") } else if constexpr (SEM == kAcquire && SCOPE == kCta) { BODY(".acquire.cta") } \
  else if constexpr (SEM == kAcquire && SCOPE == kGpu) { BODY(".acquire.gpu") } else if constexpr (SEM == kAcquire) { BODY(".acquire.sys") } \
  else if constexpr (SEM == kRelease && SCOPE == kCta) { BODY(".release.cta") } else if constexpr (SEM == kRelease && SCOPE == kGpu) { BODY(".release.gpu") } \
  else if constexpr (SEM == kRelease) { BODY(".release.sys") } else if constexpr (SCOPE == kCta) { BODY(".acq_rel.cta") } \
  else if constexpr (SCOPE == kGpu) { BODY(".acq_rel.gpu") } else { BODY(".acq_rel.sys") }

template <int SEM, int SCOPE, typename T>
__device__ __forceinline__ T atom_add(T v, void* p) {
  T old;
  if constexpr (std::is_same<T, float>::value) {
#define TS_B(Q) asm volatile("atom" Q ".global.add.f32 %0, [%1], %2;" : "=f"(old) : "l"(p), "f"(v) : "memory");
    TS_ATOM_SEM_SCOPE(SEM, SCOPE, TS_B)
#undef TS_B
  } else if constexpr (sizeof(T) == 4) {
    uint32_t o, x = (uint32_t)to_bits(v);
#define TS_B(Q) asm volatile("atom" Q ".global.add.u32 %0, [%1], %2;" : "=r"(o) : "l"(p), "r"(x) : "memory");
    TS_ATOM_SEM_SCOPE(SEM, SCOPE, TS_B)
#undef TS_B
    old = from_bits<T>(o);
  } else {
    uint64_t o, x = to_bits(v);
#define TS_B(Q) asm volatile("atom" Q ".global.add.u64 %0, [%1], %2;" : "=l"(o) : "l"(p), "l"(x) : "memory");
    TS_ATOM_SEM_SCOPE(SEM, SCOPE, TS_B)
#undef TS_B
    old = from_bits<T>(o);
  }
  return old;
}
// T.release_stores(counter, value, scope=): the stores of this warp (TMA stores included: this thread's bulk
// groups are waited for, then a proxy fence orders them like plain stores) become visible before lane 0's
// release add. Warp-level: every lane of the warp calls it; the counter grows by `v` per warp.
// PENDING: this thread's most recent groups of bulk stores left in flight (a persistent kernel's next tile).
template <int SCOPE, typename T, int PENDING = 0>
__device__ __forceinline__ void release_stores(T v, void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(PENDING) : "memory");
  asm volatile("fence.proxy.async;" ::: "memory");
#endif
  __syncwarp();
  if ((threadIdx.x & 31) == 0) atom_add<kRelease, SCOPE, T>(v, p);
}
template <int SEM, int SCOPE, typename T>
__device__ __forceinline__ T atom_cas(T compare, T v, void* p) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "tilescale::atom_cas supports 32- and 64-bit types");
  uint64_t o;
  if constexpr (sizeof(T) == 4) {
    uint32_t oo, c = (uint32_t)to_bits(compare), x = (uint32_t)to_bits(v);
#define TS_B(Q) asm volatile("atom" Q ".global.cas.b32 %0, [%1], %2, %3;" : "=r"(oo) : "l"(p), "r"(c), "r"(x) : "memory");
    TS_ATOM_SEM_SCOPE(SEM, SCOPE, TS_B)
#undef TS_B
    o = oo;
  } else {
    uint64_t c = to_bits(compare), x = to_bits(v);
#define TS_B(Q) asm volatile("atom" Q ".global.cas.b64 %0, [%1], %2, %3;" : "=l"(o) : "l"(p), "l"(c), "l"(x) : "memory");
    TS_ATOM_SEM_SCOPE(SEM, SCOPE, TS_B)
#undef TS_B
  }
  return from_bits<T>(o);
}
#undef TS_ATOM_SEM_SCOPE

// ---------------------------------------------------------------- scalar ops on a peer's memory
// Through the peer mapping when there is one (ld/st/atom on the mapped address, the semantics as asked);
// else with NVSHMEM's atomics (AMOs), on the 32/64-bit pattern of the value. Release: earlier writes of this
// thread, and its puts to `pe` (nvshmem_fence), are ordered before the AMO; acquire: the AMO before later
// reads (a system-scope fence after it). Floats add by compare-and-swap (NVSHMEM has no float fetch-add on
// every transport).
template <typename T>
using bits_t = typename std::conditional<sizeof(T) == 4, uint32_t, uint64_t>::type;
__device__ __forceinline__ uint32_t amo_fetch(uint32_t* p, int pe) { return nvshmem_uint32_atomic_fetch(p, pe); }
__device__ __forceinline__ uint64_t amo_fetch(uint64_t* p, int pe) { return nvshmem_uint64_atomic_fetch(p, pe); }
__device__ __forceinline__ void amo_set(uint32_t* p, uint32_t v, int pe) { nvshmem_uint32_atomic_set(p, v, pe); }
__device__ __forceinline__ void amo_set(uint64_t* p, uint64_t v, int pe) { nvshmem_uint64_atomic_set(p, v, pe); }
__device__ __forceinline__ uint32_t amo_fetch_add(uint32_t* p, uint32_t v, int pe) {
  return nvshmem_uint32_atomic_fetch_add(p, v, pe);
}
__device__ __forceinline__ uint64_t amo_fetch_add(uint64_t* p, uint64_t v, int pe) {
  return nvshmem_uint64_atomic_fetch_add(p, v, pe);
}
__device__ __forceinline__ uint32_t amo_cas(uint32_t* p, uint32_t c, uint32_t v, int pe) {
  return nvshmem_uint32_atomic_compare_swap(p, c, v, pe);
}
__device__ __forceinline__ uint64_t amo_cas(uint64_t* p, uint64_t c, uint64_t v, int pe) {
  return nvshmem_uint64_atomic_compare_swap(p, c, v, pe);
}
template <int SEM>
__device__ __forceinline__ void amo_release() {
  if constexpr (SEM == kRelease || SEM == kAcqRel) {
    __threadfence_system();
    nvshmem_fence();
  }
}
template <int SEM>
__device__ __forceinline__ void amo_acquire() {
  if constexpr (SEM == kAcquire || SEM == kAcqRel) __threadfence_system();
}
template <typename T>
__device__ __forceinline__ bits_t<T>* as_bits(const void* p) {
  return reinterpret_cast<bits_t<T>*>(const_cast<void*>(p));
}

template <int SEM, int SCOPE, typename T>
__device__ __forceinline__ T ld_pe(const void* p, int pe) {
  if (void* q = peer_ptr_or_null(p, pe)) return ld<SEM, SCOPE, T>(q);
  const T v = from_bits<T>(amo_fetch(as_bits<T>(p), pe));
  amo_acquire<SEM>();
  return v;
}
template <int SEM, int SCOPE, typename T>
__device__ __forceinline__ void st_pe(T v, void* p, int pe) {
  if (void* q = peer_ptr_or_null(p, pe)) return st<SEM, SCOPE, T>(v, q);
  amo_release<SEM>();
  amo_set(as_bits<T>(p), (bits_t<T>)to_bits(v), pe);
}
template <int SEM, int SCOPE, typename T>
__device__ __forceinline__ T atom_add_pe(T v, void* p, int pe) {
  if (void* q = peer_ptr_or_null(p, pe)) return atom_add<SEM, SCOPE, T>(v, q);
  amo_release<SEM>();
  T old;
  if constexpr (std::is_same<T, float>::value) {
    uint32_t seen = amo_fetch(as_bits<T>(p), pe), prev;
    while ((prev = amo_cas(as_bits<T>(p), seen, (uint32_t)to_bits(from_bits<T>(seen) + v), pe)) != seen) seen = prev;
    old = from_bits<T>(seen);
  } else {
    old = from_bits<T>(amo_fetch_add(as_bits<T>(p), (bits_t<T>)to_bits(v), pe));  // two's complement: signed too
  }
  amo_acquire<SEM>();
  return old;
}
template <int SEM, int SCOPE, typename T>
__device__ __forceinline__ T atom_cas_pe(T c, T v, void* p, int pe) {
  if (void* q = peer_ptr_or_null(p, pe)) return atom_cas<SEM, SCOPE, T>(c, v, q);
  amo_release<SEM>();
  const T old = from_bits<T>(amo_cas(as_bits<T>(p), (bits_t<T>)to_bits(c), (bits_t<T>)to_bits(v), pe));
  amo_acquire<SEM>();
  return old;
}

// ------------------------------------------------------------------------------------------ waits
template <typename T>
__device__ __forceinline__ bool cmp_holds(T v, int cmp, T x) {
  switch (cmp) {
    case kEq: return v == x;
    case kNe: return v != x;
    case kGt: return v > x;
    case kGe: return v >= x;
    case kLt: return v < x;
    default: return v <= x;
  }
}

// Records what the wait saw in the diagnostics record (mapped host memory) and stops the kernel.
// Inlined and printf-free on purpose: a call (or printf) anywhere in a kernel makes ptxas serialise its wgmma
// pipeline (C7510), which cost the AG+GEMM GEMM up to a quarter of its speed in debug mode. The host prints the
// record (tilescale.diagnostics.describe).
//   1. The module's first thread to give up takes its gate (g_wait_gate 0 -> 1, an atomic in device memory);
//   2. it claims the process's record (flag 0 -> 2, the one atomic on host memory; another module's record may
//      be there first: then it writes nothing), writes it, fences, sets flag = 1, then the gate to 2;
//   3. every other thread that gives up waits for the gate to be 2 (device memory, with a sleep between reads),
//      at most 1 s: stopping the kernel at once would stop the writer too, before its record is complete;
//   4. then each stops the kernel (trap).
__device__ __forceinline__ void wait_timed_out(const void* addr, int cmp, int bits, uint64_t expected,
                                               uint64_t observed, uint64_t elapsed, int site) {
  WaitDiag* d = g_wait_diag;
  const int rank = nvshmem_my_pe();
  const int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  if (d != nullptr) {
    if (atomicCAS(&g_wait_gate, 0u, 1u) == 0u) {                     // 1
      if (atomicCAS(&d->flag, 0ull, 2ull) == 0ull) {                // 2
        volatile WaitDiag* v = d;
        v->rank = rank;
        v->block = block;
        v->thread = thread;
        v->site = site;
        v->cmp = cmp;
        v->bits = bits;
        v->addr = (unsigned long long)addr;
        v->expected = expected;
        v->observed = observed;
        v->elapsed_ns = elapsed;
        __threadfence_system();
        v->flag = 1ull;
        __threadfence_system();
      }
      atomicExch(&g_wait_gate, 2u);
    } else {                                                        // 3
      const uint64_t t0 = globaltimer();
      while (atomicAdd(&g_wait_gate, 0u) != 2u && globaltimer() - t0 < 1000000000ull) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
        __nanosleep(1000);
#endif
      }
    }
  }
  __trap();                                                         // 4
}

// Spins until `load() cmp value` holds, then returns the value it saw (`addr`: what a time-out reports).
// With TILESCALE_WAIT_TIMEOUT_NS > 0 (debug mode) it gives up after that long and stops the kernel.
template <typename T, typename Load>
__device__ __forceinline__ T wait_until_loaded(const Load& load, const void* addr, int cmp, T value, int site) {
  T v = load();
  if (!cmp_holds(v, cmp, value)) {
#if TILESCALE_WAIT_TIMEOUT_NS > 0
    const uint64_t t0 = globaltimer();
#endif
    do {
#if TILESCALE_WAIT_TIMEOUT_NS > 0
      const uint64_t dt = globaltimer() - t0;
      if (dt > (uint64_t)(TILESCALE_WAIT_TIMEOUT_NS))
        wait_timed_out(addr, cmp, (int)sizeof(T) * 8, to_bits(value), to_bits(v), dt, site);
#endif
      v = load();
    } while (!cmp_holds(v, cmp, value));
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.global;" ::: "memory");  // TMA reads after this see the peer's data
#endif
  return v;
}

// The loads of the waits (functors, not lambdas: always inlined; a call in a kernel costs wgmma its pipeline).
template <typename T>
struct LoadAcquire {  // a local or mapped word, acquire at system scope
  const void* addr;
  __device__ __forceinline__ T operator()() const { return ld<kAcquire, kSys, T>(addr); }
};
template <typename T>
struct FetchAcquire {  // PE `pe`'s word, NVSHMEM's atomic fetch, then a system-scope fence
  const void* addr;
  int pe;
  __device__ __forceinline__ T operator()() const {
    const T v = from_bits<T>(amo_fetch(as_bits<T>(addr), pe));
    __threadfence_system();
    return v;
  }
};

// Spins until `*addr cmp value` holds (acquire, system scope), then returns the value it saw.
template <typename T>
__device__ __forceinline__ T wait_until(const void* addr, int cmp, T value, int site) {
  return wait_until_loaded<T>(LoadAcquire<T>{addr}, addr, cmp, value, site);
}

// wait_until on PE `pe`'s copy of symmetric `addr`: through the peer mapping, else polled with NVSHMEM's
// atomic fetch. A time-out reports this PE's address of the word.
template <typename T>
__device__ __forceinline__ T wait_until_pe(const void* addr, int pe, int cmp, T value, int site) {
  if (const void* q = peer_ptr_or_null(addr, pe)) return wait_until<T>(q, cmp, value, site);
  return wait_until_loaded<T>(FetchAcquire<T>{addr, pe}, addr, cmp, value, site);
}

// ---------------------------------------------------------------------------------------- barriers
// The wait-site id that bounded barriers report (tilescale/language/distributed.py names it).
constexpr int kBarrierSite = -2;

// A barrier of all PEs, by one thread of this PE, bounded like every wait (TILESCALE_WAIT_TIMEOUT_NS):
// 1. complete_puts: nvshmem_quiet(), so every put this PE issued before is complete at its destination;
// 2. take the next epoch e of this PE (word n_pes of the runtime's barrier words counts its barriers);
// 3. signal e into word `me` of every other PE (signal set: a PE that runs a barrier ahead only raises it);
// 4. wait until word p >= e for every other PE p: every PE has reached barrier e.
// Without the runtime's barrier words (a module not initialised by tilescale) it is NVSHMEM's barrier.
__device__ __forceinline__ void barrier_one_thread(bool complete_puts) {
  unsigned long long* w = g_barrier;
  if (w == nullptr) {
    if (complete_puts) nvshmem_barrier_all(); else nvshmem_sync_all();
    return;
  }
  if (complete_puts) nvshmem_quiet();
  const int me = nvshmem_my_pe(), n = nvshmem_n_pes();
  const unsigned long long e = atomicAdd(w + n, 1ull) + 1ull;
  for (int p = 0; p < n; ++p)
    if (p != me) nvshmemx_signal_op(reinterpret_cast<uint64_t*>(w + me), (uint64_t)e, NVSHMEM_SIGNAL_SET, p);
  for (int p = 0; p < n; ++p)
    if (p != me) wait_until<unsigned long long>(w + p, kGe, e, kBarrierSite);
}

// barrier_all / sync_all of a thread, a warp or a block per PE: the group meets, its first thread runs
// the barrier, the group meets again (sync_all: without completing puts first).
template <int G>
__device__ __forceinline__ void barrier_all() {
  group_sync<G>();
  if (group_leader<G>()) barrier_one_thread(true);
  group_sync<G>();
}
template <int G>
__device__ __forceinline__ void sync_all() {
  group_sync<G>();
  if (group_leader<G>()) barrier_one_thread(false);
  group_sync<G>();
}

// The first block of the grid joins a barrier of all PEs (grid-scope barrier, between two grid syncs
// emitted by the language op).
__device__ __forceinline__ void barrier_all_first_block() {
  if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) barrier_all<kBlock>();
}

// ============================================================================== call numbers (CUDA graphs)
// T.call_number(counters): which launch of this kernel this is (1, 2, ...), counted on the device, so that a
// kernel replayed from a CUDA graph sees a new number on every replay (a number passed from the host would be
// frozen at capture). Block b of the grid (linear index) owns counters[b]: thread 0 adds 1 to it and shares
// the new value through shared memory; every block of one launch sees the same number, since every launch
// adds 1 to every word and launches of one kernel run in stream order. An atomic add (performed at L2, its
// result awaited before the block exits) rather than a load and a store: the next launch may start before
// this one's memory is flushed (programmatic dependent launch), and still sees the count. Every thread of the
// block calls it, once per launch, outside any branch (it synchronises the block).
constexpr int kCallNumberSite = -3;   // tilescale.language.distributed.CALL_NUMBER_SITE
__device__ __forceinline__ uint64_t count_call(int64_t* counters, int n) {   // one thread of the block
  const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  // no print call here (a call anywhere in the kernel serialises its wgmma pipeline, C7510: the GEMM+RS GEMM
  // ran at 0.85-0.91 of cuBLAS with one): a wait's record with the site of T.call_number, said by the host
  if (b >= n) wait_timed_out(counters, kGe, 64, (uint64_t)n, (uint64_t)b, 0, kCallNumberSite);
  return atomicAdd(reinterpret_cast<unsigned long long*>(counters + b), 1ull) + 1ull;
}
__device__ __forceinline__ uint64_t call_number(int64_t* counters, int n) {
  __shared__ uint64_t number;
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) number = count_call(counters, n);
  __syncthreads();
  return number;
}
// T.call_number(counters, scope="warp"): the same count, known to the calling warp alone (lane 0 counts, a
// shuffle shares it), with no block synchronisation: every lane of exactly one warp of the block calls it.
__device__ __forceinline__ uint64_t call_number_warp(int64_t* counters, int n) {
  const uint64_t number = (threadIdx.x & 31) == 0 ? count_call(counters, n) : 0;
  return __shfl_sync(0xffffffffu, number, 0);
}
// ========================================================================== end of call numbers

// =============================================== asynchronous bulk copies: into shared memory and back out
// T.init_barrier(bar, arrivals): thread 0 makes `bar` (a uint64 in shared memory) an mbarrier expecting `arrivals`
// arrivals per phase; the block then synchronises (every thread calls it, outside any branch).
__device__ __forceinline__ void init_barrier(void* bar, int arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
                 ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "r"(arrivals) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
#endif
  __syncthreads();
}
// T.arrive_barrier(bar): one arrival of the calling thread on the mbarrier `bar`, with no bytes announced.
__device__ __forceinline__ void arrive_barrier(void* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];"
               ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))) : "memory");
#endif
}
// T.wait_barrier(bar, phase): wait until phase `phase` (0, 1, 0, ...) of the mbarrier `bar` completed (no timeout:
// a phase that nothing was started for never completes).
__device__ __forceinline__ void wait_barrier(void* bar, int phase) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t b = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}\n" ::"r"(b), "r"(phase) : "memory");
#endif
}
// T.load_async(src, dst, barrier=): `rows` rows of `row_bytes` from global `src` (rows `src_ld` bytes apart) into
// shared `dst` (rows `dst_ld` apart) by bulk copies (cp.async.bulk, one per row, spread over the lanes) that
// complete on the mbarrier `bar`: lane 0 arrives on it expecting every byte, then the lanes start their rows.
// Warp-level (every lane of one warp calls it; the warp may then go on: nothing here waits for the data). A
// proxy fence first orders this thread's earlier acquires (a flag that says the rows are written) before the
// copies' reads. Every address and size is a multiple of 16 bytes (checked where the kernel is traced).
__device__ __forceinline__ void load_rows_async(const void* src, void* dst, int rows, int row_bytes, long src_ld,
                                                int dst_ld, void* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t b = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  const int lane = threadIdx.x & 31;
  asm volatile("fence.proxy.async.global;" ::: "memory");
  if (lane == 0)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(rows * row_bytes) : "memory");
  __syncwarp();
  for (int r = lane; r < rows; r += 32)
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(d + r * dst_ld), "l"(static_cast<const char*>(src) + r * src_ld), "r"(row_bytes), "r"(b)
                 : "memory");
#endif
}
// T.store_async(src, dst): `rows` rows of `row_bytes` from shared `src` (rows `src_ld` apart) into global `dst` (rows
// `dst_ld` bytes apart; local or a peer's through its mapping) by bulk copies (cp.async.bulk, one per row, spread over
// the lanes) in one bulk group per lane; returns once they have read `src` (`written`: once they are written). Their
// writes complete later: T.release_stores (cp.async.bulk.wait_group 0 in the same lanes) waits for them. Warp-level.
__device__ __forceinline__ void store_rows_async(const void* src, void* dst, int rows, int row_bytes, int src_ld,
                                                 long dst_ld, int written = 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(src));
  const int lane = threadIdx.x & 31;
  for (int r = lane; r < rows; r += 32)
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                 ::"l"(static_cast<char*>(dst) + r * dst_ld), "r"(s + r * src_ld), "r"(row_bytes) : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  if (written) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  else asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  __syncwarp();
#endif
}
// T.store_tile(src, dst, threads=(first, count)): threads first .. first + count - 1 of the block (whole warps, every
// one calling) copy `rows` rows of `row_bytes` from shared `src` (rows `src_ld` bytes apart) into global `dst` (rows
// `dst_ld` apart; local or a peer's through its mapping) by plain 16-byte stores, then meet at named barrier
// kStoreTileBarrier: afterwards `src` may be written again and any of them may count the stores (T.release_stores:
// its release is cumulative over the group's stores, ordered before it by the barrier). No bulk copy: why, in
// T.store_tile's docstring (tilescale/language/tiles.py).
constexpr int kStoreTileBarrier = 15;   // the last named barrier: tilelang numbers its own from 3 up
__device__ __forceinline__ void store_tile(const void* src, void* dst, int rows, int row_bytes, int src_ld,
                                           long dst_ld, int first, int count) {
  const int t = static_cast<int>(threadIdx.x) - first;
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(src));
  char* d = static_cast<char*>(dst);
  const int per_row = row_bytes >> 4;
  const int n = rows * per_row;
  const bool flat = src_ld == row_bytes && dst_ld == (long)row_bytes;
#pragma unroll 4
  for (int i = t; i < n; i += count) {
    const int r = flat ? 0 : i / per_row;
    const int c = flat ? i : i - r * per_row;
    uint32_t a, b, x, y;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a), "=r"(b), "=r"(x), "=r"(y) : "r"(s + r * src_ld + c * 16) : "memory");
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};"
                 ::"l"(d + r * dst_ld + c * 16), "r"(a), "r"(b), "r"(x), "r"(y) : "memory");
  }
  asm volatile("bar.sync %0, %1;" ::"n"(kStoreTileBarrier), "r"(count) : "memory");
}
// ============================================================================ end of asynchronous bulk copies

}  // namespace tilescale

// tilescale.barrier(): the same barrier as a one-thread kernel on `stream` (host code of every module).
extern "C" __global__ void tilescale_module_barrier_kernel(int complete_puts) {
  tilescale::barrier_one_thread(complete_puts != 0);
}
extern "C" int tilescale_module_barrier(void* stream, int complete_puts) {
  tilescale_module_barrier_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(complete_puts);
  return (int)cudaGetLastError();
}
