// Host side of the FP8 main kernel, built for the GPU and for the emulator (common/cuda/target.hpp): checks
// the parameters, builds the TMA tensor maps of the e4m3 operands and picks the instantiation (head dims 128
// and 256; 64 would need a 64-byte swizzle for its 64-byte rows).
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include "common/cuda/check.hpp"
#include "common/cuda/launch.cuh"
#include "common/error.hpp"
#include "cuda_v3_hopper/fp8.hpp"
#include "cuda_v3_hopper/fp8_kernel.cuh"
#include "cuda_v3_hopper/tma_host.hpp"

namespace flashlab::hopper {
namespace FLASHLAB_CUDA_TARGET {
namespace {

// A byte tensor of `rank` dimensions (dims[0] contiguous), moved in `box` boxes with the 128-byte swizzle;
// boxes past the bounds read zeros.
CUtensorMap byte_tensor_map(const void* base, int rank, const cuuint64_t* dims, const cuuint64_t* strides,
                            const cuuint32_t* box, const char* tensor) {
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult result =
      tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, rank, const_cast<void*>(base), dims, strides,
                           box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) fail("cuTensorMapEncodeTiled failed for ", tensor, " (CUresult ", result, ")");
  return map;
}

// BSHD e4m3 (Q8, K8) as (head_dim, seqlen, heads, batch), boxes of 128 columns x rows.
CUtensorMap bshd_e4m3_map(const uint8_t* base, int head_dim, int seqlen, int heads, int batch, int box_rows,
                          const char* tensor) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(seqlen),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(heads) * head_dim, static_cast<cuuint64_t>(head_dim),
                                 static_cast<cuuint64_t>(seqlen) * heads * head_dim};
  const cuuint32_t box[4] = {128, static_cast<cuuint32_t>(box_rows), 1, 1};
  return byte_tensor_map(base, 4, dims, strides, box, tensor);
}

template <class Config>
void launch(const Fp8AttentionParams& params, cudaStream_t stream) {
  const int num_m_blocks = (params.seqlen_q + Config::kBlockM - 1) / Config::kBlockM;
  const int tiles_k = static_cast<int>(fp8_tiles(params.seqlen_k, Config::kBlockN));
  // With no keys K and V are never read; their maps still need a valid address and extents: Q's.
  const bool no_keys = params.seqlen_k == 0;
  const CUtensorMap q_map = bshd_e4m3_map(params.q8, params.head_dim, params.seqlen_q, params.heads_q,
                                          params.batch, Config::kBlockM, "q8");
  const CUtensorMap k_map = no_keys ? bshd_e4m3_map(params.q8, params.head_dim, params.seqlen_q,
                                                    params.heads_q, params.batch, Config::kBlockN, "k8")
                                    : bshd_e4m3_map(params.k8, params.head_dim, params.seqlen_k,
                                                    params.heads_kv, params.batch, Config::kBlockN, "k8");
  // V8 as (key position in tile, head_dim, tile): boxes of 128 positions x head_dim rows.
  const cuuint64_t v_dims[3] = {
      static_cast<cuuint64_t>(Config::kBlockN), static_cast<cuuint64_t>(params.head_dim),
      static_cast<cuuint64_t>(no_keys ? 1 : params.batch * params.heads_kv * tiles_k)};
  const cuuint64_t v_strides[2] = {static_cast<cuuint64_t>(Config::kBlockN),
                                   static_cast<cuuint64_t>(Config::kBlockN) * params.head_dim};
  const cuuint32_t v_box[3] = {128, static_cast<cuuint32_t>(params.head_dim), 1};
  const CUtensorMap v_map =
      byte_tensor_map(no_keys ? params.q8 : params.v8, 3, v_dims, v_strides, v_box, "v8");

  WsArgs args{};
  args.lse = params.lse;
  args.seqlens_q = params.seqlens_q;
  args.seqlens_k = params.seqlens_k;
  args.seqlen_q = params.seqlen_q;
  args.seqlen_k = params.seqlen_k;
  args.heads_q = params.heads_q;
  args.heads_kv = params.heads_kv;
  args.causal = params.causal ? 1 : 0;
  args.window_left = params.window_left;
  args.window_right = params.window_right;
  args.num_m_blocks = num_m_blocks;
  args.scale_log2 = 0.0f;  // unused: the FP8 softmax scale changes per block (Fp8Args)
  Fp8Args fp8{};
  fp8.q_descale = params.q_descale;
  fp8.k_descale = params.k_descale;
  fp8.v_descale = params.v_descale;
  fp8.lse_shift = params.lse_shift;
  fp8.o = reinterpret_cast<__nv_bfloat16*>(params.o);
  fp8.block_q = params.block_q;
  fp8.tiles_q = static_cast<int>(fp8_tiles(params.seqlen_q, params.block_q));
  fp8.tiles_k = tiles_k;
  fp8.softmax_scale = params.softmax_scale;
  fp8.p_scale = params.p_scale;

  static const bool configured = [] {
    FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(
        fp8_attention_kernel<Config>, cudaFuncAttributeMaxDynamicSharedMemorySize, Config::kSharedBytes));
    return true;
  }();
  (void)configured;
  const dim3 grid(num_m_blocks, params.heads_q, params.batch);
  cuda::launch_kernel<fp8_attention_kernel<Config>>(grid, Config::kThreads, Config::kSharedBytes, stream,
                                                    q_map, k_map, v_map, args, fp8);
}

}  // namespace

void launch_fp8_attention(const Fp8AttentionParams& params, cudaStream_t stream) {
  if (const char* reason = fp8_attention_unsupported(params); reason[0] != '\0')
    fail("cuda_v3_hopper/fp8: ", reason);
  if (params.head_dim == 128) return launch<Fp8KernelConfig<128, 224>>(params, stream);
  return launch<Fp8KernelConfig<256, 128>>(params, stream);
}

}  // namespace FLASHLAB_CUDA_TARGET
}  // namespace flashlab::hopper
