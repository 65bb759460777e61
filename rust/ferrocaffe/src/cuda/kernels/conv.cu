// The `conv` family's kernels: im2col / col2im for 2-d convolution (NCHW and NHWC), the
// layout shuffles of grouped NHWC products, bias and its gradient, a direct depthwise
// convolution, and 2-d max / average pooling with their gradients.
//
// Geometry arguments: h, w input size; oh, ow output size; kh, kw kernel; sh, sw strides;
// pt, pl top / left padding; dh, dw dilation.

// Column matrix of nb NCHW images: col[b][(c * kh + ki) * kw + kj][oy * ow + ox], all C
// channels (group gi's rows are the block gi * (C / G) * kh * kw onwards).
extern "C" __global__ void im2col_nchw_f32(const float* x, float* col, i64 nb, i64 c, i64 h,
                                           i64 w, i64 oh, i64 ow, i64 kh, i64 kw, i64 sh,
                                           i64 sw, i64 pt, i64 pl, i64 dh, i64 dw) {
    const i64 so = oh * ow;
    const i64 total = nb * c * kh * kw * so;
    FC_LOOP(idx, total) {
        const i64 p = idx % so;
        i64 t = idx / so;
        const i64 kj = t % kw;
        t /= kw;
        const i64 ki = t % kh;
        t /= kh;  // t = b * c + ch
        const i64 oy = p / ow, ox = p % ow;
        const i64 iy = oy * sh + ki * dh - pt;
        const i64 ix = ox * sw + kj * dw - pl;
        float v = 0.0f;
        if (iy >= 0 && iy < h && ix >= 0 && ix < w) v = x[(t * h + iy) * w + ix];
        col[idx] = v;
    }
}

// dx (nb NCHW images) = the sum of the column entries that im2col_nchw_f32 took from each
// element (one thread per element of dx; no atomics).
extern "C" __global__ void col2im_nchw_f32(const float* col, float* dx, i64 nb, i64 c, i64 h,
                                           i64 w, i64 oh, i64 ow, i64 kh, i64 kw, i64 sh,
                                           i64 sw, i64 pt, i64 pl, i64 dh, i64 dw) {
    const i64 so = oh * ow;
    const i64 total = nb * c * h * w;
    FC_LOOP(idx, total) {
        const i64 ix = idx % w;
        i64 t = idx / w;
        const i64 iy = t % h;
        t /= h;  // t = b * c + ch
        float s = 0.0f;
        for (i64 ki = 0; ki < kh; ++ki) {
            const i64 ry = iy + pt - ki * dh;
            if (ry < 0 || ry % sh != 0) continue;
            const i64 oy = ry / sh;
            if (oy >= oh) continue;
            for (i64 kj = 0; kj < kw; ++kj) {
                const i64 rx = ix + pl - kj * dw;
                if (rx < 0 || rx % sw != 0) continue;
                const i64 ox = rx / sw;
                if (ox >= ow) continue;
                s += col[((t * kh + ki) * kw + kj) * so + oy * ow + ox];
            }
        }
        dx[idx] = s;
    }
}

// Column matrix of nb NHWC images, group-major:
// col[g][b][oy * ow + ox][(ki * kw + kj) * cg + ci] with cg = c / groups.
extern "C" __global__ void im2col_nhwc_f32(const float* x, float* col, i64 nb, i64 c, i64 h,
                                           i64 w, i64 oh, i64 ow, i64 kh, i64 kw, i64 sh,
                                           i64 sw, i64 pt, i64 pl, i64 dh, i64 dw, i64 groups) {
    const i64 so = oh * ow;
    const i64 cg = c / groups;
    const i64 total = groups * nb * so * kh * kw * cg;
    FC_LOOP(idx, total) {
        const i64 ci = idx % cg;
        i64 t = idx / cg;
        const i64 kj = t % kw;
        t /= kw;
        const i64 ki = t % kh;
        t /= kh;
        const i64 p = t % so;
        t /= so;
        const i64 b = t % nb;
        const i64 g = t / nb;
        const i64 oy = p / ow, ox = p % ow;
        const i64 iy = oy * sh + ki * dh - pt;
        const i64 ix = ox * sw + kj * dw - pl;
        float v = 0.0f;
        if (iy >= 0 && iy < h && ix >= 0 && ix < w) v = x[((b * h + iy) * w + ix) * c + g * cg + ci];
        col[idx] = v;
    }
}

// dx (nb NHWC images) from a group-major NHWC column matrix (inverse of im2col_nhwc_f32,
// summing; one thread per element of dx).
extern "C" __global__ void col2im_nhwc_f32(const float* col, float* dx, i64 nb, i64 c, i64 h,
                                           i64 w, i64 oh, i64 ow, i64 kh, i64 kw, i64 sh,
                                           i64 sw, i64 pt, i64 pl, i64 dh, i64 dw, i64 groups) {
    const i64 so = oh * ow;
    const i64 cg = c / groups;
    const i64 kd = kh * kw * cg;
    const i64 total = nb * h * w * c;
    FC_LOOP(idx, total) {
        const i64 ch = idx % c;
        i64 t = idx / c;
        const i64 ix = t % w;
        t /= w;
        const i64 iy = t % h;
        const i64 b = t / h;
        const i64 g = ch / cg, ci = ch % cg;
        const float* cb = col + (g * nb + b) * so * kd + ci;
        float s = 0.0f;
        for (i64 ki = 0; ki < kh; ++ki) {
            const i64 ry = iy + pt - ki * dh;
            if (ry < 0 || ry % sh != 0) continue;
            const i64 oy = ry / sh;
            if (oy >= oh) continue;
            for (i64 kj = 0; kj < kw; ++kj) {
                const i64 rx = ix + pl - kj * dw;
                if (rx < 0 || rx % sw != 0) continue;
                const i64 ox = rx / sw;
                if (ox >= ow) continue;
                s += cb[(oy * ow + ox) * kd + (ki * kw + kj) * cg];
            }
        }
        dx[idx] = s;
    }
}

// Grouped NHWC outputs: dst[r][g * mg + j] = src[g][r][j] for r < rows (rows = images *
// positions), m = groups * mg.
extern "C" __global__ void ungroup_rows_f32(const float* src, float* dst, i64 rows, i64 m,
                                            i64 mg) {
    const i64 total = rows * m;
    FC_LOOP(idx, total) {
        const i64 ja = idx % m;
        const i64 r = idx / m;
        const i64 g = ja / mg, j = ja % mg;
        dst[idx] = src[(g * rows + r) * mg + j];
    }
}

// The inverse: dst[g][r][j] = src[r][g * mg + j].
extern "C" __global__ void group_rows_f32(const float* src, float* dst, i64 rows, i64 m,
                                          i64 mg) {
    const i64 total = rows * m;
    FC_LOOP(idx, total) {
        const i64 ja = idx % m;
        const i64 r = idx / m;
        const i64 g = ja / mg, j = ja % mg;
        dst[(g * rows + r) * mg + j] = src[idx];
    }
}

// y[i] += bias[(i / inner) % m] over n elements (NCHW: inner = positions; NHWC: inner = 1).
extern "C" __global__ void bias_add_f32(float* y, const float* bias, i64 n, i64 inner, i64 m) {
    FC_LOOP(i, n) { y[i] += bias[(i / inner) % m]; }
}

// db[k] = sum over o < outer, q < inner of dy[(o * m + k) * inner + q]: one block per channel
// (blockDim a multiple of 32), blocks striding over channels.
extern "C" __global__ void bias_grad_f32(const float* dy, float* db, i64 outer, i64 m,
                                         i64 inner) {
    const i64 count = outer * inner;
    for (i64 k = blockIdx.x; k < m; k += gridDim.x) {
        float s = 0.0f;
        for (i64 i = threadIdx.x; i < count; i += blockDim.x) {
            const i64 o = i / inner, q = i % inner;
            s += dy[(o * m + k) * inner + q];
        }
        s = fc_block_sum(s);
        if (threadIdx.x == 0) db[k] = s;
    }
}

// Depthwise convolution (groups = C = M): one thread per output; w[ch][ki][kw] (the same
// offsets for NCHW [C, 1, kh, kw] and NHWC [C, kh, kw, 1]); bias may be null (has_bias 0).
extern "C" __global__ void depthwise_f32(const float* x, const float* wt, const float* bias,
                                         float* y, i64 n, i64 c, i64 h, i64 w, i64 oh, i64 ow,
                                         i64 kh, i64 kw, i64 sh, i64 sw, i64 pt, i64 pl,
                                         i64 dh, i64 dw, i64 nhwc, i64 has_bias) {
    const i64 total = n * c * oh * ow;
    FC_LOOP(o, total) {
        i64 b, ch, oy, ox;
        if (nhwc) {
            ch = o % c;
            i64 t = o / c;
            ox = t % ow;
            t /= ow;
            oy = t % oh;
            b = t / oh;
        } else {
            ox = o % ow;
            i64 t = o / ow;
            oy = t % oh;
            t /= oh;
            ch = t % c;
            b = t / c;
        }
        float acc = has_bias ? bias[ch] : 0.0f;
        for (i64 ki = 0; ki < kh; ++ki) {
            const i64 iy = oy * sh + ki * dh - pt;
            if (iy < 0 || iy >= h) continue;
            for (i64 kj = 0; kj < kw; ++kj) {
                const i64 ix = ox * sw + kj * dw - pl;
                if (ix < 0 || ix >= w) continue;
                const i64 xi = nhwc ? ((b * h + iy) * w + ix) * c + ch
                                    : ((b * c + ch) * h + iy) * w + ix;
                acc += x[xi] * wt[(ch * kh + ki) * kw + kj];
            }
        }
        y[o] = acc;
    }
}

// ---- pooling ----
// Windows as the CPU kernel: rows [max(y0, 0), min(y0 + kh, h + pb, h)) with
// y0 = oy * sh - pt, likewise columns; the average divides by the window's size inside the
// padded input (count_include_pad) or by the number of elements summed (at least 1).

struct FcPool {
    i64 n, c, h, w, oh, ow, kh, kw, sh, sw, pt, pl, pb, pr, nhwc;
};

__device__ __forceinline__ void fc_pool_out(const FcPool& g, i64 o, i64& b, i64& ch, i64& oy,
                                            i64& ox) {
    if (g.nhwc) {
        ch = o % g.c;
        i64 t = o / g.c;
        ox = t % g.ow;
        t /= g.ow;
        oy = t % g.oh;
        b = t / g.oh;
    } else {
        ox = o % g.ow;
        i64 t = o / g.ow;
        oy = t % g.oh;
        t /= g.oh;
        ch = t % g.c;
        b = t / g.c;
    }
}

__device__ __forceinline__ i64 fc_pool_in_index(const FcPool& g, i64 b, i64 ch, i64 iy,
                                                i64 ix) {
    return g.nhwc ? ((b * g.h + iy) * g.w + ix) * g.c + ch : ((b * g.c + ch) * g.h + iy) * g.w + ix;
}

__device__ __forceinline__ i64 fc_pool_out_index(const FcPool& g, i64 b, i64 ch, i64 oy,
                                                 i64 ox) {
    return g.nhwc ? ((b * g.oh + oy) * g.ow + ox) * g.c + ch
                  : ((b * g.c + ch) * g.oh + oy) * g.ow + ox;
}

// The window of output (oy, ox): rows [ys, ye), columns [xs, xe), and its divisor.
__device__ __forceinline__ void fc_pool_window(const FcPool& g, i64 oy, i64 ox, i64 incl,
                                               i64& ys, i64& ye, i64& xs, i64& xe,
                                               float& div) {
    const i64 y0 = oy * g.sh - g.pt;
    const i64 y1 = min(y0 + g.kh, g.h + g.pb);
    const i64 x0 = ox * g.sw - g.pl;
    const i64 x1 = min(x0 + g.kw, g.w + g.pr);
    ys = max(y0, (i64)0);
    ye = max(min(y1, g.h), (i64)0);
    xs = max(x0, (i64)0);
    xe = max(min(x1, g.w), (i64)0);
    i64 d;
    if (incl) {
        d = (y1 - y0) * (x1 - x0);
    } else {
        d = max(ye - ys, (i64)0) * max(xe - xs, (i64)0);
    }
    div = (float)max(d, (i64)1);
}

#define FC_POOL_ARGS                                                                        \
    i64 n, i64 c, i64 h, i64 w, i64 oh, i64 ow, i64 kh, i64 kw, i64 sh, i64 sw, i64 pt,    \
        i64 pl, i64 pb, i64 pr, i64 nhwc
#define FC_POOL_MAKE FcPool g = {n, c, h, w, oh, ow, kh, kw, sh, sw, pt, pl, pb, pr, nhwc}

// y = the max of each window (-inf when empty); one thread per output.
extern "C" __global__ void max_pool_f32(const float* x, float* y, FC_POOL_ARGS) {
    FC_POOL_MAKE;
    FC_LOOP(o, n * c * oh * ow) {
        i64 b, ch, oy, ox, ys, ye, xs, xe;
        float div;
        fc_pool_out(g, o, b, ch, oy, ox);
        fc_pool_window(g, oy, ox, 0, ys, ye, xs, xe, div);
        float m = __int_as_float(0xff800000);
        for (i64 iy = ys; iy < ye; ++iy)
            for (i64 ix = xs; ix < xe; ++ix) m = fmaxf(m, x[fc_pool_in_index(g, b, ch, iy, ix)]);
        y[o] = m;
    }
}

// y = the mean of each window; one thread per output.
extern "C" __global__ void avg_pool_f32(const float* x, float* y, FC_POOL_ARGS,
                                        i64 include_pad) {
    FC_POOL_MAKE;
    FC_LOOP(o, n * c * oh * ow) {
        i64 b, ch, oy, ox, ys, ye, xs, xe;
        float div;
        fc_pool_out(g, o, b, ch, oy, ox);
        fc_pool_window(g, oy, ox, include_pad, ys, ye, xs, xe, div);
        float s = 0.0f;
        for (i64 iy = ys; iy < ye; ++iy)
            for (i64 ix = xs; ix < xe; ++ix) s += x[fc_pool_in_index(g, b, ch, iy, ix)];
        y[o] = s / div;
    }
}

// arg[o] = the index in x of the first element of window o (row-major scan) equal to y[o],
// or -1; one thread per output.
extern "C" __global__ void max_pool_arg_f32(const float* x, const float* y, i64* arg,
                                            FC_POOL_ARGS) {
    FC_POOL_MAKE;
    FC_LOOP(o, n * c * oh * ow) {
        i64 b, ch, oy, ox, ys, ye, xs, xe;
        float div;
        fc_pool_out(g, o, b, ch, oy, ox);
        fc_pool_window(g, oy, ox, 0, ys, ye, xs, xe, div);
        const float target = y[o];
        i64 found = -1;
        for (i64 iy = ys; iy < ye && found < 0; ++iy) {
            for (i64 ix = xs; ix < xe; ++ix) {
                const i64 i = fc_pool_in_index(g, b, ch, iy, ix);
                if (x[i] == target) {
                    found = i;
                    break;
                }
            }
        }
        arg[o] = found;
    }
}

// Output rows whose window covers input row iy: [lo, hi).
__device__ __forceinline__ void fc_pool_cover(i64 i, i64 p, i64 k, i64 s, i64 on, i64& lo,
                                              i64& hi) {
    const i64 r = i + p;
    lo = r < k ? 0 : (r - k) / s + 1;
    hi = min(r / s + 1, on);
}

// dx[i] = the sum of dy[o] over the windows o whose arg is i; one thread per input element.
extern "C" __global__ void max_pool_grad_f32(const i64* arg, const float* dy, float* dx,
                                             FC_POOL_ARGS) {
    FC_POOL_MAKE;
    FC_LOOP(i, n * c * h * w) {
        i64 b, ch, iy, ix;
        if (nhwc) {
            ch = i % c;
            i64 t = i / c;
            ix = t % w;
            t /= w;
            iy = t % h;
            b = t / h;
        } else {
            ix = i % w;
            i64 t = i / w;
            iy = t % h;
            t /= h;
            ch = t % c;
            b = t / c;
        }
        i64 ylo, yhi, xlo, xhi;
        fc_pool_cover(iy, pt, kh, sh, oh, ylo, yhi);
        fc_pool_cover(ix, pl, kw, sw, ow, xlo, xhi);
        float s = 0.0f;
        for (i64 oy = ylo; oy < yhi; ++oy)
            for (i64 ox = xlo; ox < xhi; ++ox) {
                const i64 o = fc_pool_out_index(g, b, ch, oy, ox);
                if (arg[o] == i) s += dy[o];
            }
        dx[i] = s;
    }
}

// dx[i] = the sum of dy[o] / divisor(o) over the windows o covering i.
extern "C" __global__ void avg_pool_grad_f32(const float* dy, float* dx, FC_POOL_ARGS,
                                             i64 include_pad) {
    FC_POOL_MAKE;
    FC_LOOP(i, n * c * h * w) {
        i64 b, ch, iy, ix;
        if (nhwc) {
            ch = i % c;
            i64 t = i / c;
            ix = t % w;
            t /= w;
            iy = t % h;
            b = t / h;
        } else {
            ix = i % w;
            i64 t = i / w;
            iy = t % h;
            t /= h;
            ch = t % c;
            b = t / c;
        }
        i64 ylo, yhi, xlo, xhi;
        fc_pool_cover(iy, pt, kh, sh, oh, ylo, yhi);
        fc_pool_cover(ix, pl, kw, sw, ow, xlo, xhi);
        float s = 0.0f;
        for (i64 oy = ylo; oy < yhi; ++oy)
            for (i64 ox = xlo; ox < xhi; ++ox) {
                i64 ys, ye, xs, xe;
                float div;
                fc_pool_window(g, oy, ox, include_pad, ys, ye, xs, xe, div);
                s += dy[fc_pool_out_index(g, b, ch, oy, ox)] / div;
            }
        dx[i] = s;
    }
}
