/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "dflashAttentionPlugin.h"

#include "dflashAttentionKernel.h"
#include "dflashAttentionPlan.h"

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>

using namespace nvinfer1;

namespace dflash
{
namespace
{

//! One row per field: the single table behind the creator's list, the parse loop and getFieldsToSerialize.
struct FieldSpec
{
    char const* name;
    bool isInt;
    size_t offset;
    bool required;
};

constexpr FieldSpec kFIELD_SPECS[] = {
    {kFIELD_NUM_HEADS, true, offsetof(DflashAttentionFields, numHeads), true},
    {kFIELD_NUM_KV_HEADS, true, offsetof(DflashAttentionFields, numKvHeads), true},
    {kFIELD_HEAD_DIM, true, offsetof(DflashAttentionFields, headDim), true},
    {kFIELD_ROPE_TYPE, true, offsetof(DflashAttentionFields, ropeType), false},
    {kFIELD_ROPE_THETA, false, offsetof(DflashAttentionFields, ropeTheta), true},
    {kFIELD_YARN_FACTOR, false, offsetof(DflashAttentionFields, yarnFactor), false},
    {kFIELD_YARN_ORIGINAL_MAX_POSITION, true, offsetof(DflashAttentionFields, yarnOriginalMaxPosition), false},
    {kFIELD_YARN_BETA_FAST, false, offsetof(DflashAttentionFields, yarnBetaFast), false},
    {kFIELD_YARN_BETA_SLOW, false, offsetof(DflashAttentionFields, yarnBetaSlow), false},
    {kFIELD_YARN_ATTENTION_FACTOR, false, offsetof(DflashAttentionFields, yarnAttentionFactor), false},
    {kFIELD_YARN_MSCALE, false, offsetof(DflashAttentionFields, yarnMscale), false},
    {kFIELD_YARN_MSCALE_ALL_DIM, false, offsetof(DflashAttentionFields, yarnMscaleAllDim), false},
    {kFIELD_YARN_TRUNCATE, true, offsetof(DflashAttentionFields, yarnTruncate), false},
};
constexpr int32_t kNB_FIELDS = static_cast<int32_t>(sizeof(kFIELD_SPECS) / sizeof(kFIELD_SPECS[0]));

//! Attributes the ONNX parser may forward that are not plugin fields.
constexpr char const* kONNX_PLUGIN_VERSION_ATTR{"plugin_version"};
constexpr char const* kONNX_PLUGIN_NAMESPACE_ATTR{"plugin_namespace"};

ILoggerFinder* gLoggerFinder{nullptr};
std::mutex gLoggerMutex;

void logError(char const* message) noexcept
{
    std::lock_guard<std::mutex> lock(gLoggerMutex);
    ILogger* logger = gLoggerFinder != nullptr ? gLoggerFinder->findLogger() : nullptr;
    if (logger != nullptr)
    {
        logger->log(ILogger::Severity::kERROR, message);
    }
    else
    {
        std::fprintf(stderr, "[E] %s\n", message);
    }
}

//! Callers build messages with std::string, which may throw; every caller is inside a try block.
void logError(std::string const& message) noexcept
{
    logError(message.c_str());
}

//! Read a scalar field given as any int or float width (the ONNX parser and the Python API differ).
bool readNumber(PluginField const& field, double& value)
{
    if (field.data == nullptr || field.length < 1)
    {
        return false;
    }
    switch (field.type)
    {
    case PluginFieldType::kINT32: value = *static_cast<int32_t const*>(field.data); return true;
    case PluginFieldType::kINT64: value = static_cast<double>(*static_cast<int64_t const*>(field.data)); return true;
    case PluginFieldType::kFLOAT32: value = *static_cast<float const*>(field.data); return true;
    case PluginFieldType::kFLOAT64: value = *static_cast<double const*>(field.data); return true;
    default: return false;
    }
}

bool isDataType(nvinfer1::DataType type)
{
    return type == nvinfer1::DataType::kFLOAT || type == nvinfer1::DataType::kHALF || type == nvinfer1::DataType::kBF16;
}

dflash::DataType toKernelType(nvinfer1::DataType type)
{
    return type == nvinfer1::DataType::kFLOAT ? dflash::DataType::kFLOAT
                                              : (type == nvinfer1::DataType::kHALF ? dflash::DataType::kHALF
                                                                                   : dflash::DataType::kBF16);
}

int64_t volume(Dims const& dims)
{
    int64_t n = 1;
    for (int32_t i = 0; i < dims.nbDims; ++i)
    {
        n *= dims.d[i];
    }
    return n;
}

} // namespace

// ---------------------------------------------------------------------------------------------------------------------
// DflashAttentionPlugin

DflashAttentionPlugin::DflashAttentionPlugin(DflashAttentionFields const& fields)
    : mFields(fields)
    , mParams(makeParams(fields))
{
    for (FieldSpec const& spec : kFIELD_SPECS)
    {
        char const* data = reinterpret_cast<char const*>(&mFields) + spec.offset;
        mSerialized.emplace_back(
            spec.name, data, spec.isInt ? PluginFieldType::kINT32 : PluginFieldType::kFLOAT32, 1);
    }
    mSerializedCollection.nbFields = static_cast<int32_t>(mSerialized.size());
    mSerializedCollection.fields = mSerialized.data();
}

IPluginCapability* DflashAttentionPlugin::getCapabilityInterface(PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
    case PluginCapabilityType::kBUILD: return static_cast<IPluginV3OneBuildV2*>(this);
    case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
    }
    return nullptr;
}

IPluginV3* DflashAttentionPlugin::clone() noexcept
{
    try
    {
        return new DflashAttentionPlugin(mFields);
    }
    catch (...)
    {
        logError("DFlashAttention: clone failed");
        return nullptr;
    }
}

char const* DflashAttentionPlugin::getPluginName() const noexcept
{
    return kPLUGIN_NAME;
}

char const* DflashAttentionPlugin::getPluginVersion() const noexcept
{
    return kPLUGIN_VERSION;
}

char const* DflashAttentionPlugin::getPluginNamespace() const noexcept
{
    return kPLUGIN_NAMESPACE;
}

int32_t DflashAttentionPlugin::getNbOutputs() const noexcept
{
    return kNB_OUTPUTS;
}

int32_t DflashAttentionPlugin::getOutputDataTypes(
    nvinfer1::DataType* outputTypes, int32_t nbOutputs, nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    if (nbInputs != kNB_INPUTS || nbOutputs != kNB_OUTPUTS)
    {
        return -1;
    }
    outputTypes[0] = inputTypes[0];
    outputTypes[1] = inputTypes[5];
    outputTypes[2] = inputTypes[6];
    return 0;
}

int32_t DflashAttentionPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const* /*shapeInputs*/,
    int32_t /*nbShapeInputs*/, DimsExprs* outputs, int32_t nbOutputs, IExprBuilder& /*exprBuilder*/) noexcept
{
    if (nbInputs != kNB_INPUTS || nbOutputs != kNB_OUTPUTS)
    {
        logError("DFlashAttention: expects 9 inputs and 3 outputs");
        return -1;
    }
    outputs[0] = inputs[0];
    outputs[1] = inputs[5];
    outputs[2] = inputs[6];
    return 0;
}

bool DflashAttentionPlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    if (nbInputs != kNB_INPUTS || nbOutputs != kNB_OUTPUTS || pos < 0 || pos >= kNB_INPUTS + kNB_OUTPUTS)
    {
        return false;
    }
    PluginTensorDesc const& desc = inOut[pos].desc;
    if (desc.format != TensorFormat::kLINEAR)
    {
        return false;
    }
    if (pos == 7 || pos == 8)
    {
        return desc.type == nvinfer1::DataType::kINT32;
    }
    // Every value tensor takes the type of q (position 0), which itself is fp32, fp16 or bf16.
    return pos == 0 ? isDataType(desc.type) : desc.type == inOut[0].desc.type;
}

std::string DflashAttentionPlugin::checkDims(Dims const* dims) const
{
    InputDims in{};
    for (int32_t i = 0; i < kNB_INPUTS; ++i)
    {
        in.nbDims[i] = dims[i].nbDims;
        for (int32_t a = 0; a < 4; ++a)
        {
            in.d[i][a] = a < dims[i].nbDims ? dims[i].d[a] : -1;
        }
    }
    return checkInputDims(mFields, in);
}

int32_t DflashAttentionPlugin::configurePlugin(
    DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* /*out*/, int32_t nbOutputs) noexcept
{
    try
    {
        if (nbInputs != kNB_INPUTS || nbOutputs != kNB_OUTPUTS)
        {
            return -1;
        }
        Dims dims[kNB_INPUTS];
        for (int32_t i = 0; i < kNB_INPUTS; ++i)
        {
            dims[i] = in[i].desc.dims;
        }
        std::string const error = checkDims(dims);
        if (!error.empty())
        {
            logError(error);
            return -1;
        }
        return 0;
    }
    catch (...)
    {
        return -1;
    }
}

size_t DflashAttentionPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    if (nbInputs != kNB_INPUTS)
    {
        return 0;
    }
    // Exactly what the largest profile shape uses: RoPE'd queries and keys, plus split partials when the largest
    // cache capacity has more than one split. Smaller shapes use a prefix of the same layout.
    Dims const& q = inputs[0].max;
    Dims const& cache = inputs[5].max;
    return dflashAttentionWorkspaceSize(static_cast<int32_t>(q.d[0]), static_cast<int32_t>(q.d[1]),
        mFields.numHeads, mFields.numKvHeads, mFields.headDim, static_cast<int32_t>(cache.d[2]),
        toKernelType(inputs[0].desc.type));
}

int32_t DflashAttentionPlugin::getAliasedInput(int32_t outputIndex) noexcept
{
    // The cache outputs are the cache inputs updated in place (needs PreviewFeature::kALIASED_PLUGIN_IO_10_03, which
    // the engine builder enables; without it enqueue copies the cache first).
    return outputIndex == 1 ? 5 : (outputIndex == 2 ? 6 : -1);
}

int32_t DflashAttentionPlugin::onShapeChange(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* /*out*/, int32_t nbOutputs) noexcept
{
    try
    {
        if (nbInputs != kNB_INPUTS || nbOutputs != kNB_OUTPUTS)
        {
            return -1;
        }
        Dims dims[kNB_INPUTS];
        for (int32_t i = 0; i < kNB_INPUTS; ++i)
        {
            dims[i] = in[i].dims;
        }
        std::string const error = checkDims(dims);
        if (!error.empty())
        {
            logError(error);
            return -1;
        }
        return 0;
    }
    catch (...)
    {
        return -1;
    }
}

int32_t DflashAttentionPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /*outputDesc*/,
    void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept
{
    try
    {
        // Runtime shapes are checked again here: a mismatched binding must fail, not read or write out of bounds.
        Dims dims[kNB_INPUTS];
        for (int32_t i = 0; i < kNB_INPUTS; ++i)
        {
            dims[i] = inputDesc[i].dims;
        }
        std::string const shapeError = checkDims(dims);
        if (!shapeError.empty())
        {
            logError(shapeError);
            return -1;
        }
        DflashAttentionParams p = mParams;
        p.batch = static_cast<int32_t>(inputDesc[0].dims.d[0]);
        p.blockLen = static_cast<int32_t>(inputDesc[0].dims.d[1]);
        p.ctxRows = static_cast<int32_t>(inputDesc[3].dims.d[1]);
        p.cacheCapacity = static_cast<int32_t>(inputDesc[5].dims.d[2]);
        if (p.batch == 0 || p.blockLen == 0)
        {
            return 0;
        }
        dflash::DataType const type = toKernelType(inputDesc[0].type);
        size_t const cacheBytes = static_cast<size_t>(volume(inputDesc[5].dims)) * dataTypeSize(type);
        for (int32_t i : {1, 2})
        {
            // Without aliasing TensorRT hands separate output buffers: start them from the cache inputs.
            if (outputs[i] != inputs[4 + i])
            {
                cudaError_t const status
                    = cudaMemcpyAsync(outputs[i], inputs[4 + i], cacheBytes, cudaMemcpyDeviceToDevice, stream);
                if (status != cudaSuccess)
                {
                    logError(std::string(kPLUGIN_NAME) + ": cache copy failed: " + cudaGetErrorString(status));
                    return -1;
                }
            }
        }
        p.q = inputs[0];
        p.k = inputs[1];
        p.v = inputs[2];
        p.ctxK = inputs[3];
        p.ctxV = inputs[4];
        p.cacheK = outputs[1];
        p.cacheV = outputs[2];
        p.cacheLens = static_cast<int32_t const*>(inputs[7]);
        p.ctxLens = static_cast<int32_t const*>(inputs[8]);
        p.out = outputs[0];
        // getWorkspaceSize sized the workspace for the largest shapes, which covers these.
        size_t const workspaceSize = dflashAttentionWorkspaceSize(
            p.batch, p.blockLen, p.numHeads, p.numKvHeads, p.headDim, p.cacheCapacity, type);
        cudaError_t const status = launchDflashAttention(p, type, workspace, workspaceSize, stream);
        if (status != cudaSuccess)
        {
            logError(std::string(kPLUGIN_NAME) + ": kernel launch failed: " + cudaGetErrorString(status));
            return -1;
        }
        return 0;
    }
    catch (...)
    {
        return -1;
    }
}

IPluginV3* DflashAttentionPlugin::attachToContext(IPluginResourceContext* /*context*/) noexcept
{
    return clone();
}

PluginFieldCollection const* DflashAttentionPlugin::getFieldsToSerialize() noexcept
{
    return &mSerializedCollection;
}

// ---------------------------------------------------------------------------------------------------------------------
// DflashAttentionPluginCreator

DflashAttentionPluginCreator::DflashAttentionPluginCreator()
{
    for (FieldSpec const& spec : kFIELD_SPECS)
    {
        mFieldNames.emplace_back(
            spec.name, nullptr, spec.isInt ? PluginFieldType::kINT32 : PluginFieldType::kFLOAT32, 1);
    }
    mFieldCollection.nbFields = static_cast<int32_t>(mFieldNames.size());
    mFieldCollection.fields = mFieldNames.data();
}

char const* DflashAttentionPluginCreator::getPluginName() const noexcept
{
    return kPLUGIN_NAME;
}

char const* DflashAttentionPluginCreator::getPluginVersion() const noexcept
{
    return kPLUGIN_VERSION;
}

char const* DflashAttentionPluginCreator::getPluginNamespace() const noexcept
{
    return kPLUGIN_NAMESPACE;
}

PluginFieldCollection const* DflashAttentionPluginCreator::getFieldNames() noexcept
{
    return &mFieldCollection;
}

bool DflashAttentionPluginCreator::parseFields(
    PluginFieldCollection const* fc, DflashAttentionFields& fields, std::string& error)
{
    fields = defaultFields();
    bool seen[kNB_FIELDS] = {};
    for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i)
    {
        PluginField const& field = fc->fields[i];
        if (field.name == nullptr || std::strcmp(field.name, kONNX_PLUGIN_VERSION_ATTR) == 0
            || std::strcmp(field.name, kONNX_PLUGIN_NAMESPACE_ATTR) == 0)
        {
            continue;
        }
        int32_t index = 0;
        while (index < kNB_FIELDS && std::strcmp(field.name, kFIELD_SPECS[index].name) != 0)
        {
            ++index;
        }
        if (index == kNB_FIELDS)
        {
            error = std::string(kPLUGIN_NAME) + ": unknown field '" + field.name + "'";
            return false;
        }
        double value = 0.0;
        if (!readNumber(field, value))
        {
            error = std::string(kPLUGIN_NAME) + ": field '" + field.name + "' must be a scalar int or float";
            return false;
        }
        FieldSpec const& spec = kFIELD_SPECS[index];
        char* member = reinterpret_cast<char*>(&fields) + spec.offset;
        if (spec.isInt)
        {
            *reinterpret_cast<int32_t*>(member) = static_cast<int32_t>(value);
        }
        else
        {
            *reinterpret_cast<float*>(member) = static_cast<float>(value);
        }
        seen[index] = true;
    }
    for (int32_t index = 0; index < kNB_FIELDS; ++index)
    {
        if (kFIELD_SPECS[index].required && !seen[index])
        {
            error = std::string(kPLUGIN_NAME) + ": missing required field '" + kFIELD_SPECS[index].name + "'";
            return false;
        }
    }
    error = validateFields(fields);
    return error.empty();
}

IPluginV3* DflashAttentionPluginCreator::createPlugin(
    char const* /*name*/, PluginFieldCollection const* fc, TensorRTPhase /*phase*/) noexcept
{
    try
    {
        // Build and runtime phases receive the same fields (getFieldsToSerialize == creation fields).
        DflashAttentionFields fields;
        std::string error;
        if (!parseFields(fc, fields, error))
        {
            logError(error);
            return nullptr;
        }
        return new DflashAttentionPlugin(fields);
    }
    catch (std::exception const& e)
    {
        logError(e.what());
        return nullptr;
    }
    catch (...)
    {
        return nullptr;
    }
}

} // namespace dflash

// ---------------------------------------------------------------------------------------------------------------------
// Entry points of the plugin library (trtexec --dynamicPlugins, IPluginRegistry::loadLibrary).

extern "C" TENSORRTAPI void setLoggerFinder(ILoggerFinder* finder)
{
    std::lock_guard<std::mutex> lock(dflash::gLoggerMutex);
    if (dflash::gLoggerFinder == nullptr)
    {
        dflash::gLoggerFinder = finder;
    }
}

extern "C" TENSORRTAPI IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    static dflash::DflashAttentionPluginCreator sCreator;
    static IPluginCreatorInterface* const kCREATORS[] = {&sCreator};
    nbCreators = 1;
    return kCREATORS;
}
