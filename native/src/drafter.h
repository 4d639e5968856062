// drafter.h — block-diffusion drafters (DFlash, DFlash 2, DSpark) bound to a qwen35 target.
//
// Shape legend (spec/drafters.md §1-§3; Qwen3.8-27B DFlash2 values in brackets):
//   E  hidden = target hidden [5120]     L  drafter layers [5]      F  MLP width [17408]
//   H  q heads [32]   Hkv kv heads [8]   D  head dim [128]          N  target taps [5]
//   B  block rows (anchor + masks) [8]   V  target vocab [248320]
//   K  DFlash 2 conv taps [2]            G  conv groups = E / group size [320]
//   R  selector rank [256] / Markov rank  C  confidence input width (E or E + R)
//   n_ctx  committed positions whose target features are in the drafter's context cache
//
// The drafter has no embedding and no LM head: block rows are embedded with the target's
// token_embd and proposals come from the target's output head (spec drafters.md §1.1, §7.5).
// Weights stay in their GGUF encoding and run through the target backend's matmul. Everything
// the drafter touches per token (weights, its K/V cache, scratch, the captured target features)
// is backend memory and every per-token operation a Backend op, so a drafter bound to a GPU
// target runs on the GPU; the host sees only a few ids and scores per step (drafter_heads.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "gguf.h"
#include "model.h"
#include "sampling.h"

namespace luce {

// DRAFT_MTP is the target's own MTP block (mtp.h): no drafter file, no block forward; the
// speculative loop drafts with it row by row instead of through draft_forward / draft_chain.
enum DrafterKind : int32_t { DRAFT_DFLASH = 0, DRAFT_DFLASH2 = 1, DRAFT_DSPARK = 2, DRAFT_MTP = 3 };

struct YarnParams {
    float factor = 1.f;       // > 1 enables YaRN
    int orig_ctx = 0;         // original_max_position_embeddings
    float beta_fast = 32.f, beta_slow = 1.f;
    float attn_factor = 0.f;  // 0 = HF's default 0.1 ln(factor) + 1
};

struct DrafterHparams {
    DrafterKind kind = DRAFT_DFLASH;
    int n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0;
    int block_size = 0;                 // checkpoint horizon B
    std::vector<int> target_layer_ids;  // 0-based target layers tapped, in fc order
    int mask_token_id = 0;
    bool sample_from_anchor = false;    // DSpark next-token slots: B proposals instead of B-1
    float rms_eps = 1e-6f;
    float rope_theta = 1e7f;
    YarnParams yarn;
    int sliding_window = 0;             // W for sliding layers (context keys pos > q_pos - W)
    std::vector<bool> sliding;          // per layer: sliding window on context keys
    std::vector<bool> causal;           // per layer: in-block causal (slot j sees slots 0..j)
    int conv_kernel = 0, conv_group = 0;          // DFlash 2 conv (0 = none)
    int selector_rank = 0, selector_top_k = 0;    // DFlash 2 selector (0 = none)
    // DFlash 2 unary logits U -> tanh(U*m / cap)*cap (U*m when cap = 0, off), fp32, before top-k.
    float output_multiplier = 1.f, final_logit_softcapping = 0.f;
    int markov_rank = 0, confidence_dim = 0;      // DSpark heads (0 = none)
};

// DFlash 2 grouped dynamic causal conv of one sublayer: base [2][K][E] (side 0 = before the
// sublayer, 1 = after), proj E -> 2*K*G with output order (side, tap, group).
struct DrafterConv {
    Vector base;
    Weight proj;
};

struct DrafterLayer {
    Vector attn_norm, ffn_norm;              // [E] plain Qwen3 RMSNorm weights (no +1)
    Weight q, k, v, o;                       // E -> H*D, E -> Hkv*D (x2), H*D -> E
    Vector q_norm, k_norm;                   // [D]
    Weight gate, up, down;                   // E -> F (x2), F -> E
    DrafterConv attn_conv, ffn_conv;         // DFlash 2 only
};

struct Drafter {
    std::unique_ptr<GgufFile> file;
    Model *target = nullptr;                 // borrowed: token_embd, output head, backend
    DrafterHparams hp;
    Weight fc;                               // N*E -> E
    Vector hidden_norm, output_norm;         // [E]
    std::vector<DrafterLayer> layers;
    Weight sel_hproj, sel_pred, sel_succ;    // E -> R; codebooks [V][R] (rows by token id)
    Weight markov_w1, markov_w2;             // [V][R] rows by token id; R -> V
    Vector conf_w;                           // [C]
    float conf_b = 0.f;
    Vector rope_inv_freq;                    // [D/2] fp32, YaRN applied
    float rope_mscale = 1.f;                 // multiplied into cos and sin (HF attention_factor)

    int n_taps() const { return int(hp.target_layer_ids.size()); }
    // Proposals one forward yields for a block of B rows: B-1 (same-position slots) or B (DSpark).
    int proposals(int B) const { return hp.sample_from_anchor ? B : B - 1; }
};

// Opens, validates (the rules of `luce inspect`, spec/engine.md §3) and binds a drafter GGUF
// in either layout to a target. Throws luce::Error (FORMAT / INVALID_ARGUMENT / UNSUPPORTED).
std::unique_ptr<Drafter> load_drafter(const std::string &path, Model *target);

// The target's MTP block as a drafter (kind DRAFT_MTP): taps the last main layer (the MTP reads
// the target's final-normed hidden state), k drafts from k rows (sample_from_anchor), default
// horizon MTP_HORIZON. Throws luce::Error (UNSUPPORTED) naming the file when it has no MTP block.
constexpr int MTP_HORIZON = 4;
std::unique_ptr<Drafter> mtp_drafter(Model *target);

// Per-generation drafter state, all in backend memory: the context K/V of every layer for
// committed positions 0..n_ctx-1 (after k_norm and RoPE), plus room for one transient block.
struct DraftContext {
    static constexpr int ROWS = 64;  // block rows / context rows projected per pass
    Backend &be;
    int cap = 0;            // positions the cache holds (committed + one block)
    int n_ctx = 0;
    std::vector<KvLayer> kv;  // per layer: k, v [Hkv][cap][D] f32
    // Scratch, sized once for ROWS rows: x, cur, tmp, mix [ROWS][E]; q, attn [ROWS][H*D];
    // kr, vr [ROWS][Hkv*D]; dyn [ROWS][2*K*G]; gate, up [ROWS][F]; masks [4][ROWS][cap]
    // (one per (sliding, causal) layer variant); pos, block [ROWS].
    float *x, *cur, *tmp, *mix, *q, *attn, *kr, *vr, *dyn, *gate, *up;
    uint8_t *masks;
    int32_t *pos, *block;
    std::vector<int32_t> host_ids;    // [ROWS] staging for pos / block ids
    uint64_t graph_id = new_graph_owner();  // the high bits of this context's block graph keys
    DraftContext(const Drafter &d, int cap);
    ~DraftContext();
    DraftContext(const DraftContext &) = delete;
    DraftContext &operator=(const DraftContext &) = delete;

private:
    std::vector<void *> owned_;
    void *take(size_t n_bytes);
};

// Appends the fused features of n new committed positions (positions ctx.n_ctx ..): taps
// [n][N*E] raw target layer outputs (backend memory) -> hidden_norm(fc(taps)) -> per layer
// k_norm(k_proj), v_proj, RoPE at the absolute positions. Only these rows are projected.
void draft_append_context(const Drafter &d, DraftContext &ctx, const float *taps, int n);

// One drafter forward of a block at positions ctx.n_ctx .. ctx.n_ctx+B-1: block token ids [B]
// (host; normally [anchor, mask x (B-1)]) -> final-normed hidden rows out [B][E] (backend memory).
void draft_forward(const Drafter &d, DraftContext &ctx, const int32_t *block, int B, float *out);

// Scratch of the candidate heads for up to `rows` proposal rows, backend memory plus host
// mirrors of the small results (drafter_heads.cpp says what each holds).
struct DraftHeads {
    Backend &be;
    int rows = 0, V = 0, k = 0, R = 0;
    float *U;            // [rows][V] unary logits
    int32_t *ids;        // [rows][k] selector candidates, then [rows][k] their predecessors
    float *vals;         // [rows][k] candidate unary logits
    float *pred, *succ;  // [rows][k][R] codebook rows
    float *hproj;        // [rows][R]
    float *pairs;        // [rows][k][k]
    int32_t *tok;        // [rows + 1]: the anchor, then each row's token
    float *conf;         // [rows]
    float *e, *bias;     // [R] Markov embedding of prev, [V] its logit bias
    std::vector<int32_t> h_ids, h_tok;
    std::vector<float> h_vals, h_pairs, h_row, h_conf;
    DraftHeads(const Drafter &d, int rows);
    ~DraftHeads();
    DraftHeads(const DraftHeads &) = delete;
    DraftHeads &operator=(const DraftHeads &) = delete;

private:
    std::vector<void *> owned_;
    void *take(size_t n_bytes);
};

// The unary logits the candidate heads start from: logits [n_rows][V] = target_head(hidden rows
// [n_rows][E]); for DFlash 2 then scaled by output_multiplier and soft-capped (fp32), as the
// drafter was trained. DFlash and DSpark use the raw head output. Backend memory in and out.
void draft_unary_logits(const Drafter &d, const float *hidden, int n_rows, float *logits);

// Candidate heads over final-normed hidden rows [n_rows][E] (backend memory; drafter_heads.cpp).
//   DFlash: argmax of the target head; DFlash 2: selector walk; DSpark: Markov chain.
// tokens[n_rows] and confidence[n_rows] (DSpark sigmoid; may be null) are host memory.
// Sampled chains (params.temperature > 0) draw each row's token from q = the target sampler's own
// distribution (sampling.h: temperature, then top-k, then top-p) over the row's candidate scores,
// and q_out[i] (host, n_rows of them, required) receives row i's q for the rejection test. Truncating
// q as the target's p is truncated keeps proposals where p has mass: a draft outside p's top-k /
// nucleus is always rejected. top_k (may be null): where its k() > 0 each row's k best are ranked
// on the backend and only they come back, not the vocabulary row; the speculative loop asks for
// the sampler's top-k, at most 32 (proposal_top_k), so q is then the sampler's distribution over
// the drafter's k best.
class TopKRows;
struct ChainSampling {
    SamplerParams params;
    Rng *rng = nullptr;
    Distribution *q_out = nullptr;
    TopKRows *top_k = nullptr;
};
void draft_chain(const Drafter &d, DraftHeads &heads, const float *hidden, int n_rows, int32_t anchor,
                 int32_t *tokens, float *confidence, const ChainSampling *sampling = nullptr);

// Tree candidates (DDTree): the k best next tokens after `prev` at one proposal row, with their
// log-probabilities under the drafter's scores there, best first. U_row [V] = the row's unary
// logits (draft_unary_logits), hidden_row [E] = h. DFlash: log-softmax of U (prev unused);
// DFlash 2: the selector's top-k of U rescored with prev and renormalised over them; DSpark:
// log-softmax of U + W2 W1[prev]. k <= the candidate set (DFlash 2: selector_top_k).
// U_row is host memory (the speculative loop downloads the rows), hidden_row backend memory;
// the DSpark bias and the selector's codebook rows are formed in hd's backend scratch.
// `row`: what the calls for the nodes of one proposal row share (start with an empty one per
// row and U_row): DFlash's candidates, DFlash 2's selector pick; each costs a pass over the
// vocabulary, which repeated per node made tree drafting ~20x a chain's on a 27B (H200).
struct RowCandidates {
    bool ready = false;
    std::vector<int32_t> ids;  // DFlash: the row's best tokens; DFlash 2: the selector's top of U
    std::vector<float> logp;   // DFlash: their log-probabilities
};
int draft_candidates(const Drafter &d, DraftHeads &hd, const float *U_row, const float *hidden_row, int32_t prev,
                     int k, int32_t *ids, float *logp, RowCandidates &row);

}  // namespace luce
