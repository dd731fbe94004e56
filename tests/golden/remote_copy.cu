extern "C" __global__ void __launch_bounds__(128, 1) remote_copy_kernel(half_t* buf, half_t* out) {
extern __shared__ __align__(1024) half_t s[];
int me = nvshmem_my_pe();
void* v = tilescale::peer_ptr((&(buf[0])), ((me + 1) & 3));
#pragma unroll
for (int i = 0; i < 4; ++i) {
*(uint4*)(s + ((i * 1024) + (((int)threadIdx.x) * 8))) = *(uint4*)(((half_t*)v) + ((i * 1024) + (((int)threadIdx.x) * 8)));
}
void* v_1 = tilescale::peer_ptr((&(out[0])), ((me + 3) & 3));
__syncthreads();
if (tl::tl_shuffle_elect<128>()) {
tl::fence_proxy_async();
tl::tma_store((&(((half_t*)v_1)[0])), (&(s[0])), 8192);
tl::tma_store_arrive();
tl::tma_store_wait<0, true>();
}
void* peer = tilescale::peer_ptr((&(buf[0])), 0);
out[0] = ((half_t*)peer)[65];
}
