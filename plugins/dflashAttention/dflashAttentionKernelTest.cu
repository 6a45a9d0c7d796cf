/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Self-checking GPU test of the DFlash draft-attention kernels: random inputs, kernel vs CPU twin (output and both
 * caches, elementwise), sequence 0 alone vs inside its batch (bit-identical: the split of the context depends only on
 * the sequence), then timing with the achieved bandwidth of the byte model in README.md.
 * Exit code 0 when every check passes. Usage: dflash_attention_kernel_test [--quick]
 */
#include "dflashAttentionCpu.h"
#include "dflashAttentionKernel.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace
{

using namespace dflash;

#define CHECK_CUDA(call)                                                                                               \
    do                                                                                                                 \
    {                                                                                                                  \
        cudaError_t const status_ = (call);                                                                            \
        if (status_ != cudaSuccess)                                                                                    \
        {                                                                                                              \
            std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(status_), __FILE__, __LINE__);         \
            std::exit(2);                                                                                              \
        }                                                                                                              \
    } while (0)

struct Case
{
    char const* name;
    DataType type;
    int32_t batch, blockLen, numHeads, numKvHeads, headDim, ctxRows, cacheCapacity;
    int32_t maxCacheLen; //!< cache lengths drawn in [maxCacheLen / 2, maxCacheLen]
    bool yarn;
    bool checkCpu; //!< compare with the CPU twin (skipped for the large timing cases)
};

//! Host buffer of n elements of the case's type, filled from N(0, 1).
std::vector<uint16_t> randomBuffer(size_t n, DataType type, std::mt19937& rng)
{
    std::normal_distribution<float> dist(0.F, 1.F);
    std::vector<uint16_t> buf(type == DataType::kFLOAT ? 2 * n : n);
    for (size_t i = 0; i < n; ++i)
    {
        float const x = dist(rng);
        if (type == DataType::kFLOAT)
        {
            std::memcpy(&buf[2 * i], &x, sizeof(x));
        }
        else if (type == DataType::kHALF)
        {
            buf[i] = fromFloat<Fp16>(x).bits;
        }
        else
        {
            buf[i] = fromFloat<Bf16>(x).bits;
        }
    }
    return buf;
}

float elementAt(std::vector<uint16_t> const& buf, size_t i, DataType type)
{
    if (type == DataType::kFLOAT)
    {
        float x;
        std::memcpy(&x, &buf[2 * i], sizeof(x));
        return x;
    }
    return type == DataType::kHALF ? toFloat(Fp16{buf[i]}) : toFloat(Bf16{buf[i]});
}

//! Elementwise tolerance |a - ref| <= rtol |ref| + atol max|ref|: bf16/fp16 P V products round the softmax weights to
//! the I/O type, so the kernel may differ from the fp32 twin by about one unit in the last place of each output.
struct Tolerance
{
    float rtol;
    float atol;
};

Tolerance tolerance(DataType type)
{
    return type == DataType::kFLOAT ? Tolerance{1e-4F, 1e-5F}
                                    : (type == DataType::kHALF ? Tolerance{2.F / 1024, 1.F / 4096}
                                                               : Tolerance{2.F / 128, 1.F / 512});
}

//! Count of elements outside the tolerance; worst receives the largest abs difference.
size_t countBad(std::vector<uint16_t> const& a, std::vector<uint16_t> const& ref, size_t n, DataType type,
    Tolerance tol, float& worst)
{
    float largest = 0.F;
    for (size_t i = 0; i < n; ++i)
    {
        largest = std::max(largest, std::fabs(elementAt(ref, i, type)));
    }
    size_t bad = 0;
    worst = 0.F;
    for (size_t i = 0; i < n; ++i)
    {
        float const r = elementAt(ref, i, type);
        float const diff = std::fabs(elementAt(a, i, type) - r);
        worst = std::max(worst, diff);
        bad += (diff > tol.rtol * std::fabs(r) + tol.atol * largest || std::isnan(diff)) ? 1 : 0;
    }
    return bad;
}

struct DeviceBuffer
{
    void* ptr{nullptr};
    explicit DeviceBuffer(size_t bytes)
    {
        CHECK_CUDA(cudaMalloc(&ptr, std::max<size_t>(bytes, 1)));
    }
    ~DeviceBuffer()
    {
        cudaFree(ptr);
    }
    void upload(void const* src, size_t bytes)
    {
        CHECK_CUDA(cudaMemcpy(ptr, src, bytes, cudaMemcpyHostToDevice));
    }
    void download(void* dst, size_t bytes) const
    {
        CHECK_CUDA(cudaMemcpy(dst, ptr, bytes, cudaMemcpyDeviceToHost));
    }
};

//! Bytes one call moves in DRAM (README "Expected bytes moved"), for the achieved-bandwidth figure.
double bytesMoved(Case const& c, std::vector<int32_t> const& cacheLens, std::vector<int32_t> const& ctxLens)
{
    double const e = dataTypeSize(c.type);
    double const row = static_cast<double>(c.headDim) * e;
    int32_t const group = c.numHeads / c.numKvHeads;
    int32_t const rows = rowsPerCta(static_cast<int32_t>(c.type), c.headDim);
    int32_t const rowTiles = (group * c.blockLen + rows - 1) / rows;
    double bytes = 2.0 * c.batch * c.blockLen * c.numHeads * row; // q in, out
    bytes += 2.0 * c.batch * c.blockLen * c.numKvHeads * row * rowTiles; // block k, v
    for (int32_t b = 0; b < c.batch; ++b)
    {
        bytes += 4.0 * ctxLens[b] * c.numKvHeads * row;                                  // ctx k,v in; cache rows out
        bytes += 2.0 * (cacheLens[b] + ctxLens[b]) * c.numKvHeads * row * rowTiles; // cache k, v read
    }
    return bytes;
}

bool runCase(Case const& c, std::mt19937& rng, bool timing)
{
    DflashAttentionFields fields = defaultFields();
    fields.numHeads = c.numHeads;
    fields.numKvHeads = c.numKvHeads;
    fields.headDim = c.headDim;
    fields.ropeTheta = c.yarn ? 150000.F : 1000000.F;
    if (c.yarn)
    {
        fields.ropeType = kROPE_YARN;
        fields.yarnFactor = 32.F;
        fields.yarnOriginalMaxPosition = 4096;
    }
    DflashAttentionParams p = makeParams(fields);
    p.batch = c.batch;
    p.blockLen = c.blockLen;
    p.ctxRows = c.ctxRows;
    p.cacheCapacity = c.cacheCapacity;

    std::vector<int32_t> cacheLens(c.batch);
    std::vector<int32_t> ctxLens(c.batch);
    for (int32_t b = 0; b < c.batch; ++b)
    {
        cacheLens[b] = c.maxCacheLen / 2 + static_cast<int32_t>(rng() % (c.maxCacheLen / 2 + 1));
        ctxLens[b] = b == 0 ? c.ctxRows : static_cast<int32_t>(rng() % (c.ctxRows + 1));
    }
    size_t const e = dataTypeSize(c.type);
    size_t const nQ = static_cast<size_t>(c.batch) * c.blockLen * c.numHeads * c.headDim;
    size_t const nK = static_cast<size_t>(c.batch) * c.blockLen * c.numKvHeads * c.headDim;
    size_t const nCtx = static_cast<size_t>(c.batch) * c.ctxRows * c.numKvHeads * c.headDim;
    size_t const nCache = static_cast<size_t>(c.batch) * c.numKvHeads * c.cacheCapacity * c.headDim;
    auto q = randomBuffer(nQ, c.type, rng);
    auto k = randomBuffer(nK, c.type, rng);
    auto v = randomBuffer(nK, c.type, rng);
    auto ctxK = randomBuffer(nCtx, c.type, rng);
    auto ctxV = randomBuffer(nCtx, c.type, rng);
    auto cacheK = randomBuffer(nCache, c.type, rng);
    auto cacheV = randomBuffer(nCache, c.type, rng);

    DeviceBuffer dQ(nQ * e), dK(nK * e), dV(nK * e), dCtxK(nCtx * e), dCtxV(nCtx * e), dCacheK(nCache * e),
        dCacheV(nCache * e), dOut(nQ * e), dCacheLens(4 * c.batch), dCtxLens(4 * c.batch);
    size_t const wsBytes = dflashAttentionWorkspaceSize(
        c.batch, c.blockLen, c.numHeads, c.numKvHeads, c.headDim, c.cacheCapacity, c.type);
    DeviceBuffer dWs(wsBytes);
    dQ.upload(q.data(), nQ * e);
    dK.upload(k.data(), nK * e);
    dV.upload(v.data(), nK * e);
    dCtxK.upload(ctxK.data(), nCtx * e);
    dCtxV.upload(ctxV.data(), nCtx * e);
    dCacheK.upload(cacheK.data(), nCache * e);
    dCacheV.upload(cacheV.data(), nCache * e);
    dCacheLens.upload(cacheLens.data(), 4 * c.batch);
    dCtxLens.upload(ctxLens.data(), 4 * c.batch);

    DflashAttentionParams dp = p;
    dp.q = dQ.ptr;
    dp.k = dK.ptr;
    dp.v = dV.ptr;
    dp.ctxK = dCtxK.ptr;
    dp.ctxV = dCtxV.ptr;
    dp.cacheK = dCacheK.ptr;
    dp.cacheV = dCacheV.ptr;
    dp.cacheLens = static_cast<int32_t const*>(dCacheLens.ptr);
    dp.ctxLens = static_cast<int32_t const*>(dCtxLens.ptr);
    dp.out = dOut.ptr;
    CHECK_CUDA(launchDflashAttention(dp, c.type, dWs.ptr, wsBytes, nullptr));
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<uint16_t> gpuOut(q.size());
    std::vector<uint16_t> gpuCacheK(cacheK.size());
    std::vector<uint16_t> gpuCacheV(cacheV.size());
    dOut.download(gpuOut.data(), nQ * e);
    dCacheK.download(gpuCacheK.data(), nCache * e);
    dCacheV.download(gpuCacheV.data(), nCache * e);

    // Sequence 0 alone (batch 1, fresh cache) must give bit-identical output rows: its context split depends only on
    // its own length, never on the batch.
    bool ok = true;
    if (c.batch > 1)
    {
        DflashAttentionParams one = dp;
        one.batch = 1;
        size_t const oneQ = nQ / c.batch;
        size_t const oneCache = nCache / c.batch;
        DeviceBuffer dCacheK1(oneCache * e), dCacheV1(oneCache * e), dOut1(oneQ * e);
        dCacheK1.upload(cacheK.data(), oneCache * e);
        dCacheV1.upload(cacheV.data(), oneCache * e);
        one.cacheK = dCacheK1.ptr;
        one.cacheV = dCacheV1.ptr;
        one.out = dOut1.ptr;
        CHECK_CUDA(launchDflashAttention(one, c.type, dWs.ptr, wsBytes, nullptr));
        CHECK_CUDA(cudaDeviceSynchronize());
        std::vector<uint16_t> aloneOut(gpuOut.size());
        dOut1.download(aloneOut.data(), oneQ * e);
        if (std::memcmp(aloneOut.data(), gpuOut.data(), oneQ * e) != 0)
        {
            std::printf("%-28s sequence 0 differs between batch 1 and batch %d\n", c.name, c.batch);
            ok = false;
        }
    }

    float outErr = 0.F;
    float cacheErr = 0.F;
    if (c.checkCpu)
    {
        std::vector<uint16_t> cpuOut(q.size());
        DflashAttentionParams hp = p;
        hp.q = q.data();
        hp.k = k.data();
        hp.v = v.data();
        hp.ctxK = ctxK.data();
        hp.ctxV = ctxV.data();
        hp.cacheK = cacheK.data();
        hp.cacheV = cacheV.data();
        hp.cacheLens = cacheLens.data();
        hp.ctxLens = ctxLens.data();
        hp.out = cpuOut.data();
        std::string const error = dflashAttentionCpu(hp, c.type);
        if (!error.empty())
        {
            std::printf("%-28s CPU twin failed: %s\n", c.name, error.c_str());
            return false;
        }
        size_t const badOut = countBad(gpuOut, cpuOut, nQ, c.type, tolerance(c.type), outErr);
        // RoPE'd cache keys: one rounding of the same fp32 value (sincosf vs libm may move it by one unit);
        // values are copied, so they must be identical, and rows outside the appended ones untouched.
        size_t const badK = countBad(gpuCacheK, cacheK, nCache, c.type, Tolerance{1.F / 64, 0.F}, cacheErr);
        bool const sameV = std::memcmp(gpuCacheV.data(), cacheV.data(), nCache * e) == 0;
        if (badOut != 0 || badK != 0 || !sameV)
        {
            std::printf("%-28s %zu outputs and %zu cache keys out of tolerance, cache values %s\n", c.name, badOut,
                badK, sameV ? "identical" : "DIFFER");
            ok = false;
        }
    }

    double gbPerS = 0.0;
    double usPerCall = 0.0;
    if (timing)
    {
        cudaEvent_t start;
        cudaEvent_t stop;
        CHECK_CUDA(cudaEventCreate(&start));
        CHECK_CUDA(cudaEventCreate(&stop));
        int32_t const iterations = 50;
        CHECK_CUDA(cudaEventRecord(start));
        for (int32_t i = 0; i < iterations; ++i)
        {
            CHECK_CUDA(launchDflashAttention(dp, c.type, dWs.ptr, wsBytes, nullptr));
        }
        CHECK_CUDA(cudaEventRecord(stop));
        CHECK_CUDA(cudaEventSynchronize(stop));
        float ms = 0.F;
        CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
        usPerCall = 1000.0 * ms / iterations;
        gbPerS = bytesMoved(c, cacheLens, ctxLens) / (usPerCall * 1e3);
        cudaEventDestroy(start);
        cudaEventDestroy(stop);
    }
    std::printf("%-28s %s  out err %.3g  cache-k err %.3g", c.name, ok ? "PASS" : "FAIL", outErr, cacheErr);
    if (timing)
    {
        std::printf("  %.1f us  %.1f GB/s", usPerCall, gbPerS);
    }
    std::printf("\n");
    return ok;
}

} // namespace

int main(int argc, char** argv)
{
    bool const quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
    int device = 0;
    CHECK_CUDA(cudaGetDevice(&device));
    cudaDeviceProp prop{};
    CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
    std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);

    std::vector<Case> const checks = {
        {"fp32 d128 gqa4 b2", DataType::kFLOAT, 2, 16, 32, 8, 128, 16, 1024, 700, false, true},
        {"fp32 d64 gqa8 yarn b1", DataType::kFLOAT, 1, 10, 64, 8, 64, 11, 4096, 3000, true, true},
        {"fp16 d128 gqa2 b3", DataType::kHALF, 3, 8, 8, 4, 128, 5, 512, 300, false, true},
        {"bf16 d128 gqa4 b4", DataType::kBF16, 4, 16, 32, 8, 128, 16, 2304, 2048, false, true},
        {"bf16 d64 gqa8 yarn b2", DataType::kBF16, 2, 10, 64, 8, 64, 11, 4096, 3000, true, true},
        {"bf16 d128 mha empty cache", DataType::kBF16, 2, 4, 4, 4, 128, 0, 64, 0, false, true},
        {"fp32 d128 gqa16 rows>32", DataType::kFLOAT, 1, 16, 32, 2, 128, 3, 256, 100, false, true},
        {"bf16 d64 gqa8 yarn rows>64", DataType::kBF16, 2, 16, 64, 8, 64, 1, 1600, 1500, true, true},
        {"fp16 d128 splits b3 ragged", DataType::kHALF, 3, 16, 32, 8, 128, 7, 3000, 2900, false, true},
        {"bf16 d128 one key b1 s1", DataType::kBF16, 1, 1, 8, 8, 128, 1, 8, 0, false, true},
    };
    std::vector<Case> const timings = {
        {"time bf16 qwen3-8b 8k b1", DataType::kBF16, 1, 16, 32, 8, 128, 16, 8192 + 16, 8192, false, false},
        {"time bf16 qwen3-8b 32k b4", DataType::kBF16, 4, 16, 32, 8, 128, 16, 32768 + 16, 32768, false, false},
        {"time bf16 gpt-oss 32k b1", DataType::kBF16, 1, 10, 64, 8, 64, 11, 32768 + 16, 32768, true, false},
    };
    std::mt19937 rng(1234);
    int32_t failures = 0;
    for (Case const& c : checks)
    {
        failures += runCase(c, rng, !quick) ? 0 : 1;
    }
    if (!quick)
    {
        for (Case const& c : timings)
        {
            failures += runCase(c, rng, true) ? 0 : 1;
        }
    }
    std::printf("%d passed, %d failed\n", static_cast<int>(checks.size() + (quick ? 0 : timings.size())) - failures,
        failures);
    return failures == 0 ? 0 : 1;
}
