#line 1 "prelude.cuh"
// ferrocaffe CUDA prelude: compiled in front of every kernel module.
typedef long long i64;
typedef unsigned long long u64;
typedef int i32;
typedef unsigned int u32;
typedef unsigned char u8;

// Grid-stride loop over [0, n).
#define FC_LOOP(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (i64)blockDim.x * gridDim.x)

// Sum of `v` over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float fc_block_sum(float v) {
    __shared__ float fc_part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) fc_part[warp] = v;
    __syncthreads();
    const int nw = (blockDim.x + 31) >> 5;
    v = lane < nw ? fc_part[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Max of `v` over the block, as fc_block_sum.
__device__ __forceinline__ float fc_block_max(float v) {
    __shared__ float fc_partm[32];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) fc_partm[warp] = v;
    __syncthreads();
    const int nw = (blockDim.x + 31) >> 5;
    v = lane < nw ? fc_partm[lane] : __int_as_float(0xff800000);
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// A counter-based random number (a 64-bit mix of seed and index), uniform in [0, 1).
__device__ __forceinline__ float fc_uniform01(u64 seed, u64 idx) {
    u64 z = seed + 0x9E3779B97F4A7C15ull * (idx + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}
