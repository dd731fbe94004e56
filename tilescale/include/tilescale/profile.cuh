// tilescale/profile.cuh: in-kernel timestamps for tilescale's profiler (tilescale.profiler).
//
// Behind T.timestamp() and T.smid() (tilescale/language/profile.py). Self-contained on purpose:
// builtin types only, no NVSHMEM, a macro guard instead of #pragma once. Kernels without distributed
// ops are built by tilelang without tilescale's headers, so the language op also pastes this file
// into the generated source (T.import_source); in distributed kernels tilescale.cuh includes it
// first and the guard drops the pasted copy. The function names do not start with "tilescale::",
// so a kernel that only takes timestamps is not classified as distributed (tilescale/compilation/analysis.py).
#ifndef TILESCALE_PROFILE_CUH_
#define TILESCALE_PROFILE_CUH_

// Nanoseconds of the GPU's global timer (%globaltimer): one clock for every SM of the GPU, in
// nanoseconds since an epoch that the driver sets (tilescale.profiler.device_timeline maps it to the
// host clock). Its resolution is the GPU's (tens of ns to 1 us; the profiler reports what it saw).
// The "memory" clobber keeps the read in place relative to the loads and stores around it.
__device__ __forceinline__ unsigned long long tilescale_profile_timestamp() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : : "memory");
  return t;
}

// The SM this thread runs on (%smid).
__device__ __forceinline__ unsigned int tilescale_profile_smid() {
  unsigned int s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

#endif  // TILESCALE_PROFILE_CUH_
