// The `nn` family's kernels: softmax and the losses, LayerNorm, SpatialBN, Dropout.
// Row kernels run one block per row (blockDim a multiple of 32) and loop over rows by
// gridDim.x; element kernels use grid-stride loops. Labels arrive as checked int64 indices.

#define NN_LOG_THRESHOLD 1e-20f

// Sum of a double over the block (as fc_block_sum).
__device__ __forceinline__ double nn_block_sum_d(double v) {
    __shared__ double nn_part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) nn_part[warp] = v;
    __syncthreads();
    const int nw = (blockDim.x + 31) >> 5;
    v = lane < nw ? nn_part[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---- Softmax ------------------------------------------------------------------------------

// y = softmax of each row of the [n, d] matrix x.
extern "C" __global__ void softmax_f32(const float* x, float* y, i64 n, i64 d) {
    for (i64 r = blockIdx.x; r < n; r += gridDim.x) {
        const float* xr = x + r * d;
        float* yr = y + r * d;
        float m = __int_as_float(0xff800000);
        for (i64 j = threadIdx.x; j < d; j += blockDim.x) m = fmaxf(m, xr[j]);
        m = fc_block_max(m);
        float s = 0.0f;
        for (i64 j = threadIdx.x; j < d; j += blockDim.x) {
            const float e = expf(xr[j] - m);
            yr[j] = e;
            s += e;
        }
        s = fc_block_sum(s);
        for (i64 j = threadIdx.x; j < d; j += blockDim.x) yr[j] = yr[j] / s;
    }
}

// dx = y * (dy - <y, dy>) row by row.
extern "C" __global__ void softmax_grad_f32(const float* y, const float* dy, float* dx, i64 n,
                                            i64 d) {
    for (i64 r = blockIdx.x; r < n; r += gridDim.x) {
        const i64 o = r * d;
        float s = 0.0f;
        for (i64 j = threadIdx.x; j < d; j += blockDim.x) s += y[o + j] * dy[o + j];
        s = fc_block_sum(s);
        for (i64 j = threadIdx.x; j < d; j += blockDim.x) dx[o + j] = y[o + j] * (dy[o + j] - s);
    }
}

// ---- SoftmaxWithLoss ----------------------------------------------------------------------

// rl[i] = w[i] * -log(max(p[i, idx[i]], threshold)) (w = 1 without weights).
extern "C" __global__ void swl_loss_idx_f32(const float* p, const i64* idx, const float* w,
                                            float* rl, i64 n, i64 d, i32 has_w) {
    FC_LOOP(i, n) {
        const float l = -logf(fmaxf(p[i * d + idx[i]], NN_LOG_THRESHOLD));
        rl[i] = (has_w ? w[i] : 1.0f) * l;
    }
}

// rl[i] = w[i] * -sum_j t[i, j] log(max(p[i, j], threshold)), one block per row.
extern "C" __global__ void swl_loss_prob_f32(const float* p, const float* t, const float* w,
                                             float* rl, i64 n, i64 d, i32 has_w) {
    for (i64 r = blockIdx.x; r < n; r += gridDim.x) {
        const i64 o = r * d;
        float s = 0.0f;
        for (i64 j = threadIdx.x; j < d; j += blockDim.x)
            s += t[o + j] * logf(fmaxf(p[o + j], NN_LOG_THRESHOLD));
        s = fc_block_sum(s);
        if (threadIdx.x == 0) rl[r] = (has_w ? w[r] : 1.0f) * -s;
    }
}

// Total weight (n without weights) over one block.
__device__ __forceinline__ float swl_total_weight(const float* w, i64 n, i32 has_w) {
    if (!has_w) return (float)n;
    float s = 0.0f;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) s += w[i];
    return fc_block_sum(s);
}

// out[0] = sum(rl) * scale / total weight (0 when the total weight is not positive).
// One block.
extern "C" __global__ void swl_finish_f32(const float* rl, const float* w, float* out, i64 n,
                                          float scale, i32 has_w) {
    float s = 0.0f;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) s += rl[i];
    s = fc_block_sum(s);
    const float tw = swl_total_weight(w, n, has_w);
    if (threadIdx.x == 0) out[0] = tw > 0.0f ? s * scale / tw : 0.0f;
}

// coef[0] = scale * dloss / total weight (0 when the total weight is not positive); dloss is
// dl[0] when dl_dev, else dl_host. One block.
extern "C" __global__ void swl_coef_f32(const float* w, const float* dl, float* coef, i64 n,
                                        float scale, float dl_host, i32 has_w, i32 dl_dev) {
    const float tw = swl_total_weight(w, n, has_w);
    if (threadIdx.x == 0) {
        const float g = dl_dev ? dl[0] : dl_host;
        coef[0] = tw > 0.0f ? scale * g / tw : 0.0f;
    }
}

// dx = (p - target) * w[i] * coef[0]; the target is t (label_prob) or the one-hot of idx.
extern "C" __global__ void swl_grad_f32(const float* p, const i64* idx, const float* t,
                                        const float* w, const float* coef, float* dx, i64 n,
                                        i64 d, i32 has_w, i32 label_prob) {
    FC_LOOP(k, n * d) {
        const i64 i = k / d, j = k - i * d;
        float v = p[k];
        if (label_prob) {
            v -= t[k];
        } else if (j == idx[i]) {
            v -= 1.0f;
        }
        v *= has_w ? w[i] : 1.0f;
        dx[k] = v * coef[0];
    }
}

// ---- LabelCrossEntropy, CrossEntropy ------------------------------------------------------

extern "C" __global__ void label_xent_f32(const float* x, const i64* idx, float* y, i64 n,
                                          i64 d) {
    FC_LOOP(i, n) { y[i] = -logf(fmaxf(x[i * d + idx[i]], NN_LOG_THRESHOLD)); }
}

extern "C" __global__ void label_xent_grad_f32(const float* x, const i64* idx, const float* dy,
                                               float* dx, i64 n, i64 d) {
    FC_LOOP(k, n * d) {
        const i64 i = k / d, j = k - i * d;
        dx[k] = j == idx[i] ? -dy[i] / fmaxf(x[k], NN_LOG_THRESHOLD) : 0.0f;
    }
}

// y[i] = -sum_j t[i, j] log(max(x[i, j], threshold)), one block per row.
extern "C" __global__ void xent_f32(const float* x, const float* t, float* y, i64 n, i64 d) {
    for (i64 r = blockIdx.x; r < n; r += gridDim.x) {
        const i64 o = r * d;
        float s = 0.0f;
        for (i64 j = threadIdx.x; j < d; j += blockDim.x)
            s += t[o + j] * logf(fmaxf(x[o + j], NN_LOG_THRESHOLD));
        s = fc_block_sum(s);
        if (threadIdx.x == 0) y[r] = -s;
    }
}

extern "C" __global__ void xent_grad_f32(const float* x, const float* t, const float* dy,
                                         float* dx, i64 n, i64 d) {
    FC_LOOP(k, n * d) { dx[k] = -dy[k / d] * t[k] / fmaxf(x[k], NN_LOG_THRESHOLD); }
}

// ---- SigmoidCrossEntropyWithLogits (kind 0 plain, 1 log_D_trick, 2 unjoined_lr_loss) -------

__device__ __forceinline__ float sx_log1p_exp_neg_abs(float x) {
    return logf(1.0f + expf(-fabsf(x)));
}

__device__ __forceinline__ float sx_term(i32 kind, float x, float t) {
    const float pos = x >= 0.0f ? 1.0f : 0.0f;
    if (kind == 0) return x * (t - pos) - sx_log1p_exp_neg_abs(x);
    if (kind == 1) return (2.0f * t - 1.0f) * (x - (x * pos + sx_log1p_exp_neg_abs(x)));
    return x * t + (t - 1.0f) * x * pos - (1.0f - t) * sx_log1p_exp_neg_abs(x);
}

__device__ __forceinline__ float sx_term_grad(i32 kind, float x, float t) {
    if (kind == 0) return t - 1.0f / (1.0f + expf(-x));
    if (kind == 1) return (2.0f * t - 1.0f) / (1.0f + expf(x));
    return t - (1.0f - t) / (1.0f + expf(-x));
}

// y[i] = -mean_j term(x[i, j], t[i, j]), one block per row of `inner` classes.
extern "C" __global__ void sigmoid_xent_f32(const float* x, const float* t, float* y, i64 outer,
                                            i64 inner, i32 kind) {
    for (i64 r = blockIdx.x; r < outer; r += gridDim.x) {
        const i64 o = r * inner;
        float s = 0.0f;
        for (i64 j = threadIdx.x; j < inner; j += blockDim.x) s += sx_term(kind, x[o + j], t[o + j]);
        s = fc_block_sum(s);
        if (threadIdx.x == 0) y[r] = -s / (float)inner;
    }
}

extern "C" __global__ void sigmoid_xent_grad_f32(const float* g, const float* x, const float* t,
                                                 float* dx, i64 outer, i64 inner, i32 kind) {
    FC_LOOP(k, outer * inner) {
        const float factor = -g[k / inner] / (float)inner;
        dx[k] = factor * sx_term_grad(kind, x[k], t[k]);
    }
}

// ---- SquaredL2Distance --------------------------------------------------------------------

// z[i] = 0.5 * |x[i] - y[i]|^2, one block per row.
extern "C" __global__ void sql2_f32(const float* x, const float* y, float* z, i64 n, i64 d) {
    for (i64 r = blockIdx.x; r < n; r += gridDim.x) {
        const i64 o = r * d;
        float s = 0.0f;
        for (i64 j = threadIdx.x; j < d; j += blockDim.x) {
            const float e = x[o + j] - y[o + j];
            s += e * e;
        }
        s = fc_block_sum(s);
        if (threadIdx.x == 0) z[r] = 0.5f * s;
    }
}

extern "C" __global__ void sql2_grad_f32(const float* x, const float* y, const float* dz,
                                         float* dx, float* dy, i64 n, i64 d) {
    FC_LOOP(k, n * d) {
        const float v = dz[k / d] * (x[k] - y[k]);
        dx[k] = v;
        dy[k] = -v;
    }
}

// ---- LayerNorm ----------------------------------------------------------------------------

// Each row of [rows, cols] normalised: mean, std = sqrt(max(E[x^2] - mean^2, 0) + eps), then
// gamma and beta per column when affine. One block per row.
extern "C" __global__ void layer_norm_f32(const float* x, const float* gamma, const float* beta,
                                          float* y, float* mean, float* stdev, i64 rows,
                                          i64 cols, float eps, i32 affine) {
    const float m = (float)(cols > 0 ? cols : 1);
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const i64 o = r * cols;
        float s1 = 0.0f, s2 = 0.0f;
        for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
            const float v = x[o + j];
            s1 += v;
            s2 += v * v;
        }
        s1 = fc_block_sum(s1);
        s2 = fc_block_sum(s2);
        const float mu = s1 / m;
        const float var = fmaxf(s2 / m - mu * mu, 0.0f);
        const float sd = sqrtf(var + eps);
        if (threadIdx.x == 0) {
            mean[r] = mu;
            stdev[r] = sd;
        }
        for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
            const float v = (x[o + j] - mu) / sd;
            y[o + j] = affine ? v * gamma[j] + beta[j] : v;
        }
    }
}

// dx of LayerNorm row by row: dxhat = dy (* gamma), dx = (dxhat - mean(dxhat) -
// xhat * mean(dxhat * xhat)) / std. One block per row.
extern "C" __global__ void layer_norm_grad_f32(const float* dy, const float* x, const float* mean,
                                               const float* stdev, const float* gamma, float* dx,
                                               i64 rows, i64 cols, i32 affine) {
    const float m = (float)(cols > 0 ? cols : 1);
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const i64 o = r * cols;
        const float mu = mean[r], sd = stdev[r];
        float s1 = 0.0f, s2 = 0.0f;
        for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
            const float xhat = (x[o + j] - mu) / sd;
            const float dh = affine ? dy[o + j] * gamma[j] : dy[o + j];
            s1 += dh;
            s2 += dh * xhat;
        }
        s1 = fc_block_sum(s1);
        s2 = fc_block_sum(s2);
        for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
            const float xhat = (x[o + j] - mu) / sd;
            const float dh = affine ? dy[o + j] * gamma[j] : dy[o + j];
            dx[o + j] = (dh - s1 / m - xhat * s2 / m) / sd;
        }
    }
}

// dgamma[j] = sum_r dy[r, j] xhat[r, j], dbeta[j] = sum_r dy[r, j] (one thread per column).
extern "C" __global__ void layer_norm_param_grad_f32(const float* dy, const float* x,
                                                     const float* mean, const float* stdev,
                                                     float* dgamma, float* dbeta, i64 rows,
                                                     i64 cols) {
    FC_LOOP(j, cols) {
        float sg = 0.0f, sb = 0.0f;
        for (i64 r = 0; r < rows; ++r) {
            const i64 k = r * cols + j;
            sg += dy[k] * ((x[k] - mean[r]) / stdev[r]);
            sb += dy[k];
        }
        dgamma[j] = sg;
        dbeta[j] = sb;
    }
}

// ---- SpatialBN ----------------------------------------------------------------------------

// Offset of (image, channel, spatial position) in NCHW or NHWC.
__device__ __forceinline__ i64 bn_at(i32 nhwc, i64 c, i64 inner, i64 img, i64 ch, i64 s) {
    return nhwc ? (img * inner + s) * c + ch : (img * c + ch) * inner + s;
}

// Inference: y = x * scale / sqrt(var + eps) + bias - mean * scale / sqrt(var + eps).
extern "C" __global__ void bn_infer_f32(const float* x, const float* scale, const float* bias,
                                        const float* mean, const float* var, float* y, i64 total,
                                        i64 c, i64 inner, float eps, i32 nhwc) {
    FC_LOOP(k, total) {
        const i64 ch = nhwc ? k % c : (k / inner) % c;
        const float inv = 1.0f / sqrtf(var[ch] + eps);
        const float a = scale[ch] * inv;
        const float b = bias[ch] - mean[ch] * scale[ch] * inv;
        y[k] = x[k] * a + b;
    }
}

// Training, one block per channel: batch mean and (biased) variance from double sums over
// the `m` = n * inner values, saved mean and inverse std, the running statistics updated in
// place (rv with the unbiased variance), and y.
extern "C" __global__ void bn_train_f32(const float* x, const float* scale, const float* bias,
                                        float* y, float* rm, float* rv, float* smean,
                                        float* sinv, i64 n, i64 c, i64 inner, float m, float eps,
                                        float momentum, float unbias, i32 nhwc) {
    const i64 cnt = n * inner;
    const double md = (double)fmaxf(m, 1.0f);
    for (i64 ch = blockIdx.x; ch < c; ch += gridDim.x) {
        double s1 = 0.0, s2 = 0.0;
        for (i64 t = threadIdx.x; t < cnt; t += blockDim.x) {
            const i64 img = t / inner, s = t - img * inner;
            const double v = (double)x[bn_at(nhwc, c, inner, img, ch, s)];
            s1 += v;
            s2 += v * v;
        }
        s1 = nn_block_sum_d(s1);
        s2 = nn_block_sum_d(s2);
        const float mu = (float)(s1 / md);
        const float var = fmaxf((float)(s2 / md) - mu * mu, 0.0f);
        const float inv = 1.0f / sqrtf(var + eps);
        if (threadIdx.x == 0) {
            smean[ch] = mu;
            sinv[ch] = inv;
            rm[ch] = rm[ch] * momentum + mu * (1.0f - momentum);
            rv[ch] = rv[ch] * momentum + var * unbias * (1.0f - momentum);
        }
        const float a = scale[ch] * inv;
        const float b = bias[ch] - mu * scale[ch] * inv;
        for (i64 t = threadIdx.x; t < cnt; t += blockDim.x) {
            const i64 img = t / inner, s = t - img * inner;
            const i64 k = bn_at(nhwc, c, inner, img, ch, s);
            y[k] = x[k] * a + b;
        }
    }
}

// Gradient, one block per channel: dbias = sum dy, dscale = sum dy * xhat, and
// dx = scale * inv / max(m, 1) * (m * dy - dbias - xhat * dscale).
extern "C" __global__ void bn_grad_f32(const float* x, const float* scale, const float* dy,
                                       const float* mean, const float* inv, float* dx,
                                       float* dscale, float* dbias, i64 n, i64 c, i64 inner,
                                       float m, i32 nhwc) {
    const i64 cnt = n * inner;
    for (i64 ch = blockIdx.x; ch < c; ch += gridDim.x) {
        const float mu = mean[ch], iv = inv[ch];
        double sb = 0.0, ss = 0.0;
        for (i64 t = threadIdx.x; t < cnt; t += blockDim.x) {
            const i64 img = t / inner, s = t - img * inner;
            const i64 k = bn_at(nhwc, c, inner, img, ch, s);
            const float g = dy[k];
            sb += (double)g;
            ss += (double)(g * (x[k] - mu) * iv);
        }
        const float db = (float)nn_block_sum_d(sb);
        const float ds = (float)nn_block_sum_d(ss);
        if (threadIdx.x == 0) {
            dscale[ch] = ds;
            dbias[ch] = db;
        }
        const float f = scale[ch] * iv / fmaxf(m, 1.0f);
        for (i64 t = threadIdx.x; t < cnt; t += blockDim.x) {
            const i64 img = t / inner, s = t - img * inner;
            const i64 k = bn_at(nhwc, c, inner, img, ch, s);
            const float xhat = (x[k] - mu) * iv;
            dx[k] = f * (m * dy[k] - db - xhat * ds);
        }
    }
}

// ---- Dropout ------------------------------------------------------------------------------

// Keeps x[i] (times scale) where a uniform draw is >= ratio; the mask (bool bytes) when
// has_mask.
extern "C" __global__ void dropout_f32(const float* x, float* y, u8* mask, i64 n, float ratio,
                                       float scale, u64 seed, i32 has_mask) {
    FC_LOOP(i, n) {
        const bool keep = fc_uniform01(seed, (u64)i) >= ratio;
        y[i] = keep ? x[i] * scale : 0.0f;
        if (has_mask) mask[i] = keep ? 1 : 0;
    }
}

extern "C" __global__ void dropout_grad_f32(const float* dy, const u8* mask, float* dx, i64 n,
                                            float scale) {
    FC_LOOP(i, n) { dx[i] = mask[i] ? dy[i] * scale : 0.0f; }
}
