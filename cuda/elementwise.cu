// elementwise.cu — elementwise.c's ops on the CUDA provider: broadcast binaries, Equal, unary math,
// their fused backward helpers, Where, Cast, Dropout (the CPU's counter-based RNG: the same masks
// on both providers) and SumToShape; and the pointwise machinery misc.cu's comparisons, logic and
// activations run through too (pointwise.cuh).
//
// One kernel per shape of work, selected by an op code (a switch that every thread of a launch
// takes the same way): the math is in float for fp16/bf16/fp32 (double for fp64), so the
// reduced-precision types are rounded once, on store.
#include <math.h>

#include "common.cuh"
#include "gelu.cuh"
#include "pointwise.cuh"

enum { RED_SUM = 0, RED_MEAN, RED_MAX, RED_MIN, RED_PROD };

// ---- binary arithmetic --------------------------------------------------------------------------

enum { B_ADD, B_SUB, B_MUL, B_DIV, B_MAX, B_MIN, B_POW, B_FMOD, B_MOD, B_PRELU };

// Mod: B_FMOD truncates (C's fmod), B_MOD takes the divisor's sign (Python's %), as ops/elementwise.c
template <typename A> __device__ __forceinline__ A mod_floor(A r, A y) { return r != 0 && ((r < 0) != (y < 0)) ? r + y : r; }

template <typename A> __device__ __forceinline__ A bin_op(int op, A x, A y) {
    switch (op) {
    case B_ADD: return x + y;
    case B_SUB: return x - y;
    case B_MUL: return x * y;
    case B_DIV: return x / y;
    case B_MAX: return (x != x || x > y) ? x : y;
    case B_MIN: return (x != x || x < y) ? x : y;
    case B_FMOD: return (A)fmod((double)x, (double)y);
    case B_MOD: return mod_floor((A)fmod((double)x, (double)y), y);
    case B_PRELU: return x > 0 ? x : y * x;   // torch's form: NaN stays NaN
    default: return (A)pow((double)x, (double)y);
    }
}
template <> __device__ __forceinline__ float bin_op<float>(int op, float x, float y) {
    switch (op) {
    case B_ADD: return x + y;
    case B_SUB: return x - y;
    case B_MUL: return x * y;
    case B_DIV: return x / y;
    case B_MAX: return (x != x || x > y) ? x : y;
    case B_MIN: return (x != x || x < y) ? x : y;
    case B_FMOD: return fmodf(x, y);
    case B_MOD: return mod_floor(fmodf(x, y), y);
    case B_PRELU: return x > 0 ? x : y * x;
    default: return y == 2.0f ? x * x : powf(x, y);
    }
}
template <> __device__ __forceinline__ int64_t bin_op<int64_t>(int op, int64_t x, int64_t y) {
    switch (op) {
    case B_ADD: return x + y;
    case B_SUB: return x - y;
    case B_MUL: return x * y;
    case B_DIV: return y == 0 ? 0 : y == -1 ? (int64_t)(0 - (uint64_t)x) : x / y;
    case B_MAX: return x > y ? x : y;
    case B_MIN: return x < y ? x : y;
    case B_FMOD: return y == 0 || y == -1 ? 0 : x % y;
    case B_MOD: return y == 0 || y == -1 ? 0 : mod_floor<int64_t>(x % y, y);
    case B_PRELU: return x > 0 ? x : y * x;
    default: return (int64_t)pow((double)x, (double)y);
    }
}
template <> __device__ __forceinline__ int32_t bin_op<int32_t>(int op, int32_t x, int32_t y) {
    return (int32_t)bin_op<int64_t>(op, x, y);
}

// out, a, b broadcast to out (n elements); TB is b's storage type (Pow takes an int exponent)
template <typename T, typename TB>
__global__ void binary_kernel(T *out, const T *a, const TB *b, bcast p, int64_t n, int op) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(i, n) {
        A x = ld(a[bcast_off(p, 1, i)]);
        A y = (A)ld(b[bcast_off(p, 2, i)]);
        out[i] = st<T>(bin_op<A>(op, x, y));
    }
}

static om_status *binary_plan(const om_kernel_ctx *ctx, int n_ops, bcast *p) {
    const om_tensor *ops[4] = {&ctx->out[0], &ctx->in[0], &ctx->in[1], n_ops > 3 ? &ctx->in[2] : NULL};
    if (bcast_init(p, &ctx->out[0], ops, n_ops))
        return OMC_ERR(OM_INVALID_ARGUMENT, "node '%s' (%s): operands do not broadcast", omc_node_name(ctx), omc_op_name(ctx));
    return NULL;
}

static om_status *binary_run(const om_kernel_ctx *ctx, const om_cuda_exec *x, int op) {
    bcast p;
    OMC_TRY(binary_plan(ctx, 3, &p));
    int64_t n = numel(&ctx->out[0]);
    if (!n) return NULL;
    if (op == B_POW && ctx->in[1].dtype != ctx->in[0].dtype) {
        OMC_DISPATCH_FLOAT(ctx->in[0].dtype, ctx, 0, {
            switch (ctx->in[1].dtype) {
            case OM_I64: binary_kernel<T, int64_t><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
                (T *)ctx->out[0].data, (const T *)ctx->in[0].data, (const int64_t *)ctx->in[1].data, p, n, op); break;
            case OM_I32: binary_kernel<T, int32_t><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
                (T *)ctx->out[0].data, (const T *)ctx->in[0].data, (const int32_t *)ctx->in[1].data, p, n, op); break;
            case OM_F32: binary_kernel<T, float><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
                (T *)ctx->out[0].data, (const T *)ctx->in[0].data, (const float *)ctx->in[1].data, p, n, op); break;
            case OM_F64: binary_kernel<T, double><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
                (T *)ctx->out[0].data, (const T *)ctx->in[0].data, (const double *)ctx->in[1].data, p, n, op); break;
            case OM_F16: binary_kernel<T, __half><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
                (T *)ctx->out[0].data, (const T *)ctx->in[0].data, (const __half *)ctx->in[1].data, p, n, op); break;
            case OM_BF16: binary_kernel<T, __nv_bfloat16><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
                (T *)ctx->out[0].data, (const T *)ctx->in[0].data, (const __nv_bfloat16 *)ctx->in[1].data, p, n, op);
                break;
            default: return omc_err_dtype(ctx, 1, ctx->in[1].dtype);
            }
        });
        return omc_launched(ctx);
    }
    OMC_DISPATCH_ARITH(ctx->in[0].dtype, ctx, 0, {
        binary_kernel<T, T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((T *)ctx->out[0].data, (const T *)ctx->in[0].data,
                                                                      (const T *)ctx->in[1].data, p, n, op);
    });
    return omc_launched(ctx);
}

#define BINARY(name, op) \
    om_status *name(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return binary_run(ctx, x, op); }
BINARY(add_cuda, B_ADD)
BINARY(sub_cuda, B_SUB)
BINARY(mul_cuda, B_MUL)
BINARY(div_cuda, B_DIV)
BINARY(max_cuda, B_MAX)
BINARY(min_cuda, B_MIN)
BINARY(pow_cuda, B_POW)
BINARY(prelu_cuda, B_PRELU)
om_status *mod_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    return binary_run(ctx, x, attr_i(ctx, "fmod", 0) ? B_FMOD : B_MOD);
}

// ---- comparisons and logic: -> bool (misc.cu's run through omc_compare too) -------------------------

// out (bool), a, b broadcast to out
template <typename T>
__global__ void compare_kernel(uint8_t *out, const T *a, const T *b, bcast p, int64_t n, int op) {
    GRID_STRIDE(i, n) {
        double x = to_f64(a[bcast_off(p, 1, i)]), y = to_f64(b[bcast_off(p, 2, i)]);
        uint8_t r;
        switch (op) {
        case C_EQ: r = x == y; break;
        case C_LT: r = x < y; break;
        case C_GT: r = x > y; break;
        case C_LE: r = x <= y; break;
        case C_GE: r = x >= y; break;
        case L_AND: r = (x != 0) && (y != 0); break;
        case L_OR: r = (x != 0) || (y != 0); break;
        default: r = (x != 0) != (y != 0); break;
        }
        out[i] = r;
    }
}
// int64 compared exactly (doubles lose precision past 2^53)
template <>
__global__ void compare_kernel<int64_t>(uint8_t *out, const int64_t *a, const int64_t *b, bcast p, int64_t n, int op) {
    GRID_STRIDE(i, n) {
        int64_t x = a[bcast_off(p, 1, i)], y = b[bcast_off(p, 2, i)];
        out[i] = op == C_EQ ? x == y : op == C_LT ? x < y : op == C_GT ? x > y : op == C_LE ? x <= y : x >= y;
    }
}

om_status *omc_compare(const om_kernel_ctx *ctx, const om_cuda_exec *x, int op) {
    bcast p;
    OMC_TRY(binary_plan(ctx, 3, &p));
    int64_t n = numel(&ctx->out[0]);
    if (!n) return NULL;
    om_dtype dt = ctx->in[0].dtype;
    if (op == C_EQ && dt == OM_BOOL) op = L_XOR + 1;   // (x != 0) == (y != 0): handled below
    if (op == L_XOR + 1) {
        compare_kernel<uint8_t><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
            (uint8_t *)ctx->out[0].data, (const uint8_t *)ctx->in[0].data, (const uint8_t *)ctx->in[1].data, p, n, C_EQ);
        return omc_launched(ctx);
    }
    OMC_DISPATCH_ALL(dt, ctx, 0, {
        compare_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((uint8_t *)ctx->out[0].data,
                                                                         (const T *)ctx->in[0].data,
                                                                         (const T *)ctx->in[1].data, p, n, op);
    });
    return omc_launched(ctx);
}

#define COMPARE(name, op) \
    om_status *name(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return omc_compare(ctx, x, op); }
COMPARE(equal_cuda, C_EQ)

// ---- unary -------------------------------------------------------------------------------------------



template <typename A> __device__ __forceinline__ A softplus_(A v) { return v > 0 ? v + log1p(exp(-v)) : log1p(exp(v)); }
template <typename A> __device__ __forceinline__ A sigmoid_(A v) {
    A e = exp(-(v < 0 ? -v : v));
    A s = (A)1 / ((A)1 + e);
    return v >= 0 ? s : e * s;
}

template <typename A> __device__ __forceinline__ A unary_op(int op, A v, act_params p) {
    switch (op) {
    case U_NEG: return -v;
    case U_RELU: return v < 0 ? (A)0 : v;   // NaN propagates, as torch's clamp_min
    case U_ABS: return v < 0 ? -v : v;
    case U_TANH: return tanh(v);
    case U_SIGMOID: return sigmoid_(v);
    case U_GELU_ERF: return gelu_of(v, 0);
    case U_GELU_TANH: return gelu_of(v, 1);
    case U_ERF: return erf(v);
    case U_SQRT: return sqrt(v);
    case U_EXP: return exp(v);
    case U_LOG: return log(v);
    case U_RECIP: return (A)1 / v;
    case U_LEAKY: return v > 0 ? v : (A)p.a * v;
    case U_SOFTPLUS: return softplus_(v);
    case U_ELU: return v > 0 ? v : (A)p.a * expm1(v);
    case U_SELU: return v > 0 ? (A)p.g * v : (A)p.g * (A)p.a * expm1(v);
    case U_HARD_SIGMOID: { A t = (A)p.a * v + (A)p.b; return t < 0 ? (A)0 : t > 1 ? (A)1 : t; }
    case U_HARD_SWISH: { A m = v + 3; m = m < 0 ? (A)0 : m; m = m > 6 ? (A)6 : m; return v * m / 6; }   // torch's form
    case U_MISH: return v * tanh(softplus_(v));
    case U_SOFTSIGN: return v / ((A)1 + (v < 0 ? -v : v));
    case U_CELU: return v <= 0 ? (A)p.a * expm1(v / (A)p.a) : v;
    case U_SIN: return sin(v);
    case U_COS: return cos(v);
    case U_SIGN: return (A)((v > 0) - (v < 0));   // torch.sign(NaN) is 0
    case U_FLOOR: return floor(v);
    case U_CEIL: return ceil(v);
    case U_ROUND: return rint(v);   // halves to even, as ONNX Round and torch.round
    default: return v;
    }
}
// integer types: only the ops that serve shape arithmetic
template <> __device__ __forceinline__ int64_t unary_op<int64_t>(int op, int64_t v, act_params p) {
    return op == U_NEG ? -v : op == U_RELU ? (v > 0 ? v : 0) : op == U_ABS ? (v < 0 ? -v : v)
         : op == U_SIGN ? (int64_t)((v > 0) - (v < 0)) : v;
}
template <> __device__ __forceinline__ int32_t unary_op<int32_t>(int op, int32_t v, act_params p) {
    return (int32_t)unary_op<int64_t>(op, v, p);
}

// x, y are (n)
template <typename T>
__global__ void unary_kernel(T *y, const T *x, int64_t n, int op, act_params p) {
    GRID_STRIDE(i, n) y[i] = st<T>(unary_op(op, ld(x[i]), p));
}

om_status *omc_unary(const om_kernel_ctx *ctx, const om_cuda_exec *x, int op, act_params p) {
    int64_t n = numel(&ctx->in[0]);
    if (!n) return NULL;
    if (op == U_NEG || op == U_RELU || op == U_ABS || op == U_SIGN) {
        OMC_DISPATCH_ARITH(ctx->in[0].dtype, ctx, 0, {
            unary_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((T *)ctx->out[0].data, (const T *)ctx->in[0].data,
                                                                           n, op, p);
        });
    } else {
        OMC_DISPATCH_FLOAT(ctx->in[0].dtype, ctx, 0, {
            unary_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((T *)ctx->out[0].data, (const T *)ctx->in[0].data,
                                                                           n, op, p);
        });
    }
    return omc_launched(ctx);
}

#define UNARY(name, op) \
    om_status *name(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return omc_unary(ctx, x, op); }
UNARY(neg_cuda, U_NEG)
UNARY(relu_cuda, U_RELU)
UNARY(abs_cuda, U_ABS)
UNARY(tanh_cuda, U_TANH)
UNARY(sigmoid_cuda, U_SIGMOID)
UNARY(erf_cuda, U_ERF)
UNARY(sin_cuda, U_SIN)
UNARY(cos_cuda, U_COS)
UNARY(sign_cuda, U_SIGN)
UNARY(floor_cuda, U_FLOOR)
UNARY(ceil_cuda, U_CEIL)
UNARY(round_cuda, U_ROUND)
UNARY(sqrt_cuda, U_SQRT)
UNARY(exp_cuda, U_EXP)
UNARY(log_cuda, U_LOG)
UNARY(reciprocal_cuda, U_RECIP)

static int gelu_mode(const om_kernel_ctx *ctx) {
    const char *s = attr_s(ctx, "approximate", "none");
    return !strcmp(s, "none") ? 0 : !strcmp(s, "tanh") ? 1 : -1;
}

om_status *gelu_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    int m = gelu_mode(ctx);
    if (m < 0) return omc_err_unsupported(ctx, "approximate must be \"none\" or \"tanh\"");
    return omc_unary(ctx, x, m ? U_GELU_TANH : U_GELU_ERF);
}

// ---- fused backward helpers: dx = dy * f'(saved) --------------------------------------------------------

// dx from (g, v) = (dy, x), in eager's form (misc.c's act_grad_cpu): a select where torch selects
template <typename A> __device__ __forceinline__ A act_grad_of(int kind, A g, A v, act_params p) {
    switch (kind) {
    case U_LEAKY: return v > 0 ? g : g * (A)p.a;
    case U_SOFTPLUS: return g * sigmoid_(v);
    case U_ELU: return v <= 0 ? g * (A)p.a * exp(v) : g;
    case U_SELU: return v <= 0 ? g * (A)p.g * (A)p.a * exp(v) : g * (A)p.g;
    case U_HARD_SIGMOID: { A t = (A)p.a * v + (A)p.b; return t > 0 && t < 1 ? g * (A)p.a : (A)0; }
    case U_HARD_SWISH: return v <= -3 ? (A)0 : v < 3 ? g * (v / 3 + (A)0.5) : g;
    case U_MISH: { A t = tanh(softplus_(v)); return g * (t + v * sigmoid_(v) * ((A)1 - t * t)); }
    case U_SOFTSIGN: { A d = (A)1 + (v < 0 ? -v : v); return g / (d * d); }
    case U_CELU: return v <= 0 ? g * exp(v / (A)p.a) : g;
    default: return (A)0;
    }
}

// dy and s (the saved x or y) are (n); dx like dy
template <typename T>
__global__ void grad2_kernel(T *dx, const T *dy, const T *s_, int64_t n, int op, int kind, act_params p) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(i, n) {
        A g = ld(dy[i]), s = ld(s_[i]), r;
        switch (op) {
        case G_RELU: r = s <= 0 ? (A)0 : g; break;   // NaN passes, as in eager
        case G_TANH: r = g * ((A)1 - s * s); break;
        case G_SIGMOID: r = g * s * ((A)1 - s); break;
        case G_ABS: r = g * (A)((s > 0) - (s < 0)); break;   // dy * sgn(x): NaN/inf dy stays non-finite
        case G_GELU_ERF: r = g * gelu_erf_deriv(s); break;
        case G_GELU_TANH: r = g * gelu_tanh_deriv(s); break;
        default: r = act_grad_of(kind, g, s, p); break;
        }
        dx[i] = st<T>(r);
    }
}

om_status *omc_grad2(const om_kernel_ctx *ctx, const om_cuda_exec *x, int op, int kind, act_params p) {
    int64_t n = numel(&ctx->in[0]);
    if (!n) return NULL;
    OMC_DISPATCH_FLOAT(ctx->in[0].dtype, ctx, 0, {
        grad2_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((T *)ctx->out[0].data, (const T *)ctx->in[0].data,
                                                                       (const T *)ctx->in[1].data, n, op, kind, p);
    });
    return omc_launched(ctx);
}
#define GRAD2(name, op) \
    om_status *name(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return omc_grad2(ctx, x, op); }
GRAD2(relu_grad_cuda, G_RELU)
GRAD2(tanh_grad_cuda, G_TANH)
GRAD2(sigmoid_grad_cuda, G_SIGMOID)
GRAD2(abs_grad_cuda, G_ABS)

om_status *gelu_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    int m = gelu_mode(ctx);
    if (m < 0) return omc_err_unsupported(ctx, "approximate must be \"none\" or \"tanh\"");
    return omc_grad2(ctx, x, m ? G_GELU_TANH : G_GELU_ERF);
}

// ---- Where: moves elements, so by element size ----------------------------------------------------

// cond (bool), x, y broadcast to out
template <typename U>
__global__ void where_kernel(U *out, const uint8_t *c, const U *a, const U *b, bcast p, int64_t n) {
    GRID_STRIDE(i, n) out[i] = c[bcast_off(p, 1, i)] ? a[bcast_off(p, 2, i)] : b[bcast_off(p, 3, i)];
}
om_status *where_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    bcast p;
    const om_tensor *ops[4] = {&ctx->out[0], &ctx->in[0], &ctx->in[1], &ctx->in[2]};
    if (bcast_init(&p, &ctx->out[0], ops, 4)) return OMC_ERR(OM_INVALID_ARGUMENT, "Where node '%s': operands do not broadcast", omc_node_name(ctx));
    int64_t n = numel(&ctx->out[0]);
    if (!n) return NULL;
    OMC_DISPATCH_SIZE(dtype_size(ctx->out[0].dtype), ctx, {
        where_kernel<U><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((U *)ctx->out[0].data, (const uint8_t *)ctx->in[0].data,
                                                                       (const U *)ctx->in[1].data, (const U *)ctx->in[2].data, p, n);
    });
    return omc_launched(ctx);
}

// ---- Identity / Cast -------------------------------------------------------------------------------------

om_status *identity_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    return copy_d2d(ctx->out[0].data, ctx->in[0].data, nbytes(&ctx->in[0]), x);
}

template <typename D> __device__ __forceinline__ D cast_from_f64(double v) {
    if (v != v) return (D)0;
    const double lo = -9223372036854775808.0, hi = 9223372036854775807.0;
    if (v >= hi) return (D)INT64_MAX;
    if (v <= lo) return (D)INT64_MIN;
    return (D)(int64_t)v;
}
template <> __device__ __forceinline__ float cast_from_f64<float>(double v) { return (float)v; }
template <> __device__ __forceinline__ double cast_from_f64<double>(double v) { return v; }
template <> __device__ __forceinline__ __half cast_from_f64<__half>(double v) { return __float2half_rn((float)v); }
template <> __device__ __forceinline__ __nv_bfloat16 cast_from_f64<__nv_bfloat16>(double v) { return __float2bfloat16_rn((float)v); }

// x, y are (n): y = (D) x — float -> int saturates, NaN -> 0; -> bool is x != 0
template <typename S, typename D>
__global__ void cast_kernel(D *y, const S *x, int64_t n, int to_bool) {
    GRID_STRIDE(i, n) {
        if (to_bool) { y[i] = (D)(to_f64(x[i]) != 0); continue; }
        y[i] = cast_from_f64<D>(to_f64(x[i]));
    }
}
// int64 -> int64-ish: exact, not through double
template <typename D>
__global__ void cast_int_kernel(D *y, const int64_t *x, int64_t n, int to_bool) {
    GRID_STRIDE(i, n) y[i] = to_bool ? (D)(x[i] != 0) : (D)x[i];
}

#define CAST_TO_ALL(S, ...)                                                                              \
    switch (to) {                                                                                        \
    case OM_F32: { typedef float D; __VA_ARGS__; } break;                                                \
    case OM_F64: { typedef double D; __VA_ARGS__; } break;                                               \
    case OM_F16: { typedef __half D; __VA_ARGS__; } break;                                               \
    case OM_BF16: { typedef __nv_bfloat16 D; __VA_ARGS__; } break;                                       \
    case OM_I64: { typedef int64_t D; __VA_ARGS__; } break;                                              \
    case OM_I32: { typedef int32_t D; __VA_ARGS__; } break;                                              \
    case OM_I8: { typedef int8_t D; __VA_ARGS__; } break;                                                \
    case OM_U8: case OM_BOOL: { typedef uint8_t D; __VA_ARGS__; } break;                                 \
    default: return omc_err_unsupported(ctx, "Cast to this dtype");                                     \
    }

om_status *cast_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    om_dtype to = ctx->out[0].dtype, from = ctx->in[0].dtype;
    int64_t n = numel(&ctx->in[0]);
    if (to == from) return copy_d2d(ctx->out[0].data, ctx->in[0].data, nbytes(&ctx->in[0]), x);
    if (!n) return NULL;
    int tb = to == OM_BOOL;
    if (from == OM_I64 && to != OM_F32 && to != OM_F64 && to != OM_F16 && to != OM_BF16) {
        CAST_TO_ALL(int64_t, cast_int_kernel<D><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
                                 (D *)ctx->out[0].data, (const int64_t *)ctx->in[0].data, n, tb));
        return omc_launched(ctx);
    }
    OMC_DISPATCH_ALL(from, ctx, 0, {
        CAST_TO_ALL(T, cast_kernel<T, D><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
                           (D *)ctx->out[0].data, (const T *)ctx->in[0].data, n, tb));
    });
    return omc_launched(ctx);
}

// ---- Dropout -------------------------------------------------------------------------------------------

// x is (n,); y like x; mask (n,) bool or NULL — keep(i) = uniform(seed, i) >= ratio, as core.c
template <typename T>
__global__ void dropout_kernel(T *y, uint8_t *mask, const T *x_, int64_t n, uint64_t seed, float ratio, float scale) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(i, n) {
        int keep = rand_uniform(seed, (uint64_t)i) >= ratio;
        if (mask) mask[i] = (uint8_t)keep;
        y[i] = keep ? st<T>(ld(x_[i]) * (A)scale) : st<T>((A)0);
    }
}
__global__ void fill_u8_kernel(uint8_t *p, uint8_t v, int64_t n) { GRID_STRIDE(i, n) p[i] = v; }

om_status *dropout_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    double ratio, scale;
    int training;
    OMC_TRY(omc_dropout_params(ctx, x, 1, 2, &ratio, &training, &scale));
    int64_t n = numel(&ctx->in[0]);
    uint8_t *mask = wanted(ctx, 1) ? (uint8_t *)ctx->out[1].data : NULL;
    if (!n) return NULL;
    if (!training || ratio == 0.0) {
        OMC_TRY(copy_d2d(ctx->out[0].data, ctx->in[0].data, nbytes(&ctx->in[0]), x));
        if (mask) OMC_TRY(omc_cuda(cudaMemsetAsync(mask, 1, (size_t)n, stream_of(x)), "cudaMemsetAsync"));
        return NULL;
    }
    OMC_DISPATCH_FLOAT(ctx->in[0].dtype, ctx, 0, {
        dropout_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((T *)ctx->out[0].data, mask, (const T *)ctx->in[0].data,
                                                                         n, ctx->seed, (float)ratio, (float)scale);
    });
    return omc_launched(ctx);
}

// dy, mask are (n,); dx like dy
template <typename T>
__global__ void dropout_grad_kernel(T *dx, const T *dy, const uint8_t *mask, int64_t n, float scale) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(i, n) dx[i] = mask[i] ? st<T>(ld(dy[i]) * (A)scale) : st<T>((A)0);
}

om_status *dropout_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    double ratio, scale;
    int training;
    OMC_TRY(omc_dropout_params(ctx, x, 2, 3, &ratio, &training, &scale));
    int64_t n = numel(&ctx->in[0]);
    if (!n) return NULL;
    if (!training) return copy_d2d(ctx->out[0].data, ctx->in[0].data, nbytes(&ctx->in[0]), x);
    OMC_DISPATCH_FLOAT(ctx->in[0].dtype, ctx, 0, {
        dropout_grad_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((T *)ctx->out[0].data, (const T *)ctx->in[0].data,
                                                                              (const uint8_t *)ctx->in[1].data, n, (float)scale);
    });
    return omc_launched(ctx);
}

// ---- SumToShape: x summed over the axes where the target has 1 (or no) dim ---------------------------

om_status *sum_to_shape_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *in = &ctx->in[0], *out = &ctx->out[0];
    if (numel(out) == numel(in)) return copy_d2d(out->data, in->data, nbytes(in), x);
    uint8_t axes[OM_MAX_RANK];
    int off = in->rank - out->rank;
    for (int d = 0; d < in->rank; d++) axes[d] = d < off || (out->dims[d - off] == 1 && in->dims[d] != 1);
    return omc_reduce(ctx, x, RED_SUM, in, in->data, axes, out->data, 1.0);
}
