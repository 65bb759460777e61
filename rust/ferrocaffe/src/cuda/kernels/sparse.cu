// The `sparse` family's kernels: Gather, the (Sparse)Lengths reductions and their gradients,
// ScatterAssign, ScatterWeightedSum, the dense and sparse optimizer updates, and the LSTM and
// GRU units.
//
// Index kernels come in two variants, `_i32` and `_i64`, for the indices' type. Indices are
// checked by `check_indices_*` first (it records the first bad value it sees in flag[1] and
// sets flag[0]); the other kernels skip an index out of range instead of reading outside the
// data. Updates whose result depends on the order of repeated indices run one thread per
// column looping over the indices in order, so they equal the CPU's sequential loops.

template <typename I>
__device__ __forceinline__ i64 fc_row(const I* idx, i64 k, i64 bound) {
    const i64 v = (i64)idx[k];
    return (v >= 0 && v < bound) ? v : -1;
}

template <typename I>
__device__ void check_indices(const I* idx, i64 n, i64 bound, u64* flag) {
    FC_LOOP(k, n) {
        const i64 v = (i64)idx[k];
        if (v < 0 || v >= bound) {
            if (atomicCAS(flag, 0ull, 1ull) == 0ull) flag[1] = (u64)v;
        }
    }
}

// y[o, k, i] = x[o, idx[k], i] with x of [outer, axis_dim, inner] elements of type T.
template <typename T, typename I>
__device__ void gather(const T* x, const I* idx, T* y, i64 outer, i64 axis_dim, i64 n_idx,
                       i64 inner) {
    FC_LOOP(e, outer * n_idx * inner) {
        const i64 in = e % inner;
        const i64 t = e / inner;
        const i64 k = t % n_idx;
        const i64 o = t / n_idx;
        const i64 r = fc_row(idx, k, axis_dim);
        if (r >= 0) y[e] = x[(o * axis_dim + r) * inner + in];
    }
}

// y[s, j] = sum over the items `it` of segment s (offs[s] <= it < offs[s + 1]) of
// w[it] * data[row(it), j], row(it) = idx[it] (or it without indices); divided by the
// segment's length when `mean`. One thread per output value, items in order.
template <typename I>
__device__ void lengths_reduce(const float* data, const float* w, const I* idx, const i64* offs,
                               float* y, i64 n_seg, i64 block, i64 n_rows, i32 mean) {
    FC_LOOP(e, n_seg * block) {
        const i64 s = e / block;
        const i64 j = e % block;
        const i64 a = offs[s];
        const i64 b = offs[s + 1];
        float acc = 0.0f;
        for (i64 it = a; it < b; ++it) {
            const i64 r = idx ? fc_row(idx, it, n_rows) : it;
            if (r < 0) continue;
            const float wt = w ? w[it] : 1.0f;
            acc += wt * data[r * block + j];
        }
        if (mean && b > a) acc /= (float)(b - a);
        y[e] = acc;
    }
}

// The segment of item `it`: the last s < n_seg with offs[s] <= it (offs[0] = 0 <= it).
__device__ __forceinline__ i64 fc_segment(const i64* offs, i64 n_seg, i64 it) {
    i64 lo = 0, hi = n_seg - 1;
    while (lo < hi) {
        const i64 mid = lo + (hi - lo + 1) / 2;
        if (offs[mid] <= it) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

// The two entry points of template `name`: `params` is a function-like macro giving the
// parameter list for an index type.
#define FC_IDX_VARIANTS(name, params, args)                                          \
    extern "C" __global__ void name##_i32 params(i32) { name<i32> args; }            \
    extern "C" __global__ void name##_i64 params(i64) { name<i64> args; }

#define FC_P_check_indices(I) (const I* idx, i64 n, i64 bound, u64* flag)
FC_IDX_VARIANTS(check_indices, FC_P_check_indices,
                (idx, n, bound, flag))

// Gather by element size: b1, b2, b4, b8.
#define FC_GATHER(T, suffix)                                                                  \
    extern "C" __global__ void gather_##suffix##_i32(const T* x, const i32* idx, T* y,        \
                                                     i64 outer, i64 axis_dim, i64 n_idx,      \
                                                     i64 inner) {                             \
        gather<T, i32>(x, idx, y, outer, axis_dim, n_idx, inner);                             \
    }                                                                                         \
    extern "C" __global__ void gather_##suffix##_i64(const T* x, const i64* idx, T* y,        \
                                                     i64 outer, i64 axis_dim, i64 n_idx,      \
                                                     i64 inner) {                             \
        gather<T, i64>(x, idx, y, outer, axis_dim, n_idx, inner);                             \
    }
FC_GATHER(u8, b1)
FC_GATHER(unsigned short, b2)
FC_GATHER(u32, b4)
FC_GATHER(u64, b8)

#define FC_P_lengths_reduce(I) (const float* data, const float* w, const I* idx, const i64* offs, float* y, \
    i64 n_seg, i64 block, i64 n_rows, i32 mean)
FC_IDX_VARIANTS(lengths_reduce, FC_P_lengths_reduce,
                (data, w, idx, offs, y, n_seg, block, n_rows, mean))

// Gradient of the length reductions: out[it, j] = scale(it) * dy[seg(it), j], scale = w[it]
// with weights, 1 / length with `mean`, else 1.
extern "C" __global__ void lengths_grad_f32(const float* dy, const float* w, const i64* offs,
                                            float* out, i64 n_seg, i64 total, i64 block,
                                            i32 mean) {
    FC_LOOP(e, total * block) {
        const i64 it = e / block;
        const i64 j = e % block;
        const i64 s = fc_segment(offs, n_seg, it);
        float scale = 1.0f;
        if (w) {
            scale = w[it];
        } else if (mean) {
            scale = 1.0f / (float)(offs[s + 1] - offs[s]);
        }
        out[e] = scale * dy[s * block + j];
    }
}

// The weights' gradient of SparseLengthsWeightedSum: wg[it] = <dy[seg(it)], data[idx[it]]>,
// one thread per item, the products summed in order.
template <typename I>
__device__ void lengths_weight_grad(const float* dy, const float* data, const I* idx,
                                    const i64* offs, float* wg, i64 n_seg, i64 total, i64 block,
                                    i64 n_rows) {
    FC_LOOP(it, total) {
        const i64 s = fc_segment(offs, n_seg, it);
        const i64 r = fc_row(idx, it, n_rows);
        float acc = 0.0f;
        if (r >= 0) {
            for (i64 j = 0; j < block; ++j) acc += dy[s * block + j] * data[r * block + j];
        }
        wg[it] = acc;
    }
}

#define FC_P_lengths_weight_grad(I) (const float* dy, const float* data, const I* idx, const i64* offs, float* wg, \
    i64 n_seg, i64 total, i64 block, i64 n_rows)
FC_IDX_VARIANTS(lengths_weight_grad, FC_P_lengths_weight_grad,
                (dy, data, idx, offs, wg, n_seg, total, block, n_rows))

// ScatterAssign, last writer wins: owner[row] = 1 + the last k whose index is row, then the
// owners copy their slice. Elements by size (b2, b4, b8).
template <typename I>
__device__ void scatter_owner(const I* idx, u32* owner, i64 n_idx, i64 n_rows) {
    FC_LOOP(k, n_idx) {
        const i64 r = fc_row(idx, k, n_rows);
        if (r >= 0) atomicMax(owner + r, (u32)(k + 1));
    }
}

#define FC_P_scatter_owner(I) (const I* idx, u32* owner, i64 n_idx, i64 n_rows)
FC_IDX_VARIANTS(scatter_owner, FC_P_scatter_owner,
                (idx, owner, n_idx, n_rows))

template <typename T, typename I>
__device__ void scatter_assign(T* y, const T* s, const I* idx, const u32* owner, i64 n_idx,
                               i64 block, i64 n_rows) {
    FC_LOOP(e, n_idx * block) {
        const i64 k = e / block;
        const i64 j = e % block;
        const i64 r = fc_row(idx, k, n_rows);
        if (r >= 0 && owner[r] == (u32)(k + 1)) y[r * block + j] = s[e];
    }
}

#define FC_SCATTER(T, suffix)                                                                 \
    extern "C" __global__ void scatter_assign_##suffix##_i32(                                 \
        T* y, const T* s, const i32* idx, const u32* owner, i64 n_idx, i64 block,             \
        i64 n_rows) {                                                                         \
        scatter_assign<T, i32>(y, s, idx, owner, n_idx, block, n_rows);                       \
    }                                                                                         \
    extern "C" __global__ void scatter_assign_##suffix##_i64(                                 \
        T* y, const T* s, const i64* idx, const u32* owner, i64 n_idx, i64 block,             \
        i64 n_rows) {                                                                         \
        scatter_assign<T, i64>(y, s, idx, owner, n_idx, block, n_rows);                       \
    }
FC_SCATTER(unsigned short, b2)
FC_SCATTER(u32, b4)
FC_SCATTER(u64, b8)

// ScatterWeightedSum, in the CPU kernel's order (Caffe2's): first y[idx[k]] *= w0 for each k
// (a repeated index is scaled again), then for each term t and each k in order
// y[idx[k]] += w_t * x_t[k] (x_t[k, j] read as 0 past x_t's length). `terms` holds m addresses
// of X_t, then m of W_t (float), then m lengths. One thread per column, so a repeated index
// is never written by two threads.
template <typename I>
__device__ void scatter_weighted_sum(float* y, const float* w0, const I* idx, const u64* terms,
                                     i64 m, i64 n_idx, i64 block, i64 n_rows) {
    FC_LOOP(j, block) {
        const float a0 = *w0;
        for (i64 k = 0; k < n_idx; ++k) {
            const i64 r = fc_row(idx, k, n_rows);
            if (r >= 0) y[r * block + j] *= a0;
        }
        for (i64 t = 0; t < m; ++t) {
            const float* x = (const float*)terms[t];
            const float wt = *(const float*)terms[m + t];
            const i64 len = (i64)terms[2 * m + t];
            for (i64 k = 0; k < n_idx; ++k) {
                const i64 r = fc_row(idx, k, n_rows);
                if (r < 0) continue;
                const i64 at = k * block + j;
                y[r * block + j] += wt * (at < len ? x[at] : 0.0f);
            }
        }
    }
}

#define FC_P_scatter_weighted_sum(I) (float* y, const float* w0, const I* idx, const u64* terms, i64 m, i64 n_idx, \
    i64 block, i64 n_rows)
FC_IDX_VARIANTS(scatter_weighted_sum, FC_P_scatter_weighted_sum,
                (y, w0, idx, terms, m, n_idx, block, n_rows))

// ---- Dense optimizers (lr: one float on the device) ----

// MomentumSGD(Update): ng, nm from g, m; param p (may be null) -= ng.
extern "C" __global__ void momentum_sgd_f32(const float* g, const float* m, const float* lr,
                                            float* ng, float* nm, float* p, float mu,
                                            i32 nesterov, i64 n) {
    const float a = *lr;
    FC_LOOP(i, n) {
        const float gi = g[i], mi = m[i];
        float step, mnew;
        if (nesterov) {
            mnew = mu * mi + a * gi;
            step = (1.0f + mu) * mnew - mu * mi;
        } else {
            mnew = a * gi + mu * mi;
            step = mnew;
        }
        nm[i] = mnew;
        ng[i] = step;
        if (p) p[i] -= step;
    }
}

// Adagrad: h = decay h + g^2, e = lr / (sqrt(h) + eps), p += e g; eff and upd optional.
extern "C" __global__ void adagrad_f32(float* p, float* h, const float* g, const float* lr,
                                       float* eff, float* upd, float eps, float decay, i64 n) {
    const float a = *lr;
    FC_LOOP(i, n) {
        const float gi = g[i];
        const float hi = decay * h[i] + gi * gi;
        h[i] = hi;
        const float e = a / (sqrtf(hi) + eps);
        p[i] += e * gi;
        if (eff) eff[i] = e;
        if (upd) upd[i] = e * gi;
    }
}

// Adam: moments, then the step corr * m1 / (sqrt(m2) + eps) (times lr into p); `eg` (may be
// null) receives the step without the learning rate.
extern "C" __global__ void adam_f32(float* p, float* m1, float* m2, const float* g,
                                    const float* lr, float* eg, float b1, float b2, float omb1,
                                    float omb2, float eps, float corr, i64 n) {
    const float a = *lr;
    FC_LOOP(i, n) {
        const float gi = g[i];
        const float mi = b1 * m1[i] + omb1 * gi;
        const float vi = b2 * m2[i] + omb2 * gi * gi;
        m1[i] = mi;
        m2[i] = vi;
        const float denom = sqrtf(vi) + eps;
        if (eg) {
            const float s = corr * mi / denom;
            eg[i] = s;
            p[i] += a * s;
        } else {
            p[i] += a * corr * mi / denom;
        }
    }
}

// ---- Sparse optimizers: one thread per column, indices in order ----

// SparseAdagrad: h[r] += g^2, p[r] += lr g / (sqrt(h[r]) + eps).
template <typename I>
__device__ void sparse_adagrad(float* p, float* h, const I* idx, const float* g,
                               const float* lr, float eps, i64 n_idx, i64 block, i64 n_rows) {
    const float a = *lr;
    FC_LOOP(j, block) {
        for (i64 k = 0; k < n_idx; ++k) {
            const i64 r = fc_row(idx, k, n_rows);
            if (r < 0) continue;
            const i64 pi = r * block + j;
            const float gi = g[k * block + j];
            const float hi = h[pi] + gi * gi;
            h[pi] = hi;
            p[pi] += a * gi / (sqrtf(hi) + eps);
        }
    }
}

#define FC_P_sparse_adagrad(I) (float* p, float* h, const I* idx, const float* g, const float* lr, float eps, \
    i64 n_idx, i64 block, i64 n_rows)
FC_IDX_VARIANTS(sparse_adagrad, FC_P_sparse_adagrad,
                (p, h, idx, g, lr, eps, n_idx, block, n_rows))

// RowWiseSparseAdagrad: one block, indices in order. With decay = wd * freq(row) and
// v = decay * w + g: h[r] += mean(v^2), w += v * lr / (sqrt(h[r]) + eps). `counter` (double,
// may be null) gives freq = halflife / counter[r] where counter[r] > 0, else 1.
template <typename I>
__device__ void rowwise_adagrad(float* p, float* h, const I* idx, const float* g,
                                const float* lr, const double* counter, float eps, float wd,
                                double halflife, i64 n_idx, i64 block, i64 n_rows) {
    const float a = *lr;
    for (i64 k = 0; k < n_idx; ++k) {
        const i64 r = fc_row(idx, k, n_rows);
        if (r < 0) continue;
        float freq = 1.0f;
        if (counter && counter[r] > 0.0) freq = (float)(halflife / counter[r]);
        const float decay = wd * freq;
        float part = 0.0f;
        for (i64 j = threadIdx.x; j < block; j += blockDim.x) {
            const float v = fmaf(decay, p[r * block + j], g[k * block + j]);
            part += v * v;
        }
        const float hr = h[r];
        const float sq = fc_block_sum(part);
        const float hn = hr + sq / (float)block;
        const float step = a / (sqrtf(hn) + eps);
        for (i64 j = threadIdx.x; j < block; j += blockDim.x) {
            const i64 pi = r * block + j;
            p[pi] += fmaf(decay, p[pi], g[k * block + j]) * step;
        }
        __syncthreads();
        if (threadIdx.x == 0) h[r] = hn;
        __syncthreads();
    }
}

#define FC_P_rowwise_adagrad(I) (float* p, float* h, const I* idx, const float* g, const float* lr, \
    const double* counter, float eps, float wd, double halflife, i64 n_idx, \
    i64 block, i64 n_rows)
FC_IDX_VARIANTS(rowwise_adagrad, FC_P_rowwise_adagrad,
                (p, h, idx, g, lr, counter, eps, wd, halflife, n_idx, block, n_rows))

// SparseAdam. radam: 0 plain, 1 RAdam before the variance is tractable (step = m / (1 -
// beta1^t)), 2 RAdam rectified by `rect`. `wide` (rows of one value) computes the step in
// double precision. `eg` (may be null) receives the effective gradient, shaped like GRAD.
__device__ __forceinline__ double fc_adam_eff(float m, float v, float eps, double corr,
                                              double b1corr, i32 radam, float rect, i32 wide) {
    const float denom = sqrtf(v) + eps;
    if (wide) {
        if (radam == 1) return b1corr * (double)m;
        if (radam == 2) return (double)rect * corr * (double)m / (double)denom;
        return corr * (double)m / (double)denom;
    }
    float f;
    if (radam == 1) {
        f = (float)b1corr * m;
    } else if (radam == 2) {
        f = rect * (float)corr * m / denom;
    } else {
        f = (float)corr * m / denom;
    }
    return (double)f;
}

template <typename I>
__device__ void sparse_adam(float* p, float* m1, float* m2, const I* idx, const float* g,
                            const float* lr, float* eg, float b1, float b2, float omb1,
                            float omb2, float eps, double corr, double b1corr, i32 radam,
                            float rect, i32 wide, i64 n_idx, i64 block, i64 n_rows) {
    const float a = *lr;
    FC_LOOP(j, block) {
        for (i64 k = 0; k < n_idx; ++k) {
            const i64 r = fc_row(idx, k, n_rows);
            if (r < 0) continue;
            const i64 pi = r * block + j;
            const i64 gk = k * block + j;
            const float gi = g[gk];
            const float mi = m1[pi] * b1 + gi * omb1;
            const float vi = m2[pi] * b2 + gi * gi * omb2;
            m1[pi] = mi;
            m2[pi] = vi;
            const double e = fc_adam_eff(mi, vi, eps, corr, b1corr, radam, rect, wide);
            if (eg) {
                const float ef = (float)e;
                eg[gk] = ef;
                p[pi] += a * ef;
            } else if (wide) {
                p[pi] = (float)((double)p[pi] + (double)a * e);
            } else {
                p[pi] += a * (float)e;
            }
        }
    }
}

#define FC_P_sparse_adam(I) (float* p, float* m1, float* m2, const I* idx, const float* g, const float* lr, \
    float* eg, float b1, float b2, float omb1, float omb2, float eps, double corr, \
    double b1corr, i32 radam, float rect, i32 wide, i64 n_idx, i64 block, \
    i64 n_rows)
FC_IDX_VARIANTS(sparse_adam, FC_P_sparse_adam,
                (p, m1, m2, idx, g, lr, eg, b1, b2, omb1, omb2, eps, corr, b1corr, radam, rect,
                 wide, n_idx, block, n_rows))

// SparseMomentumSGDUpdate: the step (as MomentumSGDUpdate) into ng[k], taken off p[r].
template <typename I>
__device__ void sparse_momentum(const float* g, float* m, const float* lr, float* p,
                                const I* idx, float* ng, float mu, i32 nesterov, i64 n_idx,
                                i64 block, i64 n_rows) {
    const float a = *lr;
    FC_LOOP(j, block) {
        for (i64 k = 0; k < n_idx; ++k) {
            const i64 r = fc_row(idx, k, n_rows);
            if (r < 0) continue;
            const i64 pi = r * block + j;
            const i64 gi = k * block + j;
            const float mi = m[pi];
            float step;
            if (nesterov) {
                const float mnew = mu * mi + a * g[gi];
                step = (1.0f + mu) * mnew - mu * mi;
                m[pi] = mnew;
            } else {
                step = a * g[gi] + mu * mi;
                m[pi] = step;
            }
            ng[gi] = step;
            p[pi] -= step;
        }
    }
}

#define FC_P_sparse_momentum(I) (const float* g, float* m, const float* lr, float* p, const I* idx, float* ng, \
    float mu, i32 nesterov, i64 n_idx, i64 block, i64 n_rows)
FC_IDX_VARIANTS(sparse_momentum, FC_P_sparse_momentum,
                (g, m, lr, p, idx, ng, mu, nesterov, n_idx, block, n_rows))

// ---- Recurrent units: one thread per (n, d) ----

// As the CPU: sigmoid(x) = 1 / (1 + e^-x) with the exponent clamped to [-87, 88],
// tanh(x) = 2 sigmoid(2x) - 1.
__device__ __forceinline__ float fc_sigmoid(float x) {
    return 1.0f / (1.0f + expf(fminf(fmaxf(-x, -87.0f), 88.0f)));
}

__device__ __forceinline__ float fc_tanh(float x) { return 2.0f * fc_sigmoid(2.0f * x) - 1.0f; }

// Whether row r is inside its sequence: no lengths (lens null), or t < lens[r] (int32, or
// int64 when lens64).
__device__ __forceinline__ bool fc_valid(const void* lens, i32 lens64, i64 t, i64 r) {
    if (!lens) return true;
    const i64 l = lens64 ? ((const i64*)lens)[r] : (i64)((const i32*)lens)[r];
    return t < l;
}

extern "C" __global__ void lstm_unit_f32(const float* h_prev, const float* c_prev,
                                         const float* x, const void* lens, i32 lens64, i64 t,
                                         float* h, float* c, i64 n, i64 d, float fb,
                                         i32 drop) {
    FC_LOOP(e, n * d) {
        const i64 r = e / d;
        const i64 j = e % d;
        if (fc_valid(lens, lens64, t, r)) {
            const float* g = x + r * 4 * d;
            const float i = fc_sigmoid(g[j]);
            const float f = fc_sigmoid(g[d + j] + fb);
            const float o = fc_sigmoid(g[2 * d + j]);
            const float cand = fc_tanh(g[3 * d + j]);
            const float cj = f * c_prev[e] + i * cand;
            c[e] = cj;
            h[e] = o * fc_tanh(cj);
        } else if (drop) {
            h[e] = 0.0f;
            c[e] = 0.0f;
        } else {
            h[e] = h_prev[e];
            c[e] = c_prev[e];
        }
    }
}

extern "C" __global__ void lstm_unit_grad_f32(const float* c_prev, const float* x,
                                              const void* lens, i32 lens64, i64 t,
                                              const float* c_t, const float* dh,
                                              const float* dc, float* dh_prev, float* dc_prev,
                                              float* dx, i64 n, i64 d, float fb, i32 drop) {
    FC_LOOP(e, n * d) {
        const i64 r = e / d;
        const i64 j = e % d;
        float* dxr = dx + r * 4 * d;
        if (fc_valid(lens, lens64, t, r)) {
            const float* g = x + r * 4 * d;
            const float i = fc_sigmoid(g[j]);
            const float f = fc_sigmoid(g[d + j] + fb);
            const float o = fc_sigmoid(g[2 * d + j]);
            const float cand = fc_tanh(g[3 * d + j]);
            const float tc = fc_tanh(c_t[e]);
            const float c_term = dc[e] + dh[e] * o * (1.0f - tc * tc);
            dh_prev[e] = 0.0f;
            dc_prev[e] = c_term * f;
            dxr[j] = c_term * cand * i * (1.0f - i);
            dxr[d + j] = c_term * c_prev[e] * f * (1.0f - f);
            dxr[2 * d + j] = dh[e] * tc * o * (1.0f - o);
            dxr[3 * d + j] = c_term * i * (1.0f - cand * cand);
        } else {
            dxr[j] = 0.0f;
            dxr[d + j] = 0.0f;
            dxr[2 * d + j] = 0.0f;
            dxr[3 * d + j] = 0.0f;
            dh_prev[e] = drop ? 0.0f : dh[e];
            dc_prev[e] = drop ? 0.0f : dc[e];
        }
    }
}

extern "C" __global__ void gru_unit_f32(const float* h_prev, const float* x, const void* lens,
                                        i32 lens64, i64 t, float* h, i64 n, i64 d, i32 drop) {
    FC_LOOP(e, n * d) {
        const i64 r = e / d;
        const i64 j = e % d;
        if (fc_valid(lens, lens64, t, r)) {
            const float* g = x + r * 3 * d;
            const float u = fc_sigmoid(g[d + j]);
            h[e] = h_prev[e] * u + fc_tanh(g[2 * d + j]) * (1.0f - u);
        } else {
            h[e] = drop ? 0.0f : h_prev[e];
        }
    }
}

extern "C" __global__ void gru_unit_grad_f32(const float* h_prev, const float* x,
                                             const void* lens, i32 lens64, i64 t,
                                             const float* dh, float* dh_prev, float* dx, i64 n,
                                             i64 d, i32 drop) {
    FC_LOOP(e, n * d) {
        const i64 r = e / d;
        const i64 j = e % d;
        float* dxr = dx + r * 3 * d;
        if (fc_valid(lens, lens64, t, r)) {
            const float* g = x + r * 3 * d;
            const float u = fc_sigmoid(g[d + j]);
            const float o = fc_tanh(g[2 * d + j]);
            dh_prev[e] = dh[e] * u;
            dxr[j] = 0.0f;
            dxr[d + j] = dh[e] * (h_prev[e] - o) * u * (1.0f - u);
            dxr[2 * d + j] = dh[e] * (1.0f - u) * (1.0f - o * o);
        } else {
            dxr[j] = 0.0f;
            dxr[d + j] = 0.0f;
            dxr[2 * d + j] = 0.0f;
            dh_prev[e] = drop ? 0.0f : dh[e];
        }
    }
}
