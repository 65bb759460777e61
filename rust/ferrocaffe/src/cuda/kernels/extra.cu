// Kernels of the `extra` family: batched 2-D transposes (NCHW2NHWC / NHWC2NCHW), tiling,
// InstanceNorm, LRN and its gradient, PRelu and its gradient, Max / Min and their gradients,
// DotProduct and its gradient. Each mirrors the CPU kernel of the same type (see
// cuda/ops/extra.rs); products that the CPU rounds separately use __f*_rn (no contraction).

// Sum of a double over the block (blockDim.x a multiple of 32); every thread gets it.
__device__ __forceinline__ double ex_block_sum_d(double v) {
    __shared__ double ex_part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) ex_part[warp] = v;
    __syncthreads();
    const int nw = (blockDim.x + 31) >> 5;
    v = lane < nw ? ex_part[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---- batched transpose: y[b, j, i] = x[b, i, j] for x of [batch, rows, cols] ---------------

template <typename T>
__device__ __forceinline__ void ex_btrans(const T* x, T* y, i64 total, i64 rows, i64 cols) {
    FC_LOOP(o, total) {
        const i64 i = o % rows;
        const i64 r = o / rows;
        const i64 j = r % cols;
        const i64 b = r / cols;
        y[o] = x[(b * rows + i) * cols + j];
    }
}

extern "C" __global__ void btrans_u8(const u8* x, u8* y, i64 total, i64 rows, i64 cols) {
    ex_btrans<u8>(x, y, total, rows, cols);
}
extern "C" __global__ void btrans_u16(const unsigned short* x, unsigned short* y, i64 total,
                                      i64 rows, i64 cols) {
    ex_btrans<unsigned short>(x, y, total, rows, cols);
}
extern "C" __global__ void btrans_u32(const u32* x, u32* y, i64 total, i64 rows, i64 cols) {
    ex_btrans<u32>(x, y, total, rows, cols);
}
extern "C" __global__ void btrans_u64(const u64* x, u64* y, i64 total, i64 rows, i64 cols) {
    ex_btrans<u64>(x, y, total, rows, cols);
}

// ---- Tile: y[o, t, j] = x[o, j] for t < tiles, j < block -----------------------------------

template <typename T>
__device__ __forceinline__ void ex_tile(const T* x, T* y, i64 total, i64 tiles, i64 block) {
    FC_LOOP(i, total) {
        const i64 j = i % block;
        const i64 o = i / (tiles * block);
        y[i] = x[o * block + j];
    }
}

extern "C" __global__ void tile_u8(const u8* x, u8* y, i64 total, i64 tiles, i64 block) {
    ex_tile<u8>(x, y, total, tiles, block);
}
extern "C" __global__ void tile_u32(const u32* x, u32* y, i64 total, i64 tiles, i64 block) {
    ex_tile<u32>(x, y, total, tiles, block);
}
extern "C" __global__ void tile_u64(const u64* x, u64* y, i64 total, i64 tiles, i64 block) {
    ex_tile<u64>(x, y, total, tiles, block);
}

// dx[o, j] = sum over t < tiles of g[o, t, j] (in order of t), dx of [outer, small].
extern "C" __global__ void tile_grad_f32(const float* g, float* dx, i64 total, i64 tiles,
                                         i64 small) {
    FC_LOOP(i, total) {
        const i64 j = i % small;
        const i64 o = i / small;
        float acc = 0.0f;
        for (i64 t = 0; t < tiles; ++t) acc += g[(o * tiles + t) * small + j];
        dx[i] = acc;
    }
}

// ---- InstanceNorm: one block per (image, channel) -------------------------------------------

extern "C" __global__ void instance_norm_f32(const float* x, const float* scale,
                                             const float* bias, float* y, float* mean_out,
                                             float* inv_out, i64 n, i64 c, i64 inner, float eps,
                                             int nhwc) {
    const i64 nc = n * c;
    for (i64 row = blockIdx.x; row < nc; row += gridDim.x) {
        const i64 img = row / c, ch = row % c;
        const i64 base = nhwc ? img * inner * c + ch : row * inner;
        const i64 step = nhwc ? c : 1;
        double s1 = 0.0, s2 = 0.0;
        for (i64 s = threadIdx.x; s < inner; s += blockDim.x) {
            const double v = (double)x[base + s * step];
            s1 += v;
            s2 += v * v;
        }
        s1 = ex_block_sum_d(s1);
        s2 = ex_block_sum_d(s2);
        const double m = (double)(inner > 1 ? inner : 1);
        const float mean = (float)(s1 / m);
        const float var = fmaxf(__fsub_rn((float)(s2 / m), __fmul_rn(mean, mean)), 0.0f);
        const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, eps)));
        const float sc = scale[ch], b = bias[ch];
        for (i64 s = threadIdx.x; s < inner; s += blockDim.x) {
            const i64 k = base + s * step;
            y[k] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(x[k], mean), inv), sc), b);
        }
        if (threadIdx.x == 0) {
            if (mean_out) mean_out[row] = mean;
            if (inv_out) inv_out[row] = inv;
        }
    }
}

// ---- LRN across channels ------------------------------------------------------------------

// The channel of element k, and the index of channel 0 at its (image, position) and the stride
// between channels.
__device__ __forceinline__ void ex_lrn_at(i64 k, i64 c, i64 inner, int nhwc, i64* ch, i64* base,
                                          i64* step) {
    if (nhwc) {
        *ch = k % c;
        *step = 1;
    } else {
        *ch = (k / inner) % c;
        *step = inner;
    }
    *base = k - *ch * *step;
}

// scale = bias + a * (sum of x^2 over the window ch - pre ..= ch + pre, clipped), a = alpha/size.
extern "C" __global__ void lrn_scale_f32(const float* x, float* scale, i64 total, i64 c,
                                         i64 inner, i64 pre, float bias, float a, int nhwc) {
    FC_LOOP(k, total) {
        i64 ch, base, step;
        ex_lrn_at(k, c, inner, nhwc, &ch, &base, &step);
        const i64 lo = ch > pre ? ch - pre : 0;
        const i64 hi = ch + pre + 1 < c ? ch + pre + 1 : c;
        float sum = 0.0f;
        for (i64 j = lo; j < hi; ++j) {
            const float v = x[base + j * step];
            sum = __fadd_rn(sum, __fmul_rn(v, v));
        }
        scale[k] = __fadd_rn(bias, __fmul_rn(a, sum));
    }
}

extern "C" __global__ void lrn_fwd_f32(const float* x, const float* scale, float* y, i64 total,
                                       float beta) {
    FC_LOOP(k, total) { y[k] = __fmul_rn(x[k], powf(scale[k], -beta)); }
}

// dx = dy s^-beta - cache_ratio * x * sum over the window of dy_j y_j / s_j.
extern "C" __global__ void lrn_grad_f32(const float* x, const float* y, const float* dy,
                                        const float* scale, float* dx, i64 total, i64 c,
                                        i64 inner, i64 pre, float beta, float cache_ratio,
                                        int nhwc) {
    FC_LOOP(k, total) {
        i64 ch, base, step;
        ex_lrn_at(k, c, inner, nhwc, &ch, &base, &step);
        const i64 lo = ch > pre ? ch - pre : 0;
        const i64 hi = ch + pre + 1 < c ? ch + pre + 1 : c;
        float acc = 0.0f;
        for (i64 j = lo; j < hi; ++j) {
            const i64 q = base + j * step;
            acc = __fadd_rn(acc, __fdiv_rn(__fmul_rn(dy[q], y[q]), scale[q]));
        }
        dx[k] = __fsub_rn(__fmul_rn(dy[k], powf(scale[k], -beta)),
                          __fmul_rn(__fmul_rn(cache_ratio, x[k]), acc));
    }
}

// ---- PRelu --------------------------------------------------------------------------------

// The slope index of element k: 0 when shared, else its channel.
__device__ __forceinline__ i64 ex_prelu_ch(i64 k, i64 c, i64 inner, int shared, int nhwc) {
    if (shared) return 0;
    return nhwc ? k % c : (k / inner) % c;
}

extern "C" __global__ void prelu_f32(const float* x, const float* w, float* y, i64 total, i64 c,
                                     i64 inner, int shared, int nhwc) {
    FC_LOOP(k, total) {
        const float v = x[k];
        y[k] = v > 0.0f ? v : __fmul_rn(v, w[ex_prelu_ch(k, c, inner, shared, nhwc)]);
    }
}

extern "C" __global__ void prelu_dx_f32(const float* x, const float* w, const float* g,
                                        float* dx, i64 total, i64 c, i64 inner, int shared,
                                        int nhwc) {
    FC_LOOP(k, total) {
        const float v = x[k];
        dx[k] = v > 0.0f ? g[k] : __fmul_rn(g[k], w[ex_prelu_ch(k, c, inner, shared, nhwc)]);
    }
}

// One block per slope: ds[s] = sum of g x over the elements of slope s where x <= 0. `per`
// elements belong to each slope; shared: every element (per = total).
extern "C" __global__ void prelu_ds_f32(const float* x, const float* g, float* ds, i64 nslope,
                                        i64 per, i64 c, i64 inner, int shared, int nhwc) {
    for (i64 s = blockIdx.x; s < nslope; s += gridDim.x) {
        double acc = 0.0;
        for (i64 j = threadIdx.x; j < per; j += blockDim.x) {
            i64 k;
            if (shared) {
                k = j;
            } else if (nhwc) {
                k = j * c + s;
            } else {
                k = ((j / inner) * c + s) * inner + j % inner;
            }
            const float v = x[k];
            if (!(v > 0.0f)) acc += (double)__fmul_rn(g[k], v);
        }
        acc = ex_block_sum_d(acc);
        if (threadIdx.x == 0) ds[s] = (float)acc;
    }
}

// ---- Max / Min ----------------------------------------------------------------------------

// y = (b > a ? b : a) for Max, (b < a ? b : a) for Min; y may be a.
extern "C" __global__ void minmax_f32(const float* a, const float* b, float* y, i64 n,
                                      int is_max) {
    FC_LOOP(i, n) {
        const float u = a[i], v = b[i];
        y[i] = is_max ? (v > u ? v : u) : (v < u ? v : u);
    }
}

extern "C" __global__ void select_grad_f32(const float* x, const float* y, const float* dy,
                                           float* dx, i64 n) {
    FC_LOOP(i, n) { dx[i] = x[i] == y[i] ? dy[i] : 0.0f; }
}

// ---- DotProduct ---------------------------------------------------------------------------

extern "C" __global__ void dot_rows_f32(const float* x, const float* y, float* z, i64 n, i64 d) {
    for (i64 r = blockIdx.x; r < n; r += gridDim.x) {
        float acc = 0.0f;
        for (i64 j = threadIdx.x; j < d; j += blockDim.x) {
            acc += x[r * d + j] * y[r * d + j];
        }
        acc = fc_block_sum(acc);
        if (threadIdx.x == 0) z[r] = acc;
    }
}

extern "C" __global__ void dot_grad_f32(const float* x, const float* y, const float* dz,
                                        float* dx, float* dy, i64 total, i64 d) {
    FC_LOOP(j, total) {
        const float g = dz[j / d];
        const float xv = x[j], yv = y[j];
        dx[j] = __fmul_rn(g, yv);
        dy[j] = __fmul_rn(g, xv);
    }
}
