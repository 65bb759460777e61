// The `reduce` family's kernels: whole-tensor sums (two passes through double partials),
// reductions over axes and their gradients, transposes, strided row copies (Concat / Split),
// constant fills by bit pattern, and the random fills.
//
// Shapes travel as `RdDims` (up to RD_MAXD dims, passed by value); the host coalesces dims
// first, so ranks above RD_MAXD only appear for very unusual tensors (refused on the host).

#define RD_MAXD 16
struct RdDims {
    i64 v[RD_MAXD];
};

// Sum of a double over the block (blockDim.x a multiple of 32); every thread gets it.
__device__ __forceinline__ double rd_block_sum_d(double v) {
    __shared__ double rd_part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) rd_part[warp] = v;
    __syncthreads();
    const int nw = (blockDim.x + 31) >> 5;
    v = lane < nw ? rd_part[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---------------------------------------------------------------------------------------------
// Whole-tensor sums. Pass 1: block b writes the double sum of its grid-stride share of x (of x
// squared when `square`) to part[b]. Pass 2 (one block): y[0] = (T)(sum(part) / div).

template <typename T>
__device__ __forceinline__ void rd_partial(const T* x, double* part, i64 n, int square) {
    double acc = 0.0;
    FC_LOOP(i, n) {
        const double v = (double)x[i];
        acc += square ? v * v : v;
    }
    acc = rd_block_sum_d(acc);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

template <typename T>
__device__ __forceinline__ void rd_finish(const double* part, T* y, i64 nparts, double div) {
    double acc = 0.0;
    for (i64 i = threadIdx.x; i < nparts; i += blockDim.x) acc += part[i];
    acc = rd_block_sum_d(acc);
    if (threadIdx.x == 0) y[0] = (T)(acc / div);
}

extern "C" __global__ void sum_partial_f32(const float* x, double* part, i64 n, int square) {
    rd_partial<float>(x, part, n, square);
}
extern "C" __global__ void sum_partial_f64(const double* x, double* part, i64 n, int square) {
    rd_partial<double>(x, part, n, square);
}
extern "C" __global__ void sum_partial_i32(const int* x, double* part, i64 n, int square) {
    rd_partial<int>(x, part, n, square);
}
extern "C" __global__ void sum_partial_i64(const i64* x, double* part, i64 n, int square) {
    rd_partial<i64>(x, part, n, square);
}

extern "C" __global__ void sum_finish_f32(const double* part, float* y, i64 nparts, double div) {
    rd_finish<float>(part, y, nparts, div);
}
extern "C" __global__ void sum_finish_f64(const double* part, double* y, i64 nparts, double div) {
    rd_finish<double>(part, y, nparts, div);
}
extern "C" __global__ void sum_finish_i32(const double* part, int* y, i64 nparts, double div) {
    rd_finish<int>(part, y, nparts, div);
}
extern "C" __global__ void sum_finish_i64(const double* part, i64* y, i64 nparts, double div) {
    rd_finish<i64>(part, y, nparts, div);
}

// y[i] = g[0] / div for i < n (SumElementsGradient, AveragedLossGradient).
extern "C" __global__ void fill_scalar_div_f32(const float* g, float* y, float div, i64 n) {
    FC_LOOP(i, n) { y[i] = g[0] / div; }
}

// ---------------------------------------------------------------------------------------------
// Reductions over axes. The output element `o` (row-major over the kept dims kd[0..nk]) reduces
// the `count` elements of x at offset base(o) + off(r), with base(o) from the kept strides ks and
// off(r) from r row-major over the reduced dims rd[0..nr] with strides rs.
// op: 0 sum, 1 max, 2 min. The result is divided by `div` (the count for a mean, else 1).

__device__ __forceinline__ i64 rd_offset(i64 t, const RdDims& d, const RdDims& s, int nd) {
    i64 off = 0;
    for (int k = nd - 1; k >= 0; --k) {
        const i64 q = t / d.v[k];
        off += (t - q * d.v[k]) * s.v[k];
        t = q;
    }
    return off;
}

__device__ __forceinline__ float rd_init(int op) {
    return op == 1 ? __int_as_float(0xff800000) : (op == 2 ? __int_as_float(0x7f800000) : 0.0f);
}

__device__ __forceinline__ float rd_combine(int op, float a, float v) {
    return op == 1 ? fmaxf(a, v) : (op == 2 ? fminf(a, v) : a + v);
}

// One thread per output element.
extern "C" __global__ void reduce_thread_f32(const float* x, float* y, i64 out_n, i64 count,
                                             RdDims kd, RdDims ks, int nk, RdDims rd, RdDims rs,
                                             int nr, int op, float div) {
    FC_LOOP(o, out_n) {
        const i64 base = rd_offset(o, kd, ks, nk);
        float acc = rd_init(op);
        for (i64 r = 0; r < count; ++r) acc = rd_combine(op, acc, x[base + rd_offset(r, rd, rs, nr)]);
        y[o] = acc / div;
    }
}

// One block per output element (grid-stride over outputs; the loop bound is uniform across the
// block, so the block reductions inside are reached by every thread).
extern "C" __global__ void reduce_block_f32(const float* x, float* y, i64 out_n, i64 count,
                                            RdDims kd, RdDims ks, int nk, RdDims rd, RdDims rs,
                                            int nr, int op, float div) {
    for (i64 o = blockIdx.x; o < out_n; o += gridDim.x) {
        const i64 base = rd_offset(o, kd, ks, nk);
        float acc = rd_init(op);
        for (i64 r = threadIdx.x; r < count; r += blockDim.x)
            acc = rd_combine(op, acc, x[base + rd_offset(r, rd, rs, nr)]);
        if (op == 0) {
            acc = fc_block_sum(acc);
        } else if (op == 1) {
            acc = fc_block_max(acc);
        } else {
            acc = -fc_block_max(-acc);
        }
        if (threadIdx.x == 0) y[o] = acc / div;
    }
}

// Gradient: dx[i] over x's dims xd[0..nd]; iy = sum of x's index digits times ys (0 for the
// reduced dims). mode 0: dx = dy[iy] * scale; mode 1 (max / min): dx = x == y ? dy : 0.
extern "C" __global__ void reduce_grad_f32(const float* dy, const float* x, const float* y,
                                           float* dx, i64 n, RdDims xd, RdDims ys, int nd,
                                           int mode, float scale) {
    FC_LOOP(i, n) {
        const i64 iy = rd_offset(i, xd, ys, nd);
        if (mode == 0) {
            dx[i] = dy[iy] * scale;
        } else {
            dx[i] = x[i] == y[iy] ? dy[iy] : 0.0f;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Transpose by element size: y (row-major over od[0..nd]) takes x at the source strides ss.

template <typename T>
__device__ __forceinline__ void rd_transpose(const T* x, T* y, i64 n, const RdDims& od,
                                             const RdDims& ss, int nd) {
    FC_LOOP(i, n) { y[i] = x[rd_offset(i, od, ss, nd)]; }
}

extern "C" __global__ void transpose_u8(const u8* x, u8* y, i64 n, RdDims od, RdDims ss, int nd) {
    rd_transpose<u8>(x, y, n, od, ss, nd);
}
extern "C" __global__ void transpose_u16(const unsigned short* x, unsigned short* y, i64 n,
                                         RdDims od, RdDims ss, int nd) {
    rd_transpose<unsigned short>(x, y, n, od, ss, nd);
}
extern "C" __global__ void transpose_u32(const u32* x, u32* y, i64 n, RdDims od, RdDims ss,
                                         int nd) {
    rd_transpose<u32>(x, y, n, od, ss, nd);
}
extern "C" __global__ void transpose_u64(const u64* x, u64* y, i64 n, RdDims od, RdDims ss,
                                         int nd) {
    rd_transpose<u64>(x, y, n, od, ss, nd);
}

// ---------------------------------------------------------------------------------------------
// Strided row copies (Concat / Split): `rows` rows of `width` elements, row r of src at
// r * src_pitch, of dst at r * dst_pitch (all in elements of the kernel's size).

template <typename T>
__device__ __forceinline__ void rd_copy_rows(const T* src, T* dst, i64 rows, i64 width,
                                             i64 src_pitch, i64 dst_pitch) {
    FC_LOOP(i, rows * width) {
        const i64 r = i / width;
        const i64 c = i - r * width;
        dst[r * dst_pitch + c] = src[r * src_pitch + c];
    }
}

extern "C" __global__ void copy_rows_u8(const u8* src, u8* dst, i64 rows, i64 width,
                                        i64 src_pitch, i64 dst_pitch) {
    rd_copy_rows<u8>(src, dst, rows, width, src_pitch, dst_pitch);
}
extern "C" __global__ void copy_rows_u16(const unsigned short* src, unsigned short* dst, i64 rows,
                                         i64 width, i64 src_pitch, i64 dst_pitch) {
    rd_copy_rows<unsigned short>(src, dst, rows, width, src_pitch, dst_pitch);
}
extern "C" __global__ void copy_rows_u32(const u32* src, u32* dst, i64 rows, i64 width,
                                         i64 src_pitch, i64 dst_pitch) {
    rd_copy_rows<u32>(src, dst, rows, width, src_pitch, dst_pitch);
}
extern "C" __global__ void copy_rows_u64(const u64* src, u64* dst, i64 rows, i64 width,
                                         i64 src_pitch, i64 dst_pitch) {
    rd_copy_rows<u64>(src, dst, rows, width, src_pitch, dst_pitch);
}

// ---------------------------------------------------------------------------------------------
// Constant fills by bit pattern (the low bytes of `bits`).

extern "C" __global__ void fill_bits_u8(u8* y, u64 bits, i64 n) {
    FC_LOOP(i, n) { y[i] = (u8)bits; }
}
extern "C" __global__ void fill_bits_u16(unsigned short* y, u64 bits, i64 n) {
    FC_LOOP(i, n) { y[i] = (unsigned short)bits; }
}
extern "C" __global__ void fill_bits_u32(u32* y, u64 bits, i64 n) {
    FC_LOOP(i, n) { y[i] = (u32)bits; }
}
extern "C" __global__ void fill_bits_u64(u64* y, u64 bits, i64 n) {
    FC_LOOP(i, n) { y[i] = bits; }
}

// ---------------------------------------------------------------------------------------------
// Random fills. Element i of a run uses the counter-based stream at (seed, offset + 2 i) and
// (seed, offset + 2 i + 1). kind 0: uniform in [a, b]; kind 1: gaussian of mean a and std b
// (Box-Muller). out: 0 float32, 1 float64, 2 float16.

__device__ __forceinline__ unsigned short rd_f32_to_f16(float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}

extern "C" __global__ void random_fill(void* y, i64 n, u64 seed, u64 offset, int kind, float a,
                                       float b, int out) {
    FC_LOOP(i, n) {
        const u64 k = offset + 2ull * (u64)i;
        const float u = fc_uniform01(seed, k);
        float v;
        if (kind == 0) {
            v = a + u * (b - a);
            const float lo = fminf(a, b), hi = fmaxf(a, b);
            v = fminf(fmaxf(v, lo), hi);
        } else {
            const float u1 = 1.0f - u;  // in (0, 1]
            const float u2 = fc_uniform01(seed, k + 1ull);
            const float r = sqrtf(-2.0f * logf(u1));
            v = a + b * (r * cospif(2.0f * u2));
        }
        if (out == 1) {
            ((double*)y)[i] = (double)v;
        } else if (out == 2) {
            ((unsigned short*)y)[i] = rd_f32_to_f16(v);
        } else {
            ((float*)y)[i] = v;
        }
    }
}
