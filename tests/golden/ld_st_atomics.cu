extern "C" __global__ void __launch_bounds__(32, 1) ld_st_atomics_kernel(float* acc, int* flag, int64_t* out, uint64_t* word) {
int a = tilescale::ld<1, 2, int>((&(flag[0])));
int b = tilescale::ld_pe<0, 1, int>((&(flag[1])), 1);
uint64_t c = tilescale::ld<4, 0, unsigned long long>((&(word[0])));
tilescale::st<2, 2, int>((a + b), (&(flag[2])));
tilescale::st_pe<2, 2, int>(7, (&(flag[3])), 2);
tilescale::st<0, 1, unsigned long long>(c, (&(word[1])));
int d = tilescale::atom_add<0, 1, int>(1, (&(flag[4])));
float e = tilescale::atom_add_pe<3, 2, float>(0x1.8p+0f/*1.500000e+00*/, (&(acc[0])), 3);
uint64_t f = tilescale::atom_cas<1, 2, unsigned long long>((uint64_t)0, (uint64_t)1, (&(word[2])));
int g = tilescale::atom_cas_pe<2, 2, int>(0, 9, (&(flag[5])), 1);
out[0] = ((int64_t)d);
out[1] = ((int64_t)e);
out[2] = ((int64_t)f);
out[3] = ((int64_t)g);
}
