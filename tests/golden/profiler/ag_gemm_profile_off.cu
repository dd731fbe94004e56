#define TILESCALE_NVSHMEM_NO_COLLECTIVES
#include <tilescale/tilescale.cuh>
#if defined(_MSC_VER) && !defined(__clang__) && _MSC_VER < 1940
#define _tl_orig_alignas alignas
#define alignas(N) _tl_orig_alignas((N) <= 64 ? (N) : 64)
#include <cuda.h>
#undef alignas
#define alignas _tl_orig_alignas
#endif
#if defined(__CUDA_ARCH__)
#include <tl_templates/cuda/instruction/wgmma.h>
#include <tl_templates/cuda/intrin.h>
#include <tl_templates/cuda/barrier.h>
#include <tl_templates/cuda/copy_sm90.h>
#include <tl_templates/cuda/reduce.h>
#include <tl_templates/cuda/scan.h>
#include <tl_templates/cuda/ldsm.h>
#include <tl_templates/cuda/threadblock_swizzle.h>
#include <tl_templates/cuda/debug.h>
#endif
#ifdef ENABLE_BF16
#include <tl_templates/cuda/cuda_bf16_fallbacks.cuh>
#endif

#include <tl_templates/cuda/common.h>
#if defined(__CUDA_ARCH__)
extern "C" __global__ void ag_gemm_kernel(__grid_constant__ const CUtensorMap A_desc, __grid_constant__ const CUtensorMap B_desc, __grid_constant__ const CUtensorMap C_desc, const uint64_t* arrived, int m);
extern "C" __global__ void __launch_bounds__(384, 1) ag_gemm_kernel(__grid_constant__ const CUtensorMap A_desc, __grid_constant__ const CUtensorMap B_desc, __grid_constant__ const CUtensorMap C_desc, const uint64_t* arrived, int m) {
  extern __shared__ __align__(1024) uchar buf_dyn_shmem[];
  void* Bs = ((void*)((char*)buf_dyn_shmem + 0));
  void* Cs = ((void*)((char*)buf_dyn_shmem + 0));
  void* As = ((void*)((char*)buf_dyn_shmem + 98304));
  __shared__ __align__(16) uint64_t mbarrier_mem[6];
  auto mbarrier = reinterpret_cast<Barrier*>(mbarrier_mem);
  int at[3];
  float Cl[128];
  if (tl::tl_shuffle_elect<0>()) {
    tl::prefetch_tma_descriptor(A_desc);
    tl::prefetch_tma_descriptor(B_desc);
    tl::prefetch_tma_descriptor(C_desc);
  }
  if (tl::tl_shuffle_elect<0>()) {
    mbarrier[0].init(1);
    mbarrier[1].init(1);
    mbarrier[2].init(1);
    mbarrier[3].init(256);
    mbarrier[4].init(256);
    mbarrier[5].init(256);
  }
  tl::fence_barrier_init();
  __syncthreads();
  const dim3 blockIdx = tl::rasterization2DRow<10>();
  int me = nvshmem_my_pe();
  int rmod = (((int)blockIdx.y) % ((m + 127) >> 7));
  at[0] = ((((0 <= ((m + 127) >> 7)) && (0 <= rmod)) || ((((m + 127) >> 7) < 0) && (rmod <= 0))) ? rmod : (rmod + ((m + 127) >> 7)));
  int rmod_1 = (((int)blockIdx.y) % ((m + 127) >> 7));
  int rdiv = (((int)blockIdx.y) / ((m + 127) >> 7));
  at[1] = (((me + ((((0 <= ((m + 127) >> 7)) && (0 <= rmod_1)) || ((((m + 127) >> 7) < 0) && (rmod_1 <= 0))) ? rdiv : (rdiv - 1))) + 1) & 1);
  at[2] = ((at[0] / max(1, ((m + 511) >> 9))) + ((at[0] % max(1, ((m + 511) >> 9))) >> 31));
  int rb = at[0];
  int c_src = at[1];
  int chunk = at[2];
  if (0 <= ((c_src * 4) + chunk)) {
    if (((chunk >> 2) + c_src) < 2) {
      tilescale::wait_until<unsigned long long>((&(arrived[((c_src * 4) + chunk)])), 3, (uint64_t)1, <site>);
    }
  }
  if (((int)threadIdx.x) < 128) {
    tl::warpgroup_reg_dealloc<24>();
    for (int ko = 0; ko < 8; ++ko) {
      mbarrier[((ko % 3) + 3)].wait((((ko % 6) / 3) ^ 1));
      if (tl::tl_shuffle_elect<128>()) {
        mbarrier[(ko % 3)].expect_transaction(16384);
        tl::tma_load(A_desc, mbarrier[(ko % 3)], (&(((bfloat16_t*)As)[((ko % 3) * 8192)])), (ko * 64), (rb * 128), c_src);
        mbarrier[(ko % 3)].arrive_and_expect_tx(32768);
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
          tl::tma_load(B_desc, mbarrier[(ko % 3)], (&(((bfloat16_t*)Bs)[(((ko % 3) * 16384) + (i * 4096))])), ((((int)blockIdx.x) * 256) + (i * 64)), (ko * 64));
        }
      }
    }
  } else {
    tl::warpgroup_reg_alloc<240>();
    #pragma unroll
    for (int i_1 = 0; i_1 < 32; ++i_1) {
      float broadcast_var = 0x0p+0f/*0.000000e+00*/;
      *(float4*)(Cl + (i_1 * 4)) = make_float4(broadcast_var, broadcast_var, broadcast_var, broadcast_var);
    }
    for (int ko_1 = 0; ko_1 < 8; ++ko_1) {
      mbarrier[(ko_1 % 3)].wait(((ko_1 % 6) / 3));
      {
        tl::GmmaDescriptor desc_a;
        tl::GmmaDescriptor desc_b;
        tl::initialize_wgmma_descriptor<1, 1, 64>(desc_a, (&(((bfloat16_t*)As)[0])));
        tl::increase_descriptor_offset<int>(desc_a, ((ko_1 % 3) * 16384));
        tl::initialize_wgmma_descriptor<1, 512, 64>(desc_b, (&(((bfloat16_t*)Bs)[0])));
        tl::increase_descriptor_offset<int>(desc_b, ((ko_1 % 3) * 32768));
        tl::warpgroup_fence_operand(reinterpret_cast<float*>(Cl + 0), 128);
        tl::warpgroup_arrive();
        #pragma unroll
        for (int i_2 = 0; i_2 < 2; ++i_2) {
          #pragma unroll
          for (int ki = 0; ki < 4; ++ki) {
            tl::wgmma_ss<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32, 64, 128, 16, false, true, 1, 1>(uint64_t(desc_a + (((i_2 * 8192) + (ki * 32)) >> 4)), uint64_t(desc_b + ((((((((int)threadIdx.x) >> 7) + 1) & 1) * 16384) + (ki * 2048)) >> 4)), ((uint32_t*)(Cl + (i_2 * 64))), 1);
          }
        }
        tl::warpgroup_commit_batch();
        tl::warpgroup_wait<0>();
        tl::warpgroup_fence_operand(reinterpret_cast<float*>(Cl + 0), 128);
      }
      mbarrier[((ko_1 % 3) + 3)].arrive();
    }
    tl::__sync_thread_partial(3, 256);
    #pragma unroll
    for (int i_3 = 0; i_3 < 16; ++i_3) {
      tl::ptx_stmatrix_m8n8_x4((&(((bfloat16_t*)Cs)[((((((((((((int)threadIdx.x) >> 7) * 16384) + (((i_3 & 7) >> 2) * 8192)) + ((i_3 >> 3) * 4096)) + (((((int)threadIdx.x) & 127) >> 5) * 1024)) + ((((int)threadIdx.x) & 15) * 64)) + (((((((int)threadIdx.x) & 7) >> 2) + ((i_3 & 3) >> 1)) & 1) * 32)) + (((((((int)threadIdx.x) & 3) >> 1) + (i_3 & 1)) & 1) * 16)) + (((((((int)threadIdx.x) & 31) >> 4) + (((int)threadIdx.x) & 1)) & 1) * 8)) - 16384)])), __pack_half2(((bfloat16_t)Cl[(i_3 * 8)]), ((bfloat16_t)Cl[((i_3 * 8) + 1)])), __pack_half2(((bfloat16_t)Cl[((i_3 * 8) + 2)]), ((bfloat16_t)Cl[((i_3 * 8) + 3)])), __pack_half2(((bfloat16_t)Cl[((i_3 * 8) + 4)]), ((bfloat16_t)Cl[((i_3 * 8) + 5)])), __pack_half2(((bfloat16_t)Cl[((i_3 * 8) + 6)]), ((bfloat16_t)Cl[((i_3 * 8) + 7)])));
    }
    tl::__sync_thread_partial(3, 256);
    if (tl::tl_shuffle_elect<256>()) {
      tl::fence_proxy_async();
      #pragma unroll
      for (int i_4 = 0; i_4 < 4; ++i_4) {
        tl::tma_store(C_desc, (&(((bfloat16_t*)Cs)[(i_4 * 8192)])), ((((int)blockIdx.x) * 256) + (i_4 * 64)), (rb * 128), c_src);
      }
      tl::tma_store_arrive();
      tl::tma_store_wait<0, true>();
    }
  }
}


#else
// tilescale: the host pass of nvcc sees the kernels' signatures only (codegen.py)
extern "C" __global__ void ag_gemm_kernel(__grid_constant__ const CUtensorMap A_desc, __grid_constant__ const CUtensorMap B_desc, __grid_constant__ const CUtensorMap C_desc, const uint64_t* arrived, int m);
extern "C" __global__ void __launch_bounds__(384, 1) ag_gemm_kernel(__grid_constant__ const CUtensorMap A_desc, __grid_constant__ const CUtensorMap B_desc, __grid_constant__ const CUtensorMap C_desc, const uint64_t* arrived, int m) {}
#endif
