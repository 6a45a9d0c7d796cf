/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Host-only checks of the TensorRT plugin library through its exported entry points (no TensorRT runtime, no GPU):
 * creator identity and field list, rejection of bad fields with a message, serialisation round trip, formats and
 * aliasing. Prints one line per check and "N passed, M failed"; exit code 0 when all pass.
 */
#include "dflashAttentionPlan.h"
#include "dflashAttentionPlugin.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace nvinfer1;

extern "C" IPluginCreatorInterface* const* getCreators(int32_t& nbCreators);

namespace
{

int32_t gPassed = 0;
int32_t gFailed = 0;

void check(bool ok, char const* what)
{
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", what);
    (ok ? gPassed : gFailed) += 1;
}

//! Owns the storage of a field collection built from (name, value) pairs.
struct Fields
{
    std::vector<int32_t> ints;
    std::vector<float> floats;
    std::vector<PluginField> fields;
    PluginFieldCollection fc{};

    Fields(std::vector<std::pair<char const*, int32_t>> const& intFields,
        std::vector<std::pair<char const*, float>> const& floatFields)
    {
        ints.reserve(intFields.size());
        floats.reserve(floatFields.size());
        for (auto const& [name, value] : intFields)
        {
            ints.push_back(value);
            fields.emplace_back(name, &ints.back(), PluginFieldType::kINT32, 1);
        }
        for (auto const& [name, value] : floatFields)
        {
            floats.push_back(value);
            fields.emplace_back(name, &floats.back(), PluginFieldType::kFLOAT32, 1);
        }
        fc.nbFields = static_cast<int32_t>(fields.size());
        fc.fields = fields.data();
    }
};

IPluginV3* create(IPluginCreatorV3One* creator, int32_t numHeads, int32_t numKvHeads, int32_t headDim, float theta)
{
    Fields f({{dflash::kFIELD_NUM_HEADS, numHeads}, {dflash::kFIELD_NUM_KV_HEADS, numKvHeads},
                 {dflash::kFIELD_HEAD_DIM, headDim}},
        {{dflash::kFIELD_ROPE_THETA, theta}});
    return creator->createPlugin("attn", &f.fc, TensorRTPhase::kBUILD);
}

} // namespace

int main()
{
    int32_t nbCreators = 0;
    IPluginCreatorInterface* const* creators = getCreators(nbCreators);
    check(nbCreators == 1 && creators[0] != nullptr, "getCreators returns one creator");
    auto* creator = static_cast<IPluginCreatorV3One*>(creators[0]);
    check(std::strcmp(creator->getPluginName(), "DFlashAttention") == 0
            && std::strcmp(creator->getPluginVersion(), "1") == 0,
        "creator name DFlashAttention, version 1");
    PluginFieldCollection const* names = creator->getFieldNames();
    check(names->nbFields == 13 && std::strcmp(names->fields[0].name, dflash::kFIELD_NUM_HEADS) == 0,
        "creator lists the 13 fields");

    check(create(creator, 32, 8, 96, 1e6F) == nullptr, "rejects head_dim 96");
    check(create(creator, 32, 5, 128, 1e6F) == nullptr, "rejects num_kv_heads that do not divide num_heads");
    check(create(creator, 32, 8, 128, -1.F) == nullptr, "rejects a negative rope_theta");
    Fields missing({{dflash::kFIELD_NUM_HEADS, 8}}, {});
    check(creator->createPlugin("attn", &missing.fc, TensorRTPhase::kBUILD) == nullptr, "rejects missing fields");

    IPluginV3* plugin = create(creator, 32, 8, 128, 1e6F);
    check(plugin != nullptr, "accepts valid fields");
    if (plugin == nullptr)
    {
        std::printf("%d passed, %d failed\n", gPassed, gFailed);
        return 1;
    }
    auto* core = static_cast<IPluginV3OneCore*>(plugin->getCapabilityInterface(PluginCapabilityType::kCORE));
    auto* build = static_cast<IPluginV3OneBuildV2*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
    auto* runtime = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    check(std::strcmp(core->getPluginName(), "DFlashAttention") == 0, "core capability names the plugin");
    check(build->getNbOutputs() == 3, "three outputs");
    check(build->getAliasedInput(0) == -1 && build->getAliasedInput(1) == 5 && build->getAliasedInput(2) == 6,
        "cache outputs alias the cache inputs");

    // Round trip: the serialised fields recreate an equal plugin (runtime phase).
    PluginFieldCollection const* serialized = runtime->getFieldsToSerialize();
    IPluginV3* restored = creator->createPlugin("attn", serialized, TensorRTPhase::kRUNTIME);
    check(restored != nullptr, "serialised fields recreate the plugin");
    if (restored != nullptr)
    {
        auto* restoredRuntime
            = static_cast<IPluginV3OneRuntime*>(restored->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
        PluginFieldCollection const* again = restoredRuntime->getFieldsToSerialize();
        bool same = again->nbFields == serialized->nbFields;
        for (int32_t i = 0; same && i < again->nbFields; ++i)
        {
            same = std::strcmp(again->fields[i].name, serialized->fields[i].name) == 0
                && std::memcmp(again->fields[i].data, serialized->fields[i].data, 4) == 0;
        }
        check(same, "serialisation is stable");
        delete restored;
    }

    // Formats: bf16 values with int32 lengths pass; int64 lengths and mixed value types do not.
    DynamicPluginTensorDesc io[12]{};
    for (auto& d : io)
    {
        d.desc.format = TensorFormat::kLINEAR;
        d.desc.type = DataType::kBF16;
    }
    io[7].desc.type = DataType::kINT32;
    io[8].desc.type = DataType::kINT32;
    bool allOk = true;
    for (int32_t pos = 0; pos < 12; ++pos)
    {
        allOk = allOk && build->supportsFormatCombination(pos, io, 9, 3);
    }
    check(allOk, "bf16 values with int32 lengths are supported");
    io[7].desc.type = DataType::kINT64;
    check(!build->supportsFormatCombination(7, io, 9, 3), "int64 lengths are not supported");
    io[3].desc.type = DataType::kHALF;
    check(!build->supportsFormatCombination(3, io, 9, 3), "mixed value types are not supported");

    // Cross-input shapes (fields 32/8 heads, head_dim 128): consistent dims configure; a cache whose batch differs from
    // q's, or ctx_v rows that differ from ctx_k's, is rejected (it would read and write out of bounds).
    auto setDims = [&](int64_t batch, int64_t ctxVRows, int64_t cacheVBatch) {
        int64_t const shapes[9][4] = {{batch, 16, 32, 128}, {batch, 16, 8, 128}, {batch, 16, 8, 128},
            {batch, 5, 8, 128}, {batch, ctxVRows, 8, 128}, {batch, 8, 1024, 128}, {cacheVBatch, 8, 1024, 128},
            {batch, 0, 0, 0}, {batch, 0, 0, 0}};
        for (int32_t i = 0; i < 9; ++i)
        {
            io[i].desc.dims.nbDims = i < 7 ? 4 : 1;
            for (int32_t a = 0; a < io[i].desc.dims.nbDims; ++a)
            {
                io[i].desc.dims.d[a] = shapes[i][a];
            }
            io[i].max = io[i].desc.dims;
        }
    };
    io[3].desc.type = DataType::kBF16;
    io[7].desc.type = DataType::kINT32;
    setDims(2, 5, 2);
    check(build->configurePlugin(io, 9, io + 9, 3) == 0, "consistent shapes configure");
    size_t const expected = dflash::workspaceLayout(2, 16, 32, 8, 128, 1024, 2).totalBytes;
    check(build->getWorkspaceSize(io, 9, io + 9, 3) == expected, "workspace is the plan's exact size");
    setDims(2, 5, 3);
    check(build->configurePlugin(io, 9, io + 9, 3) != 0, "rejects cache_v with another batch");
    setDims(2, 4, 2);
    check(build->configurePlugin(io, 9, io + 9, 3) != 0, "rejects ctx_v rows that differ from ctx_k");
    setDims(-1, 5, -1);
    check(build->configurePlugin(io, 9, io + 9, 3) == 0, "unknown (-1) dims pass at build time");

    IPluginV3* cloned = plugin->clone();
    check(cloned != nullptr, "clone");
    delete cloned;
    delete plugin;
    std::printf("%d passed, %d failed\n", gPassed, gFailed);
    return gFailed == 0 ? 0 : 1;
}
