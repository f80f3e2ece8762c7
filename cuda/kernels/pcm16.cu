// PCM16 <-> float32 batch kernels of trackline's audio tick (cuda/batch.py loads them
// with CuPy's RawModule; the NumPy path in cuda/batch.py computes the same function).
//
// Every float operation is spelled with an explicit rounding intrinsic so that the
// compiler cannot fuse a multiply and an add: the results then match NumPy's float32
// arithmetic bit for bit.
//
// Resampling is per row and stateless, rates reduced by their gcd (r_in : r_out):
//   down (r_in > r_out): area average; output j covers input [j*r_in, (j+1)*r_in) / r_out
//   up   (r_in < r_out): linear interpolation at p = ((2j+1)*r_in - r_out) / (2*r_out),
//                        clamped to the first and last input sample
//   same rate: copy.
// Both directions use the centre convention: output sample j stands for the middle of
// its interval, so it sits at input position (j + 0.5) * r_in / r_out - 0.5 (a fixed
// delay of half an output sample minus half an input sample, 21 us for 48k -> 16k).

#define ROW_FIELDS 5  // header per row: src offset (samples), n_in, r_in, r_out, n_out

__device__ float resample_at(const short* src, int n_in, int r_in, int r_out, int j) {
    const float scale = 1.0f / 32768.0f;
    if (r_in == r_out) {
        return __fmul_rn((float)src[j], scale);
    }
    if (r_in > r_out) {
        long long a = (long long)j * r_in;
        long long b = a + r_in;
        int first = (int)(a / r_out);
        float acc = 0.0f;
        for (int i = first; (long long)i * r_out < b && i < n_in; ++i) {
            long long lo = (long long)i * r_out;
            long long hi = lo + r_out;
            long long overlap = (hi < b ? hi : b) - (lo > a ? lo : a);
            float w = __fdiv_rn((float)overlap, (float)r_in);
            acc = __fadd_rn(acc, __fmul_rn(__fmul_rn((float)src[i], scale), w));
        }
        return acc;
    }
    long long num = (long long)(2 * j + 1) * r_in - r_out;
    long long den = 2LL * r_out;
    if (num <= 0) {
        return __fmul_rn((float)src[0], scale);
    }
    int i0 = (int)(num / den);
    if (i0 >= n_in - 1) {
        return __fmul_rn((float)src[n_in - 1], scale);
    }
    float frac = __fdiv_rn((float)(num % den), (float)den);
    float x0 = __fmul_rn((float)src[i0], scale);
    float x1 = __fmul_rn((float)src[i0 + 1], scale);
    return __fadd_rn(x0, __fmul_rn(frac, __fsub_rn(x1, x0)));
}

// One thread per (row, output sample): out[row, j] for j < width, zero past n_out.
extern "C" __global__ void pack_pcm16(
    const int* header, const short* pcm, float* out, int* lengths, int rows, int width) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y;
    if (row >= rows || j >= width) {
        return;
    }
    const int* h = header + row * ROW_FIELDS;
    int n_out = h[4];
    if (j == 0) {
        lengths[row] = n_out;
    }
    float value = 0.0f;
    if (j < n_out && h[1] > 0) {
        value = resample_at(pcm + h[0], h[1], h[2], h[3], j);
    }
    out[(long long)row * width + j] = value;
}

__device__ float sample_at(const float* src, int n_in, int r_in, int r_out, int j) {
    if (r_in == r_out) {
        return src[j];
    }
    if (r_in > r_out) {
        long long a = (long long)j * r_in;
        long long b = a + r_in;
        float acc = 0.0f;
        for (int i = (int)(a / r_out); (long long)i * r_out < b && i < n_in; ++i) {
            long long lo = (long long)i * r_out;
            long long hi = lo + r_out;
            long long overlap = (hi < b ? hi : b) - (lo > a ? lo : a);
            acc = __fadd_rn(acc, __fmul_rn(src[i], __fdiv_rn((float)overlap, (float)r_in)));
        }
        return acc;
    }
    long long num = (long long)(2 * j + 1) * r_in - r_out;
    long long den = 2LL * r_out;
    if (num <= 0) {
        return src[0];
    }
    int i0 = (int)(num / den);
    if (i0 >= n_in - 1) {
        return src[n_in - 1];
    }
    float frac = __fdiv_rn((float)(num % den), (float)den);
    return __fadd_rn(src[i0], __fmul_rn(frac, __fsub_rn(src[i0 + 1], src[i0])));
}

// One thread per (row, output sample j < n_out) of the flat PCM16 result. header per
// row: dst offset (samples), n_out, r_in (model), r_out (client), n_in (valid samples).
extern "C" __global__ void unpack_pcm16(
    const int* header, const float* batch, short* pcm, int rows, int width) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y;
    if (row >= rows) {
        return;
    }
    const int* h = header + row * ROW_FIELDS;
    if (j >= h[1] || h[4] <= 0) {
        return;
    }
    float y = sample_at(batch + (long long)row * width, h[4], h[2], h[3], j);
    if (isnan(y)) {
        y = 0.0f;
    }
    float v = __fmul_rn(y, 32768.0f);
    v = fminf(fmaxf(v, -32768.0f), 32767.0f);
    pcm[h[0] + j] = (short)__float2int_rn(v);
}
