// The `math` family's kernels: element-wise unary math and its gradients, binary arithmetic,
// comparisons and logic with broadcasting, the reductions of the broadcast gradients, n-ary
// sums and casts.
//
// Conventions: `n` is the element count; every unary kernel takes (x, y, n, p0, p1) and every
// two-input gradient kernel (in0, in1, out, n, p0, p1), the floats being the op's parameters
// (unused ones are passed as 0). Bools are bytes holding 0 or 1 (`u8`). Integer arithmetic
// wraps and integer division by zero (or MIN / -1) gives 0, as the CPU kernels do.

#define FC_MAXD 12

// A broadcast binary op over the output's (coalesced) dims `d`: the strides of A and B in
// elements, 0 along broadcast dims. Mirrors `BcPlan` in ops/math.rs.
struct FcBcPlan {
    i64 nd;
    i64 d[FC_MAXD];
    i64 sa[FC_MAXD];
    i64 sb[FC_MAXD];
};

// A reduction of a broadcast operand's gradient: output element `o` enumerates the kept dims
// `kd` (row-major); its terms enumerate the reduced dims `rd`. `kc`/`rc` are strides into the
// full-size tensors (dC and C), `ko`/`ro` into the other operand. Mirrors `RedPlan`.
struct FcRedPlan {
    i64 nk;
    i64 nr;
    i64 kd[FC_MAXD];
    i64 kc[FC_MAXD];
    i64 ko[FC_MAXD];
    i64 rd[FC_MAXD];
    i64 rc[FC_MAXD];
    i64 ro[FC_MAXD];
};

#define FC_I32_MIN (-2147483647 - 1)
#define FC_I64_MIN (-9223372036854775807LL - 1)

// ---- scalar arithmetic ---------------------------------------------------------------------

__device__ __forceinline__ float fc_add(float a, float b) { return a + b; }
__device__ __forceinline__ float fc_sub(float a, float b) { return a - b; }
__device__ __forceinline__ float fc_mul(float a, float b) { return a * b; }
__device__ __forceinline__ float fc_div(float a, float b) { return a / b; }

__device__ __forceinline__ i32 fc_add(i32 a, i32 b) { return (i32)((u32)a + (u32)b); }
__device__ __forceinline__ i32 fc_sub(i32 a, i32 b) { return (i32)((u32)a - (u32)b); }
__device__ __forceinline__ i32 fc_mul(i32 a, i32 b) { return (i32)((u32)a * (u32)b); }
__device__ __forceinline__ i32 fc_div(i32 a, i32 b) {
    if (b == 0 || (b == -1 && a == FC_I32_MIN)) return 0;
    return a / b;
}

__device__ __forceinline__ i64 fc_add(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
__device__ __forceinline__ i64 fc_sub(i64 a, i64 b) { return (i64)((u64)a - (u64)b); }
__device__ __forceinline__ i64 fc_mul(i64 a, i64 b) { return (i64)((u64)a * (u64)b); }
__device__ __forceinline__ i64 fc_div(i64 a, i64 b) {
    if (b == 0 || (b == -1 && a == FC_I64_MIN)) return 0;
    return a / b;
}

struct FcOpAdd { template <class T> __device__ T operator()(T a, T b) const { return fc_add(a, b); } };
struct FcOpSub { template <class T> __device__ T operator()(T a, T b) const { return fc_sub(a, b); } };
struct FcOpMul { template <class T> __device__ T operator()(T a, T b) const { return fc_mul(a, b); } };
struct FcOpDiv { template <class T> __device__ T operator()(T a, T b) const { return fc_div(a, b); } };
struct FcOpPow { __device__ float operator()(float a, float b) const { return powf(a, b); } };

// Comparisons: C++ operators are false for NaN except `!=`, as the CPU kernels.
struct FcOpEq { template <class T> __device__ u8 operator()(T a, T b) const { return a == b ? 1 : 0; } };
struct FcOpNe { template <class T> __device__ u8 operator()(T a, T b) const { return a != b ? 1 : 0; } };
struct FcOpLt { template <class T> __device__ u8 operator()(T a, T b) const { return a < b ? 1 : 0; } };
struct FcOpLe { template <class T> __device__ u8 operator()(T a, T b) const { return a <= b ? 1 : 0; } };
struct FcOpGt { template <class T> __device__ u8 operator()(T a, T b) const { return a > b ? 1 : 0; } };
struct FcOpGe { template <class T> __device__ u8 operator()(T a, T b) const { return a >= b ? 1 : 0; } };

struct FcOpAnd { __device__ u8 operator()(u8 a, u8 b) const { return (a != 0 && b != 0) ? 1 : 0; } };
struct FcOpOr { __device__ u8 operator()(u8 a, u8 b) const { return (a != 0 || b != 0) ? 1 : 0; } };
struct FcOpXor { __device__ u8 operator()(u8 a, u8 b) const { return ((a != 0) != (b != 0)) ? 1 : 0; } };

// ---- binary kernels ------------------------------------------------------------------------

template <class T, class R, class F>
__device__ __forceinline__ void fc_bin_same(const T* a, const T* b, R* c, i64 n) {
    const F f{};
    FC_LOOP(i, n) { c[i] = f(a[i], b[i]); }
}

template <class T, class R, class F>
__device__ __forceinline__ void fc_bin_bc(const T* a, const T* b, R* c, i64 n, const FcBcPlan& p) {
    const F f{};
    const int nd = p.nd < FC_MAXD ? (int)p.nd : FC_MAXD;
    FC_LOOP(i, n) {
        i64 rem = i, ia = 0, ib = 0;
#pragma unroll 1
        for (int k = nd - 1; k >= 0; --k) {
            const i64 d = p.d[k];
            const i64 q = rem / d;
            const i64 j = rem - q * d;
            rem = q;
            ia += j * p.sa[k];
            ib += j * p.sb[k];
        }
        c[i] = f(a[ia], b[ib]);
    }
}

// NAME_same(a, b, c, n) and NAME_bc(a, b, c, n, plan).
#define FC_BINARY(NAME, T, R, F)                                                              \
    extern "C" __global__ void NAME##_same(const T* a, const T* b, R* c, i64 n) {            \
        fc_bin_same<T, R, F>(a, b, c, n);                                                     \
    }                                                                                         \
    extern "C" __global__ void NAME##_bc(const T* a, const T* b, R* c, i64 n, FcBcPlan p) {  \
        fc_bin_bc<T, R, F>(a, b, c, n, p);                                                    \
    }

FC_BINARY(add_f32, float, float, FcOpAdd)
FC_BINARY(add_i32, i32, i32, FcOpAdd)
FC_BINARY(add_i64, i64, i64, FcOpAdd)
FC_BINARY(sub_f32, float, float, FcOpSub)
FC_BINARY(sub_i32, i32, i32, FcOpSub)
FC_BINARY(sub_i64, i64, i64, FcOpSub)
FC_BINARY(mul_f32, float, float, FcOpMul)
FC_BINARY(mul_i32, i32, i32, FcOpMul)
FC_BINARY(mul_i64, i64, i64, FcOpMul)
FC_BINARY(div_f32, float, float, FcOpDiv)
FC_BINARY(div_i32, i32, i32, FcOpDiv)
FC_BINARY(div_i64, i64, i64, FcOpDiv)
FC_BINARY(pow_f32, float, float, FcOpPow)

#define FC_COMPARE(NAME, F)                \
    FC_BINARY(NAME##_f32, float, u8, F)    \
    FC_BINARY(NAME##_i32, i32, u8, F)      \
    FC_BINARY(NAME##_i64, i64, u8, F)      \
    FC_BINARY(NAME##_u8, u8, u8, F)

FC_COMPARE(eq, FcOpEq)
FC_COMPARE(ne, FcOpNe)
FC_COMPARE(lt, FcOpLt)
FC_COMPARE(le, FcOpLe)
FC_COMPARE(gt, FcOpGt)
FC_COMPARE(ge, FcOpGe)

FC_BINARY(and_u8, u8, u8, FcOpAnd)
FC_BINARY(or_u8, u8, u8, FcOpOr)
FC_BINARY(xor_u8, u8, u8, FcOpXor)

// ---- unary kernels -------------------------------------------------------------------------

// NAME(xs, ys, n, p0, p1): ys[i] = EXPR of `x` (= xs[i]) and the parameters.
#define FC_UNARY(NAME, T, EXPR)                                                               \
    extern "C" __global__ void NAME(const T* xs, T* ys, i64 n, float p0, float p1) {         \
        FC_LOOP(i, n) {                                                                       \
            const T x = xs[i];                                                                \
            ys[i] = (EXPR);                                                                   \
        }                                                                                     \
    }

// The CPU computes these in double and rounds to float: so do they.
#define FC_UNARY_F64(NAME, EXPR)                                                              \
    extern "C" __global__ void NAME(const float* xs, float* ys, i64 n, float p0, float p1) { \
        FC_LOOP(i, n) {                                                                       \
            const double x = (double)xs[i];                                                   \
            ys[i] = (float)(EXPR);                                                            \
        }                                                                                     \
    }

FC_UNARY_F64(sigmoid_f32, 1.0 / (1.0 + exp(-x)))
FC_UNARY_F64(tanh_f32, tanh(x))
FC_UNARY_F64(exp_f32, exp(x))
FC_UNARY_F64(log_f32, log(x))
FC_UNARY_F64(sqrt_f32, sqrt(x))
FC_UNARY_F64(rsqrt_f32, 1.0 / sqrt(x))
FC_UNARY_F64(reciprocal_f32, 1.0 / x)
FC_UNARY_F64(cos_f32, cos(x))
FC_UNARY_F64(sin_f32, sin(x))
FC_UNARY_F64(tan_f32, tan(x))
FC_UNARY_F64(acos_f32, acos(x))
FC_UNARY_F64(asin_f32, asin(x))
FC_UNARY_F64(atan_f32, atan(x))
FC_UNARY_F64(softsign_f32, x / (1.0 + fabs(x)))
FC_UNARY_F64(log1p_f32, log1p(x))
FC_UNARY_F64(cbrt_f32, cbrt(x))

// Computed in float on the CPU.
FC_UNARY(rsqrt32_f32, float, 1.0f / sqrtf(x))
FC_UNARY(leaky_relu_f32, float, x >= 0.0f ? x : x * p0)
// fmaxf/fminf return the other operand for a NaN, as Rust's f32::max/min.
FC_UNARY(clip_f32, float, fminf(fmaxf(x, p0), p1))
FC_UNARY(scale_f32, float, x * p0)
FC_UNARY(powe_f32, float, powf(x, p0))
FC_UNARY(not_u8, u8, (u8)(x != 0 ? 0 : 1))

// Sign-aware ops on float, int32 and int64 (integers wrap).
FC_UNARY(neg_f32, float, 0.0f - x)
FC_UNARY(abs_f32, float, x < 0.0f ? 0.0f - x : x)
FC_UNARY(sqr_f32, float, x * x)
FC_UNARY(cube_f32, float, (x * x) * x)
FC_UNARY(sign_f32, float, x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f))
FC_UNARY(neg_i32, i32, fc_sub((i32)0, x))
FC_UNARY(abs_i32, i32, x < 0 ? fc_sub((i32)0, x) : x)
FC_UNARY(sqr_i32, i32, fc_mul(x, x))
FC_UNARY(cube_i32, i32, fc_mul(fc_mul(x, x), x))
FC_UNARY(sign_i32, i32, (i32)(x > 0 ? 1 : (x < 0 ? -1 : 0)))
FC_UNARY(neg_i64, i64, fc_sub((i64)0, x))
FC_UNARY(abs_i64, i64, x < 0 ? fc_sub((i64)0, x) : x)
FC_UNARY(sqr_i64, i64, fc_mul(x, x))
FC_UNARY(cube_i64, i64, fc_mul(fc_mul(x, x), x))
FC_UNARY(sign_i64, i64, (i64)(x > 0 ? 1 : (x < 0 ? -1 : 0)))

// ---- gradients of unary ops (two inputs of one shape) --------------------------------------

// NAME(in0, in1, out, n, p0, p1): out[i] = EXPR of `a` (= in0[i]) and `b` (= in1[i]).
#define FC_PAIR(NAME, EXPR)                                                                   \
    extern "C" __global__ void NAME(const float* in0, const float* in1, float* out, i64 n,   \
                                    float p0, float p1) {                                     \
        FC_LOOP(i, n) {                                                                       \
            const float a = in0[i];                                                           \
            const float b = in1[i];                                                           \
            out[i] = (EXPR);                                                                  \
        }                                                                                     \
    }

// As FC_PAIR in double (the CPU's unary_grad kernels compute in double).
#define FC_PAIR_F64(NAME, EXPR)                                                               \
    extern "C" __global__ void NAME(const float* in0, const float* in1, float* out, i64 n,   \
                                    float p0, float p1) {                                     \
        FC_LOOP(i, n) {                                                                       \
            const double a = (double)in0[i];                                                  \
            const double b = (double)in1[i];                                                  \
            out[i] = (float)(EXPR);                                                           \
        }                                                                                     \
    }

// (Y, dY)
FC_PAIR(sigmoid_grad_f32, b * a * (1.0f - a))
FC_PAIR(tanh_grad_f32, b * (1.0f - a * a))
FC_PAIR(leaky_relu_grad_f32, a > 0.0f ? b : b * p0)
FC_PAIR(clip_grad_f32, (a <= p0 || a >= p1) ? 0.0f : b)
// (X, dY)
FC_PAIR(softsign_grad_f32, b / ((1.0f + fabsf(a)) * (1.0f + fabsf(a))))
FC_PAIR(abs_grad_f32, a > 0.0f ? b : (a < 0.0f ? -b : 0.0f))
FC_PAIR_F64(sin_grad_f32, b * cos(a))
FC_PAIR_F64(cos_grad_f32, -b * sin(a))
FC_PAIR_F64(tan_grad_f32, b / (cos(a) * cos(a)))
FC_PAIR_F64(acos_grad_f32, -b / sqrt(1.0 - a * a))
FC_PAIR_F64(asin_grad_f32, b / sqrt(1.0 - a * a))
FC_PAIR_F64(atan_grad_f32, b / (1.0 + a * a))
// (dY, Y)
FC_PAIR_F64(cbrt_grad_f32, a / (b * b) / 3.0)
FC_PAIR_F64(rsqrt_grad_f32, -0.5 * a * b * b * b)
// (Y, dY)
FC_PAIR_F64(reciprocal_grad_f32, -b * a * a)

// ---- n-ary sums ----------------------------------------------------------------------------

// y = x * w[0] (w a one-element device tensor).
extern "C" __global__ void wsum_first_f32(const float* x, const float* w, float* y, i64 n) {
    const float wv = w[0];
    FC_LOOP(i, n) { y[i] = x[i] * wv; }
}

// y += w[0] * x
extern "C" __global__ void wsum_acc_f32(const float* x, const float* w, float* y, i64 n) {
    const float wv = w[0];
    FC_LOOP(i, n) { y[i] += wv * x[i]; }
}

// ---- broadcast-gradient reductions ---------------------------------------------------------

// MODE 0: g; 1: g * other; 2: g / other; 3: g * c / other.
template <int MODE>
__device__ __forceinline__ float fc_red_term(const float* g, const float* oth, const float* c,
                                             i64 ic, i64 io) {
    if (MODE == 0) return g[ic];
    if (MODE == 1) return g[ic] * oth[io];
    if (MODE == 2) return g[ic] / oth[io];
    return g[ic] * c[ic] / oth[io];
}

// Offsets of output element `o` (kept dims).
__device__ __forceinline__ void fc_red_kept(const FcRedPlan& p, i64 o, i64* ic, i64* io) {
    const int nk = p.nk < FC_MAXD ? (int)p.nk : FC_MAXD;
    i64 rem = o, c = 0, t = 0;
#pragma unroll 1
    for (int k = nk - 1; k >= 0; --k) {
        const i64 d = p.kd[k];
        const i64 q = rem / d;
        const i64 j = rem - q * d;
        rem = q;
        c += j * p.kc[k];
        t += j * p.ko[k];
    }
    *ic = c;
    *io = t;
}

// Offsets of term `r` (reduced dims), added to (*ic, *io).
__device__ __forceinline__ void fc_red_more(const FcRedPlan& p, i64 r, i64* ic, i64* io) {
    const int nr = p.nr < FC_MAXD ? (int)p.nr : FC_MAXD;
    i64 rem = r, c = 0, t = 0;
#pragma unroll 1
    for (int k = nr - 1; k >= 0; --k) {
        const i64 d = p.rd[k];
        const i64 q = rem / d;
        const i64 j = rem - q * d;
        rem = q;
        c += j * p.rc[k];
        t += j * p.ro[k];
    }
    *ic += c;
    *io += t;
}

// One thread per output element, its `nterms` terms in order.
template <int MODE>
__device__ __forceinline__ void fc_red_thread(const float* g, const float* oth, const float* c,
                                              float* out, float scale, i64 nout, i64 nterms,
                                              const FcRedPlan& p) {
    FC_LOOP(o, nout) {
        i64 bc = 0, bo = 0;
        fc_red_kept(p, o, &bc, &bo);
        float s = 0.0f;
        for (i64 r = 0; r < nterms; ++r) {
            i64 ic = bc, io = bo;
            fc_red_more(p, r, &ic, &io);
            s += fc_red_term<MODE>(g, oth, c, ic, io);
        }
        out[o] = scale * s;
    }
}

// One block per output element (blockDim.x a multiple of 32), looping over the outputs.
template <int MODE>
__device__ __forceinline__ void fc_red_block(const float* g, const float* oth, const float* c,
                                             float* out, float scale, i64 nout, i64 nterms,
                                             const FcRedPlan& p) {
    for (i64 o = blockIdx.x; o < nout; o += gridDim.x) {
        i64 bc = 0, bo = 0;
        fc_red_kept(p, o, &bc, &bo);
        float s = 0.0f;
        for (i64 r = threadIdx.x; r < nterms; r += blockDim.x) {
            i64 ic = bc, io = bo;
            fc_red_more(p, r, &ic, &io);
            s += fc_red_term<MODE>(g, oth, c, ic, io);
        }
        s = fc_block_sum(s);
        if (threadIdx.x == 0) out[o] = scale * s;
    }
}

#define FC_REDUCE(MODE)                                                                       \
    extern "C" __global__ void red_thread_m##MODE(const float* g, const float* oth,          \
                                                  const float* c, float* out, float scale,    \
                                                  i64 nout, i64 nterms, FcRedPlan p) {        \
        fc_red_thread<MODE>(g, oth, c, out, scale, nout, nterms, p);                          \
    }                                                                                         \
    extern "C" __global__ void red_block_m##MODE(const float* g, const float* oth,           \
                                                 const float* c, float* out, float scale,     \
                                                 i64 nout, i64 nterms, FcRedPlan p) {         \
        fc_red_block<MODE>(g, oth, c, out, scale, nout, nterms, p);                           \
    }

FC_REDUCE(0)
FC_REDUCE(1)
FC_REDUCE(2)
FC_REDUCE(3)

// ---- casts ---------------------------------------------------------------------------------

// Float to integer as Rust's `as` (the CPU converts through double): truncation toward zero,
// saturating at the type's range, NaN to 0.
__device__ __forceinline__ i32 fc_to_i32(double v) {
    if (v != v) return 0;
    if (v >= 2147483647.0) return 2147483647;
    if (v <= -2147483648.0) return FC_I32_MIN;
    return (i32)v;
}

__device__ __forceinline__ i64 fc_to_i64(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775807.0) return 9223372036854775807LL;
    if (v <= -9223372036854775808.0) return FC_I64_MIN;
    return (i64)v;
}

#define FC_CAST(NAME, S, D, EXPR)                                                             \
    extern "C" __global__ void NAME(const S* xs, D* ys, i64 n) {                             \
        FC_LOOP(i, n) {                                                                       \
            const S x = xs[i];                                                                \
            ys[i] = (EXPR);                                                                   \
        }                                                                                     \
    }

FC_CAST(cast_f32_i32, float, i32, fc_to_i32((double)x))
FC_CAST(cast_f32_i64, float, i64, fc_to_i64((double)x))
FC_CAST(cast_f32_u8, float, u8, (u8)(x != 0.0f ? 1 : 0))
FC_CAST(cast_i32_f32, i32, float, (float)x)
FC_CAST(cast_i32_i64, i32, i64, (i64)x)
FC_CAST(cast_i32_u8, i32, u8, (u8)(x != 0 ? 1 : 0))
// int64 -> float through double, as the CPU (v as f64 as f32).
FC_CAST(cast_i64_f32, i64, float, (float)(double)x)
FC_CAST(cast_i64_i32, i64, i32, fc_to_i32((double)x))
FC_CAST(cast_i64_u8, i64, u8, (u8)(x != 0 ? 1 : 0))
FC_CAST(cast_u8_f32, u8, float, x != 0 ? 1.0f : 0.0f)
FC_CAST(cast_u8_i32, u8, i32, (i32)(x != 0 ? 1 : 0))
FC_CAST(cast_u8_i64, u8, i64, (i64)(x != 0 ? 1 : 0))
