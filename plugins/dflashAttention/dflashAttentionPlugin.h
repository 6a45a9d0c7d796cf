/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * TensorRT IPluginV3 of the DFlash draft attention ("DFlashAttention", version 1).
 *
 * Inputs:  0 q [B,S,Hq,Dh]  1 k [B,S,Hkv,Dh]  2 v [B,S,Hkv,Dh]  3 ctx_k [B,C,Hkv,Dh]  4 ctx_v [B,C,Hkv,Dh]
 *          5 cache_k [B,Hkv,Cmax,Dh]  6 cache_v [B,Hkv,Cmax,Dh]  7 cache_lens [B] int32  8 ctx_lens [B] int32
 * Outputs: 0 out [B,S,Hq,Dh]  1 cache_k (aliases input 5)  2 cache_v (aliases input 6)
 * Tensors 0-6 and the outputs share one type: fp32, fp16 or bf16. All linear.
 */
#ifndef DFLASH_ATTENTION_PLUGIN_H
#define DFLASH_ATTENTION_PLUGIN_H

#include "dflashAttentionConfig.h"
#include "dflashAttentionParams.h"

#include <NvInferRuntime.h>

#include <string>
#include <vector>

namespace dflash
{

class DflashAttentionPlugin : public nvinfer1::IPluginV3,
                              public nvinfer1::IPluginV3OneCore,
                              public nvinfer1::IPluginV3OneBuildV2,
                              public nvinfer1::IPluginV3OneRuntime
{
public:
    //! Fields must be valid (the creator validates them).
    explicit DflashAttentionPlugin(DflashAttentionFields const& fields);
    ~DflashAttentionPlugin() override = default;

    // IPluginV3: capability lookup and cloning.
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
    nvinfer1::IPluginV3* clone() noexcept override;

    // IPluginV3OneCore: identity.
    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;

    // IPluginV3OneBuildV2: types, shapes, formats, workspace and the in-place cache outputs.
    int32_t getNbOutputs() const noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs, nvinfer1::DimsExprs const* shapeInputs,
        int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
        nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
        int32_t nbOutputs) noexcept override;
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;
    int32_t getAliasedInput(int32_t outputIndex) noexcept override;

    // IPluginV3OneRuntime: execution and serialisation.
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs, nvinfer1::PluginTensorDesc const* out,
        int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

    static constexpr int32_t kNB_INPUTS{9};
    static constexpr int32_t kNB_OUTPUTS{3};

private:
    //! Empty when the dims of the 9 inputs fit the fields (unknown dims, -1, pass), else a message.
    std::string checkDims(nvinfer1::Dims const* dims) const;

    DflashAttentionFields mFields;
    DflashAttentionParams mParams; //!< shape-independent part: heads, RoPE table, softmax scale
    std::vector<nvinfer1::PluginField> mSerialized;
    nvinfer1::PluginFieldCollection mSerializedCollection{};
};

class DflashAttentionPluginCreator : public nvinfer1::IPluginCreatorV3One
{
public:
    DflashAttentionPluginCreator();
    ~DflashAttentionPluginCreator() override = default;

    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override;
    nvinfer1::IPluginV3* createPlugin(
        char const* name, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept override;

    //! Parse and validate a field collection; on failure returns false and sets `error` (names the field).
    static bool parseFields(nvinfer1::PluginFieldCollection const* fc, DflashAttentionFields& fields, std::string& error);

private:
    std::vector<nvinfer1::PluginField> mFieldNames;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

} // namespace dflash

#endif // DFLASH_ATTENTION_PLUGIN_H
