/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "dflashAttentionCApi.h"

#include "dflashAttentionPlan.h"

#include "dflashAttentionCpu.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>

namespace
{

int32_t report(std::string const& text, char* message, size_t capacity)
{
    if (text.empty())
    {
        return 0;
    }
    if (message != nullptr && capacity > 0)
    {
        size_t const n = std::min(text.size(), capacity - 1);
        std::memcpy(message, text.data(), n);
        message[n] = '\0';
    }
    return 1;
}

} // namespace

extern "C"
{

char const* dflash_attention_plugin_name()
{
    return dflash::kPLUGIN_NAME;
}

char const* dflash_attention_plugin_version()
{
    return dflash::kPLUGIN_VERSION;
}

char const* dflash_attention_onnx_domain()
{
    return dflash::kONNX_DOMAIN;
}

char const* dflash_attention_field_names()
{
    using namespace dflash;
    static std::string const names = std::string(kFIELD_NUM_HEADS) + "," + kFIELD_NUM_KV_HEADS + "," + kFIELD_HEAD_DIM
        + "," + kFIELD_ROPE_TYPE + "," + kFIELD_ROPE_THETA + "," + kFIELD_YARN_FACTOR + ","
        + kFIELD_YARN_ORIGINAL_MAX_POSITION + "," + kFIELD_YARN_BETA_FAST + "," + kFIELD_YARN_BETA_SLOW + ","
        + kFIELD_YARN_ATTENTION_FACTOR + "," + kFIELD_YARN_MSCALE + "," + kFIELD_YARN_MSCALE_ALL_DIM + ","
        + kFIELD_YARN_TRUNCATE;
    return names.c_str();
}

void dflash_attention_default_fields(dflash::DflashAttentionFields* fields)
{
    *fields = dflash::defaultFields();
}

int32_t dflash_attention_validate(dflash::DflashAttentionFields const* fields, char* message, size_t capacity)
{
    return report(dflash::validateFields(*fields), message, capacity);
}

int32_t dflash_attention_rope_table(dflash::DflashAttentionFields const* fields, float* invFreq,
    float* attentionFactor, char* message, size_t capacity)
{
    std::string const error = dflash::validateFields(*fields);
    if (!error.empty())
    {
        return report(error, message, capacity);
    }
    dflash::RopeTable const table = dflash::computeRopeTable(*fields);
    std::memcpy(invFreq, table.invFreq, sizeof(float) * (fields->headDim / 2));
    *attentionFactor = table.attentionFactor;
    return 0;
}

int32_t dflash_attention_cpu(dflash::DflashAttentionFields const* fields, int32_t dataType, int32_t batch,
    int32_t blockLen, int32_t ctxRows, int32_t cacheCapacity, void const* q, void const* k, void const* v,
    void const* ctxK, void const* ctxV, void* cacheK, void* cacheV, int32_t const* cacheLens, int32_t const* ctxLens,
    void* out, char* message, size_t capacity)
{
    try
    {
        std::string const error = dflash::validateFields(*fields);
        if (!error.empty())
        {
            return report(error, message, capacity);
        }
        if (dataType < 0 || dataType > 2)
        {
            return report("DFlashAttention: data type must be 0 (fp32), 1 (fp16) or 2 (bf16)", message, capacity);
        }
        dflash::DflashAttentionParams p = dflash::makeParams(*fields);
        p.q = q;
        p.k = k;
        p.v = v;
        p.ctxK = ctxK;
        p.ctxV = ctxV;
        p.cacheK = cacheK;
        p.cacheV = cacheV;
        p.cacheLens = cacheLens;
        p.ctxLens = ctxLens;
        p.out = out;
        p.batch = batch;
        p.blockLen = blockLen;
        p.ctxRows = ctxRows;
        p.cacheCapacity = cacheCapacity;
        return report(dflash::dflashAttentionCpu(p, static_cast<dflash::DataType>(dataType)), message, capacity);
    }
    catch (std::exception const& e)
    {
        return report(std::string("DFlashAttention: ") + e.what(), message, capacity);
    }
}

void dflash_attention_kernel_plan(int32_t dataType, int32_t headDim, size_t* sharedBytes, int32_t* rowsPerCta,
    int32_t* keysPerSplit, size_t* maxSharedBytes)
{
    *sharedBytes = dflash::sharedMemoryBytes(dataType, headDim);
    *rowsPerCta = dflash::rowsPerCta(dataType, headDim);
    *keysPerSplit = dflash::kKEYS_PER_SPLIT;
    *maxSharedBytes = dflash::kMAX_SHARED_BYTES;
}

int32_t dflash_attention_num_splits(int32_t numKeys)
{
    return dflash::numSplitsForKeys(numKeys);
}

void dflash_attention_workspace_layout(int32_t batch, int32_t blockLen, int32_t numHeads, int32_t numKvHeads,
    int32_t headDim, int32_t cacheCapacity, int32_t dataType, uint64_t* out)
{
    dflash::WorkspaceLayout const w
        = dflash::workspaceLayout(batch, blockLen, numHeads, numKvHeads, headDim, cacheCapacity, dataType);
    out[0] = static_cast<uint64_t>(w.maxSplits);
    out[1] = w.ropedQ;
    out[2] = w.ropedK;
    out[3] = w.partialAcc;
    out[4] = w.partialStats;
    out[5] = w.totalBytes;
}

int32_t dflash_attention_check_dims(dflash::DflashAttentionFields const* fields, int32_t const* nbDims,
    int64_t const* dims, char* message, size_t capacity)
{
    try
    {
        dflash::InputDims in{};
        for (int32_t i = 0; i < 9; ++i)
        {
            in.nbDims[i] = nbDims[i];
            for (int32_t a = 0; a < 4; ++a)
            {
                in.d[i][a] = dims[i * 4 + a];
            }
        }
        return report(dflash::checkInputDims(*fields, in), message, capacity);
    }
    catch (std::exception const& e)
    {
        return report(std::string("DFlashAttention: ") + e.what(), message, capacity);
    }
}

} // extern "C"
