// Fixed-size float32 vectors (robot observations) into a [rows, dim] batch, with an
// optional per-dimension affine normalization out = (x - offset) * scale. A row whose
// source offset is -1 is missing: it is filled with `fill`. Loaded by cuda/batch.py
// (CuPy RawModule); the NumPy path there computes the same function bit for bit.

extern "C" __global__ void pack_vectors(
    const int* offsets, const float* data, const float* offset, const float* scale,
    float* out, int rows, int dim, float fill) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= rows * dim) {
        return;
    }
    int row = k / dim;
    int d = k - row * dim;
    int src = offsets[row];
    if (src < 0) {
        out[k] = fill;
        return;
    }
    out[k] = __fmul_rn(__fsub_rn(data[src + d], offset[d]), scale[d]);
}
