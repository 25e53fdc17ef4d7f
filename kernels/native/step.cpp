// The native decode step (completer_kernels.native): one call per forward of T new tokens (a
// step, a verify, a draft's proposal, a chunk of prefill) of a Llama-layout model (Llama, Mistral's window, Qwen2's biases, Qwen3's q/k norm):
// embedding, RMSNorm, the products, q/k norm, RoPE, the K/V write into the runner's cache,
// attention over the cached positions, the gated SiLU MLP, residuals and the LM head, with no
// Python in between. Built on the user's machine with the vector extensions its CPU reports
// (native.py picks -mavx512* or -mavx2; never -march=native), one library per set. Where the CPU
// reports AMX, native.py builds a variant with -DNSTEP_AMX: its AMX functions carry their own
// target attribute, and run only after nstep_amx_init() got the kernel's permission.
//
// Products y[T, N] = x[T, K] @ W^T read W once per block of BW output columns for all T rows:
// - f32 / f16 weights: blocked [N/BW][K][BW] (f16 widened in registers, fp32 math);
// - int8: fbgemm's dynamic scheme, so results match the fbgemm path the Python step takes:
//   per-tensor asymmetric uint8 activations in [0, 127] (reduce_range), per-channel symmetric
//   int8 weights blocked [N/BW][K/4][BW][4] for vpdpbusd (AVX512-VNNI) or vpmaddubsw. With AMX
//   (NSTEP_AMX, forwards of 7+ rows) the same layout is TDPBUSD's B operand as it is: 16 columns
//   × 4 bytes of one K/4 row are 64 contiguous bytes, a row of a B tile at a stride of BW·4;
// - f16 weights whose values are all bf16 (an fp16 pack of a bf16 checkpoint), where the CPU has
//   AMX-BF16 (NSTEP_AMX_BF16): a second layout, [N/BW][Kb/2][BW][2] bf16 pairs, multiplied on
//   tiles from one row on, the activations split exactly into three bf16 (rows_h_amx).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(NSTEP_AMX)
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#endif

#if defined(__AVX512F__)
typedef __m512 V;
typedef __m512i VI;
constexpr int VW = 16;
static inline V vload(const float* p) { return _mm512_loadu_ps(p); }
static inline V vloadh(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
static inline V vset1(float x) { return _mm512_set1_ps(x); }
static inline V vzero() { return _mm512_setzero_ps(); }
static inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
static inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
static inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
static inline V vsub(V a, V b) { return _mm512_sub_ps(a, b); }
static inline void vstore(float* p, V v) { _mm512_storeu_ps(p, v); }
static inline VI viload(const void* p) { return _mm512_loadu_si512(p); }
static inline VI viset1(int32_t x) { return _mm512_set1_epi32(x); }
static inline VI vizero() { return _mm512_setzero_si512(); }
static inline VI vdot4(VI acc, VI a_u8, VI b_s8) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(acc, a_u8, b_s8);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(a_u8, b_s8), _mm512_set1_epi16(1)));
#endif
}
static inline V vcvt(VI x) { return _mm512_cvtepi32_ps(x); }
static inline VI visub(VI a, VI b) { return _mm512_sub_epi32(a, b); }
static inline VI vimul(VI a, VI b) { return _mm512_mullo_epi32(a, b); }
static inline void vistore(int32_t* p, VI v) { _mm512_storeu_si512(p, v); }
static inline VI viloadi(const int32_t* p) { return _mm512_loadu_si512(p); }
static inline VI vnib_lo(VI v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
static inline VI vnib_hi(VI v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
static inline V vfnma(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
static inline float vsum(V v) { return _mm512_reduce_add_ps(v); }
static inline V vloadm(const float* p, int n) { return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p); }
static inline V vmin(V a, V b) { return _mm512_min_ps(a, b); }
static inline V vmax(V a, V b) { return _mm512_max_ps(a, b); }
static inline float vhmin(V v) { return _mm512_reduce_min_ps(v); }
static inline float vhmax(V v) { return _mm512_reduce_max_ps(v); }
// q[0..VW) = clamp(round_even(min(x·inv + z, 2^31)), 0, 255): fbgemm's QuantizeAvx2, per lane
static inline void vquant(uint8_t* q, V x, V inv, V z) {
  __m512i i = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_fmadd_ps(x, inv, z), _mm512_set1_ps(2147483520.f)));
  i = _mm512_min_epi32(_mm512_max_epi32(i, _mm512_setzero_si512()), _mm512_set1_epi32(255));
  _mm_storeu_si128((__m128i*)q, _mm512_cvtepi32_epi8(i));
}
static inline void vstorem(float* p, V v, int n) { _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), v); }
#else
typedef __m256 V;
typedef __m256i VI;
constexpr int VW = 8;
static inline V vload(const float* p) { return _mm256_loadu_ps(p); }
static inline V vloadh(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
static inline V vset1(float x) { return _mm256_set1_ps(x); }
static inline V vzero() { return _mm256_setzero_ps(); }
static inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
static inline V vadd(V a, V b) { return _mm256_add_ps(a, b); }
static inline V vmul(V a, V b) { return _mm256_mul_ps(a, b); }
static inline V vsub(V a, V b) { return _mm256_sub_ps(a, b); }
static inline void vstore(float* p, V v) { _mm256_storeu_ps(p, v); }
static inline VI viload(const void* p) { return _mm256_loadu_si256((const __m256i*)p); }
static inline VI viset1(int32_t x) { return _mm256_set1_epi32(x); }
static inline VI vizero() { return _mm256_setzero_si256(); }
static inline VI vdot4(VI acc, VI a_u8, VI b_s8) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a_u8, b_s8), _mm256_set1_epi16(1)));
}
static inline V vcvt(VI x) { return _mm256_cvtepi32_ps(x); }
static inline VI visub(VI a, VI b) { return _mm256_sub_epi32(a, b); }
static inline VI vimul(VI a, VI b) { return _mm256_mullo_epi32(a, b); }
static inline void vistore(int32_t* p, VI v) { _mm256_storeu_si256((__m256i*)p, v); }
static inline VI viloadi(const int32_t* p) { return _mm256_loadu_si256((const __m256i*)p); }
static inline VI vnib_lo(VI v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
static inline VI vnib_hi(VI v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
static inline V vfnma(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
static inline float vsum(V v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
static inline __m256i vmask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline V vloadm(const float* p, int n) { return _mm256_maskload_ps(p, vmask(n)); }
static inline V vmin(V a, V b) { return _mm256_min_ps(a, b); }
static inline V vmax(V a, V b) { return _mm256_max_ps(a, b); }
static inline float vhmin(V v) {
  __m128 s = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_min_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_min_ss(s, _mm_movehdup_ps(s)));
}
static inline float vhmax(V v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
static inline void vquant(uint8_t* q, V x, V inv, V z) {
  __m256i i = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_fmadd_ps(x, inv, z), _mm256_set1_ps(2147483520.f)));
  i = _mm256_min_epi32(_mm256_max_epi32(i, _mm256_setzero_si256()), _mm256_set1_epi32(255));
  __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
  _mm_storel_epi64((__m128i*)q, _mm_packus_epi16(w, w));
}
static inline void vstorem(float* p, V v, int n) { _mm256_maskstore_ps(p, vmask(n), v); }
#endif

// K/V cache rows: float32, or fp16 (half the bytes a step reads at depth; widened in registers).
// Masked tails of fp16 rows load whole 32-bit pairs: head widths are even (RoPE rotates pairs).
static inline V kload(const float* p) { return vload(p); }
static inline V kloadm(const float* p, int n) { return vloadm(p, n); }
static inline V kload(const uint16_t* p) { return vloadh(p); }
#if defined(__AVX512F__)
static inline V kloadm(const uint16_t* p, int n) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((__mmask16)((1u << n) - 1), p));
}
#else
static inline V kloadm(const uint16_t* p, int n) {
  return _mm256_cvtph_ps(_mm_maskload_epi32((const int*)p, _mm_cmpgt_epi32(_mm_set1_epi32(n / 2), _mm_setr_epi32(0, 1, 2, 3))));
}
#endif
static inline void kstore(float* dst, const float* src, int n) { memcpy(dst, src, sizeof(float) * n); }
static inline void kstore(uint16_t* dst, const float* src, int n) {  // round to nearest even, as torch's .half()
  for (int i = 0; i < n; i++) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

constexpr int NV = 4, BW = NV * VW;  // output columns per weight block: 64 (AVX-512) or 32 (AVX2)
#if defined(__AVX512F__)
constexpr int TRF = 6, TRI = 6, TR4 = 2;  // rows per register tile (accumulators: TR·NV of 32 registers)
#else
constexpr int TRF = 2, TRI = 2, TR4 = 1;  // 16 registers
#endif

// int8 products of this many rows or more run on AMX (0: none; set by nstep_amx_init). From 7:
// up to 6 rows VNNI reads the weights once (one register tile) and measured cheaper (the
// embedded target's products, one thread, an Intel Xeon with AMX, loaded: AMX 6-20 % dearer at
// 2-6 rows); from 7 VNNI reads them twice and AMX, once for up to 16 rows, is 20 % cheaper at 8
// rows, 26 % at 9, 28 % at 16.
static int g_amx_rows = 0;
// fp16 products of this many rows or more run on AMX-BF16 tiles, where the weight carries their
// layout (Mat.wbf; 0: none; set by nstep_amx_init where the build has NSTEP_AMX_BF16). From 1: the
// embedded target's step measured cheaper there than in registers in most runs on an Intel Xeon
// with AMX (bench/steps.py's "registers" rows; one run in a slow phase of the VM went the other
// way), a verify of 8 drafts ~1.3-1.5 steps instead of ~1.7-2.0, and a row's products are then
// the same bits whatever the rows beside it (a verify's logits equal lone steps' up to attention).
// On more than one thread the register path scales and the tiles did not (the embedded target's step
// on 2 threads: 0.86 ms in registers, 1.38 on tiles; crossing at ~8 rows), so there from AMXH_ROWS_MT.
static int g_amxh_rows = 0;
constexpr int AMXH_ROWS = 1, AMXH_ROWS_MT = 8;
static bool g_amx_granted = false;
constexpr int AMX_ROWS = TRI + 1, AR = 16;  // AR: rows of an A / C tile at most

extern "C" {

// One weight matrix, y = x @ W^T with W [N, K]; layouts in the header comment.
struct Mat {
  int32_t kind;  // 0 f32, 1 f16, 2 int8, 3 int4
  int32_t N, K, Kp;  // Kp: K rounded up to 4 (int8)
  const void* w;
  const float* scale;     // int8: per output channel [Np]; int4: Σ_g s·Σq per channel [Np]
  const int32_t* colsum;  // int8: Σ_k W[n, k] [Np]
  const float* bias;      // [N] or null
  const float* gs;        // int4: group scales s [N/BW][K/G][BW]
  const float* gsz;       // int4: s·z per group, same layout
  const float* szsum;     // int4: Σ_g s·z per channel [Np]
  int32_t G;              // int4: group size (a multiple of 8)
  const uint16_t* wbf;    // f16 whose values are all bf16, with AMX-BF16: the weight as rows_h_amx reads it, or null
};

struct Layer {
  const float* w_in;
  const float* w_post;
  const float* q_norm;  // [hd] or null (Qwen3)
  const float* k_norm;
  Mat qkv, o, gu, down;
};

struct Model {
  int32_t D, H, Hkv, hd, I, L, V, window;  // window 0: none
  int32_t embed_kind;  // 0 f32, 1 f16, 2 bf16
  float eps;
  const void* embed;  // [vocab, D]
  const float* norm;
  const Layer* layers;
  Mat head;
};

int nstep_block_width() { return BW; }

int nstep_max_head_dim() { return 16 * VW; }

// Ask the kernel for AMX's tile data (Linux grants it per process; without it the first tile
// instruction faults) and use AMX from then on: 0, or why not (an errno; -1 granted but not
// reported; -2 a build without NSTEP_AMX).
int nstep_amx_init() {
#if defined(NSTEP_AMX)
  constexpr int ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return errno;
  unsigned long granted = 0;
  if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &granted) != 0 || !(granted & (1ul << XFEATURE_XTILEDATA)))
    return -1;
  g_amx_granted = true;
  g_amx_rows = AMX_ROWS;
#if defined(NSTEP_AMX_BF16)
  g_amxh_rows = AMXH_ROWS;
#endif
  return 0;
#else
  return -2;
#endif
}

// From how many rows int8 products run on AMX (0: none; tests set 2 to check every tile shape;
// -1 only asks), once nstep_amx_init() granted AMX. Returns the number before.
int nstep_amx_rows(int rows) {
  int before = g_amx_rows;
  if (g_amx_granted && rows >= 0) g_amx_rows = rows > 0 ? std::max(rows, 2) : 0;
  return before;
}

// The same for fp16 products on AMX-BF16 (0: none; -1 only asks; tests set 2 to compare a lone row
// in registers with rows on tiles); always 0 in a build without NSTEP_AMX_BF16.
int nstep_amxh_rows(int rows) {
  int before = g_amxh_rows;
#if defined(NSTEP_AMX_BF16)
  if (g_amx_granted && rows >= 0) g_amxh_rows = rows;
#endif
  return before;
}

int nstep_isa() {
#if defined(__AVX512VNNI__)
  return 3;
#elif defined(__AVX512F__)
  return 2;
#else
  return 1;
#endif
}

}  // extern "C"

namespace {

// exp(x) for x ≤ 0 (softmax, SiLU's exp(-g) with the sign folded): Cody-Waite range reduction and
// a degree-6 polynomial, ~2 ulp; x < -87 gives 0.
static inline V vexp(V x) {
  const V lo = vset1(-87.3f), hi = vset1(88.3f);
#if defined(__AVX512F__)
  x = _mm512_max_ps(_mm512_min_ps(x, hi), lo);
  V n = _mm512_roundscale_ps(vmul(x, vset1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
  V n = _mm256_round_ps(vmul(x, vset1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#endif
  V r = vfma(n, vset1(-0.693145751953125f), x);
  r = vfma(n, vset1(-1.428606765330187045e-06f), r);
  V p = vset1(1.0f / 720);
  p = vfma(p, r, vset1(1.0f / 120));
  p = vfma(p, r, vset1(1.0f / 24));
  p = vfma(p, r, vset1(1.0f / 6));
  p = vfma(p, r, vset1(0.5f));
  p = vfma(p, r, vset1(1.0f));
  p = vfma(p, r, vset1(1.0f));
#if defined(__AVX512F__)
  return _mm512_scalef_ps(p, n);
#else
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  V res = vmul(p, _mm256_castsi256_ps(e));
  return _mm256_and_ps(res, _mm256_cmp_ps(x, lo, _CMP_GT_OQ));
#endif
}

// Register tile of float products: rows x[0..TR) × BW columns of one weight block.
template <int TR, bool H>
static inline void tile_f(const float* x, int ldx, const void* wb, int K, float* out /*[TR][BW]*/) {
  V acc[TR][NV], acc2[NV];
  #pragma GCC unroll 16
  for (int t = 0; t < TR; t++)
    #pragma GCC unroll 16
    for (int j = 0; j < NV; j++) acc[t][j] = vzero();
  #pragma GCC unroll 16
  for (int j = 0; j < NV; j++) acc2[j] = vzero();
  int k = 0;
  if (TR == 1) {  // two chains of accumulators: one row alone is latency-bound
    for (; k + 1 < K; k += 2) {
      V x0 = vset1(x[k]), x1 = vset1(x[k + 1]);
      #pragma GCC unroll 16
      for (int j = 0; j < NV; j++) {
        V w0 = H ? vloadh((const uint16_t*)wb + (size_t)k * BW + j * VW) : vload((const float*)wb + (size_t)k * BW + j * VW);
        V w1 = H ? vloadh((const uint16_t*)wb + (size_t)(k + 1) * BW + j * VW)
                 : vload((const float*)wb + (size_t)(k + 1) * BW + j * VW);
        acc[0][j] = vfma(x0, w0, acc[0][j]);
        acc2[j] = vfma(x1, w1, acc2[j]);
      }
    }
  }
  for (; k < K; k++) {
    V w[NV];
    #pragma GCC unroll 16
    for (int j = 0; j < NV; j++)
      w[j] = H ? vloadh((const uint16_t*)wb + (size_t)k * BW + j * VW) : vload((const float*)wb + (size_t)k * BW + j * VW);
    #pragma GCC unroll 16
    for (int t = 0; t < TR; t++) {
      V xb = vset1(x[(size_t)t * ldx + k]);
      #pragma GCC unroll 16
      for (int j = 0; j < NV; j++) acc[t][j] = vfma(xb, w[j], acc[t][j]);
    }
  }
  if (TR == 1)
    #pragma GCC unroll 16
    for (int j = 0; j < NV; j++) acc[0][j] = vadd(acc[0][j], acc2[j]);
  #pragma GCC unroll 16
  for (int t = 0; t < TR; t++)
    #pragma GCC unroll 16
    for (int j = 0; j < NV; j++) vstore(out + t * BW + j * VW, acc[t][j]);
}

template <int TR>
static inline void tile_i8(const uint8_t* xq, int ldx, const int8_t* wb, int Kp, int32_t* out) {
  VI acc[TR][NV];
  #pragma GCC unroll 16
  for (int t = 0; t < TR; t++)
    #pragma GCC unroll 16
    for (int j = 0; j < NV; j++) acc[t][j] = vizero();
  for (int k = 0; k < Kp; k += 4) {
    VI w[NV];
    #pragma GCC unroll 16
    for (int j = 0; j < NV; j++) w[j] = viload(wb + (size_t)k * BW + j * VW * 4);
    #pragma GCC unroll 16
    for (int t = 0; t < TR; t++) {
      int32_t xv;
      memcpy(&xv, xq + (size_t)t * ldx + k, 4);
      VI xb = viset1(xv);
      #pragma GCC unroll 16
      for (int j = 0; j < NV; j++) acc[t][j] = vdot4(acc[t][j], xb, w[j]);
    }
  }
  #pragma GCC unroll 16
  for (int t = 0; t < TR; t++)
    #pragma GCC unroll 16
    for (int j = 0; j < NV; j++) vistore(out + t * BW + j * VW, acc[t][j]);
}

// y[t, n0..n0+BW) (= or +=) tile + bias, only the n < N columns.
static inline void put(float* y, int ldy, int n0, int N, const float* tile, int rows, const float* bias, bool add) {
  int w = std::min(BW, N - n0);
  for (int t = 0; t < rows; t++) {
    float* yr = y + (size_t)t * ldy + n0;
    const float* tr = tile + t * BW;
    if (add) {
      for (int j = 0; j < w; j++) yr[j] += tr[j] + (bias ? bias[n0 + j] : 0.f);
    } else {
      for (int j = 0; j < w; j++) yr[j] = tr[j] + (bias ? bias[n0 + j] : 0.f);
    }
  }
}

struct Scratch {
  std::vector<uint8_t> xq;
  std::vector<uint16_t> xb;   // AMX-BF16: the rows as three bf16 parts
  std::vector<int32_t> gsum;  // int4: Σ xq per row and group
};

template <bool H>
static void rows_f(const float* x, int ldx, int T, const Mat& m, int nb, float* y, int ldy, bool add) {
  alignas(64) float tile[TRF * BW];
  const size_t bstride = (size_t)m.K * BW;
  const char* base = (const char*)m.w + (size_t)nb * bstride * (H ? 2 : 4);
  for (int t = 0; t < T;) {
    int r = std::min(T - t, (int)TRF);
    const float* xr = x + (size_t)t * ldx;
    switch (r) {
      case 1: tile_f<1, H>(xr, ldx, base, m.K, tile); break;
      case 2: tile_f<2, H>(xr, ldx, base, m.K, tile); break;
#if defined(__AVX512F__)
      case 3: tile_f<3, H>(xr, ldx, base, m.K, tile); break;
      case 4: tile_f<4, H>(xr, ldx, base, m.K, tile); break;
      case 5: tile_f<5, H>(xr, ldx, base, m.K, tile); break;
      case 6: tile_f<6, H>(xr, ldx, base, m.K, tile); break;
#endif
    }
    put(y + (size_t)t * ldy, ldy, nb * BW, m.N, tile, r, m.bias, add);
    t += r;
  }
}

// fbgemm's ReQuantizeForFloat over r rows of int32 products acc[r][BW] of block n0:
// y = (acc - zp·colsum) · (xs·ws) (+ bias), into `tile` then y.
static inline void requant(const int32_t* acc, int r, const Mat& m, int n0, int32_t zp, float xs, float* tile,
                           float* y, int ldy, bool add) {
  VI zpv = viset1(zp);
  for (int j = 0; j < NV; j++) {
    VI cs = viloadi(m.colsum + n0 + j * VW);
    V mult = vmul(vset1(xs), vload(m.scale + n0 + j * VW));
    for (int t = 0; t < r; t++) {
      VI a = visub(viloadi(acc + t * BW + j * VW), vimul(zpv, cs));
      vstore(tile + t * BW + j * VW, vmul(vcvt(a), mult));
    }
  }
  put(y, ldy, n0, m.N, tile, r, m.bias, add);
}

static void rows_i8(const uint8_t* xq, int T, const Mat& m, int nb, int32_t zp, float xs, float* y, int ldy, bool add) {
  alignas(64) int32_t acc[TRI * BW];
  alignas(64) float tile[TRI * BW];
  const int8_t* base = (const int8_t*)m.w + (size_t)nb * m.Kp * BW;
  for (int t = 0; t < T;) {
    int r = std::min(T - t, (int)TRI);
    const uint8_t* xr = xq + (size_t)t * m.Kp;
    switch (r) {
      case 1: tile_i8<1>(xr, m.Kp, base, m.Kp, acc); break;
      case 2: tile_i8<2>(xr, m.Kp, base, m.Kp, acc); break;
#if defined(__AVX512F__)
      case 3: tile_i8<3>(xr, m.Kp, base, m.Kp, acc); break;
      case 4: tile_i8<4>(xr, m.Kp, base, m.Kp, acc); break;
      case 5: tile_i8<5>(xr, m.Kp, base, m.Kp, acc); break;
      case 6: tile_i8<6>(xr, m.Kp, base, m.Kp, acc); break;
#endif
    }
    requant(acc, r, m, nb * BW, zp, xs, tile, y + (size_t)t * ldy, ldy, add);
    t += r;
  }
}

#if defined(NSTEP_AMX)
static_assert(BW == 64, "AMX: a weight block is four B tiles of 16 columns");

// The tile configuration (ldtilecfg's 64 bytes, palette 1). Tiles 0..3: C, R rows × 16 int32
// (one per 16 columns of the block); 4, 5: A, R rows × 64 uint8 (64 of K); 6, 7: B, 16 K/4-rows
// × 64 bytes. A and B alternate between two tiles so that a load can overlap the product that
// reads the other.
struct alignas(64) TileCfg {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

__attribute__((target("amx-tile,amx-int8"))) static void amx_config(int R, int first_b = 6) {
  TileCfg c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int i = 0; i < 8; i++) c.colsb[i] = 64, c.rows[i] = i < first_b ? (uint8_t)R : 16;
  // gcc's _tile_loadconfig tells the compiler it reads 8 bytes: without this barrier the stores
  // above are dead to it, and a stale or empty configuration makes the next tile op fault
  __asm__ __volatile__("" : : "r"(&c) : "memory");
  _tile_loadconfig(&c);
}

__attribute__((target("amx-tile,amx-int8"))) static void amx_release() { _tile_release(); }

// C[R × 64 cols] += A[R × 64 of K at k] · B[64 of K × 64 cols at wk], A in tile TA, B through 6, 7.
// The weights 64 of K ahead (the next block's after the last) are prefetched: tile loads alone
// left the 8192×288 head at 2 rows 1.43× its 1-row VNNI time, prefetched 1.23× (no gain 8 KB ahead).
#define NSTEP_AMX_K64(TA, k, wk)                                \
  do {                                                          \
    for (int p_ = 0; p_ < 4096; p_ += 64) _mm_prefetch((const char*)(wk) + 4096 + p_, _MM_HINT_T0); \
    _tile_loadd(TA, xr + (k), ldx);                             \
    _tile_loadd(6, (wk), bstride);                              \
    _tile_loadd(7, (wk) + 64, bstride);                         \
    _tile_dpbusd(0, TA, 6);                                     \
    _tile_loadd(6, (wk) + 128, bstride);                        \
    _tile_dpbusd(1, TA, 7);                                     \
    _tile_loadd(7, (wk) + 192, bstride);                        \
    _tile_dpbusd(2, TA, 6);                                     \
    _tile_dpbusd(3, TA, 7);                                     \
  } while (0)

// Weight block nb against all T rows (xq: ldx = Kp rounded up to 64 bytes a row, rows padded to a
// multiple of R, the padding zero): per R rows, C = Σ over K of A · B by TDPBUSD (the same exact
// u8·s8 sums into int32 as vpdpbusd), then rows_i8's epilogue. The K tail past the last 64 bytes
// of the block (Kp % 64) is copied into a zero-padded B tile: the block's end is not read past.
// Needs amx_config(R).
__attribute__((target("amx-tile,amx-int8"))) static void rows_i8_amx(const uint8_t* xq, int ldx, int T, int R,
                                                                     const Mat& m, int nb, int32_t zp, float xs,
                                                                     float* y, int ldy, bool add) {
  alignas(64) int32_t acc[AR * BW];
  alignas(64) float tile[AR * BW];
  alignas(64) int8_t tail[16 * BW * 4];
  const int8_t* base = (const int8_t*)m.w + (size_t)nb * m.Kp * BW;
  const int kfull = m.Kp / 64 * 64;
  const long bstride = BW * 4;  // bytes from one K/4 row of the block to the next
  if (kfull < m.Kp) {
    const size_t have = (size_t)(m.Kp - kfull) / 4 * bstride;
    memcpy(tail, base + (size_t)kfull / 4 * bstride, have);
    memset(tail + have, 0, sizeof tail - have);
  }
  for (int t = 0; t < T; t += R) {
    const uint8_t* xr = xq + (size_t)t * ldx;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    int k = 0;
    for (; k + 128 <= kfull; k += 128) {
      NSTEP_AMX_K64(4, k, base + (size_t)k / 4 * bstride);
      NSTEP_AMX_K64(5, k + 64, base + (size_t)(k + 64) / 4 * bstride);
    }
    if (k < kfull) {
      NSTEP_AMX_K64(4, k, base + (size_t)k / 4 * bstride);
      k += 64;
      if (kfull < m.Kp) NSTEP_AMX_K64(5, k, tail);
    } else if (kfull < m.Kp) {
      NSTEP_AMX_K64(4, k, tail);
    }
    _tile_stored(0, acc, bstride);
    _tile_stored(1, acc + 16, bstride);
    _tile_stored(2, acc + 32, bstride);
    _tile_stored(3, acc + 48, bstride);
    requant(acc, std::min(R, T - t), m, nb * BW, zp, xs, tile, y + (size_t)t * ldy, ldy, add);
  }
}
#undef NSTEP_AMX_K64

#if defined(NSTEP_AMX_BF16)
// fp16 weights on AMX-BF16 for forwards of g_amxh_rows+ rows (verifies, a few tokens of catch-up),
// where every fp16 value is exactly a bf16 (an fp16 pack of a bf16 checkpoint, as most are: the
// conversion only drops bits): Mat.wbf holds the weight again as TDPBF16PS's B operand, per block
// of BW columns [Kb/2][BW][2] (Kb = K rounded up to 32, the padding zero), as many bytes as the
// fp16 blocks. A float32 activation is exactly the sum of three bf16, x = xh + xm + xl (8 + 8 + 8
// of its 24 significant bits), each product with a bf16 weight is exact in float32, and C += xl·w
// + xm·w + xh·w accumulates in float32: results equal the register path's up to float32
// summation order, as a verify's rows already do (tile config: tiles 0..3 C, 4..6 A, 7 B).
static void bf16_split_rows(const float* x, int ldx, int T, int K, int Kb, size_t rows, uint16_t* xs) {
  memset(xs, 0, 3 * rows * Kb * sizeof(uint16_t));
  const __m512i half = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1);
  auto rne = [&](__m512 v) {  // float32 → bf16 bits in the low half of each lane, nearest even
    __m512i b = _mm512_castps_si512(v);
    return _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, half), _mm512_and_si512(_mm512_srli_epi32(b, 16), one)), 16);
  };
  auto wide = [](__m512i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)); };
  for (int t = 0; t < T; t++)
    for (int k = 0; k < K; k += 16) {
      const int n = std::min(16, K - k);
      const __mmask16 mk = (__mmask16)((1u << n) - 1);
      __m512 v = _mm512_maskz_loadu_ps(mk, x + (size_t)t * ldx + k);
      __m512i h = rne(v);
      __m512 r1 = _mm512_sub_ps(v, wide(h));  // exact, as is r1 - m
      __m512i m = rne(r1);
      __m512i l = rne(_mm512_sub_ps(r1, wide(m)));
      uint16_t* at = xs + (size_t)t * Kb + k;
      _mm256_mask_storeu_epi16(at, mk, _mm512_cvtepi32_epi16(h));
      _mm256_mask_storeu_epi16(at + rows * Kb, mk, _mm512_cvtepi32_epi16(m));
      _mm256_mask_storeu_epi16(at + 2 * rows * Kb, mk, _mm512_cvtepi32_epi16(l));
    }
}

// C_j (16 columns of the block) += A_l·B + A_m·B + A_h·B, the smallest parts first.
#define NSTEP_AMXH_J(j)                                          \
  do {                                                           \
    _tile_loadd(7, (const char*)wk + (j) * 64, 256);             \
    _tile_dpbf16ps(j, 6, 7);                                     \
    _tile_dpbf16ps(j, 5, 7);                                     \
    _tile_dpbf16ps(j, 4, 7);                                     \
  } while (0)

// Weight block nb against all T rows (xs: the h, m, l parts, each rows × Kb bf16, rows padded to
// a multiple of R with zeros), R rows per A / C tile, then put's epilogue (bias, residual). Needs
// amx_config(R, 7): 64-byte tile rows, 32 bf16 of K in A, 16 K-pairs × 16 columns in B. The
// weights 32 of K ahead are prefetched, as the int8 kernel's are.
__attribute__((target("amx-tile,amx-bf16"))) static void rows_h_amx(const uint16_t* xs, size_t rows, int Kb, int T,
                                                                    int R, const Mat& m, int nb, float* y, int ldy,
                                                                    bool add) {
  alignas(64) float tile[AR * BW];
  const uint16_t* base = m.wbf + (size_t)nb * Kb * BW;
  const long lda = (long)Kb * 2;
  const size_t part = rows * Kb;
  for (int t = 0; t < T; t += R) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int k = 0; k < Kb; k += 32) {
      const uint16_t* wk = base + (size_t)k * BW;  // 16 K-pairs of BW columns: 4 KB
      for (int p_ = 0; p_ < 4096; p_ += 64) _mm_prefetch((const char*)wk + 4096 + p_, _MM_HINT_T0);
      const uint16_t* a = xs + (size_t)t * Kb + k;
      _tile_loadd(4, a, lda);
      _tile_loadd(5, a + part, lda);
      _tile_loadd(6, a + 2 * part, lda);
      NSTEP_AMXH_J(0);
      NSTEP_AMXH_J(1);
      NSTEP_AMXH_J(2);
      NSTEP_AMXH_J(3);
    }
    _tile_stored(0, tile, BW * 4);
    _tile_stored(1, tile + 16, BW * 4);
    _tile_stored(2, tile + 32, BW * 4);
    _tile_stored(3, tile + 48, BW * 4);
    put(y + (size_t)t * ldy, ldy, nb * BW, m.N, tile, std::min(R, T - t), m.bias, add);
  }
}
#undef NSTEP_AMXH_J
#endif  // NSTEP_AMX_BF16
#endif

// int4 weights (group G, w = (q - z)·s, q in 0..15) against the same uint8 activations: per group
// the integer dot I = Σ xq·q (nibbles unpacked in registers: byte i of a column holds k = 8j + i
// low and 8j + 4 + i high), then Σ_g (s·I - s·z·A_g) with A_g = Σ_{k in g} xq; the zero points'
// remaining terms are the epilogue's (rows_i4).
template <int TR>
static inline void tile_i4(const uint8_t* xq, int ldx, const int32_t* A, int lda, const Mat& m, int nb, float* out) {
  const int G = m.G, ngroups = m.K / G;
  const uint8_t* wb = (const uint8_t*)m.w + (size_t)nb * m.K * BW / 2;
  const float* gs = m.gs + (size_t)nb * ngroups * BW;
  const float* gsz = m.gsz + (size_t)nb * ngroups * BW;
  V acc[TR][NV];
  for (int t = 0; t < TR; t++)
    #pragma GCC unroll 16
    for (int c = 0; c < NV; c++) acc[t][c] = vzero();
  for (int g = 0; g < ngroups; g++) {
    VI ai[TR][NV];
    for (int t = 0; t < TR; t++)
      #pragma GCC unroll 16
      for (int c = 0; c < NV; c++) ai[t][c] = vizero();
    const uint8_t* wg = wb + (size_t)g * G * BW / 2;
    for (int j = 0; j < G / 8; j++) {
      VI lo[NV], hi[NV];
      #pragma GCC unroll 16
      for (int c = 0; c < NV; c++) {
        VI v = viload(wg + ((size_t)j * BW + c * VW) * 4);
        lo[c] = vnib_lo(v);
        hi[c] = vnib_hi(v);
      }
      for (int t = 0; t < TR; t++) {
        int32_t x0, x1;
        memcpy(&x0, xq + (size_t)t * ldx + g * G + 8 * j, 4);
        memcpy(&x1, xq + (size_t)t * ldx + g * G + 8 * j + 4, 4);
        VI b0 = viset1(x0), b1 = viset1(x1);
        #pragma GCC unroll 16
        for (int c = 0; c < NV; c++) ai[t][c] = vdot4(vdot4(ai[t][c], b0, lo[c]), b1, hi[c]);
      }
    }
    #pragma GCC unroll 16
    for (int c = 0; c < NV; c++) {
      V s = vload(gs + (size_t)g * BW + c * VW), sz = vload(gsz + (size_t)g * BW + c * VW);
      for (int t = 0; t < TR; t++)
        acc[t][c] = vfnma(sz, vset1((float)A[(size_t)t * lda + g]), vfma(s, vcvt(ai[t][c]), acc[t][c]));
    }
  }
  for (int t = 0; t < TR; t++)
    #pragma GCC unroll 16
    for (int c = 0; c < NV; c++) vstore(out + t * BW + c * VW, acc[t][c]);
}

// y = xs·(Σ_g (s·I - s·z·A_g) - zp·Σ_g s·Σq + G·zp·Σ_g s·z), from x = xs·(xq - zp), w = (q - z)·s.
static void rows_i4(const uint8_t* xq, const int32_t* A, int T, const Mat& m, int nb, int32_t zp, float xs, float* y,
                    int ldy, bool add) {
  alignas(64) float tile[TR4 * BW];
  const int n0 = nb * BW, ngroups = m.K / m.G;
  for (int t = 0; t < T;) {
    int r = std::min(T - t, (int)TR4);
    const uint8_t* xr = xq + (size_t)t * m.Kp;
    const int32_t* ar = A + (size_t)t * ngroups;
    if (r == 1) tile_i4<1>(xr, m.Kp, ar, ngroups, m, nb, tile);
#if defined(__AVX512F__)
    else tile_i4<2>(xr, m.Kp, ar, ngroups, m, nb, tile);
#endif
    for (int c = 0; c < NV; c++) {
      V corr = vsub(vmul(vset1((float)(m.G * zp)), vload(m.szsum + n0 + c * VW)),
                    vmul(vset1((float)zp), vload(m.scale + n0 + c * VW)));
      for (int i = 0; i < r; i++)
        vstore(tile + i * BW + c * VW, vmul(vset1(xs), vadd(vload(tile + i * BW + c * VW), corr)));
    }
    put(y + (size_t)t * ldy, ldy, n0, m.N, tile, r, m.bias, add);
    t += r;
  }
}

// fbgemm's dynamic activation quantization (ChooseQuantizationParams with reduce_range, then
// Quantize's fma(x, 1/scale, zero_point) rounded to nearest even) over the whole [T, K] input.
static void quantize_rows(const float* x, int ldx, int T, int K, int Kp, uint8_t* xq, int32_t* zp_out, float* scale_out) {
  V vmn = vzero(), vmx = vzero();  // the range always contains 0
  float mn = 0.f, mx = 0.f;
  for (int t = 0; t < T; t++) {
    const float* xr = x + (size_t)t * ldx;
    int k = 0;
    for (; k + VW <= K; k += VW) {
      V v = vload(xr + k);
      vmn = vmin(vmn, v);
      vmx = vmax(vmx, v);
    }
    for (; k < K; k++) {
      mn = std::min(mn, xr[k]);
      mx = std::max(mx, xr[k]);
    }
  }
  mn = std::min(mn, vhmin(vmn));
  mx = std::max(mx, vhmax(vmx));
  const int qmin = 0, qmax = 127;
  double scale = ((double)mx - mn) / (qmax - qmin);
  if ((float)scale == 0.0f || std::isinf(1.0f / (float)scale)) scale = 0.1;
  const float small = 6.1e-5f;  // fbgemm's SMALL_SCALE_THRESHOLD
  if (scale < small) {
    float org = (float)scale;
    scale = small;
    if (mn == 0.0f) mx = small * (qmax - qmin);
    else if (mx == 0.0f) mn = -small * (qmax - qmin);
    else { float amp = small / org; mn *= amp; mx *= amp; }
  }
  double zmin = qmin - mn / scale, zmax = qmax - mx / scale;
  double emin = std::abs(qmin) - std::abs(mn / scale), emax = std::abs(qmax) - std::abs(mx / scale);
  double z0 = emin < emax ? zmin : zmax;
  int32_t zp = z0 < qmin ? qmin : z0 > qmax ? qmax : (int32_t)std::nearbyint(z0);
  float fs = (float)scale, inv = 1.0f / fs, fz = (float)zp;
  const V vinv = vset1(inv), vz = vset1(fz);
  for (int t = 0; t < T; t++) {
    const float* xr = x + (size_t)t * ldx;
    uint8_t* qr = xq + (size_t)t * Kp;
    int k = 0;
    for (; k + VW <= K; k += VW) vquant(qr + k, vload(xr + k), vinv, vz);
    for (; k < K; k++) {
      float v = std::min(std::fma(xr[k], inv, fz), 2147483520.f);
      qr[k] = (uint8_t)std::min(255.f, std::max(0.f, std::nearbyint(v)));
    }
    for (; k < Kp; k++) qr[k] = 0;
  }
  *zp_out = zp;
  *scale_out = fs;
}

// y = x @ W^T (+ bias), or y += that when `add` (a residual).
static void matmul(const Mat& m, const float* x, int ldx, int T, float* y, int ldy, bool add, int nt, Scratch& s) {
  const int nblocks = (m.N + BW - 1) / BW;
  if (m.kind == 3) {
    const int ngroups = m.K / m.G;
    if (s.xq.size() < (size_t)T * m.Kp) s.xq.resize((size_t)T * m.Kp);
    if (s.gsum.size() < (size_t)T * ngroups) s.gsum.resize((size_t)T * ngroups);
    int32_t zp;
    float xs;
    quantize_rows(x, ldx, T, m.K, m.Kp, s.xq.data(), &zp, &xs);
    for (int t = 0; t < T; t++)
      for (int g = 0; g < ngroups; g++) {
        int32_t a = 0;
        for (int k = 0; k < m.G; k++) a += s.xq[(size_t)t * m.Kp + g * m.G + k];
        s.gsum[(size_t)t * ngroups + g] = a;
      }
    const uint8_t* xq = s.xq.data();
    const int32_t* A = s.gsum.data();
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int nb = 0; nb < nblocks; nb++) rows_i4(xq, A, T, m, nb, zp, xs, y, ldy, add);
  } else if (m.kind == 2) {
    const bool amx = g_amx_rows > 0 && T >= g_amx_rows;
    // AMX: R rows per A tile (TDPBUSD's time grows with them), the last tile's padding zero
    const int R = (T + (T + AR - 1) / AR - 1) / ((T + AR - 1) / AR);
    const size_t rows = amx ? (size_t)(T + R - 1) / R * R : (size_t)T;
    const int lq = amx ? (m.Kp + 63) / 64 * 64 : m.Kp;  // AMX: whole 64-byte A tile rows
    if (s.xq.size() < rows * lq) s.xq.resize(rows * lq);
    int32_t zp;
    float xs;
    quantize_rows(x, ldx, T, m.K, lq, s.xq.data(), &zp, &xs);
    const uint8_t* xq = s.xq.data();
#if defined(NSTEP_AMX)
    if (amx) {
      memset(s.xq.data() + (size_t)T * lq, 0, (rows - T) * lq);
#pragma omp parallel num_threads(nt) if (nt > 1)
      {
        amx_config(R);  // per thread: tile state is a thread's own
#pragma omp for schedule(static)
        for (int nb = 0; nb < nblocks; nb++) rows_i8_amx(xq, lq, T, R, m, nb, zp, xs, y, ldy, add);
        amx_release();
      }
      return;
    }
#endif
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int nb = 0; nb < nblocks; nb++) rows_i8(xq, T, m, nb, zp, xs, y, ldy, add);
  } else if (m.kind == 1) {
#if defined(NSTEP_AMX_BF16)
    if (m.wbf && g_amxh_rows > 0 && T >= (nt > 1 ? std::max(g_amxh_rows, AMXH_ROWS_MT) : g_amxh_rows)) {
      const int ntiles = (T + AR - 1) / AR, R = (T + ntiles - 1) / ntiles;  // as even as the int8 path's
      const size_t rows = (size_t)(T + R - 1) / R * R;
      const int Kb = (m.K + 31) / 32 * 32;
      if (s.xb.size() < 3 * rows * Kb) s.xb.resize(3 * rows * Kb);
      bf16_split_rows(x, ldx, T, m.K, Kb, rows, s.xb.data());
      const uint16_t* xs = s.xb.data();
#pragma omp parallel num_threads(nt) if (nt > 1)
      {
        amx_config(R, 7);
#pragma omp for schedule(static)
        for (int nb = 0; nb < nblocks; nb++) rows_h_amx(xs, rows, Kb, T, R, m, nb, y, ldy, add);
        amx_release();
      }
      return;
    }
#endif
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int nb = 0; nb < nblocks; nb++) rows_f<true>(x, ldx, T, m, nb, y, ldy, add);
  } else {
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int nb = 0; nb < nblocks; nb++) rows_f<false>(x, ldx, T, m, nb, y, ldy, add);
  }
}

static inline float dot(const float* a, const float* b, int n) {
  V s = vzero();
  int i = 0;
  for (; i + VW <= n; i += VW) s = vfma(vload(a + i), vload(b + i), s);
  float r = vsum(s);
  for (; i < n; i++) r += a[i] * b[i];
  return r;
}

// x · rsqrt(mean(x²) + eps) · w, as torch's rms_norm in float32.
static void rms(const float* x, int ld, int T, int n, const float* w, float eps, float* out, int ldo) {
  for (int t = 0; t < T; t++) {
    const float* xr = x + (size_t)t * ld;
    float* o = out + (size_t)t * ldo;
    float r = 1.0f / std::sqrt(dot(xr, xr, n) / n + eps);
    for (int i = 0; i < n; i++) o[i] = xr[i] * r * w[i];
  }
}

static void embed_rows(const Model& m, const int64_t* ids, int T, float* x) {
  for (int t = 0; t < T; t++) {
    float* o = x + (size_t)t * m.D;
    size_t off = (size_t)ids[t] * m.D;
    if (m.embed_kind == 0) {
      memcpy(o, (const float*)m.embed + off, sizeof(float) * m.D);
    } else {
      const uint16_t* e = (const uint16_t*)m.embed + off;
      for (int i = 0; i < m.D; i++) {
        if (m.embed_kind == 1) {
          o[i] = _cvtsh_ss(e[i]);
        } else {
          uint32_t b = (uint32_t)e[i] << 16;
          memcpy(o + i, &b, 4);
        }
      }
    }
  }
}

// One query row over keys K[lo..lo+n) of one head: softmax(q·k · scale) · V into out. NH vectors
// of VW hold a head (the last one `tail` lanes wide); q and the output stay in registers.
template <int NH, typename KT>
static void attend_row(const float* qr, const KT* K, const KT* Vv, int hd, int lo, int n, float scale,
                       float* sc, float* o) {
  const int tail = hd - (NH - 1) * VW;
  V q[NH];
  #pragma GCC unroll 16
  for (int c = 0; c < NH - 1; c++) q[c] = vmul(vload(qr + c * VW), vset1(scale));
  q[NH - 1] = vmul(vloadm(qr + (NH - 1) * VW, tail), vset1(scale));
  float mx = -INFINITY;
  for (int j = 0; j < n; j++) {
    const KT* kr = K + (size_t)(lo + j) * hd;
    V a = vmul(q[0], NH == 1 ? kloadm(kr, tail) : kload(kr));
    for (int c = 1; c < NH - 1; c++) a = vfma(q[c], kload(kr + c * VW), a);
    if (NH > 1) a = vfma(q[NH - 1], kloadm(kr + (NH - 1) * VW, tail), a);
    float s = vsum(a);
    sc[j] = s;
    mx = std::max(mx, s);
  }
  V sum = vzero(), neg = vset1(-mx);
  int j = 0;
  for (; j + VW <= n; j += VW) {
    V e = vexp(vadd(vload(sc + j), neg));
    vstore(sc + j, e);
    sum = vadd(sum, e);
  }
  if (j < n) {
    V e = vexp(vadd(vloadm(sc + j, n - j), neg));
    vstorem(sc + j, e, n - j);
    sum = vadd(sum, vloadm(sc + j, n - j));
  }
  const float inv = 1.0f / vsum(sum);
  V acc[NH];
  #pragma GCC unroll 16
  for (int c = 0; c < NH; c++) acc[c] = vzero();
  for (int jj = 0; jj < n; jj++) {
    const V w = vset1(sc[jj]);
    const KT* vr = Vv + (size_t)(lo + jj) * hd;
    #pragma GCC unroll 16
    for (int c = 0; c < NH - 1; c++) acc[c] = vfma(w, kload(vr + c * VW), acc[c]);
    acc[NH - 1] = vfma(w, kloadm(vr + (NH - 1) * VW, tail), acc[NH - 1]);
  }
  const V iv = vset1(inv);
  #pragma GCC unroll 16
  for (int c = 0; c < NH - 1; c++) vstore(o + c * VW, vmul(acc[c], iv));
  vstorem(o + (NH - 1) * VW, vmul(acc[NH - 1], iv), tail);
}

// Scores of RS rows over keys K[0..n): s[i][j] = qs[i] · k_j (q rows zero past hd). Each key row is loaded into
// registers once for the RS rows (the K cache of a head, ~115 KB at depth 400, sits in L2: read
// once per row it bounded a verify by L2 bandwidth); one horizontal sum per key and row remains.
template <int NH, int RS, typename KT>
static inline void score_rows(const float* qs, int ldq, const KT* K, int hd, int n, float* s, int lds) {
  const int tail = hd - (NH - 1) * VW;
  for (int j = 0; j < n; j++) {
    const KT* kr = K + (size_t)j * hd;
    V k[NH];
    #pragma GCC unroll 16
    for (int c = 0; c < NH - 1; c++) k[c] = kload(kr + c * VW);
    k[NH - 1] = kloadm(kr + (NH - 1) * VW, tail);
    #pragma GCC unroll 16
    for (int i = 0; i < RS; i++) {
      const float* qi = qs + (size_t)i * ldq;
      V a = vmul(vload(qi), k[0]);
      #pragma GCC unroll 16
      for (int c = 1; c < NH; c++) a = vfma(vload(qi + c * VW), k[c], a);
      s[(size_t)i * lds + j] = vsum(a);
    }
  }
}

// The horizontal sums of VW vectors at once, as one vector (lane j: the sum of a[j]): a transpose
// by halves (pairs of vectors, then quarters, ...) whose adds stay vertical, ~3 shuffles and adds
// per sum instead of a reduction tree per vector; the lanes come out interleaved, put back by one
// permute.
static inline V vsum_each(const V* a) {
#if defined(__AVX512F__)
  V b[8], c[4], d[2];
  #pragma GCC unroll 8
  for (int k = 0; k < 8; k++)
    b[k] = vadd(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0x44), _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0xEE));
  #pragma GCC unroll 4
  for (int k = 0; k < 4; k++)
    c[k] = vadd(_mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], 0x88), _mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], 0xDD));
  #pragma GCC unroll 2
  for (int k = 0; k < 2; k++)
    d[k] = vadd(_mm512_shuffle_ps(c[2 * k], c[2 * k + 1], 0x44), _mm512_shuffle_ps(c[2 * k], c[2 * k + 1], 0xEE));
  const V r = vadd(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));  // lane 4q+m: a[q+4m]
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
#else
  V b[4], c[2];
  #pragma GCC unroll 4
  for (int k = 0; k < 4; k++)
    b[k] = vadd(_mm256_permute2f128_ps(a[2 * k], a[2 * k + 1], 0x20), _mm256_permute2f128_ps(a[2 * k], a[2 * k + 1], 0x31));
  #pragma GCC unroll 2
  for (int k = 0; k < 2; k++)
    c[k] = vadd(_mm256_shuffle_ps(b[2 * k], b[2 * k + 1], 0x44), _mm256_shuffle_ps(b[2 * k], b[2 * k + 1], 0xEE));
  const V r = vadd(_mm256_shuffle_ps(c[0], c[1], 0x88), _mm256_shuffle_ps(c[0], c[1], 0xDD));  // lane 4h+m: a[2m+h]
  return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
#endif
}

// Scores of R rows over one block of VW keys K[0..VW): s[i][0..VW) = qs[i] · k_j, the VW dot
// products reduced together (vsum_each). The block (VW · hd floats) stays in L1 across the rows;
// an fp16 block is widened once for them all (else every row converts every key again).
template <int NH, typename KT>
static inline void score_block(const float* qs, int ldq, int R, const KT* K, int hd, float* s, int lds) {
  if constexpr (std::is_same_v<KT, uint16_t>) {
    if (R > 1) {
      alignas(64) float kb[VW * NH * VW];
      const int tail = hd - (NH - 1) * VW;
      for (int j = 0; j < VW; j++) {
        const uint16_t* kr = K + (size_t)j * hd;
        #pragma GCC unroll 16
        for (int c = 0; c < NH - 1; c++) vstore(kb + (size_t)j * NH * VW + c * VW, kload(kr + c * VW));
        vstore(kb + (size_t)j * NH * VW + (NH - 1) * VW, kloadm(kr + (NH - 1) * VW, tail));
      }
      score_block<NH, float>(qs, ldq, R, kb, NH * VW, s, lds);
      return;
    }
  }
  const int tail = hd - (NH - 1) * VW;
  for (int i = 0; i < R; i++) {
    const float* qi = qs + (size_t)i * ldq;
    V q[NH], a[VW];
    #pragma GCC unroll 16
    for (int c = 0; c < NH; c++) q[c] = vload(qi + c * VW);
    #pragma GCC unroll 16
    for (int j = 0; j < VW; j++) {
      const KT* kr = K + (size_t)j * hd;
      V x = vmul(q[0], NH == 1 ? kloadm(kr, tail) : kload(kr));
      #pragma GCC unroll 16
      for (int c = 1; c < NH - 1; c++) x = vfma(q[c], kload(kr + c * VW), x);
      if (NH > 1) x = vfma(q[NH - 1], kloadm(kr + (NH - 1) * VW, tail), x);
      a[j] = x;
    }
    vstore(s + (size_t)i * lds, vsum_each(a));
  }
}

// Values for RN rows: o_i = inv_i · Σ_j w[i][j] · v_j over keys [jlo, jhi) (weights of keys a row
// does not see are 0), each value row loaded once for the RN rows. Row r0 + i is head
// hA + (r0 + i) / T at t = (r0 + i) % T.
template <int NH, int RN, typename KT>
static inline void value_rows(const float* w, int ldw, const KT* Vv, int hd, int jlo, int jhi, const float* inv,
                              float* out, int ldo, int T, int hA, int r0) {
  const int tail = hd - (NH - 1) * VW;
  V acc[RN][NH];
  #pragma GCC unroll 16
  for (int i = 0; i < RN; i++)
    #pragma GCC unroll 16
    for (int c = 0; c < NH; c++) acc[i][c] = vzero();
  for (int j = jlo; j < jhi; j++) {
    const KT* vr = Vv + (size_t)j * hd;
    #pragma GCC unroll 16
    for (int i = 0; i < RN; i++) {
      const V wi = vset1(w[(size_t)i * ldw + j]);
      #pragma GCC unroll 16
      for (int c = 0; c < NH - 1; c++) acc[i][c] = vfma(wi, kload(vr + c * VW), acc[i][c]);
      acc[i][NH - 1] = vfma(wi, kloadm(vr + (NH - 1) * VW, tail), acc[i][NH - 1]);
    }
  }
  #pragma GCC unroll 16
  for (int i = 0; i < RN; i++) {
    float* o = out + (size_t)((r0 + i) % T) * ldo + (size_t)(hA + (r0 + i) / T) * hd;
    const V iv = vset1(inv[i]);
    #pragma GCC unroll 16
    for (int c = 0; c < NH - 1; c++) vstore(o + c * VW, vmul(acc[i][c], iv));
    vstorem(o + (NH - 1) * VW, vmul(acc[i][NH - 1], iv), tail);
  }
}

#if defined(__AVX512F__)
constexpr int NREG = 32;
#else
constexpr int NREG = 16;
#endif

// Attention of the R = (hB - hA)·T query rows that share one K/V head (a GQA group's heads hA..hB
// at positions p..p+T), reading each key and value once for all R rows instead of once per row:
// 1. scores: blocks of VW keys for all rows, summed together (score_block), the last keys RS rows
//    per key load (score_rows);
// 2. a softmax per row over the keys it sees (causal: pos + 1; Mistral's window), kept as weights;
// 3. values: each value row loaded once for RV rows, RV·NH accumulators in registers.
// Row r is head hA + r / T at position p + r % T.
template <int NH, typename KT>
static void attend_group(const float* q, int ldq, const KT* K, const KT* Vv, int hd, int p, int T, int hA,
                         int hB, int window, float scale, float* out, int ldo, std::vector<float>& buf) {
  constexpr int RS = 8, RV = std::max(1, std::min(8, (NREG - 2) / NH));
  const int R = (hB - hA) * T;
  const int lo0 = window > 0 ? std::max(0, p - window + 1) : 0;  // keys some row sees: [lo0, p + T)
  const int n = p + T - lo0, np = (n + VW - 1) / VW * VW;
  static thread_local std::vector<int> span;
  span.resize(2 * (size_t)R);
  constexpr int W = NH * VW;
  buf.resize((size_t)R * W + (size_t)R * np + R);
  float* qs = buf.data();                     // [R, W] queries · scale, zero past hd
  float* S = qs + (size_t)R * W;              // [R, np] scores, then exp(score - max)
  float* inv = S + (size_t)R * np;            // [R] 1 / sum of a row's weights
  int *lo = span.data(), *hi = lo + R;        // [R] the keys row r sees: [lo, hi) from lo0
  for (int r = 0; r < R; r++) {
    const int t = r % T, pos = p + t;
    const float* qr = q + (size_t)t * ldq + (size_t)(hA + r / T) * hd;
    for (int d = 0; d < W; d++) qs[(size_t)r * W + d] = d < hd ? qr[d] * scale : 0.f;
    lo[r] = (window > 0 ? std::max(0, pos - window + 1) : 0) - lo0;
    hi[r] = pos + 1 - lo0;
  }
  const KT* K0 = K + (size_t)lo0 * hd;
  const int nb = n / VW * VW;
  for (int j0 = 0; j0 < nb; j0 += VW) score_block<NH>(qs, W, R, K0 + (size_t)j0 * hd, hd, S + j0, np);
  for (int r0 = 0; r0 < R && nb < n;) {  // the last n % VW keys: RS rows at a time, then 4, 2, 1
    const float* qr = qs + (size_t)r0 * W;
    const KT* Kt = K0 + (size_t)nb * hd;
    float* s0 = S + (size_t)r0 * np + nb;
    const int left = R - r0;
    if (left >= RS) score_rows<NH, RS>(qr, W, Kt, hd, n - nb, s0, np), r0 += RS;
    else if (left >= 4) score_rows<NH, 4>(qr, W, Kt, hd, n - nb, s0, np), r0 += 4;
    else if (left >= 2) score_rows<NH, 2>(qr, W, Kt, hd, n - nb, s0, np), r0 += 2;
    else score_rows<NH, 1>(qr, W, Kt, hd, n - nb, s0, np), r0 += 1;
  }
  for (int r = 0; r < R; r++) {
    float* s = S + (size_t)r * np;
    for (int j = 0; j < lo[r]; j++) s[j] = -INFINITY;
    for (int j = hi[r]; j < np; j++) s[j] = -INFINITY;
    V mv = vset1(-INFINITY);
    for (int j = lo[r] / VW * VW; j < np; j += VW) mv = vmax(mv, vload(s + j));
    const V neg = vset1(-vhmax(mv));
    const int j0 = lo[r] / VW * VW;
    for (int j = j0; j < np; j += VW) vstore(s + j, vexp(vadd(vload(s + j), neg)));
    for (int j = 0; j < lo[r]; j++) s[j] = 0.f;  // masked keys weigh exactly 0 (vexp floors at e^-87)
    for (int j = hi[r]; j < np; j++) s[j] = 0.f;
    V sum = vzero();
    for (int j = j0; j < np; j += VW) sum = vadd(sum, vload(s + j));
    inv[r] = 1.0f / vsum(sum);
  }
  for (int r = 0; r < R;) {  // RV rows at a time, then 4, 2, 1
    const int left = R - r;
    const int rn = left >= RV ? RV : left >= 4 ? 4 : left >= 2 ? 2 : 1;
    int jlo = lo[r], jhi = hi[r];
    for (int i = 1; i < rn; i++) jlo = std::min(jlo, lo[r + i]), jhi = std::max(jhi, hi[r + i]);
    const float* w = S + (size_t)r * np;
    const KT* V0 = Vv + (size_t)lo0 * hd;
    if (rn == RV) value_rows<NH, RV>(w, np, V0, hd, jlo, jhi, inv + r, out, ldo, T, hA, r);
    else if (rn == 4) value_rows<NH, 4>(w, np, V0, hd, jlo, jhi, inv + r, out, ldo, T, hA, r);
    else if (rn == 2) value_rows<NH, 2>(w, np, V0, hd, jlo, jhi, inv + r, out, ldo, T, hA, r);
    else value_rows<NH, 1>(w, np, V0, hd, jlo, jhi, inv + r, out, ldo, T, hA, r);
    r += rn;
  }
}

template <typename KT>
using RowFn = void (*)(const float*, const KT*, const KT*, int, int, int, float, float*, float*);
template <typename KT>
using GroupFn = void (*)(const float*, int, const KT*, const KT*, int, int, int, int, int, int, float, float*, int,
                         std::vector<float>&);

// The instance for nh = ceil(hd / VW) vectors a head (1..16; null past that).
template <typename KT, int NH = 1>
static RowFn<KT> row_fn(int nh) {
  if constexpr (NH > 16) return nullptr;
  else return nh == NH ? attend_row<NH, KT> : row_fn<KT, NH + 1>(nh);
}

template <typename KT, int NH = 1>
static GroupFn<KT> group_fn(int nh) {
  if constexpr (NH > 16) return nullptr;
  else return nh == NH ? attend_group<NH, KT> : group_fn<KT, NH + 1>(nh);
}

// Attention of T queries at positions p.. over the cache (keys up to each query's position,
// the last `window` of them when set) for query heads [h0, h1). One row (a decode step) takes
// attend_row; 2+ rows take attend_group per K/V head, TG positions at a time (bounds the scores
// kept, and the keys scored past a row's own position: at most TG - 1 per row).
template <typename KT>
static void attend(const Model& m, const float* q, int ldq, const KT* kc, const KT* vc, int P, int p, int T,
                   int h0, int h1, float* out, int ldo, std::vector<float>& sc) {
  constexpr int TG = 16;
  const int hd = m.hd, g = m.H / m.Hkv, nh = (hd + VW - 1) / VW;
  const float scale = 1.0f / std::sqrt((float)hd);
  if (T >= 2) {
    const GroupFn<KT> fn = group_fn<KT>(nh);
    for (int kv = h0 / g; kv * g < h1; kv++) {
      const KT* K = kc + (size_t)kv * P * hd;
      const KT* Vv = vc + (size_t)kv * P * hd;
      const int hA = std::max(h0, kv * g), hB = std::min(h1, (kv + 1) * g);
      for (int t0 = 0; t0 < T; t0 += TG)
        fn(q + (size_t)t0 * ldq, ldq, K, Vv, hd, p + t0, std::min(TG, T - t0), hA, hB, m.window, scale,
           out + (size_t)t0 * ldo, ldo, sc);
    }
    return;
  }
  const RowFn<KT> fn = row_fn<KT>(nh);
  sc.resize(p + T + VW);
  for (int h = h0; h < h1; h++) {
    const KT* K = kc + (size_t)(h / g) * P * hd;
    const KT* Vv = vc + (size_t)(h / g) * P * hd;
    const int lo = m.window > 0 ? std::max(0, p - m.window + 1) : 0;
    fn(q + (size_t)h * hd, K, Vv, hd, lo, p + 1 - lo, scale, sc.data(), out + (size_t)h * hd);
  }
}

// The K/V rows of T new tokens (their rotated keys and values in `qkv` rows) into one layer of a
// sequence's cache, then their attention.
template <typename KT>
static void write_attend(const Model& m, const float* qkv, int nqkv, KT* kl, KT* vl, int P, int p, int T,
                         float* orows, int nt, std::vector<std::vector<float>>& sc) {
  const int H = m.H, Hkv = m.Hkv, hd = m.hd;
  for (int t = 0; t < T; t++)
    for (int hh = 0; hh < Hkv; hh++) {
      const float* row = qkv + (size_t)t * nqkv;
      kstore(kl + ((size_t)hh * P + p + t) * hd, row + (size_t)(H + hh) * hd, hd);
      kstore(vl + ((size_t)hh * P + p + t) * hd, row + (size_t)(H + Hkv + hh) * hd, hd);
    }
  if (nt > 1 && H > 1) {
#pragma omp parallel num_threads(nt)
    {
#ifdef _OPENMP
      int id = omp_get_thread_num(), nth = omp_get_num_threads();
#else
      int id = 0, nth = 1;
#endif
      attend(m, qkv, nqkv, kl, vl, P, p, T, H * id / nth, H * (id + 1) / nth, orows, H * hd, sc[id]);
    }
  } else {
    attend(m, qkv, nqkv, kl, vl, P, p, T, 0, H, orows, H * hd, sc[0]);
  }
}

struct Work {
  std::vector<float> x, xn, qkv, att, gu, h;
  std::vector<std::vector<float>> sc;
  Scratch s;
};

static thread_local Work work;

}  // namespace

extern "C" {

// One sequence of a step: its runner's cache (kc, vc: [L, Hkv, P, hd], float32 or with kv16
// fp16), rotations (rot: [P, hd/2] complex64) and T new tokens at positions p...
struct Seq {
  void* kc;
  void* vc;
  const float* rot;
  int32_t P, T, p, kv16;
};

// Append each sequence's tokens (ids: theirs one after another) and write their logits [ΣT, V]
// (over the model's head rows). The products run once over all ΣT rows (one weight read for
// them all); RoPE, the K/V write and attention run per sequence over its own cache. The engine
// steps one sequence per call (nstep_forward): batched native steps measured no faster than
// side-by-side ones on 2 cores (README, bench/concurrency.py).
int nstep_forward_many(const Model* mp, const Seq* seqs, int n, const int64_t* ids, float* logits, int nt) {
  const Model& m = *mp;
  int S = 0;
  for (int i = 0; i < n; i++) {
    if (seqs[i].p + seqs[i].T > seqs[i].P || seqs[i].T <= 0 || (seqs[i].kv16 && m.hd % 2)) return 1;
    S += seqs[i].T;
  }
  if (n <= 0 || m.hd > 16 * VW) return 1;
  Work& w = work;
  const int D = m.D, H = m.H, Hkv = m.Hkv, hd = m.hd, I = m.I;
  const int nqkv = (H + 2 * Hkv) * hd;
  w.x.resize((size_t)S * D);
  w.xn.resize((size_t)S * D);
  w.qkv.resize((size_t)S * nqkv);
  w.att.resize((size_t)S * H * hd);
  w.gu.resize((size_t)S * 2 * I);
  w.h.resize((size_t)S * I);
  nt = std::max(1, nt);
  if ((int)w.sc.size() < nt) w.sc.resize(nt);
  float* x = w.x.data();
  embed_rows(m, ids, S, x);
  for (int li = 0; li < m.L; li++) {
    const Layer& L = m.layers[li];
    rms(x, D, S, D, L.w_in, m.eps, w.xn.data(), D);
    matmul(L.qkv, w.xn.data(), D, S, w.qkv.data(), nqkv, false, nt, w.s);
    for (int i = 0, row0 = 0; i < n; row0 += seqs[i].T, i++) {
      const Seq& q = seqs[i];
      for (int t = 0; t < q.T; t++) {  // q/k norm (Qwen3) and RoPE, in place
        float* row = w.qkv.data() + (size_t)(row0 + t) * nqkv;
        const float* r = q.rot + (size_t)(q.p + t) * hd;  // complex pairs (cos, sin)
        for (int hh = 0; hh < H + Hkv; hh++) {
          float* v = row + (size_t)hh * hd;
          if (L.q_norm) {  // Qwen3: RMSNorm per head before RoPE
            const float* nw = hh < H ? L.q_norm : L.k_norm;
            float sc = 1.0f / std::sqrt(dot(v, v, hd) / hd + m.eps);
            for (int j = 0; j < hd; j++) v[j] = v[j] * sc * nw[j];
          }
          for (int j = 0; j < hd; j += 2) {
            float a = v[j], b = v[j + 1], c = r[j], sn = r[j + 1];
            v[j] = a * c - b * sn;
            v[j + 1] = a * sn + b * c;
          }
        }
      }
      const size_t layer_kv = (size_t)li * Hkv * q.P * hd;
      const float* qrows = w.qkv.data() + (size_t)row0 * nqkv;
      float* orows = w.att.data() + (size_t)row0 * H * hd;
      if (q.kv16)
        write_attend(m, qrows, nqkv, (uint16_t*)q.kc + layer_kv, (uint16_t*)q.vc + layer_kv, q.P, q.p, q.T, orows, nt, w.sc);
      else
        write_attend(m, qrows, nqkv, (float*)q.kc + layer_kv, (float*)q.vc + layer_kv, q.P, q.p, q.T, orows, nt, w.sc);
    }
    matmul(L.o, w.att.data(), H * hd, S, x, D, true, nt, w.s);
    rms(x, D, S, D, L.w_post, m.eps, w.xn.data(), D);
    matmul(L.gu, w.xn.data(), D, S, w.gu.data(), 2 * I, false, nt, w.s);
    for (int t = 0; t < S; t++) {  // SiLU(gate) · up
      const float* gr = w.gu.data() + (size_t)t * 2 * I;
      float* hr = w.h.data() + (size_t)t * I;
      int j = 0;
      for (; j + VW <= I; j += VW) {
        V gv = vload(gr + j);
        V e = vexp(vmul(gv, vset1(-1.f)));
        vstore(hr + j, vmul(vmul(gv, vload(gr + I + j)), vset1(1.f) / vadd(vset1(1.f), e)));
      }
      for (; j < I; j++) hr[j] = gr[j] / (1.f + std::exp(-gr[j])) * gr[I + j];
    }
    matmul(L.down, w.h.data(), I, S, x, D, true, nt, w.s);
  }
  rms(x, D, S, D, m.norm, m.eps, w.xn.data(), D);
  matmul(m.head, w.xn.data(), D, S, logits, m.V, false, nt, w.s);
  return 0;
}

// One runner's forward: T tokens at positions p.. (see Seq).
int nstep_forward(const Model* mp, void* kc, void* vc, int kv16, int P, const float* rot, const int64_t* ids, int T,
                  int p, float* logits, int nt) {
  const Seq one{kc, vc, rot, P, T, p, kv16};
  return nstep_forward_many(mp, &one, 1, ids, logits, nt);
}

// A draft's greedy proposal in one call: feed T tokens at positions p.., then take its argmax
// (the first of equal maxima, as torch's), feed that, and so on: k ids into `out` (vocabulary ids:
// through `rows` when the head is restricted). The cache then holds the feed and the first k-1.
int nstep_greedy(const Model* mp, void* kc, void* vc, int kv16, int P, const float* rot, const int64_t* ids, int T,
                 int p, int k, const int64_t* rows, int64_t* out, int nt) {
  static thread_local std::vector<float> lg;
  const int V = mp->V;
  if (k < 1 || p + T + k - 1 > P) return 1;
  lg.resize((size_t)T * V);
  int rc = nstep_forward(mp, kc, vc, kv16, P, rot, ids, T, p, lg.data(), nt);
  const float* last = lg.data() + (size_t)(T - 1) * V;
  for (int i = 0; rc == 0 && i < k; i++) {
    int best = 0;
    for (int j = 1; j < V; j++)
      if (last[j] > last[best]) best = j;
    out[i] = rows ? rows[best] : best;
    if (i + 1 < k) {
      rc = nstep_forward(mp, kc, vc, kv16, P, rot, out + i, 1, p + T + i, lg.data(), nt);
      last = lg.data();
    }
  }
  return rc;
}

// One product on its own (tests, and the prefill path's products): y[T, N] = x[T, K] @ W^T.
int nstep_matmul(const Mat* m, const float* x, int T, float* y, int nt) {
  static thread_local Scratch s;
  matmul(*m, x, m->K, T, y, m->N, false, std::max(1, nt), s);
  return 0;
}

// Attention on its own (tests): T queries q[T, H, hd] at positions p.. over kc, vc [Hkv, P, hd]
// (float32, or fp16 with kv16; the new rows already written), keys up to each query's position
// (the last `window` when > 0), into out[T, H, hd]; one thread.
int nstep_attend(const float* q, const void* kc, const void* vc, int kv16, int P, int p, int T, int H, int Hkv,
                 int hd, int window, float* out) {
  if (T <= 0 || p < 0 || p + T > P || Hkv <= 0 || H % Hkv || hd <= 0 || hd > 16 * VW || (kv16 && hd % 2)) return 1;
  Model m{};
  m.H = H, m.Hkv = Hkv, m.hd = hd, m.window = window;
  static thread_local std::vector<float> sc;
  if (kv16) attend(m, q, H * hd, (const uint16_t*)kc, (const uint16_t*)vc, P, p, T, 0, H, out, H * hd, sc);
  else attend(m, q, H * hd, (const float*)kc, (const float*)vc, P, p, T, 0, H, out, H * hd, sc);
  return 0;
}

}  // extern "C"
