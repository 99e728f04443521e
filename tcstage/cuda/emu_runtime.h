// CPU runtime for emulating one CUDA kernel launch (see tcstage/cuda/emulate.py).
//
// Every CUDA thread of a block is a cooperative fiber on the calling OS thread. The block's
// scheduler resumes each fiber in turn until it reaches __syncthreads() or returns; when every
// fiber has stopped, one barrier phase is over and the next begins. Blocks run one after another.
// A fiber that reaches a warp collective (shuffle, vote, __syncwarp, tensor core step) stops too,
// and its warp then runs alone until the phase ends for all its lanes (run_warp), so a phase is a
// serialisation of the block's warps (or threads, without collectives) in the scheduler's order:
// running the kernel under different orders and comparing the results exposes the races that
// change the result (the Python side does the comparing).
//
// __shared__ variables become `static thread_local`: one copy per OS thread, hence per block
// being run, shared by that block's fibers. threadIdx is a thread_local the scheduler rewrites
// before each switch, so each fiber sees its own value. Faults in a fiber (SIGSEGV, SIGBUS,
// SIGFPE) end the launch with an error instead of the process; see FaultGuard. A launch that
// runs past its time limit ends the same way; see Watchdog.
#pragma once

// Defined in every translation unit the emulator compiles: device code written for both (such as
// tcstage/cuda/device_lib.py's) chooses its emulated paths with `#if defined(TCEMU)`.
#define TCEMU 1

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
static inline unsigned short __half_as_ushort(half h) {
    unsigned short u; memcpy(&u, &h, 2); return u;
}
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
// CUDA's __bfloat162int_rz and friends: truncate, saturate; NaN -> 0 for types of up to 32
// bits, and 0x8000000000000000 for the 64-bit ones (as CUDA's documentation of __bfloat162ll_rz
// and __bfloat162ull_rz says, and an H200 gave for (long long) of a bfloat16 NaN).
template <class I> static inline I float_to_integer_rz(float f) {
    if (f != f) return sizeof(I) == 8 ? (I)(1ull << 63) : (I)0;
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
static inline __nv_bfloat16 __hneg(__nv_bfloat16 a) {
    return __ushort_as_bfloat16(a.__x ^ 0x8000u);
}
static inline __nv_bfloat16 __habs(__nv_bfloat16 a) {
    return __ushort_as_bfloat16(a.__x & 0x7fffu);
}
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
static inline double __dsub_rn(double x, double y) { return x - y; }
static inline double __dmul_rn(double x, double y) { return x * y; }
static inline double __ddiv_rn(double x, double y) { return x / y; }
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

// WAITING: at a __syncthreads(); AT_WARP: at a warp collective (shuffle, vote, __syncwarp, mma).
enum FiberState { RUNNABLE = 0, WAITING = 1, DONE = 2, AT_WARP = 3 };
// The warp collectives. The shuffle kinds are in PTX's mode order.
enum Collective {
    SHFL_IDX = 0, SHFL_UP = 1, SHFL_DOWN = 2, SHFL_XOR = 3, SYNCWARP, BALLOT, VOTE_ANY, VOTE_ALL,
    ACTIVEMASK, REDUCE_ADD, REDUCE_MIN, REDUCE_MAX, REDUCE_AND, REDUCE_OR, REDUCE_XOR,
    MMA_M16N8K16_BF16, MMA_M16N8K16_F16, COLLECTIVE_KINDS
};
static const char* const collective_names[COLLECTIVE_KINDS] = {
    "__shfl_sync()", "__shfl_up_sync()", "__shfl_down_sync()", "__shfl_xor_sync()",
    "__syncwarp()", "__ballot_sync()", "__any_sync()", "__all_sync()", "__activemask()",
    "__reduce_add_sync()", "__reduce_min_sync()", "__reduce_max_sync()", "__reduce_and_sync()",
    "__reduce_or_sync()", "__reduce_xor_sync()", "mma.sync.m16n8k16 (bf16)",
    "mma.sync.m16n8k16 (f16)"};
static const unsigned FULL_MASK = 0xffffffffu;
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
    int site = 0;  // source line of the __syncthreads() or warp collective the fiber waits at
    // What it brings to the warp collective it waits at (state AT_WARP), and what it gets back:
    // a shuffle's value travels as its bytes in a 64-bit word; an mma's operands by pointer.
    int kind = 0;
    int call = 0;   // which call site (__COUNTER__ there): two on one line differ
    unsigned mask = 0;
    int arg = 0;    // source lane, delta or lane mask; for __reduce_{min,max}: signed or not
    int width = 32;
    uint64_t value = 0, result = 0;
    const void* in = nullptr;
    void* out = nullptr;
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
    size_t nthreads = 0;  // of the block being run
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
// stacks are mapped once per thread slot and reused by every block of a launch, and given back
// when it ends: this runtime is compiled into every kernel's library, which stays loaded, so a
// pool kept between launches was one per kernel ever launched (a fuzz campaign's process held
// 30000 stacks of 900 kernels and reached the kernel's limit on memory mappings).
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

static inline void release_fibers() {
    for (size_t i = 0; i < sched.capacity; ++i)
        if (sched.fibers[i].stack) munmap(sched.fibers[i].stack, sched.stack_size + sched.page);
    free(sched.fibers);
    sched.fibers = nullptr;
    sched.capacity = 0;
}

static inline bool ensure_fibers(size_t n, size_t stack_size) {
    long page = sysconf(_SC_PAGESIZE);
    sched.page = (size_t)page;
    stack_size = (stack_size + page - 1) / page * page;
    if (sched.stack_size != stack_size) {  // a different stack size: start the pool afresh
        release_fibers();
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

// Resumes a runnable fiber until it stops; false (with sched.status set) on an error.
static inline bool step(Fiber& f) {
    resume(f);
    if (sched.status == OK && sched.timed_out) time_is_up();
    return sched.status == OK;
}

// ---------------------------------------------------------------------------------------------
// Warps. A warp is 32 consecutive linear thread ids of the block (x fastest), its last one
// possibly partial. A lane that reaches a warp collective stops (state AT_WARP); the block's
// scheduler then runs that warp alone, its lanes in the phase's order, until every lane waits at
// a barrier, has returned or waits at a collective, resolves the collectives whose lanes have all
// arrived, and goes on until none is left; so within a barrier phase the warps still run one
// after another, and the forward and reverse orders still reverse the order of any two warps.

static inline unsigned lane_of(const Fiber& f) { return unsigned((&f - sched.fibers) % 32); }

static inline unsigned lanes_of_warp(size_t first) {  // the lanes that exist, as a mask
    size_t count = std::min<size_t>(32, sched.nthreads - first);
    return count == 32 ? FULL_MASK : (1u << count) - 1;
}

// The source lane of a shuffle, as PTX's shfl.sync computes it from CUDA's width (its clamp and
// segment mask); a lane outside the segment reads its own value.
static inline unsigned shuffle_source(int kind, unsigned lane, int arg, int width) {
    unsigned seg = 32u - (unsigned)width, b = (unsigned)arg & 31u;
    unsigned lo = lane & seg, hi = kind == SHFL_UP ? lo : lo | (31u & ~seg);
    int j;
    bool ok;
    switch (kind) {
        case SHFL_UP: j = (int)lane - (int)b; ok = j >= (int)hi; break;
        case SHFL_DOWN: j = (int)(lane + b); ok = j <= (int)hi; break;
        case SHFL_XOR: j = (int)(lane ^ b); ok = j <= (int)hi; break;
        default: j = (int)(lo | (b & ~seg)); ok = j <= (int)hi; break;
    }
    return ok ? (unsigned)j : lane;
}

static void resolve_mma(Fiber* lanes, int kind);  // below, with the tensor core emulation

// Gives each lane of one complete collective its result; `m`: the lanes, all waiting at it.
static void resolve(Fiber* lanes, unsigned m) {
    Fiber& first = lanes[__builtin_ctz(m)];
    int kind = first.kind;
    if (kind <= SHFL_XOR) {
        for (unsigned r = m; r; r &= r - 1) {
            Fiber& f = lanes[__builtin_ctz(r)];
            unsigned src = shuffle_source(kind, lane_of(f), f.arg, f.width);
            // Reading a lane the mask leaves out is undefined in CUDA. A lane past the block's
            // threads reads 0 here, as on an H200 (2026-11-26); one that exists, its own value.
            f.result = (m >> src & 1) ? lanes[src].value
                     : size_t(lanes - sched.fibers) + src >= sched.nthreads ? 0 : f.value;
        }
    } else if (kind == MMA_M16N8K16_BF16 || kind == MMA_M16N8K16_F16) {
        resolve_mma(lanes, kind);
    } else if (kind != SYNCWARP) {
        uint64_t acc = 0;
        unsigned votes = 0;
        bool is_signed = first.arg != 0, seen = false;
        for (unsigned r = m; r; r &= r - 1) {
            unsigned i = __builtin_ctz(r);
            uint64_t v = lanes[i].value;
            if (v) votes |= 1u << i;
            uint32_t u = (uint32_t)v;
            int32_t sv = (int32_t)u;
            switch (kind) {
                case REDUCE_ADD: acc = (uint32_t)(acc + u); break;
                case REDUCE_AND: acc = seen ? (acc & u) : u; break;
                case REDUCE_OR: acc |= u; break;
                case REDUCE_XOR: acc ^= u; break;
                case REDUCE_MIN:
                    if (!seen || (is_signed ? sv < (int32_t)acc : u < (uint32_t)acc)) acc = u;
                    break;
                case REDUCE_MAX:
                    if (!seen || (is_signed ? sv > (int32_t)acc : u > (uint32_t)acc)) acc = u;
                    break;
            }
            seen = true;
        }
        uint64_t result = kind == BALLOT ? votes : kind == VOTE_ANY ? votes != 0
                        : kind == VOTE_ALL ? votes == m : acc;
        for (unsigned r = m; r; r &= r - 1) lanes[__builtin_ctz(r)].result = result;
    }
    for (unsigned r = m; r; r &= r - 1) lanes[__builtin_ctz(r)].state = RUNNABLE;
}

static void report_stuck_warp(Fiber* lanes, unsigned pending) {
    Fiber& a = lanes[__builtin_ctz(pending)];
    char ta[48], tb[48];
    describe(a, ta, sizeof ta);
    uint3 bi = blockIdx;
    for (unsigned r = a.mask; r; r &= r - 1) {
        Fiber& b = lanes[__builtin_ctz(r)];
        describe(b, tb, sizeof tb);
        if (b.state == DONE) {
            fail(DIVERGENT, "warp collective waits for a thread that has returned, in block "
                 "(%u,%u,%u): thread %s waits at the %s on line %d with mask 0x%08x, which names "
                 "lane %u, thread %s, which has returned", bi.x, bi.y, bi.z, ta,
                 collective_names[a.kind], a.site, a.mask, lane_of(b), tb);
            return;
        }
        if (b.state == WAITING) {
            fail(DIVERGENT, "divergent warp collective in block (%u,%u,%u): thread %s waits at the "
                 "%s on line %d with mask 0x%08x, while lane %u of its warp, thread %s, waits at "
                 "the __syncthreads() on line %d", bi.x, bi.y, bi.z, ta,
                 collective_names[a.kind], a.site, a.mask, lane_of(b), tb, b.site);
            return;
        }
        if (b.state == AT_WARP &&
            (b.kind != a.kind || b.mask != a.mask || (b.call != a.call && a.kind != SYNCWARP))) {
            fail(DIVERGENT, "divergent warp collective in block (%u,%u,%u): thread %s waits at the "
                 "%s on line %d with mask 0x%08x, while lane %u of its warp, thread %s, waits at "
                 "the %s on line %d with mask 0x%08x", bi.x, bi.y, bi.z, ta,
                 collective_names[a.kind], a.site, a.mask, lane_of(b), tb,
                 collective_names[b.kind], b.site, b.mask);
            return;
        }
    }
    fail(DIVERGENT, "divergent warp collective in block (%u,%u,%u): thread %s waits at the %s on "
         "line %d with mask 0x%08x forever", bi.x, bi.y, bi.z, ta, collective_names[a.kind],
         a.site, a.mask);
}

// Resolves every collective of the warp whose lanes have all arrived. 1: some were; 0: no lane
// waits at one; -1: lanes wait at collectives that can never complete (an error is set).
static int resolve_warp(Fiber* lanes, size_t count) {
    unsigned pending = 0;
    for (size_t i = 0; i < count; ++i)
        if (lanes[i].state == AT_WARP) pending |= 1u << i;
    if (!pending) return 0;
    bool progressed = false;
    for (unsigned left = pending; left;) {
        Fiber& a = lanes[__builtin_ctz(left)];
        if (a.kind == ACTIVEMASK) {
            // The lanes at the same __activemask() together are the active ones.
            unsigned group = 0;
            for (unsigned r = pending; r; r &= r - 1) {
                const Fiber& b = lanes[__builtin_ctz(r)];
                if (b.kind == ACTIVEMASK && b.call == a.call) group |= 1u << __builtin_ctz(r);
            }
            for (unsigned r = group; r; r &= r - 1) {
                lanes[__builtin_ctz(r)].result = group;
                lanes[__builtin_ctz(r)].state = RUNNABLE;
            }
            left &= ~group;
            pending &= ~group;
            progressed = true;
            continue;
        }
        unsigned m = a.mask;
        bool complete = (m & ~pending) == 0;
        for (unsigned r = m; complete && r; r &= r - 1) {
            const Fiber& b = lanes[__builtin_ctz(r)];
            complete = b.kind == a.kind && b.mask == m && (b.call == a.call || a.kind == SYNCWARP);
        }
        if (complete) {
            resolve(lanes, m);
            left &= ~m;
            pending &= ~m;
            progressed = true;
        } else {
            left &= left - 1;
        }
    }
    if (progressed) return 1;
    report_stuck_warp(lanes, pending);
    return -1;
}

// Runs the warp of lane `first` alone until none of its lanes waits at a collective.
static bool run_warp(size_t first, const size_t* rank) {
    Fiber* lanes = sched.fibers + first;
    size_t count = std::min<size_t>(32, sched.nthreads - first);
    size_t sweep[32];  // the lanes in the phase's order
    for (size_t i = 0; i < count; ++i) {
        size_t j = i;
        for (; j > 0 && rank[first + sweep[j - 1]] > rank[first + i]; --j) sweep[j] = sweep[j - 1];
        sweep[j] = i;
    }
    for (;;) {
        for (size_t k = 0; k < count; ++k) {
            Fiber& f = lanes[sweep[k]];
            if (f.state == RUNNABLE && !step(f)) return false;
        }
        int r = resolve_warp(lanes, count);
        if (r <= 0) return r == 0;
    }
}

// Runs one block to completion; false (with sched.status set) on an error.
static bool run_block(size_t nthreads, size_t* order, size_t* rank, int kind, uint64_t& rng) {
    dim3 bd = blockDim;
    sched.nthreads = nthreads;
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
        for (size_t k = 0; k < nthreads; ++k) rank[order[k]] = k;
        for (size_t k = 0; k < nthreads; ++k) {
            Fiber& f = sched.fibers[order[k]];
            if (f.state != RUNNABLE) continue;
            if (!step(f)) return false;
            // At a warp collective: its warp runs on alone to the end of the phase.
            if (f.state == AT_WARP && !run_warp(order[k] / 32 * 32, rank)) return false;
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

// A lane arrives at a warp collective and waits until its warp's scheduler resolves it.
// `site`: its source line (for messages); `call`: which call site it is.
static uint64_t warp_collective(int kind, int site, int call, unsigned mask, int arg, int width,
                                uint64_t value, const void* in = nullptr, void* out = nullptr) {
    Fiber* f = sched.current;
    unsigned lane = lane_of(*f);
    size_t first = size_t(f - sched.fibers) - lane;
    const char* what = collective_names[kind];
    char t[48];
    uint3 bi = blockIdx;
    if (kind == ACTIVEMASK) {
        mask = 0;
    } else if (!(mask >> lane & 1)) {
        fail(DIVERGENT, "%s on line %d in block (%u,%u,%u), thread %s: its mask 0x%08x does not "
             "name the calling lane %u", what, site, bi.x, bi.y, bi.z,
             describe(*f, t, sizeof t), mask, lane);
    } else if (mask & ~lanes_of_warp(first)) {
        fail(DIVERGENT, "%s on line %d in block (%u,%u,%u), thread %s: its mask 0x%08x names "
             "lanes past the block's %zu threads (warp %zu has lanes 0x%08x)", what, site, bi.x,
             bi.y, bi.z, describe(*f, t, sizeof t), mask, sched.nthreads, first / 32,
             lanes_of_warp(first));
    } else if (width < 1 || width > 32 || (width & (width - 1))) {
        fail(DIVERGENT, "%s on line %d in block (%u,%u,%u), thread %s: width %d is not a power "
             "of 2 from 1 to 32", what, site, bi.x, bi.y, bi.z, describe(*f, t, sizeof t),
             width);
    }
    if (sched.status != OK) {
        to_scheduler();  // never resumed: the launch is abandoned
        abort();
    }
    f->state = AT_WARP;
    f->site = site;
    f->call = call;
    f->kind = kind;
    f->mask = mask;
    f->arg = arg;
    f->width = width;
    f->value = value;
    f->in = in;
    f->out = out;
    __asm__ volatile("" ::: "memory");  // other lanes read and write this one's operands
    to_scheduler();
    __asm__ volatile("" ::: "memory");
    return f->result;
}

template <class T> static inline uint64_t to_bits(const T& v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                  "warp shuffles move values of at most 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof(T));
    return u;
}
template <class T> static inline T from_bits(uint64_t u) {
    T v;
    memcpy(&v, &u, sizeof(T));
    return v;
}

// CUDA's warp intrinsics, spelled as objects made at their call site (the macros below), so that
// the collective knows its source line, and default arguments work as in CUDA.
template <int Kind> struct Shuffle {
    int site, call;
    template <class T> T operator()(unsigned mask, T var, int arg, int width = 32) const {
        return from_bits<T>(warp_collective(Kind, site, call, mask, arg, width, to_bits(var)));
    }
};
struct SyncWarp {
    int site, call;
    void operator()(unsigned mask = FULL_MASK) const {
        warp_collective(SYNCWARP, site, call, mask, 0, 32, 0);
    }
};
template <int Kind> struct Vote {
    int site, call;
    unsigned operator()(unsigned mask, int predicate) const {
        return (unsigned)warp_collective(Kind, site, call, mask, 0, 32, predicate != 0);
    }
};
struct ActiveMask {
    int site, call;
    unsigned operator()() const {
        return (unsigned)warp_collective(ACTIVEMASK, site, call, 0, 0, 32, 0);
    }
};
template <int Kind> struct Reduce {
    int site, call;
    unsigned operator()(unsigned mask, unsigned value) const {
        return (unsigned)warp_collective(Kind, site, call, mask, 0, 32, value);
    }
    int operator()(unsigned mask, int value) const {
        return (int)(unsigned)warp_collective(Kind, site, call, mask, 1, 32, (uint32_t)value);
    }
};

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

// ---------------------------------------------------------------------------------------------
// Tensor cores: mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 as a warp
// collective. Each lane brings its fragments in PTX's layout (groupID = lane >> 2,
// threadID_in_group = lane % 4; the lower half of a 32-bit register holds the element with the
// lower index): A (16 x 16, row-major) in 4 registers, element i of the 8 at row
// groupID + 8 * (i / 2 % 2), column 2 * threadID_in_group + i % 2 + 8 * (i / 4); B (16 x 8,
// k x n) in 2 registers, element i of the 4 at row 2 * threadID_in_group + i % 2 + 8 * (i / 2),
// column groupID; C and D (16 x 8 floats), element i of the 4 at row groupID + 8 * (i / 2),
// column 2 * threadID_in_group + i % 2. Each D element is C's plus the 16 products in k order,
// each product exact in float and each sum rounded to float; tensor cores sum in an order (and
// with roundings) of their own, so results agree to rounding, not bit for bit.

struct MmaOperands { const unsigned* a; const unsigned* b; const float* c; };

static inline float half_bits_to_float(unsigned short h) {
    unsigned exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    float v = exponent == 0 ? ldexpf((float)mantissa, -24)
            : exponent == 31 ? (mantissa ? NAN : INFINITY)
            : ldexpf((float)(mantissa | 0x400u), (int)exponent - 25);
    return (h & 0x8000u) ? -v : v;
}

static void resolve_mma(Fiber* lanes, int kind) {
    float a[16][16], b[16][8], c[16][8];
    for (unsigned lane = 0; lane < 32; ++lane) {
        const MmaOperands& ops = *(const MmaOperands*)lanes[lane].in;
        unsigned g = lane >> 2, t = lane & 3;
        for (unsigned i = 0; i < 8; ++i) {
            unsigned short bits = (unsigned short)(ops.a[i / 2] >> (16 * (i % 2)));
            a[g + 8 * (i / 2 % 2)][2 * t + i % 2 + 8 * (i / 4)] =
                kind == MMA_M16N8K16_BF16 ? bf16_to_float(bits) : half_bits_to_float(bits);
        }
        for (unsigned i = 0; i < 4; ++i) {
            unsigned short bits = (unsigned short)(ops.b[i / 2] >> (16 * (i % 2)));
            b[2 * t + i % 2 + 8 * (i / 2)][g] =
                kind == MMA_M16N8K16_BF16 ? bf16_to_float(bits) : half_bits_to_float(bits);
        }
        for (unsigned i = 0; i < 4; ++i) c[g + 8 * (i / 2)][2 * t + i % 2] = ops.c[i];
    }
    // All fragments are read before any is written: D may be C's own registers.
    for (unsigned lane = 0; lane < 32; ++lane) {
        float* d = (float*)lanes[lane].out;
        unsigned g = lane >> 2, t = lane & 3;
        for (unsigned i = 0; i < 4; ++i) {
            unsigned row = g + 8 * (i / 2), col = 2 * t + i % 2;
            float acc = c[row][col];
            for (unsigned k = 0; k < 16; ++k) acc += a[row][k] * b[k][col];
            d[i] = acc;
        }
    }
}

// The emulator's side of tc::mma_m16n8k16 (tcstage/cuda/device_lib.py): the whole warp, in
// convergence, as mma.sync.aligned requires.
static inline void mma_m16n8k16(int kind, float* d, const unsigned* a, const unsigned* b,
                                const float* c, int site, int call) {
    MmaOperands ops{a, b, c};
    warp_collective(kind, site, call, FULL_MASK, 0, 32, 0, &ops, d);
}

// Runs a whole grid, or where `selected` > 0 only the blocks `only` lists (linear indices, x
// fastest): a sample of a grid too large to emulate whole. `block_order`/`thread_order` pick
// FORWARD, REVERSE or SHUFFLE. `time_limit`: seconds (0: none).
static int run_grid(Invoker invoke, void** args, const long long* grid, const long long* block,
                    const long long* only, long long selected, int block_order,
                    int thread_order, unsigned long long seed, long long stack_size,
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
    size_t nblocks = selected > 0 ? (size_t)selected : (size_t)grid[0] * grid[1] * grid[2];
    if (!ensure_fibers(nthreads, (size_t)stack_size)) {
        fail(BAD_LAUNCH, "cannot allocate %zu fiber stacks of %lld bytes", nthreads, stack_size);
        return sched.status;
    }
    size_t* order = (size_t*)malloc(sizeof(size_t) * (nthreads > nblocks ? nthreads : nblocks));
    size_t* rank = (size_t*)malloc(sizeof(size_t) * nthreads);  // positions in `order`
    size_t* border = (size_t*)malloc(sizeof(size_t) * nblocks);
    if (!order || !rank || !border) {
        free(order);
        free(rank);
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
        size_t b = selected > 0 ? (size_t)only[border[k]] : border[k];
        blockIdx = uint3{unsigned(b % grid[0]), unsigned(b / grid[0] % grid[1]),
                         unsigned(b / (size_t(grid[0]) * grid[1]))};
        if (!run_block(nthreads, order, rank, thread_order, rng)) break;
    }
    free(order);
    free(rank);
    free(border);
    *flags = float_atomics_used ? 1 : 0;
    return sched.status;
}

// run_grid, then the fiber stacks given back (once its fault guard and watchdog are gone).
static int launch(Invoker invoke, void** args, const long long* grid, const long long* block,
                  const long long* only, long long selected, int block_order, int thread_order,
                  unsigned long long seed, long long stack_size, double time_limit,
                  char* message, long long message_len, int* flags) {
    int status = run_grid(invoke, args, grid, block, only, selected, block_order, thread_order,
                          seed, stack_size, time_limit, message, message_len, flags);
    release_fibers();
    return status;
}

}  // namespace tcemu

#define __syncthreads() ::tcemu::barrier(__LINE__)
// Warp collectives (see run_warp): objects made at the call site, called with CUDA's arguments;
// __COUNTER__ tells call sites apart, __LINE__ names them.
#define __shfl_sync ::tcemu::Shuffle< ::tcemu::SHFL_IDX>{__LINE__, __COUNTER__}
#define __shfl_up_sync ::tcemu::Shuffle< ::tcemu::SHFL_UP>{__LINE__, __COUNTER__}
#define __shfl_down_sync ::tcemu::Shuffle< ::tcemu::SHFL_DOWN>{__LINE__, __COUNTER__}
#define __shfl_xor_sync ::tcemu::Shuffle< ::tcemu::SHFL_XOR>{__LINE__, __COUNTER__}
#define __syncwarp ::tcemu::SyncWarp{__LINE__, __COUNTER__}
#define __ballot_sync ::tcemu::Vote< ::tcemu::BALLOT>{__LINE__, __COUNTER__}
#define __any_sync ::tcemu::Vote< ::tcemu::VOTE_ANY>{__LINE__, __COUNTER__}
#define __all_sync ::tcemu::Vote< ::tcemu::VOTE_ALL>{__LINE__, __COUNTER__}
#define __activemask ::tcemu::ActiveMask{__LINE__, __COUNTER__}
#define __reduce_add_sync ::tcemu::Reduce< ::tcemu::REDUCE_ADD>{__LINE__, __COUNTER__}
#define __reduce_min_sync ::tcemu::Reduce< ::tcemu::REDUCE_MIN>{__LINE__, __COUNTER__}
#define __reduce_max_sync ::tcemu::Reduce< ::tcemu::REDUCE_MAX>{__LINE__, __COUNTER__}
#define __reduce_and_sync ::tcemu::Reduce< ::tcemu::REDUCE_AND>{__LINE__, __COUNTER__}
#define __reduce_or_sync ::tcemu::Reduce< ::tcemu::REDUCE_OR>{__LINE__, __COUNTER__}
#define __reduce_xor_sync ::tcemu::Reduce< ::tcemu::REDUCE_XOR>{__LINE__, __COUNTER__}
#define __trap() ::tcemu::trap("__trap()", __FILE__, __LINE__)
// Kernel asserts end the launch with an error instead of aborting the host process.
#undef assert
#define assert(e) ((e) ? (void)0 : ::tcemu::trap("assertion '" #e "' failed", __FILE__, __LINE__))
