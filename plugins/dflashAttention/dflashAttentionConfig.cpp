/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "dflashAttentionConfig.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace dflash
{
namespace
{

constexpr double kPI{3.14159265358979323846};

//! Dimension index at which the RoPE frequency completes numRotations turns over maxPosition positions.
double yarnCorrectionDim(double numRotations, int32_t dim, double base, double maxPosition)
{
    return (dim * std::log(maxPosition / (numRotations * 2.0 * kPI))) / (2.0 * std::log(base));
}

//! YaRN attention scaling of one mscale (1 when the context is not stretched).
double yarnMscale(double scale, double mscale)
{
    return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

std::string fieldError(char const* field, double value, char const* requirement)
{
    std::ostringstream os;
    os << kPLUGIN_NAME << ": field '" << field << "' = " << value << " " << requirement;
    return os.str();
}

} // namespace

DflashAttentionFields defaultFields() noexcept
{
    DflashAttentionFields f{};
    f.numHeads = 0;
    f.numKvHeads = 0;
    f.headDim = 0;
    f.ropeType = kROPE_DEFAULT;
    f.ropeTheta = 0.F;
    f.yarnFactor = 1.F;
    f.yarnOriginalMaxPosition = 0;
    f.yarnBetaFast = 32.F;
    f.yarnBetaSlow = 1.F;
    f.yarnAttentionFactor = 0.F;
    f.yarnMscale = 0.F;
    f.yarnMscaleAllDim = 0.F;
    f.yarnTruncate = 1;
    return f;
}

std::string validateFields(DflashAttentionFields const& f)
{
    if (f.numHeads <= 0)
    {
        return fieldError(kFIELD_NUM_HEADS, f.numHeads, "must be a positive integer");
    }
    if (f.numKvHeads <= 0 || f.numHeads % f.numKvHeads != 0)
    {
        return fieldError(kFIELD_NUM_KV_HEADS, f.numKvHeads, "must be positive and divide num_heads");
    }
    if (f.headDim != 64 && f.headDim != 128)
    {
        return fieldError(kFIELD_HEAD_DIM, f.headDim, "is not supported (allowed: 64, 128)");
    }
    if (!(f.ropeTheta > 0.F) || !std::isfinite(f.ropeTheta))
    {
        return fieldError(kFIELD_ROPE_THETA, f.ropeTheta, "must be a positive finite number");
    }
    if (f.ropeType != kROPE_DEFAULT && f.ropeType != kROPE_YARN)
    {
        return fieldError(kFIELD_ROPE_TYPE, f.ropeType, "is not supported (allowed: 0 = default, 1 = yarn)");
    }
    if (f.ropeType == kROPE_YARN)
    {
        if (!(f.yarnFactor > 0.F) || !std::isfinite(f.yarnFactor))
        {
            return fieldError(kFIELD_YARN_FACTOR, f.yarnFactor, "must be a positive finite number");
        }
        if (f.yarnOriginalMaxPosition <= 0)
        {
            return fieldError(kFIELD_YARN_ORIGINAL_MAX_POSITION, f.yarnOriginalMaxPosition, "must be positive");
        }
        if (f.yarnBetaFast < 0.F || f.yarnBetaSlow < 0.F)
        {
            return fieldError(kFIELD_YARN_BETA_FAST, f.yarnBetaFast, "and yarn_beta_slow must not be negative");
        }
        if (f.yarnAttentionFactor < 0.F || f.yarnMscale < 0.F || f.yarnMscaleAllDim < 0.F)
        {
            return fieldError(
                kFIELD_YARN_ATTENTION_FACTOR, f.yarnAttentionFactor, "and the mscale fields must not be negative");
        }
    }
    return {};
}

RopeTable computeRopeTable(DflashAttentionFields const& f)
{
    // Every step rounds to fp32 where Hugging Face's torch code does, so the tables agree with it to the last bit
    // except where torch's vectorised pow differs from the correctly rounded one (at most one ulp).
    RopeTable table{};
    int32_t const dim = f.headDim;
    int32_t const half = dim / 2;
    float posFreq[kMAX_HEAD_DIM / 2];
    for (int32_t i = 0; i < half; ++i)
    {
        float const exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
        posFreq[i] = static_cast<float>(std::pow(static_cast<double>(f.ropeTheta), static_cast<double>(exponent)));
    }
    if (f.ropeType != kROPE_YARN)
    {
        for (int32_t i = 0; i < half; ++i)
        {
            table.invFreq[i] = 1.F / posFreq[i];
        }
        table.attentionFactor = 1.F;
        return table;
    }

    double const factor = f.yarnFactor;
    double attentionFactor = f.yarnAttentionFactor;
    if (attentionFactor == 0.0)
    {
        attentionFactor = (f.yarnMscale != 0.F && f.yarnMscaleAllDim != 0.F)
            ? yarnMscale(factor, f.yarnMscale) / yarnMscale(factor, f.yarnMscaleAllDim)
            : yarnMscale(factor, 1.0);
    }
    double const betaFast = f.yarnBetaFast != 0.F ? f.yarnBetaFast : 32.0;
    double const betaSlow = f.yarnBetaSlow != 0.F ? f.yarnBetaSlow : 1.0;
    double const base = f.ropeTheta;
    double const originalMax = f.yarnOriginalMaxPosition;
    double low = yarnCorrectionDim(betaFast, dim, base, originalMax);
    double high = yarnCorrectionDim(betaSlow, dim, base, originalMax);
    if (f.yarnTruncate != 0)
    {
        low = std::floor(low);
        high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high)
    {
        high += 0.001; // Hugging Face's guard against a zero-width ramp.
    }
    float const lowF = static_cast<float>(low);
    float const rangeF = static_cast<float>(high - low);
    float const factorF = static_cast<float>(factor);
    for (int32_t i = 0; i < half; ++i)
    {
        float const ramp = std::min(std::max((static_cast<float>(i) - lowF) / rangeF, 0.F), 1.F);
        float const extrapolationWeight = 1.F - ramp;
        float const extrapolation = 1.F / posFreq[i];
        float const interpolation = 1.F / (factorF * posFreq[i]);
        float const a = interpolation * (1.F - extrapolationWeight);
        float const b = extrapolation * extrapolationWeight;
        table.invFreq[i] = a + b;
    }
    table.attentionFactor = static_cast<float>(attentionFactor);
    return table;
}

} // namespace dflash
