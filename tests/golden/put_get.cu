extern "C" __global__ void __launch_bounds__(128, 1) put_get_kernel(float* dst, half_t* peer_tile, int* ranks, float* src, const half_t* tile) {
extern __shared__ __align__(1024) float s[];
int me = nvshmem_my_pe();
int npes = nvshmem_n_pes();
*(float2*)(s + (((int)threadIdx.x) * 2)) = *(float2*)(src + (((int)threadIdx.x) * 2));
__syncthreads();
if (0 <= me) {
if (me < 4) {
int rmod = ((me + 1) % npes);
tilescale::put<2, false>((&(s[0])), (&(dst[(me * 256)])), 1, 1024, 1024, 1024, ((((0 <= npes) && (0 <= rmod)) || ((npes < 0) && (rmod <= 0))) ? rmod : (rmod + npes)));
int rmod_1 = ((me + 1) % npes);
tilescale::put<2, true>((&(src[0])), (&(dst[(me * 256)])), 1, 1024, 1024, 1024, ((((0 <= npes) && (0 <= rmod_1)) || ((npes < 0) && (rmod_1 <= 0))) ? rmod_1 : (rmod_1 + npes)));
int rmod_2 = ((me + 1) % npes);
tilescale::put<1, false>((&(src[0])), (&(dst[(me * 256)])), 1, 128, 128, 128, ((((0 <= npes) && (0 <= rmod_2)) || ((npes < 0) && (rmod_2 <= 0))) ? rmod_2 : (rmod_2 + npes)));
int rmod_3 = ((me + 1) % npes);
tilescale::put<1, true>((&(src[0])), (&(dst[((me * 256) + 32)])), 1, 128, 128, 128, ((((0 <= npes) && (0 <= rmod_3)) || ((npes < 0) && (rmod_3 <= 0))) ? rmod_3 : (rmod_3 + npes)));
tilescale::put<0, false>((&(src[8])), (&(dst[((me * 256) + 8)])), 1, 16, 16, 16, 0);
tilescale::put<0, true>((&(src[16])), (&(dst[((me * 256) + 16)])), 1, 16, 16, 16, 0);
}
}
int rmod_4 = ((me + 1) % npes);
tilescale::put<2, false>((&(tile[0])), (&(peer_tile[64])), 64, 128, 128, 256, ((((0 <= npes) && (0 <= rmod_4)) || ((npes < 0) && (rmod_4 <= 0))) ? rmod_4 : (rmod_4 + npes)));
__syncthreads();
if (0 <= me) {
if (me < 4) {
int rmod_5 = ((me + 1) % npes);
tilescale::get<2, false>((&(dst[(me * 256)])), (&(s[0])), 1, 1024, 1024, 1024, ((((0 <= npes) && (0 <= rmod_5)) || ((npes < 0) && (rmod_5 <= 0))) ? rmod_5 : (rmod_5 + npes)));
int rmod_6 = ((me + 1) % npes);
tilescale::get<2, true>((&(dst[(me * 256)])), (&(src[0])), 1, 1024, 1024, 1024, ((((0 <= npes) && (0 <= rmod_6)) || ((npes < 0) && (rmod_6 <= 0))) ? rmod_6 : (rmod_6 + npes)));
int rmod_7 = ((me + 1) % npes);
tilescale::get<1, false>((&(dst[(me * 256)])), (&(src[0])), 1, 128, 128, 128, ((((0 <= npes) && (0 <= rmod_7)) || ((npes < 0) && (rmod_7 <= 0))) ? rmod_7 : (rmod_7 + npes)));
int rmod_8 = ((me + 1) % npes);
tilescale::get<1, true>((&(dst[(me * 256)])), (&(src[32])), 1, 128, 128, 128, ((((0 <= npes) && (0 <= rmod_8)) || ((npes < 0) && (rmod_8 <= 0))) ? rmod_8 : (rmod_8 + npes)));
tilescale::get<0, false>((&(dst[(me * 256)])), (&(src[0])), 1, 32, 32, 32, 1);
tilescale::get<0, true>((&(dst[((me * 256) + 8)])), (&(src[8])), 1, 32, 32, 32, 1);
}
}
ranks[0] = me;
ranks[1] = npes;
}
