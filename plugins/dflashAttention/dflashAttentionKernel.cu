/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "dflashAttentionKernel.h"

#include "dflashAttentionCommon.cuh"
#include "dflashAttentionMma.cuh"
#include "dflashAttentionScalar.cuh"

#include <cmath>
#include <cstdint>
#include <mutex>
#include <type_traits>

namespace dflash
{
namespace
{

//! Raise one kernel's dynamic shared-memory limit once per device (cudaFuncSetAttribute is not a per-launch call).
//! The kernel is a template argument so that each kernel has its own record (they share one pointer type).
template <auto Kernel>
cudaError_t allowSharedMemory(size_t bytes)
{
    constexpr int32_t kMAX_RECORDED_DEVICES{64};
    static std::mutex mutex;
    static uint64_t configuredDevices = 0;
    if (bytes <= 48 * 1024) // the default limit
    {
        return cudaSuccess;
    }
    int device = 0;
    cudaError_t status = cudaGetDevice(&device);
    if (status != cudaSuccess)
    {
        return status;
    }
    if (device >= kMAX_RECORDED_DEVICES)
    {
        return cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    }
    std::lock_guard<std::mutex> lock(mutex);
    if ((configuredDevices >> device & 1U) == 0)
    {
        status = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
        if (status == cudaSuccess)
        {
            configuredDevices |= uint64_t{1} << device;
        }
    }
    return status;
}

template <typename T>
constexpr int32_t dataTypeCode()
{
    return sizeof(T) == 4 ? 0 : (std::is_same<T, __half>::value ? 1 : 2);
}

bool aligned16(void const* ptr)
{
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

template <typename T, int32_t DH>
cudaError_t launchWithHeadDim(DflashAttentionParams const& p, void* workspace, size_t workspaceSize, cudaStream_t stream)
{
    constexpr int32_t kTYPE = dataTypeCode<T>();
    WorkspaceLayout const layout
        = workspaceLayout(p.batch, p.blockLen, p.numHeads, p.numKvHeads, DH, p.cacheCapacity, kTYPE);
    if (workspace == nullptr || workspaceSize < layout.totalBytes)
    {
        return cudaErrorInvalidValue;
    }
    if (kTYPE != 0
        && !(aligned16(p.v) && aligned16(p.cacheK) && aligned16(p.cacheV) && aligned16(workspace)))
    {
        return cudaErrorMisalignedAddress;
    }
    char* base = static_cast<char*>(workspace);
    Workspace const ws{base + layout.ropedQ, base + layout.ropedK, reinterpret_cast<float*>(base + layout.partialAcc),
        reinterpret_cast<float*>(base + layout.partialStats), layout.maxSplits};

    prepareKernel<T, DH><<<dim3(p.ctxRows + p.blockLen, p.numKvHeads, p.batch), DH / 2, 0, stream>>>(p, ws);
    cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess)
    {
        return status;
    }
    int32_t const group = p.numHeads / p.numKvHeads;
    int32_t const rows = rowsPerCta(kTYPE, DH);
    int32_t const numRowTiles = (group * p.blockLen + rows - 1) / rows;
    dim3 const grid(layout.maxSplits, p.numKvHeads * numRowTiles, p.batch);
    size_t const smemBytes = sharedMemoryBytes(kTYPE, DH);
    if constexpr (kTYPE == 0)
    {
        status = allowSharedMemory<scalarAttentionKernel<DH>>(smemBytes);
        if (status == cudaSuccess)
        {
            scalarAttentionKernel<DH><<<grid, kSCALAR_THREADS, smemBytes, stream>>>(p, ws, numRowTiles);
        }
    }
    else
    {
        status = allowSharedMemory<mmaAttentionKernel<T, DH>>(smemBytes);
        if (status == cudaSuccess)
        {
            mmaAttentionKernel<T, DH><<<grid, kMMA_THREADS, smemBytes, stream>>>(p, ws, numRowTiles);
        }
    }
    if (status != cudaSuccess)
    {
        return status;
    }
    status = cudaGetLastError();
    if (status != cudaSuccess || layout.maxSplits == 1)
    {
        return status;
    }
    combineKernel<T, DH><<<p.batch * p.blockLen * p.numHeads, DH, 0, stream>>>(p, ws);
    return cudaGetLastError();
}

} // namespace

size_t dflashAttentionWorkspaceSize(int32_t batch, int32_t blockLen, int32_t numHeads, int32_t numKvHeads,
    int32_t headDim, int32_t cacheCapacity, DataType type) noexcept
{
    return workspaceLayout(batch, blockLen, numHeads, numKvHeads, headDim, cacheCapacity, static_cast<int32_t>(type))
        .totalBytes;
}

template <typename T>
cudaError_t launchDflashAttention(
    DflashAttentionParams const& params, void* workspace, size_t workspaceSize, cudaStream_t stream)
{
    if (params.batch < 1 || params.blockLen < 1 || params.ctxRows < 0 || params.cacheCapacity < 0
        || params.numKvHeads < 1 || params.numHeads % params.numKvHeads != 0)
    {
        return cudaErrorInvalidValue;
    }
    switch (params.headDim)
    {
    case 64: return launchWithHeadDim<T, 64>(params, workspace, workspaceSize, stream);
    case 128: return launchWithHeadDim<T, 128>(params, workspace, workspaceSize, stream);
    default: return cudaErrorInvalidValue;
    }
}

template cudaError_t launchDflashAttention<float>(DflashAttentionParams const&, void*, size_t, cudaStream_t);
template cudaError_t launchDflashAttention<__half>(DflashAttentionParams const&, void*, size_t, cudaStream_t);
template cudaError_t launchDflashAttention<__nv_bfloat16>(DflashAttentionParams const&, void*, size_t, cudaStream_t);

cudaError_t launchDflashAttention(
    DflashAttentionParams const& params, DataType type, void* workspace, size_t workspaceSize, cudaStream_t stream)
{
    switch (type)
    {
    case DataType::kFLOAT: return launchDflashAttention<float>(params, workspace, workspaceSize, stream);
    case DataType::kHALF: return launchDflashAttention<__half>(params, workspace, workspaceSize, stream);
    case DataType::kBF16: return launchDflashAttention<__nv_bfloat16>(params, workspace, workspaceSize, stream);
    }
    return cudaErrorInvalidValue;
}

} // namespace dflash
