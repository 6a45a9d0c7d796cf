/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Fields of the DFlash draft-attention op (one definition for the CPU twin, the CUDA launcher, the TensorRT
 * plugin and the onnxruntime custom op), their validation and the RoPE tables derived from them.
 */
#ifndef DFLASH_ATTENTION_CONFIG_H
#define DFLASH_ATTENTION_CONFIG_H

#include <cstdint>
#include <string>

namespace dflash
{

//! Stable identity of the op: TensorRT plugin name/version and ONNX op_type.
constexpr char const* kPLUGIN_NAME{"DFlashAttention"};
constexpr char const* kPLUGIN_VERSION{"1"};
constexpr char const* kPLUGIN_NAMESPACE{""};
//! ONNX domain of the custom node (onnxruntime registers the custom op in it).
constexpr char const* kONNX_DOMAIN{"dflash"};

//! Field (attribute) names: used by the creator's field list, the parse loop and getFieldsToSerialize.
constexpr char const* kFIELD_NUM_HEADS{"num_heads"};
constexpr char const* kFIELD_NUM_KV_HEADS{"num_kv_heads"};
constexpr char const* kFIELD_HEAD_DIM{"head_dim"};
constexpr char const* kFIELD_ROPE_THETA{"rope_theta"};
constexpr char const* kFIELD_ROPE_TYPE{"rope_type"};
constexpr char const* kFIELD_YARN_FACTOR{"yarn_factor"};
constexpr char const* kFIELD_YARN_ORIGINAL_MAX_POSITION{"yarn_original_max_position_embeddings"};
constexpr char const* kFIELD_YARN_BETA_FAST{"yarn_beta_fast"};
constexpr char const* kFIELD_YARN_BETA_SLOW{"yarn_beta_slow"};
constexpr char const* kFIELD_YARN_ATTENTION_FACTOR{"yarn_attention_factor"};
constexpr char const* kFIELD_YARN_MSCALE{"yarn_mscale"};
constexpr char const* kFIELD_YARN_MSCALE_ALL_DIM{"yarn_mscale_all_dim"};
constexpr char const* kFIELD_YARN_TRUNCATE{"yarn_truncate"};

//! Value of kFIELD_ROPE_TYPE.
enum RopeType : int32_t
{
    kROPE_DEFAULT = 0,
    kROPE_YARN = 1,
};

//! Largest supported head dimension; RoPE tables are sized for it.
constexpr int32_t kMAX_HEAD_DIM{128};

//! Creation fields of the op. A zero in an optional YaRN float means "unset" (derived as Hugging Face does).
//! Plain C layout: it is also the struct of the C API used by the Python binding.
struct DflashAttentionFields
{
    int32_t numHeads;
    int32_t numKvHeads;
    int32_t headDim;
    int32_t ropeType;
    float ropeTheta;
    float yarnFactor;
    int32_t yarnOriginalMaxPosition;
    float yarnBetaFast;
    float yarnBetaSlow;
    float yarnAttentionFactor;
    float yarnMscale;
    float yarnMscaleAllDim;
    int32_t yarnTruncate;
};

//! Defaults of every field; numHeads/numKvHeads/headDim/ropeTheta are required and default to invalid values.
DflashAttentionFields defaultFields() noexcept;

//! Empty string when the fields are usable, else a one-line message naming the bad field and value.
std::string validateFields(DflashAttentionFields const& fields);

//! RoPE tables: inverse frequencies (headDim / 2 of them) and the factor cos/sin are multiplied by.
struct RopeTable
{
    float invFreq[kMAX_HEAD_DIM / 2];
    float attentionFactor;
};

//! Compute the RoPE table of valid fields, mirroring Hugging Face's default and YaRN parameter maths in fp32.
RopeTable computeRopeTable(DflashAttentionFields const& fields);

} // namespace dflash

#endif // DFLASH_ATTENTION_CONFIG_H
