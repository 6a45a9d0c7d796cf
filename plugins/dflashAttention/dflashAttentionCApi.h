/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Plain C entry points of the CPU library (libdflash_attention_cpu.so), used by the Python binding.
 * Every function returns 0 on success, or 1 and writes a NUL-terminated message into `message`.
 */
#ifndef DFLASH_ATTENTION_C_API_H
#define DFLASH_ATTENTION_C_API_H

#include "dflashAttentionConfig.h"

#include <cstddef>
#include <cstdint>

extern "C"
{
    //! Plugin name, version and ONNX domain (the single source of these strings).
    char const* dflash_attention_plugin_name();
    char const* dflash_attention_plugin_version();
    char const* dflash_attention_onnx_domain();

    //! Field names in the order of DflashAttentionFields, comma separated.
    char const* dflash_attention_field_names();

    //! Default value of every field.
    void dflash_attention_default_fields(dflash::DflashAttentionFields* fields);

    //! Validate creation fields, as the plugin creator and the custom op do.
    int32_t dflash_attention_validate(dflash::DflashAttentionFields const* fields, char* message, size_t capacity);

    //! RoPE table of valid fields: invFreq receives headDim / 2 floats.
    int32_t dflash_attention_rope_table(dflash::DflashAttentionFields const* fields, float* invFreq,
        float* attentionFactor, char* message, size_t capacity);

    //! Run the CPU twin on host buffers (layouts in dflashAttentionParams.h). dataType: 0 fp32, 1 fp16, 2 bf16.
    int32_t dflash_attention_cpu(dflash::DflashAttentionFields const* fields, int32_t dataType, int32_t batch,
        int32_t blockLen, int32_t ctxRows, int32_t cacheCapacity, void const* q, void const* k, void const* v,
        void const* ctxK, void const* ctxV, void* cacheK, void* cacheV, int32_t const* cacheLens,
        int32_t const* ctxLens, void* out, char* message, size_t capacity);

    //! Launch plan of the kernels (dflashAttentionPlan.h), for the tests and the torch extension.
    //! Shared-memory bytes and query rows per CTA of the attention kernel for a data type and head dim.
    void dflash_attention_kernel_plan(int32_t dataType, int32_t headDim, size_t* sharedBytes, int32_t* rowsPerCta,
        int32_t* keysPerSplit, size_t* maxSharedBytes);

    //! Context splits of a sequence attending to numKeys keys.
    int32_t dflash_attention_num_splits(int32_t numKeys);

    //! Workspace layout: out receives maxSplits, then the byte offsets of ropedQ, ropedK, partialAcc, partialStats,
    //! then the total bytes (6 values).
    void dflash_attention_workspace_layout(int32_t batch, int32_t blockLen, int32_t numHeads, int32_t numKvHeads,
        int32_t headDim, int32_t cacheCapacity, int32_t dataType, uint64_t* out);

    //! Cross-input shape check: nbDims[9], dims[9 * 4] (row i = input i, unused entries ignored, -1 = unknown).
    int32_t dflash_attention_check_dims(dflash::DflashAttentionFields const* fields, int32_t const* nbDims,
        int64_t const* dims, char* message, size_t capacity);
}

#endif // DFLASH_ATTENTION_C_API_H
