// CPU runtime for emulating one CUDA kernel launch (see tcstage/cuda/emulate.py).
//
// Every CUDA thread of a block is a cooperative fiber on the calling OS thread. The block's
// scheduler resumes each fiber in turn until it reaches __syncthreads() or returns; when every
// fiber has stopped, one barrier phase is over and the next begins. Blocks run one after another.
// Since fibers only switch at barriers, a phase is a serialisation of the block's threads in the
// scheduler's order: running the kernel under different orders and comparing the results exposes
// the races that change the result (the Python side does the comparing).
//
// __shared__ variables become `static thread_local`: one copy per OS thread, hence per block
// being run, shared by that block's fibers. threadIdx is a thread_local the scheduler rewrites
// before each switch, so each fiber sees its own value. Faults in a fiber (SIGSEGV, SIGBUS,
// SIGFPE) end the launch with an error instead of the process; see FaultGuard. A launch that
// runs past its time limit ends the same way; see Watchdog.
#pragma once

#include <math.h>  // the C++ wrapper: float overloads of exp, log, ... in the global namespace
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <limits>
#include <new>
#include <type_traits>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#if !defined(__x86_64__) || defined(TCEMU_USE_UCONTEXT)
#define TCEMU_UCONTEXT 1
#include <ucontext.h>
#endif

// ---------------------------------------------------------------------------------------------
// CUDA's language extensions, spelled for a host compiler.

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __constant__ static
// One copy per OS thread is one copy per block: blocks of a launch run one at a time per thread.
#define __shared__ static thread_local
// __restrict__ is a GCC/Clang keyword already.

struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1)
        : x(x_), y(y_), z(z_) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
// Aligned like CUDA's, so vector loads through reinterpret_cast see the same layout.
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
static inline int2 make_int2(int x, int y) { return {x, y}; }
static inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return {x, y, z}; }

// The built-in variables. Plain (not const) because the scheduler assigns them; CUDA code
// cannot assign them anyway (nvcc rejects it, and compile_check runs nvcc where it exists).
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;
#define warpSize 32

#if defined(__FLT16_MAX__)
typedef _Float16 half;
typedef _Float16 __half;
static inline half __float2half(float f) { return (half)f; }
static inline half __float2half_rn(float f) { return (half)f; }
static inline float __half2float(half h) { return (float)h; }
static inline half __hadd(half a, half b) { return a + b; }
static inline half __hsub(half a, half b) { return a - b; }
static inline half __hmul(half a, half b) { return a * b; }
static inline half __hdiv(half a, half b) { return a / b; }
static inline half __hfma(half a, half b, half c) {
    return (half)fmaf((float)a, (float)b, (float)c);
}
static inline half hexp(half a) { return (half)expf((float)a); }
static inline half hlog(half a) { return (half)logf((float)a); }
static inline half hsqrt(half a) { return (half)sqrtf((float)a); }
static inline half hrsqrt(half a) { return (half)(1.0f / sqrtf((float)a)); }
static inline unsigned short __half_as_ushort(half h) { unsigned short u; memcpy(&u, &h, 2); return u; }
static inline half __ushort_as_half(unsigned short u) { half h; memcpy(&h, &u, 2); return h; }
static inline short __half_as_short(half h) { short u; memcpy(&u, &h, 2); return u; }
static inline half __short_as_half(short u) { half h; memcpy(&h, &u, 2); return h; }
#define CUDART_INF_FP16 __ushort_as_half((unsigned short)0x7C00U)
#define CUDART_NAN_FP16 __ushort_as_half((unsigned short)0x7FFFU)
#define CUDART_MAX_NORMAL_FP16 __ushort_as_half((unsigned short)0x7BFFU)
#define CUDART_MIN_DENORM_FP16 __ushort_as_half((unsigned short)0x0001U)
#define CUDART_ZERO_FP16 __ushort_as_half((unsigned short)0x0000U)
#define CUDART_ONE_FP16 __ushort_as_half((unsigned short)0x3C00U)
#endif

// bfloat16, as <cuda_bf16.h> declares it. GCC 12 has no arithmetic __bf16, so this is a struct
// with the conversions and operators of CUDA's (which make mixed expressions such as
// `bf16 + float` or `bf16 * 2` ambiguous, exactly as nvcc reports them: generated code converts
// explicitly). Every operation is computed in float and rounded to nearest even: for a single
// +, -, *, / of bf16 values that equals the correctly rounded result of sm_80+ hardware, since
// float's 24 bits exceed 2 * 8 + 2. NaN results are CUDA's canonical bf16 NaN (0x7FFF).
namespace tcemu {
static inline float bf16_to_float(unsigned short b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline unsigned short bf16_from_float(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
    // Round the low 16 bits away, to nearest and ties to even; a carry into the exponent is
    // right (up to infinity).
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
// Rounding a double to float and then to bf16 can round twice in the same direction (a value
// just above a bf16 tie lands on the tie, then goes to even). Rounding to float toward zero and
// setting the last bit when anything was lost ("round to odd") keeps that information, and
// float has more than 8 + 2 bits, so the second rounding is then the correct one.
static inline float round_to_odd_float(double d) {
    float f = (float)d;
    if (d != d || (double)f == d) return f;
    uint32_t u;
    memcpy(&u, &f, 4);
    if (fabs((double)f) > fabs(d)) u -= 1;  // one step toward zero (from inf: FLT_MAX)
    u |= 1u;
    memcpy(&f, &u, 4);
    return f;
}
static inline unsigned short bf16_from_double(double d) {
    return bf16_from_float(round_to_odd_float(d));
}
// Integers of any width, rounded once (an int64 through double would round twice).
static inline unsigned short bf16_from_magnitude(bool negative, unsigned long long m) {
    float f;
    if (m < (1ull << 24)) {
        f = (float)m;
    } else {
        int drop = 64 - __builtin_clzll(m) - 8;  // keep the top 8 bits
        unsigned long long keep = m >> drop, rest = m & ((1ull << drop) - 1),
                           tie = 1ull << (drop - 1);
        if (rest > tie || (rest == tie && (keep & 1))) ++keep;
        f = ldexpf((float)keep, drop);  // exact: keep <= 256
    }
    return bf16_from_float(negative ? -f : f);
}
template <class I> static inline unsigned short bf16_from_integer(I v) {
    if (v < 0) return bf16_from_magnitude(true, 0ull - (unsigned long long)(long long)v);
    return bf16_from_magnitude(false, (unsigned long long)v);
}
// CUDA's __bfloat162int_rz and friends: truncate, saturate, NaN -> 0.
template <class I> static inline I float_to_integer_rz(float f) {
    if (f != f) return 0;
    double t = trunc((double)f);
    if (t <= (double)std::numeric_limits<I>::min()) return std::numeric_limits<I>::min();
    if (t >= (double)std::numeric_limits<I>::max()) return std::numeric_limits<I>::max();
    return (I)t;
}
}  // namespace tcemu

struct __nv_bfloat16_raw { unsigned short x; };
struct alignas(2) __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    constexpr __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
    __nv_bfloat16(float f) : __x(tcemu::bf16_from_float(f)) {}
    __nv_bfloat16(double d) : __x(tcemu::bf16_from_double(d)) {}
#if defined(__FLT16_MAX__)
    explicit __nv_bfloat16(_Float16 h) : __x(tcemu::bf16_from_float((float)h)) {}
#endif
    __nv_bfloat16(short v) : __x(tcemu::bf16_from_integer(v)) {}
    __nv_bfloat16(unsigned short v) : __x(tcemu::bf16_from_integer(v)) {}
    __nv_bfloat16(int v) : __x(tcemu::bf16_from_integer(v)) {}
    __nv_bfloat16(unsigned int v) : __x(tcemu::bf16_from_integer(v)) {}
    __nv_bfloat16(long v) : __x(tcemu::bf16_from_integer(v)) {}
    __nv_bfloat16(unsigned long v) : __x(tcemu::bf16_from_integer(v)) {}
    __nv_bfloat16(long long v) : __x(tcemu::bf16_from_integer(v)) {}
    __nv_bfloat16(unsigned long long v) : __x(tcemu::bf16_from_integer(v)) {}
    operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
    operator float() const { return tcemu::bf16_to_float(__x); }
    operator signed char() const { return tcemu::float_to_integer_rz<signed char>(float(*this)); }
    operator unsigned char() const {
        return tcemu::float_to_integer_rz<unsigned char>(float(*this));
    }
    operator char() const { return tcemu::float_to_integer_rz<char>(float(*this)); }
    operator short() const { return tcemu::float_to_integer_rz<short>(float(*this)); }
    operator unsigned short() const {
        return tcemu::float_to_integer_rz<unsigned short>(float(*this));
    }
    operator int() const { return tcemu::float_to_integer_rz<int>(float(*this)); }
    operator unsigned int() const { return tcemu::float_to_integer_rz<unsigned int>(float(*this)); }
    operator long() const { return tcemu::float_to_integer_rz<long>(float(*this)); }
    operator unsigned long() const {
        return tcemu::float_to_integer_rz<unsigned long>(float(*this));
    }
    operator long long() const { return tcemu::float_to_integer_rz<long long>(float(*this)); }
    operator unsigned long long() const {
        return tcemu::float_to_integer_rz<unsigned long long>(float(*this));
    }
    constexpr operator bool() const { return (__x & 0x7fffu) != 0; }
};
typedef __nv_bfloat16 nv_bfloat16;

static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
    return __nv_bfloat16(__nv_bfloat16_raw{u});
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
static inline __nv_bfloat16 __short_as_bfloat16(short u) {
    return __ushort_as_bfloat16((unsigned short)u);
}
static inline short __bfloat16_as_short(__nv_bfloat16 h) { return (short)h.__x; }
static inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
static inline __nv_bfloat16 __float2bfloat16_rz(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __ushort_as_bfloat16(0x7fff);
    return __ushort_as_bfloat16((unsigned short)(u >> 16));
}
static inline __nv_bfloat16 __double2bfloat16(double d) { return __nv_bfloat16(d); }
static inline float __bfloat162float(__nv_bfloat16 h) { return float(h); }
static inline __nv_bfloat16 __int2bfloat16_rn(int v) { return __nv_bfloat16(v); }
static inline __nv_bfloat16 __uint2bfloat16_rn(unsigned v) { return __nv_bfloat16(v); }
static inline __nv_bfloat16 __ll2bfloat16_rn(long long v) { return __nv_bfloat16(v); }
static inline __nv_bfloat16 __ull2bfloat16_rn(unsigned long long v) { return __nv_bfloat16(v); }
static inline int __bfloat162int_rz(__nv_bfloat16 h) { return int(h); }
static inline long long __bfloat162ll_rz(__nv_bfloat16 h) { return (long long)h; }

static inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) {
    return __nv_bfloat16(float(a) + float(b));
}
static inline __nv_bfloat16 __hsub(__nv_bfloat16 a, __nv_bfloat16 b) {
    return __nv_bfloat16(float(a) - float(b));
}
static inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) {
    return __nv_bfloat16(float(a) * float(b));
}
static inline __nv_bfloat16 __hdiv(__nv_bfloat16 a, __nv_bfloat16 b) {
    return __nv_bfloat16(float(a) / float(b));
}
// One rounding: the product is exact in double, the sum rounded to odd (TwoSum recovers what
// the double addition lost), then rounded once to bf16.
static inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
    double p = (double)float(a) * (double)float(b), q = (double)float(c), s = p + q;
    double bp = s - q, err = (p - bp) + (q - (s - bp));
    if (err != 0 && s == s && !isinf(s)) {
        uint64_t u;
        memcpy(&u, &s, 8);
        if ((u & 1) == 0) s = nextafter(s, err > 0 ? INFINITY : -INFINITY);
    }
    return __nv_bfloat16(s);
}
static inline __nv_bfloat16 __hneg(__nv_bfloat16 a) { return __ushort_as_bfloat16(a.__x ^ 0x8000u); }
static inline __nv_bfloat16 __habs(__nv_bfloat16 a) { return __ushort_as_bfloat16(a.__x & 0x7fffu); }
// fmax/fmin semantics, as CUDA's: a NaN operand loses to a number.
static inline __nv_bfloat16 __hmax(__nv_bfloat16 a, __nv_bfloat16 b) {
    return __nv_bfloat16(fmaxf(float(a), float(b)));
}
static inline __nv_bfloat16 __hmin(__nv_bfloat16 a, __nv_bfloat16 b) {
    return __nv_bfloat16(fminf(float(a), float(b)));
}
static inline bool __hisnan(__nv_bfloat16 a) { return (a.__x & 0x7fffu) > 0x7f80u; }
static inline int __hisinf(__nv_bfloat16 a) {
    return a.__x == 0x7f80u ? 1 : a.__x == 0xff80u ? -1 : 0;
}
static inline __nv_bfloat16 hexp(__nv_bfloat16 a) { return __nv_bfloat16(expf(float(a))); }
static inline __nv_bfloat16 hlog(__nv_bfloat16 a) { return __nv_bfloat16(logf(float(a))); }
static inline __nv_bfloat16 hsqrt(__nv_bfloat16 a) { return __nv_bfloat16(sqrtf(float(a))); }
static inline __nv_bfloat16 hrsqrt(__nv_bfloat16 a) {
    return __nv_bfloat16(1.0f / sqrtf(float(a)));
}

static inline __nv_bfloat16 operator+(const __nv_bfloat16& a, const __nv_bfloat16& b) {
    return __hadd(a, b);
}
static inline __nv_bfloat16 operator-(const __nv_bfloat16& a, const __nv_bfloat16& b) {
    return __hsub(a, b);
}
static inline __nv_bfloat16 operator*(const __nv_bfloat16& a, const __nv_bfloat16& b) {
    return __hmul(a, b);
}
static inline __nv_bfloat16 operator/(const __nv_bfloat16& a, const __nv_bfloat16& b) {
    return __hdiv(a, b);
}
static inline __nv_bfloat16& operator+=(__nv_bfloat16& a, const __nv_bfloat16& b) {
    return a = a + b;
}
static inline __nv_bfloat16& operator-=(__nv_bfloat16& a, const __nv_bfloat16& b) {
    return a = a - b;
}
static inline __nv_bfloat16& operator*=(__nv_bfloat16& a, const __nv_bfloat16& b) {
    return a = a * b;
}
static inline __nv_bfloat16& operator/=(__nv_bfloat16& a, const __nv_bfloat16& b) {
    return a = a / b;
}
static inline __nv_bfloat16& operator++(__nv_bfloat16& a) { return a += __nv_bfloat16(1.0f); }
static inline __nv_bfloat16& operator--(__nv_bfloat16& a) { return a -= __nv_bfloat16(1.0f); }
static inline __nv_bfloat16 operator++(__nv_bfloat16& a, int) {
    __nv_bfloat16 old = a;
    ++a;
    return old;
}
static inline __nv_bfloat16 operator--(__nv_bfloat16& a, int) {
    __nv_bfloat16 old = a;
    --a;
    return old;
}
static inline __nv_bfloat16 operator+(const __nv_bfloat16& a) { return a; }
static inline __nv_bfloat16 operator-(const __nv_bfloat16& a) { return __hneg(a); }
static inline bool operator==(const __nv_bfloat16& a, const __nv_bfloat16& b) {
    return float(a) == float(b);
}
static inline bool operator!=(const __nv_bfloat16& a, const __nv_bfloat16& b) {
    return float(a) != float(b);
}
static inline bool operator<(const __nv_bfloat16& a, const __nv_bfloat16& b) {
    return float(a) < float(b);
}
static inline bool operator>(const __nv_bfloat16& a, const __nv_bfloat16& b) {
    return float(a) > float(b);
}
static inline bool operator<=(const __nv_bfloat16& a, const __nv_bfloat16& b) {
    return float(a) <= float(b);
}
static inline bool operator>=(const __nv_bfloat16& a, const __nv_bfloat16& b) {
    return float(a) >= float(b);
}
#define CUDART_INF_BF16 __ushort_as_bfloat16((unsigned short)0x7F80U)
#define CUDART_NAN_BF16 __ushort_as_bfloat16((unsigned short)0x7FFFU)
#define CUDART_MAX_NORMAL_BF16 __ushort_as_bfloat16((unsigned short)0x7F7FU)
#define CUDART_MIN_DENORM_BF16 __ushort_as_bfloat16((unsigned short)0x0001U)
#define CUDART_ZERO_BF16 __ushort_as_bfloat16((unsigned short)0x0000U)
#define CUDART_ONE_BF16 __ushort_as_bfloat16((unsigned short)0x3F80U)

// ---------------------------------------------------------------------------------------------
// Device functions: math (most come from <math.h>), intrinsics, integer min/max, atomics.

static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
// glibc declares exp10f and its internal __expf, __logf, ... itself; for CUDA's fast-math
// intrinsics of those names, macros send kernel code to functions of our own instead.
static inline float tcemu_expf(float x) { return expf(x); }
static inline float tcemu_exp10f(float x) { return powf(10.0f, x); }
static inline float tcemu_logf(float x) { return logf(x); }
static inline float tcemu_log2f(float x) { return log2f(x); }
static inline float tcemu_log10f(float x) { return log10f(x); }
static inline float tcemu_sinf(float x) { return sinf(x); }
static inline float tcemu_cosf(float x) { return cosf(x); }
static inline float tcemu_tanf(float x) { return tanf(x); }
static inline float tcemu_powf(float x, float y) { return powf(x, y); }
static inline void tcemu_sincosf(float x, float* s, float* c) { *s = sinf(x); *c = cosf(x); }
#define __expf tcemu_expf
#define __exp10f tcemu_exp10f
#define __logf tcemu_logf
#define __log2f tcemu_log2f
#define __log10f tcemu_log10f
#define __sinf tcemu_sinf
#define __cosf tcemu_cosf
#define __tanf tcemu_tanf
#define __powf tcemu_powf
#define __sincosf tcemu_sincosf
static inline float __fdividef(float x, float y) { return x / y; }
static inline float fdividef(float x, float y) { return x / y; }
static inline float __fadd_rn(float x, float y) { return x + y; }
static inline float __fsub_rn(float x, float y) { return x - y; }
static inline float __fmul_rn(float x, float y) { return x * y; }
static inline float __fdiv_rn(float x, float y) { return x / y; }
static inline float __fmaf_rn(float x, float y, float z) { return fmaf(x, y, z); }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
static inline float __saturatef(float x) { return x != x ? 0.0f : fminf(fmaxf(x, 0.0f), 1.0f); }
static inline double __dadd_rn(double x, double y) { return x + y; }
static inline double __dmul_rn(double x, double y) { return x * y; }
static inline double __fma_rn(double x, double y, double z) { return fma(x, y, z); }
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline int __float2int_rd(float x) { return (int)floorf(x); }
static inline int __float2int_ru(float x) { return (int)ceilf(x); }
static inline float __int2float_rn(int x) { return (float)x; }
static inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
static inline int __float_as_int(float x) { int i; memcpy(&i, &x, 4); return i; }
static inline unsigned __float_as_uint(float x) { unsigned i; memcpy(&i, &x, 4); return i; }
static inline float __uint_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __clzll(long long x) {
    return x == 0 ? 64 : __builtin_clzll((unsigned long long)x);
}
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
// The low 24 bits of each operand (sign-extended for __mul24), low 32 bits of the product.
static inline int __mul24(int x, int y) {
    long long a = (int)((unsigned)x << 8) >> 8, b = (int)((unsigned)y << 8) >> 8;
    return (int)(unsigned)(a * b);
}
static inline unsigned __umul24(unsigned x, unsigned y) {
    return (x & 0xffffffu) * (y & 0xffffffu);
}
static inline int __mulhi(int x, int y) { return (int)(((long long)x * y) >> 32); }
static inline unsigned __umulhi(unsigned x, unsigned y) {
    return (unsigned)(((unsigned long long)x * y) >> 32);
}

// Read-only cache loads are plain loads on a CPU.
template <class T> static inline T __ldg(const T* p) { return *p; }
template <class T> static inline T __ldcg(const T* p) { return *p; }
template <class T> static inline T __ldca(const T* p) { return *p; }
template <class T> static inline T __ldcs(const T* p) { return *p; }

// CUDA's min/max are overloaded for every pair of arithmetic types, with the usual arithmetic
// conversions (max(int, unsigned) is unsigned) and fmax/fmin semantics for floating point.
namespace tcemu {
template <class A, class B>
using arith_t = std::enable_if_t<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value,
                                 std::common_type_t<A, B>>;
}
template <class A, class B>
static inline tcemu::arith_t<A, B> max(A a, B b) {
    using C = tcemu::arith_t<A, B>;
    if constexpr (std::is_floating_point<C>::value) return fmax(C(a), C(b));
    else return C(a) < C(b) ? C(b) : C(a);
}
template <class A, class B>
static inline tcemu::arith_t<A, B> min(A a, B b) {
    using C = tcemu::arith_t<A, B>;
    if constexpr (std::is_floating_point<C>::value) return fmin(C(a), C(b));
    else return C(b) < C(a) ? C(b) : C(a);
}
static inline unsigned umin(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned umax(unsigned a, unsigned b) { return a < b ? b : a; }
static inline long long llmin(long long a, long long b) { return a < b ? a : b; }
static inline long long llmax(long long a, long long b) { return a < b ? b : a; }

namespace tcemu {
// Set when a launch used a floating-point atomic: their summation order is scheduling
// dependent on a GPU too, so the race check compares such results with a tolerance.
extern thread_local int float_atomics_used;
thread_local int float_atomics_used;
}  // namespace tcemu

// Fibers switch only at barriers and warp collectives, so a read-modify-write is atomic by
// construction. The value parameters take the pointee's type without deducing from them, so that
// (as with CUDA's overloads) `atomicMax(p, 0)` converts the 0.
namespace tcemu {
template <class T> struct same { typedef T type; };
template <class T> using same_t = typename same<T>::type;
}  // namespace tcemu
template <class T> static inline T tcemu_atomic_add(T* p, T v) {
    if (std::is_floating_point<T>::value) tcemu::float_atomics_used = 1;
    T old = *p; *p = old + v; return old;
}
static inline int atomicAdd(int* p, int v) { return tcemu_atomic_add(p, v); }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return tcemu_atomic_add(p, v); }
static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return tcemu_atomic_add(p, v);
}
static inline float atomicAdd(float* p, float v) { return tcemu_atomic_add(p, v); }
static inline double atomicAdd(double* p, double v) { return tcemu_atomic_add(p, v); }
#if defined(__FLT16_MAX__)
static inline half atomicAdd(half* p, half v) {
    tcemu::float_atomics_used = 1;
    half old = *p; *p = (half)((float)old + (float)v); return old;
}
#endif
static inline __nv_bfloat16 atomicAdd(__nv_bfloat16* p, __nv_bfloat16 v) {
    tcemu::float_atomics_used = 1;
    __nv_bfloat16 old = *p; *p = old + v; return old;
}
template <class T> static inline T atomicSub(T* p, tcemu::same_t<T> v) {
    T old = *p; *p = old - v; return old;
}
template <class T> static inline T atomicExch(T* p, tcemu::same_t<T> v) {
    T old = *p; *p = v; return old;
}
template <class T> static inline T atomicMax(T* p, tcemu::same_t<T> v) {
    T old = *p; *p = old < v ? v : old; return old;
}
template <class T> static inline T atomicMin(T* p, tcemu::same_t<T> v) {
    T old = *p; *p = v < old ? v : old; return old;
}
template <class T> static inline T atomicAnd(T* p, tcemu::same_t<T> v) {
    T old = *p; *p = old & v; return old;
}
template <class T> static inline T atomicOr(T* p, tcemu::same_t<T> v) {
    T old = *p; *p = old | v; return old;
}
template <class T> static inline T atomicXor(T* p, tcemu::same_t<T> v) {
    T old = *p; *p = old ^ v; return old;
}
// CAS loops are how CUDA code builds the floating-point atomics it lacks (min, max, products,
// half and bfloat16 on older GPUs); whatever they compute, their order is the scheduler's, so
// they count as floating-point atomics for the race check's tolerance (integer results are
// still compared exactly).
template <class T> static inline T atomicCAS(T* p, tcemu::same_t<T> cmp, tcemu::same_t<T> v) {
    static_assert(std::is_integral<T>::value && (sizeof(T) == 2 || sizeof(T) == 4 ||
                                                 sizeof(T) == 8),
                  "atomicCAS takes unsigned short, int, unsigned int or unsigned long long");
    tcemu::float_atomics_used = 1;
    T old = *p; if (old == cmp) *p = v; return old;
}

// A block's threads never run at the same time, so fences have nothing to order.
static inline void __threadfence() {}
static inline void __threadfence_block() {}
static inline void __threadfence_system() {}

// ---------------------------------------------------------------------------------------------
// Fibers and the block scheduler.

namespace tcemu {

enum FiberState { RUNNABLE = 0, WAITING = 1, DONE = 2 };
enum Status { OK = 0, DIVERGENT = 1, TRAPPED = 2, BAD_LAUNCH = 3, FAULT = 4, TIMED_OUT = 5 };
enum Order { FORWARD = 0, REVERSE = 1, SHUFFLE = 2 };

#ifndef TCEMU_UCONTEXT
// A hand-rolled switch for x86-64 (System V): save the callee-saved registers and the SSE/x87
// control words on the current stack, store the stack pointer, load the other one, restore.
// Unlike swapcontext it makes no signal-mask system call, which makes a switch ~10x cheaper.
// (emulate.py compiles without CET markers: a shadow stack would reject the return into a new
// fiber.)
extern "C" void tcemu_switch(void** save_sp, void* load_sp);
// push/popsection: the compiler does not expect top-level asm to change the current section.
__asm__(
    ".pushsection .text\n"
    ".p2align 4\n"
    ".type tcemu_switch, @function\n"
    "tcemu_switch:\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  subq $8, %rsp\n"
    "  stmxcsr (%rsp)\n"
    "  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n"
    "  fldcw 4(%rsp)\n"
    "  addq $8, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    ".size tcemu_switch, .-tcemu_switch\n"
    ".popsection\n");
#endif

struct Fiber {
    char* stack = nullptr;  // lowest address of the mapping; its first page is a guard page
#ifdef TCEMU_UCONTEXT
    ucontext_t ctx;
#else
    void* sp = nullptr;
#endif
    uint3 tid;
    int state = DONE;
    int site = 0;  // source line of the __syncthreads() the fiber waits at
};

typedef void (*Invoker)(void** args);

struct Scheduler {
    Fiber* fibers = nullptr;
    size_t capacity = 0;
    size_t stack_size = 0;
#ifdef TCEMU_UCONTEXT
    ucontext_t main_ctx;
#else
    void* main_sp = nullptr;
#endif
    Fiber* current = nullptr;
    size_t page = 0;
    char* signal_stack = nullptr;  // where the fault handler runs: a fiber's stack may be full
    Invoker invoke = nullptr;
    void** args = nullptr;
    int status = OK;
    char* message = nullptr;
    size_t message_len = 0;
    double time_limit = 0;  // seconds; 0: none
    // Written by the time limit's signal handler: whether the running fiber is in kernel code
    // (not switching, not in the runtime), so that the handler may abandon it.
    volatile sig_atomic_t in_kernel = 0;
    volatile sig_atomic_t timed_out = 0;

    ~Scheduler() {  // a Python thread that ran kernels and ends gives its stacks back
        for (size_t i = 0; i < capacity; ++i)
            if (fibers[i].stack) munmap(fibers[i].stack, stack_size + page);
        free(fibers);
        free(signal_stack);
    }
};

// One scheduler per OS thread, so launches from several Python threads do not meet. Fiber
// stacks are mapped once per thread slot and reused by every block and launch.
extern thread_local Scheduler sched;
thread_local Scheduler sched;

static inline void to_scheduler() {
    Fiber* f = sched.current;
    sched.in_kernel = 0;
#ifdef TCEMU_UCONTEXT
    swapcontext(&f->ctx, &sched.main_ctx);
#else
    tcemu_switch(&f->sp, sched.main_sp);
#endif
    sched.in_kernel = 1;  // resumed: back in the kernel's code
}

static void fiber_main() {
    sched.in_kernel = 1;
    sched.invoke(sched.args);
    sched.in_kernel = 0;
    sched.current->state = DONE;
    to_scheduler();
    abort();  // a finished fiber is never resumed
}

#ifdef TCEMU_UCONTEXT
static void fiber_entry_uc() { fiber_main(); }
#else
static void fiber_entry_asm() { fiber_main(); }
#endif

static inline void fail(int status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void fail(int status, const char* fmt, ...) {
    if (sched.status == OK) {
        sched.status = status;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(sched.message, sched.message_len, fmt, ap);
        va_end(ap);
    }
}

static inline bool ensure_fibers(size_t n, size_t stack_size) {
    long page = sysconf(_SC_PAGESIZE);
    sched.page = (size_t)page;
    stack_size = (stack_size + page - 1) / page * page;
    if (sched.stack_size != stack_size) {  // a different stack size: start the pool afresh
        for (size_t i = 0; i < sched.capacity; ++i)
            if (sched.fibers[i].stack) munmap(sched.fibers[i].stack, sched.stack_size + page);
        free(sched.fibers);
        sched.fibers = nullptr;
        sched.capacity = 0;
        sched.stack_size = stack_size;
    }
    if (n <= sched.capacity) return true;
    Fiber* fibers = (Fiber*)realloc(sched.fibers, n * sizeof(Fiber));
    if (!fibers) return false;
    sched.fibers = fibers;
    for (size_t i = sched.capacity; i < n; ++i) {
        new (&fibers[i]) Fiber();
        void* m = mmap(nullptr, stack_size + page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) { sched.capacity = i; return false; }
        // A stack overflow then faults at once instead of overwriting the next thread's stack.
        mprotect(m, page, PROT_NONE);
        fibers[i].stack = (char*)m;
        sched.capacity = i + 1;
    }
    return true;
}

static inline void start_fiber(Fiber& f) {
    char* base = f.stack + sched.page;
#ifdef TCEMU_UCONTEXT
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = base;
    f.ctx.uc_stack.ss_size = sched.stack_size;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_entry_uc, 0);
#else
    // The frame tcemu_switch pops: control words, six registers, then the return address.
    // At the entry function rsp must be 8 mod 16, as after a call; the slot above the return
    // address stands in for the entry function's own (never used) return address.
    uintptr_t top = ((uintptr_t)(base + sched.stack_size)) & ~(uintptr_t)15;
    uint64_t* sp = (uint64_t*)top;
    *--sp = 0;  // fiber_entry_asm's fake return address: rsp = 8 mod 16 at its entry
    *--sp = (uint64_t)(uintptr_t)&fiber_entry_asm;
    for (int i = 0; i < 6; ++i) *--sp = 0;  // rbp rbx r12 r13 r14 r15
    *--sp = 0;
    uint32_t mxcsr;
    uint16_t fpucw;
    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(fpucw));
    memcpy((char*)sp, &mxcsr, 4);
    memcpy((char*)sp + 4, &fpucw, 2);
    f.sp = sp;
#endif
}

static inline void resume(Fiber& f) {
    sched.current = &f;
    threadIdx = f.tid;
#ifdef TCEMU_UCONTEXT
    swapcontext(&sched.main_ctx, &f.ctx);
#else
    tcemu_switch(&sched.main_sp, f.sp);
#endif
    sched.current = nullptr;
}

// A small deterministic generator for the shuffled orders (xorshift64*).
static inline uint64_t next_random(uint64_t& s) {
    s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
    return s * 2685821657736338717ull;
}

static inline void make_order(size_t* order, size_t n, int kind, uint64_t& rng) {
    for (size_t i = 0; i < n; ++i) order[i] = kind == REVERSE ? n - 1 - i : i;
    if (kind == SHUFFLE)
        for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[next_random(rng) % i]);
}

static inline const char* describe(const Fiber& f, char* buf, size_t len) {
    snprintf(buf, len, "(%u,%u,%u)", f.tid.x, f.tid.y, f.tid.z);
    return buf;
}

static inline void time_is_up() {
    uint3 bi = blockIdx;
    fail(TIMED_OUT, "the launch ran longer than its time limit of %g s (in block (%u,%u,%u))",
         sched.time_limit, bi.x, bi.y, bi.z);
}

// Runs one block to completion; false (with sched.status set) on an error.
static bool run_block(size_t nthreads, size_t* order, int kind, uint64_t& rng) {
    dim3 bd = blockDim;
    for (size_t i = 0; i < nthreads; ++i) {
        Fiber& f = sched.fibers[i];
        // x varies fastest, as in CUDA's linear thread index.
        f.tid = uint3{unsigned(i % bd.x), unsigned(i / bd.x % bd.y),
                      unsigned(i / (size_t(bd.x) * bd.y))};
        f.state = RUNNABLE;
        f.site = 0;
        start_fiber(f);
    }
    for (int phase = 0;; ++phase) {
        make_order(order, nthreads, kind, rng);
        for (size_t k = 0; k < nthreads; ++k) {
            Fiber& f = sched.fibers[order[k]];
            if (f.state != RUNNABLE) continue;
            resume(f);
            if (sched.status == OK && sched.timed_out) time_is_up();
            if (sched.status != OK) return false;
        }
        // The phase is over: every fiber waits at a barrier or has returned.
        const Fiber *waiting = nullptr, *done = nullptr, *other_site = nullptr;
        for (size_t i = 0; i < nthreads; ++i) {
            const Fiber& f = sched.fibers[i];
            if (f.state == DONE) { if (!done) done = &f; continue; }
            if (!waiting) waiting = &f;
            else if (f.site != waiting->site && !other_site) other_site = &f;
        }
        if (!waiting) return true;
        char a[48], b[48];
        uint3 bi = blockIdx;
        if (done) {
            fail(DIVERGENT,
                 "divergent __syncthreads in block (%u,%u,%u): thread %s waits at the "
                 "__syncthreads() on line %d (barrier %d of the block) while thread %s has "
                 "returned",
                 bi.x, bi.y, bi.z, describe(*waiting, a, sizeof a), waiting->site, phase + 1,
                 describe(*done, b, sizeof b));
            return false;
        }
        if (other_site) {
            fail(DIVERGENT,
                 "divergent __syncthreads in block (%u,%u,%u): thread %s waits at the "
                 "__syncthreads() on line %d while thread %s waits at the one on line %d",
                 bi.x, bi.y, bi.z, describe(*waiting, a, sizeof a), waiting->site,
                 describe(*other_site, b, sizeof b), other_site->site);
            return false;
        }
        for (size_t i = 0; i < nthreads; ++i)
            if (sched.fibers[i].state == WAITING) sched.fibers[i].state = RUNNABLE;
    }
}

static inline void barrier(int site) {
    Fiber* f = sched.current;
    f->state = WAITING;
    f->site = site;
    __asm__ volatile("" ::: "memory");  // shared memory may change while this fiber sleeps
    to_scheduler();
    __asm__ volatile("" ::: "memory");
}

static inline void trap(const char* what, const char* file, int line) {
    char a[48];
    uint3 bi = blockIdx;
    fail(TRAPPED, "%s in block (%u,%u,%u), thread %s (%s:%d)", what, bi.x, bi.y, bi.z,
         describe(*sched.current, a, sizeof a), file, line);
    to_scheduler();  // never resumed: the launch is abandoned
    abort();
}

// ---------------------------------------------------------------------------------------------
// Faults. A kernel that dereferences a wild pointer, divides an integer by zero or overflows
// its stack would take the Python process down; during a launch, SIGSEGV, SIGBUS and SIGFPE in
// a fiber end the launch with an error instead (the fiber is abandoned, like a trapped one).
// The handler is process-wide, so it finds the faulting thread's launch in a registry it can
// read without thread-local storage, and passes faults of other threads to the previous handler.

static const int fault_signals[3] = {SIGSEGV, SIGBUS, SIGFPE};
static struct sigaction previous_actions[3];
static pthread_mutex_t fault_mutex = PTHREAD_MUTEX_INITIALIZER;
static int fault_users = 0;
struct ActiveLaunch { pthread_t thread; Scheduler* sched; };
static ActiveLaunch active_launches[64];
static const size_t SIGNAL_STACK_SIZE = 64 * 1024;

static Scheduler* active_scheduler() {
    pthread_t self = pthread_self();
    for (ActiveLaunch& a : active_launches) {
        Scheduler* s = __atomic_load_n(&a.sched, __ATOMIC_ACQUIRE);
        if (s && pthread_equal(a.thread, self)) return s;
    }
    return nullptr;
}

static void on_fault(int sig, siginfo_t* info, void* context) {
    Scheduler* s = active_scheduler();
    if (!s || !s->current) {
        // Not a kernel's fault: hand it to whoever handled it before, or to the default action
        // (which then runs when the faulting instruction faults again).
        int k = sig == SIGSEGV ? 0 : sig == SIGBUS ? 1 : 2;
        const struct sigaction& old = previous_actions[k];
        if ((old.sa_flags & SA_SIGINFO) && old.sa_sigaction) {
            old.sa_sigaction(sig, info, context);
            return;
        }
        if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler != SIG_DFL &&
            old.sa_handler != SIG_IGN) {
            old.sa_handler(sig);
            return;
        }
        signal(sig, SIG_DFL);
        return;
    }
    Fiber* f = s->current;
    uintptr_t addr = (uintptr_t)info->si_addr, guard = (uintptr_t)f->stack;
    uint3 bi = blockIdx;
    char t[48];
    describe(*f, t, sizeof t);
    if (sig == SIGSEGV && addr >= guard && addr < guard + s->page)
        fail(FAULT, "stack overflow in block (%u,%u,%u), thread %s: its stack has %zu bytes "
             "(pass a larger stack_size)", bi.x, bi.y, bi.z, t, s->stack_size);
    else if (sig == SIGFPE)
        fail(FAULT, "arithmetic exception (%s) in block (%u,%u,%u), thread %s",
             info->si_code == FPE_INTDIV ? "integer division by zero" : "integer overflow",
             bi.x, bi.y, bi.z, t);
    else
        fail(FAULT, "invalid memory access at %p in block (%u,%u,%u), thread %s",
             info->si_addr, bi.x, bi.y, bi.z, t);
    // Leave the handler by switching to the scheduler; SA_NODEFER left the signal unblocked.
    to_scheduler();
}

// The time limit. A watchdog thread signals the launching thread when the limit has passed, and
// again every 50 ms until the launch ends: a fiber running kernel code is abandoned like a
// faulting one; anywhere else (switching fibers, in the runtime) the handler only sets
// `timed_out`, which the scheduler checks after every fiber it resumes.

static int timeout_signal() { return SIGRTMIN + 7; }
static struct sigaction previous_timeout_action;

static void on_timeout(int) {
    Scheduler* s = active_scheduler();
    if (!s) return;
    s->timed_out = 1;
    if (!s->in_kernel || !s->current) return;
    s->in_kernel = 0;
    char t[48];
    uint3 bi = blockIdx;
    fail(TIMED_OUT, "the launch ran longer than its time limit of %g s (in block (%u,%u,%u), "
         "thread %s)", s->time_limit, bi.x, bi.y, bi.z, describe(*s->current, t, sizeof t));
    to_scheduler();
}

struct Watchdog {
    pthread_t thread, target;
    pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t wake;
    bool stop = false, running = false;
    struct timespec deadline;

    explicit Watchdog(double seconds) {
        if (!(seconds > 0) || seconds > 1e9) return;  // no limit
        pthread_condattr_t attr;
        pthread_condattr_init(&attr);
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        pthread_cond_init(&wake, &attr);
        pthread_condattr_destroy(&attr);
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        advance(seconds);
        target = pthread_self();
        running = pthread_create(&thread, nullptr, main, this) == 0;
        if (!running) pthread_cond_destroy(&wake);
    }

    void advance(double seconds) {
        long long ns = deadline.tv_nsec + (long long)((seconds - (long long)seconds) * 1e9);
        deadline.tv_sec += (time_t)seconds + (time_t)(ns / 1000000000);
        deadline.tv_nsec = (long)(ns % 1000000000);
    }

    static void* main(void* self) {
        Watchdog* w = (Watchdog*)self;
        pthread_mutex_lock(&w->mutex);
        while (!w->stop) {
            if (pthread_cond_timedwait(&w->wake, &w->mutex, &w->deadline) == ETIMEDOUT &&
                !w->stop) {
                pthread_kill(w->target, timeout_signal());
                w->advance(0.05);
            }
        }
        pthread_mutex_unlock(&w->mutex);
        return nullptr;
    }

    ~Watchdog() {  // before the handler goes: a signal it sent has been handled once joined
        if (!running) return;
        pthread_mutex_lock(&mutex);
        stop = true;
        pthread_cond_signal(&wake);
        pthread_mutex_unlock(&mutex);
        pthread_join(thread, nullptr);
        pthread_cond_destroy(&wake);
    }
};

struct FaultGuard {
    int slot = -1;
    stack_t old_stack;
    bool stack_set = false;

    FaultGuard() {
        if (!sched.signal_stack) sched.signal_stack = (char*)malloc(SIGNAL_STACK_SIZE);
        pthread_mutex_lock(&fault_mutex);
        if (fault_users++ == 0) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_sigaction = on_fault;
            sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
            sigemptyset(&sa.sa_mask);
            for (int k = 0; k < 3; ++k) sigaction(fault_signals[k], &sa, &previous_actions[k]);
            sa.sa_handler = on_timeout;
            sa.sa_flags = SA_ONSTACK | SA_NODEFER;
            sigaction(timeout_signal(), &sa, &previous_timeout_action);
        }
        for (int i = 0; i < 64; ++i)
            if (!active_launches[i].sched) {
                active_launches[i].thread = pthread_self();
                __atomic_store_n(&active_launches[i].sched, &sched, __ATOMIC_RELEASE);
                slot = i;
                break;
            }
        pthread_mutex_unlock(&fault_mutex);
        // The thread's own alternate stack (Python's faulthandler has one) comes back afterwards.
        if (sched.signal_stack) {
            stack_t ss;
            ss.ss_sp = sched.signal_stack;
            ss.ss_size = SIGNAL_STACK_SIZE;
            ss.ss_flags = 0;
            stack_set = sigaltstack(&ss, &old_stack) == 0;
        }
    }

    ~FaultGuard() {
        if (stack_set) sigaltstack(&old_stack, nullptr);
        pthread_mutex_lock(&fault_mutex);
        if (slot >= 0)
            __atomic_store_n(&active_launches[slot].sched, (Scheduler*)nullptr, __ATOMIC_RELEASE);
        if (--fault_users == 0) {
            for (int k = 0; k < 3; ++k) {
                struct sigaction current;
                sigaction(fault_signals[k], nullptr, &current);
                if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_fault)
                    sigaction(fault_signals[k], &previous_actions[k], nullptr);
            }
            struct sigaction current;
            sigaction(timeout_signal(), nullptr, &current);
            if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == on_timeout)
                sigaction(timeout_signal(), &previous_timeout_action, nullptr);
        }
        pthread_mutex_unlock(&fault_mutex);
    }
};

// Runs a whole grid. `block_order`/`thread_order` pick FORWARD, REVERSE or SHUFFLE.
// `time_limit`: seconds (0: none).
static int launch(Invoker invoke, void** args, const long long* grid, const long long* block,
                  int block_order, int thread_order, unsigned long long seed, long long stack_size,
                  double time_limit, char* message, long long message_len, int* flags) {
    sched.invoke = invoke;
    sched.args = args;
    sched.status = OK;
    sched.message = message;
    sched.message_len = (size_t)message_len;
    sched.time_limit = time_limit;
    sched.in_kernel = 0;
    sched.timed_out = 0;
    if (message_len > 0) message[0] = 0;
    float_atomics_used = 0;
    FaultGuard guard;
    Watchdog watchdog(time_limit);  // declared after the guard: gone before its handler
    size_t nthreads = (size_t)block[0] * block[1] * block[2];
    size_t nblocks = (size_t)grid[0] * grid[1] * grid[2];
    if (!ensure_fibers(nthreads, (size_t)stack_size)) {
        fail(BAD_LAUNCH, "cannot allocate %zu fiber stacks of %lld bytes", nthreads, stack_size);
        return sched.status;
    }
    size_t* order = (size_t*)malloc(sizeof(size_t) * (nthreads > nblocks ? nthreads : nblocks));
    size_t* border = (size_t*)malloc(sizeof(size_t) * nblocks);
    if (!order || !border) {
        free(order);
        free(border);
        fail(BAD_LAUNCH, "out of memory");
        return sched.status;
    }
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    if (rng == 0) rng = 1;
    make_order(border, nblocks, block_order, rng);
    gridDim = dim3((unsigned)grid[0], (unsigned)grid[1], (unsigned)grid[2]);
    blockDim = dim3((unsigned)block[0], (unsigned)block[1], (unsigned)block[2]);
    for (size_t k = 0; k < nblocks; ++k) {
        if (sched.timed_out) {
            time_is_up();
            break;
        }
        size_t b = border[k];
        blockIdx = uint3{unsigned(b % grid[0]), unsigned(b / grid[0] % grid[1]),
                         unsigned(b / (size_t(grid[0]) * grid[1]))};
        if (!run_block(nthreads, order, thread_order, rng)) break;
    }
    free(order);
    free(border);
    *flags = float_atomics_used ? 1 : 0;
    return sched.status;
}

}  // namespace tcemu

#define __syncthreads() ::tcemu::barrier(__LINE__)
#define __trap() ::tcemu::trap("__trap()", __FILE__, __LINE__)
// Kernel asserts end the launch with an error instead of aborting the host process.
#undef assert
#define assert(e) ((e) ? (void)0 : ::tcemu::trap("assertion '" #e "' failed", __FILE__, __LINE__))
