// Element-wise kernels over float32: activations and their gradients, arithmetic with a
// scalar, fills and copies. `n` is the element count.

extern "C" __global__ void relu_f32(const float* x, float* y, i64 n) {
    FC_LOOP(i, n) { y[i] = x[i] > 0.0f ? x[i] : 0.0f; }
}

extern "C" __global__ void relu_grad_f32(const float* y, const float* dy, float* dx, i64 n) {
    FC_LOOP(i, n) { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
}

extern "C" __global__ void fill_f32(float* y, float v, i64 n) {
    FC_LOOP(i, n) { y[i] = v; }
}

extern "C" __global__ void scale_f32(const float* x, float* y, float s, i64 n) {
    FC_LOOP(i, n) { y[i] = x[i] * s; }
}

// y = a * x + b * y
extern "C" __global__ void axpby_f32(const float* x, float* y, float a, float b, i64 n) {
    FC_LOOP(i, n) { y[i] = a * x[i] + b * y[i]; }
}

// Bias added to each row of an [m, n] matrix: x over columns, y over rows (grid-stride), so
// each thread loads its bias value once and no index is divided.
extern "C" __global__ void add_row_bias_f32(float* y, const float* b, i64 m, i64 n) {
    const i64 j = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    const float bj = b[j];
    for (i64 r = blockIdx.y; r < m; r += gridDim.y) y[r * n + j] += bj;
}

// Column sums of an [m, n] matrix into out[n] (one thread per column; for bias gradients).
extern "C" __global__ void col_sum_f32(const float* x, float* out, i64 m, i64 n) {
    FC_LOOP(j, n) {
        float s = 0.0f;
        for (i64 r = 0; r < m; ++r) s += x[r * n + j];
        out[j] = s;
    }
}
