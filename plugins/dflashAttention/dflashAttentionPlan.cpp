/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "dflashAttentionPlan.h"

namespace dflash
{
namespace
{

size_t alignUp(size_t bytes)
{
    return (bytes + kWORKSPACE_ALIGNMENT - 1) / kWORKSPACE_ALIGNMENT * kWORKSPACE_ALIGNMENT;
}

char const* const kINPUT_NAMES[9] = {"q", "k", "v", "ctx_k", "ctx_v", "cache_k", "cache_v", "cache_lens", "ctx_lens"};

//! Dim `axis` of input `i` is known and differs from `expected` (itself possibly unknown).
bool mismatch(InputDims const& dims, int32_t i, int32_t axis, int64_t expected)
{
    int64_t const actual = dims.d[i][axis];
    return actual >= 0 && expected >= 0 && actual != expected;
}

std::string describe(int32_t i, int32_t axis, int64_t actual, char const* what, int64_t expected)
{
    return std::string(kPLUGIN_NAME) + ": " + kINPUT_NAMES[i] + " dim " + std::to_string(axis) + " is "
        + std::to_string(actual) + " but " + what + " is " + std::to_string(expected);
}

} // namespace

WorkspaceLayout workspaceLayout(int32_t batch, int32_t blockLen, int32_t numHeads, int32_t numKvHeads,
    int32_t headDim, int32_t cacheCapacity, int32_t dataType) noexcept
{
    WorkspaceLayout w{};
    size_t const element = dataType == 0 ? 4 : 2;
    size_t const queryRows = static_cast<size_t>(batch) * blockLen * numHeads;
    w.maxSplits = numSplitsForKeys(cacheCapacity + blockLen);
    w.ropedQ = 0;
    w.ropedK = alignUp(queryRows * headDim * element);
    size_t end = w.ropedK + alignUp(static_cast<size_t>(batch) * numKvHeads * blockLen * headDim * element);
    w.partialAcc = end;
    w.partialStats = end;
    if (w.maxSplits > 1)
    {
        w.partialStats = w.partialAcc + alignUp(sizeof(float) * w.maxSplits * queryRows * headDim);
        end = w.partialStats + alignUp(sizeof(float) * w.maxSplits * queryRows * 2);
    }
    w.totalBytes = end;
    return w;
}

std::string checkInputDims(DflashAttentionFields const& fields, InputDims const& dims)
{
    for (int32_t i = 0; i < 9; ++i)
    {
        int32_t const want = i < 7 ? 4 : 1;
        if (dims.nbDims[i] != want)
        {
            return std::string(kPLUGIN_NAME) + ": " + kINPUT_NAMES[i] + " must be " + std::to_string(want)
                + "-D, got " + std::to_string(dims.nbDims[i]) + "-D";
        }
        if (i < 7 && mismatch(dims, i, 3, fields.headDim))
        {
            return describe(i, 3, dims.d[i][3], "head_dim", fields.headDim);
        }
    }
    if (mismatch(dims, 0, 2, fields.numHeads))
    {
        return describe(0, 2, dims.d[0][2], "num_heads", fields.numHeads);
    }
    for (int32_t i : {1, 2, 3, 4})
    {
        if (mismatch(dims, i, 2, fields.numKvHeads))
        {
            return describe(i, 2, dims.d[i][2], "num_kv_heads", fields.numKvHeads);
        }
    }
    for (int32_t i : {5, 6})
    {
        if (mismatch(dims, i, 1, fields.numKvHeads))
        {
            return describe(i, 1, dims.d[i][1], "num_kv_heads", fields.numKvHeads);
        }
    }
    int64_t const batch = dims.d[0][0];
    int64_t const block = dims.d[0][1];
    for (int32_t i = 1; i < 9; ++i)
    {
        if (mismatch(dims, i, 0, batch))
        {
            return describe(i, 0, dims.d[i][0], "the batch of q", batch);
        }
    }
    for (int32_t i : {1, 2})
    {
        if (mismatch(dims, i, 1, block))
        {
            return describe(i, 1, dims.d[i][1], "the block of q", block);
        }
    }
    if (mismatch(dims, 4, 1, dims.d[3][1]))
    {
        return describe(4, 1, dims.d[4][1], "the context rows of ctx_k", dims.d[3][1]);
    }
    if (mismatch(dims, 6, 2, dims.d[5][2]))
    {
        return describe(6, 2, dims.d[6][2], "the capacity of cache_k", dims.d[5][2]);
    }
    return {};
}

} // namespace dflash
