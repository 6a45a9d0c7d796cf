/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * onnxruntime custom-op library: runs the DFlashAttention node (domain "dflash") on CPU with the CPU twin.
 * Load it with SessionOptions.register_custom_ops_library(path). Same inputs, outputs and attributes as the
 * TensorRT plugin (dflashAttentionPlugin.h); the cache outputs are the cache inputs with the new rows written.
 * Built against the onnxruntime C API header only (no link to libonnxruntime: the API table comes from the caller).
 */
#include "dflashAttentionCpu.h"

#include <onnxruntime_c_api.h>

#include <cstring>
#include <exception>
#include <string>

namespace
{

using namespace dflash;

constexpr size_t kNB_INPUTS{9};
constexpr size_t kNB_OUTPUTS{3};
//! Oldest C API version whose OrtCustomOp has CreateKernelV2 / KernelComputeV2.
constexpr uint32_t kMIN_API_VERSION{16};

//! A typed custom op: one per value type (fp32, fp16, bf16), all with the same name and domain.
struct DflashOrtOp : OrtCustomOp
{
    ONNXTensorElementDataType valueType;
    OrtApi const* api;
};

struct DflashOrtKernel
{
    OrtApi const* api;
    DflashAttentionFields fields;
    DataType type;
};

OrtStatus* makeError(OrtApi const* api, std::string const& message)
{
    return api->CreateStatus(ORT_INVALID_ARGUMENT, message.c_str());
}

//! Read one attribute into a field; absent optional attributes keep their default.
OrtStatus* readAttribute(OrtApi const* api, OrtKernelInfo const* info, char const* name, bool isInt, void* member,
    bool required)
{
    OrtStatus* status = nullptr;
    if (isInt)
    {
        int64_t value = 0;
        status = api->KernelInfoGetAttribute_int64(info, name, &value);
        if (status == nullptr)
        {
            *static_cast<int32_t*>(member) = static_cast<int32_t>(value);
        }
    }
    else
    {
        float value = 0.F;
        status = api->KernelInfoGetAttribute_float(info, name, &value);
        if (status == nullptr)
        {
            *static_cast<float*>(member) = value;
        }
    }
    if (status != nullptr)
    {
        api->ReleaseStatus(status);
        if (required)
        {
            return makeError(api, std::string(kPLUGIN_NAME) + ": missing required attribute '" + name + "'");
        }
    }
    return nullptr;
}

OrtStatus* ORT_API_CALL createKernel(OrtCustomOp const* op, OrtApi const* api, OrtKernelInfo const* info, void** kernel)
{
    DflashAttentionFields f = defaultFields();
    struct
    {
        char const* name;
        bool isInt;
        void* member;
        bool required;
    } const attributes[] = {
        {kFIELD_NUM_HEADS, true, &f.numHeads, true},
        {kFIELD_NUM_KV_HEADS, true, &f.numKvHeads, true},
        {kFIELD_HEAD_DIM, true, &f.headDim, true},
        {kFIELD_ROPE_TYPE, true, &f.ropeType, false},
        {kFIELD_ROPE_THETA, false, &f.ropeTheta, true},
        {kFIELD_YARN_FACTOR, false, &f.yarnFactor, false},
        {kFIELD_YARN_ORIGINAL_MAX_POSITION, true, &f.yarnOriginalMaxPosition, false},
        {kFIELD_YARN_BETA_FAST, false, &f.yarnBetaFast, false},
        {kFIELD_YARN_BETA_SLOW, false, &f.yarnBetaSlow, false},
        {kFIELD_YARN_ATTENTION_FACTOR, false, &f.yarnAttentionFactor, false},
        {kFIELD_YARN_MSCALE, false, &f.yarnMscale, false},
        {kFIELD_YARN_MSCALE_ALL_DIM, false, &f.yarnMscaleAllDim, false},
        {kFIELD_YARN_TRUNCATE, true, &f.yarnTruncate, false},
    };
    for (auto const& a : attributes)
    {
        if (OrtStatus* status = readAttribute(api, info, a.name, a.isInt, a.member, a.required))
        {
            return status;
        }
    }
    std::string const error = validateFields(f);
    if (!error.empty())
    {
        return makeError(api, error);
    }
    auto const* typed = static_cast<DflashOrtOp const*>(op);
    DataType const type = typed->valueType == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT
        ? DataType::kFLOAT
        : (typed->valueType == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ? DataType::kHALF : DataType::kBF16);
    *kernel = new DflashOrtKernel{api, f, type};
    return nullptr;
}

//! Shape and data of one tensor value.
struct Tensor
{
    int64_t dims[4]{};
    size_t rank{};
    size_t count{1};
    void* data{};
};

OrtStatus* describe(OrtApi const* api, OrtValue const* value, Tensor& t)
{
    OrtTensorTypeAndShapeInfo* info = nullptr;
    OrtStatus* status = api->GetTensorTypeAndShape(value, &info);
    if (status == nullptr)
    {
        status = api->GetDimensionsCount(info, &t.rank);
    }
    if (status == nullptr && t.rank > 4)
    {
        status = makeError(api, std::string(kPLUGIN_NAME) + ": inputs have at most 4 dims");
    }
    if (status == nullptr)
    {
        status = api->GetDimensions(info, t.dims, t.rank);
    }
    if (info != nullptr)
    {
        api->ReleaseTensorTypeAndShapeInfo(info);
    }
    for (size_t i = 0; status == nullptr && i < t.rank; ++i)
    {
        t.count *= static_cast<size_t>(t.dims[i]);
    }
    return status != nullptr ? status : api->GetTensorMutableData(const_cast<OrtValue*>(value), &t.data);
}

//! Empty when the input shapes agree with the fields and with one another.
std::string checkShapes(Tensor const* in, DflashAttentionFields const& f)
{
    for (size_t i = 0; i < 7; ++i)
    {
        if (in[i].rank != 4 || in[i].dims[3] != f.headDim || in[i].dims[0] != in[0].dims[0])
        {
            return "input " + std::to_string(i) + " must be 4-D [B, ..., head_dim]";
        }
    }
    bool const headsOk = in[0].dims[2] == f.numHeads && in[1].dims[2] == f.numKvHeads && in[2].dims[2] == f.numKvHeads
        && in[3].dims[2] == f.numKvHeads && in[4].dims[2] == f.numKvHeads && in[5].dims[1] == f.numKvHeads
        && in[6].dims[1] == f.numKvHeads;
    bool const rowsOk = in[1].dims[1] == in[0].dims[1] && in[2].dims[1] == in[0].dims[1]
        && in[4].dims[1] == in[3].dims[1] && in[6].dims[2] == in[5].dims[2];
    bool const lensOk = in[7].rank == 1 && in[8].rank == 1 && in[7].dims[0] == in[0].dims[0]
        && in[8].dims[0] == in[0].dims[0];
    if (!headsOk || !rowsOk || !lensOk)
    {
        return "input shapes do not match the attributes or one another";
    }
    return {};
}

OrtStatus* ORT_API_CALL computeKernel(void* opKernel, OrtKernelContext* context)
{
    auto const* kernel = static_cast<DflashOrtKernel const*>(opKernel);
    OrtApi const* api = kernel->api;
    try
    {
        Tensor in[kNB_INPUTS];
        for (size_t i = 0; i < kNB_INPUTS; ++i)
        {
            OrtValue const* value = nullptr;
            OrtStatus* status = api->KernelContext_GetInput(context, i, &value);
            if (status == nullptr)
            {
                status = describe(api, value, in[i]);
            }
            if (status != nullptr)
            {
                return status;
            }
        }
        std::string const shapeError = checkShapes(in, kernel->fields);
        if (!shapeError.empty())
        {
            return makeError(api, std::string(kPLUGIN_NAME) + ": " + shapeError);
        }
        void* outData[kNB_OUTPUTS] = {};
        Tensor const* outShape[kNB_OUTPUTS] = {&in[0], &in[5], &in[6]};
        for (size_t i = 0; i < kNB_OUTPUTS; ++i)
        {
            OrtValue* value = nullptr;
            OrtStatus* status = api->KernelContext_GetOutput(context, i, outShape[i]->dims, 4, &value);
            if (status == nullptr)
            {
                status = api->GetTensorMutableData(value, &outData[i]);
            }
            if (status != nullptr)
            {
                return status;
            }
        }
        size_t const elementSize = static_cast<size_t>(dataTypeSize(kernel->type));
        for (size_t i : {1, 2})
        {
            if (outData[i] != in[4 + i].data) // not reused in place: start from the cache input
            {
                std::memcpy(outData[i], in[4 + i].data, in[4 + i].count * elementSize);
            }
        }
        DflashAttentionParams p = makeParams(kernel->fields);
        p.q = in[0].data;
        p.k = in[1].data;
        p.v = in[2].data;
        p.ctxK = in[3].data;
        p.ctxV = in[4].data;
        p.cacheK = outData[1];
        p.cacheV = outData[2];
        p.cacheLens = static_cast<int32_t const*>(in[7].data);
        p.ctxLens = static_cast<int32_t const*>(in[8].data);
        p.out = outData[0];
        p.batch = static_cast<int32_t>(in[0].dims[0]);
        p.blockLen = static_cast<int32_t>(in[0].dims[1]);
        p.ctxRows = static_cast<int32_t>(in[3].dims[1]);
        p.cacheCapacity = static_cast<int32_t>(in[5].dims[2]);
        std::string const error = dflashAttentionCpu(p, kernel->type);
        return error.empty() ? nullptr : makeError(api, error);
    }
    catch (std::exception const& e)
    {
        return api->CreateStatus(ORT_FAIL, (std::string(kPLUGIN_NAME) + ": " + e.what()).c_str());
    }
}

void ORT_API_CALL destroyKernel(void* opKernel)
{
    delete static_cast<DflashOrtKernel*>(opKernel);
}

char const* ORT_API_CALL getName(OrtCustomOp const* /*op*/)
{
    return kPLUGIN_NAME;
}

char const* ORT_API_CALL getExecutionProvider(OrtCustomOp const* /*op*/)
{
    return "CPUExecutionProvider";
}

ONNXTensorElementDataType ORT_API_CALL getInputType(OrtCustomOp const* op, size_t index)
{
    return index >= 7 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 : static_cast<DflashOrtOp const*>(op)->valueType;
}

size_t ORT_API_CALL getInputCount(OrtCustomOp const* /*op*/)
{
    return kNB_INPUTS;
}

ONNXTensorElementDataType ORT_API_CALL getOutputType(OrtCustomOp const* op, size_t /*index*/)
{
    return static_cast<DflashOrtOp const*>(op)->valueType;
}

size_t ORT_API_CALL getOutputCount(OrtCustomOp const* /*op*/)
{
    return kNB_OUTPUTS;
}

OrtCustomOpInputOutputCharacteristic ORT_API_CALL getCharacteristic(OrtCustomOp const* /*op*/, size_t /*index*/)
{
    return INPUT_OUTPUT_REQUIRED;
}

OrtMemType ORT_API_CALL getInputMemoryType(OrtCustomOp const* /*op*/, size_t /*index*/)
{
    return OrtMemTypeDefault;
}

//! No output is a pure alias (ORT's alias map is for outputs that are views of inputs).
size_t ORT_API_CALL getAliasMap(int** inputIndex, int** outputIndex)
{
    *inputIndex = nullptr;
    *outputIndex = nullptr;
    return 0;
}

//! Outputs 1 and 2 may reuse the buffers of inputs 5 and 6 (the caches).
size_t ORT_API_CALL getMayInplace(int** inputIndex, int** outputIndex)
{
    *inputIndex = new int[2]{5, 6};
    *outputIndex = new int[2]{1, 2};
    return 2;
}

void ORT_API_CALL releaseMayInplace(int* inputIndex, int* outputIndex)
{
    delete[] inputIndex;
    delete[] outputIndex;
}

DflashOrtOp makeOp(ONNXTensorElementDataType type)
{
    DflashOrtOp op;
    std::memset(static_cast<OrtCustomOp*>(&op), 0, sizeof(OrtCustomOp));
    op.version = ORT_API_VERSION;
    op.GetName = getName;
    op.GetExecutionProviderType = getExecutionProvider;
    op.GetInputType = getInputType;
    op.GetInputTypeCount = getInputCount;
    op.GetOutputType = getOutputType;
    op.GetOutputTypeCount = getOutputCount;
    op.GetInputCharacteristic = getCharacteristic;
    op.GetInputMemoryType = getInputMemoryType;
    op.GetOutputCharacteristic = getCharacteristic;
    op.CreateKernelV2 = createKernel;
    op.KernelComputeV2 = computeKernel;
    op.KernelDestroy = destroyKernel;
    op.GetMayInplace = getMayInplace;
    op.ReleaseMayInplace = releaseMayInplace;
    op.GetAliasMap = getAliasMap;
    op.ReleaseAliasMap = releaseMayInplace;
    op.valueType = type;
    op.api = nullptr;
    return op;
}

} // namespace

//! Entry point onnxruntime calls when the library is registered with a session.
extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(
    OrtSessionOptions* options, OrtApiBase const* apiBase)
{
    OrtApi const* api = nullptr;
    for (uint32_t version = ORT_API_VERSION; api == nullptr && version >= kMIN_API_VERSION; --version)
    {
        api = apiBase->GetApi(version);
    }
    if (api == nullptr)
    {
        return nullptr; // too old a runtime to report an error through; registration simply adds nothing
    }
    // The domain and ops must outlive every session that uses them: they live for the process.
    static DflashOrtOp sOps[] = {makeOp(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT),
        makeOp(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16), makeOp(ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16)};
    OrtCustomOpDomain* domain = nullptr;
    if (OrtStatus* status = api->CreateCustomOpDomain(kONNX_DOMAIN, &domain))
    {
        return status;
    }
    for (DflashOrtOp& op : sOps)
    {
        op.api = api;
        if (OrtStatus* status = api->CustomOpDomain_Add(domain, &op))
        {
            return status;
        }
    }
    return api->AddCustomOpDomain(options, domain);
}
