/*
 * luce.h — the C ABI of the luce native runtime, and the only boundary Python sees.
 *
 * Conventions
 *   - Every function that can fail returns a luce_status (0 = LUCE_OK). On failure a one-line,
 *     human-readable reason is available from luce_last_error() on the same thread.
 *   - Handles are opaque; each create/load function has a matching free function (NULL is fine).
 *   - No C++ exception crosses this boundary.
 *   - A model and its sessions share one worker pool: call into them from one thread at a time
 *     (different models may be used from different threads).
 *   - This header is fed to cffi verbatim between the CDEF markers, so declarations use no macros.
 */
#ifndef LUCE_H
#define LUCE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* LUCE_CDEF_BEGIN */

typedef enum {
    LUCE_OK = 0,
    LUCE_ERR_INVALID_ARGUMENT = 1, /* a caller-side mistake: bad option, token out of range, ... */
    LUCE_ERR_IO = 2,               /* file missing, unreadable, mmap failed */
    LUCE_ERR_FORMAT = 3,           /* not a GGUF, malformed or crafted file, inconsistent shapes */
    LUCE_ERR_UNSUPPORTED = 4,      /* well-formed but unsupported: architecture, quant type, ... */
    LUCE_ERR_OUT_OF_MEMORY = 5,
    LUCE_ERR_CONTEXT_FULL = 6,     /* prompt or generation does not fit the session's context, or
                                      a context longer than the model's */
    LUCE_ERR_DEVICE = 7,           /* GPU backend missing, no device, device memory exhausted */
    LUCE_ERR_CANCELLED = 8,        /* the token callback asked to stop */
    LUCE_ERR_INTERNAL = 9
} luce_status;

typedef enum {
    LUCE_DEVICE_CPU = 0,
    LUCE_DEVICE_GPU = 1
} luce_device;

const char *luce_version(void);
/* 1 when a GPU backend library is installed (libluce_gpu.so beside libluce, or the file
   LUCE_GPU_LIBRARY names), 0 for a CPU-only build. Says nothing about whether it can open a GPU. */
int32_t luce_gpu_backend_installed(void);
/* The reason of the last failure on this thread ("" if none). Valid until the next luce call. */
const char *luce_last_error(void);

/* ---- target model --------------------------------------------------------------------- */

typedef struct luce_model luce_model;

typedef struct {
    int32_t device;     /* luce_device */
    int32_t n_threads;  /* CPU worker threads; 0 = one per core */
    int32_t gpu_index;  /* which GPU when device == LUCE_DEVICE_GPU */
    /* Optional (NULL: none): reports the weights being placed, as bytes done of total, on the
       loading thread: after each tensor's upload on the GPU, once on the CPU (which maps the
       file). The last call has done == total. It must not call into luce. */
    void (*progress)(void *user_data, int64_t done, int64_t total);
    void *progress_user_data;
} luce_model_params;

typedef struct {
    int32_t n_vocab;
    int32_t n_embd;
    int32_t n_layer;          /* main layers (an MTP block, if present, is not counted) */
    int32_t n_full_attention; /* gated full-attention layers */
    int32_t n_recurrent;      /* Gated DeltaNet layers */
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t n_ff;
    int32_t n_ctx_train;
    int64_t n_params;         /* parameters of the main model (embedding included) */
    int64_t weight_bytes;     /* bytes of weights kept by the backend */
    int32_t eos_token_id;     /* tokenizer.ggml.eos_token_id, -1 if absent */
    int32_t tied_head;        /* 1 if the output head reuses token_embd */
    int32_t n_layer_file;     /* block_count as stored (main layers + MTP blocks) */
} luce_model_info;

/* Loads a qwen35 GGUF (memory-mapped; quantized weights stay in their encoding). Every field
   of the file is validated before use; a malformed file gives LUCE_ERR_FORMAT. */
luce_status luce_model_load(const char *path, const luce_model_params *params, luce_model **out);
void luce_model_free(luce_model *model);
luce_status luce_model_get_info(const luce_model *model, luce_model_info *out);

/* Memory the model's backend holds: weights (on a GPU; the CPU maps them from the file, see
   luce_model_info.weight_bytes), KV caches, recurrent states, drafters and scratch of every
   session, now and at most since the model was loaded. */
typedef struct {
    int64_t in_use_bytes;
    int64_t peak_bytes;
    int64_t device_free_bytes;  /* the whole GPU's, every process and context counted; -1 on the CPU */
    int64_t device_total_bytes; /* -1 on the CPU */
} luce_memory_info;

luce_status luce_model_memory(const luce_model *model, luce_memory_info *out);

/* ---- session: one sequence's KV cache and recurrent state -------------------------------- */

typedef struct luce_session luce_session;

typedef enum {
    LUCE_KV_F32 = 0,   /* exact: the reference for parity */
    LUCE_KV_F16 = 1,   /* half the memory; keys/values rounded to IEEE half */
    LUCE_KV_Q8_0 = 2,  /* llama.cpp's q8_0 blocks (32 values, an f16 scale): 8.5 bits a value */
    LUCE_KV_Q4_0 = 3,  /* q4_0 blocks: 4.5 bits a value */
    /* A kv_type argument is one type for K and V both, or
       K type | V type << LUCE_KV_V_SHIFT | LUCE_KV_V_GIVEN, optionally | LUCE_KV_ROTATE: K rows
       stored rotated by the orthonormal Walsh-Hadamard matrix and queries read rotated alike
       (q.k unchanged; spreads outliers over a block; head dim a power of two). Block types need
       a head dim that is a multiple of 32. Both backends hold every type. */
    LUCE_KV_V_SHIFT = 8,
    LUCE_KV_V_GIVEN = 0x20000,
    LUCE_KV_ROTATE = 0x10000
} luce_kv_type;

/* n_ctx positions (1 .. the model's context length); kv_type as above.
   A session uses its model: free every session before luce_model_free. */
luce_status luce_session_create(luce_model *model, int32_t n_ctx, int32_t kv_type, luce_session **out);
void luce_session_free(luce_session *session);
luce_status luce_session_reset(luce_session *session);
/* --fa-window: the target's full-attention layers see only the last n_window positions (a query
   at p reads keys p - n_window + 1 .. p); 0 = all (the default). At least 64 (a
   verify step's rows, so a speculative step's own rows are always seen). Both backends. */
luce_status luce_session_set_fa_window(luce_session *session, int32_t n_window);
/* Number of tokens already in the session. */
int32_t luce_session_n_past(const luce_session *session);

/* Appends tokens to the session (prefill in chunks). If logits is not NULL it receives the
   logits of the last n_logit_rows positions, row-major [n_logit_rows][n_vocab]. On a GPU the
   chunks may run the prefill GEMM (docs/gpu.md), whose rows can differ in the last bits from
   one-token evals of the same tokens; luce_generate's speculative verify steps never use it. */
luce_status luce_session_eval(luce_session *session, const int32_t *tokens, int32_t n_tokens,
                              float *logits, int32_t n_logit_rows);

/* As luce_session_eval, and also captures hidden states for drafters: for every evaluated
   position t and every i < n_layers, hidden[(t * n_layers + i) * n_embd ..] receives the output
   of main layer layer_ids[i] (the residual stream after that layer, before the final norm).
   layer_ids: strictly increasing, each in 0 .. n_layer-1. hidden: n_tokens * n_layers * n_embd floats. */
luce_status luce_session_eval_hidden(luce_session *session, const int32_t *tokens, int32_t n_tokens,
                                     float *logits, int32_t n_logit_rows,
                                     const int32_t *layer_ids, int32_t n_layers, float *hidden);

/* Rollback by snapshot and replay (what speculative verification needs after a partial accept):
   a snapshot holds n_past and the DeltaNet conv + recurrent state of every recurrent layer
   (attention keys past n_past are never visible, so the KV cache needs no copy). Memory: per
   DeltaNet layer (Kc-1)*CD + HV*DK*DV floats (3.1 MiB for a 27B layer). Restoring into another
   session than the one snapshotted is refused. */
typedef struct luce_snapshot luce_snapshot;

luce_status luce_session_snapshot(const luce_session *session, luce_snapshot **out);
luce_status luce_session_restore(luce_session *session, const luce_snapshot *snapshot);
void luce_snapshot_free(luce_snapshot *snapshot);

/* The session's state in a file: what a disk prefix cache keeps of a prompt. Save writes the
   attention layers' K and V rows of positions 0 .. n_past-1 (in the cache's own format) and every
   DeltaNet layer's conv and recurrent state, tagged with the caller's identity bytes (0 .. 64;
   e.g. a hash of the model and its settings), whole or not at all (a temporary file beside path,
   renamed over it). Load replaces the session's state and n_past with a file's; it refuses
   (LUCE_ERR_FORMAT) a file that is not a session state, has another format version or identity,
   another KV cache type or rotation, or sizes this model's state does not have, before reading any
   of its data; a read that fails past those checks leaves the session empty. */
luce_status luce_session_state_save(const luce_session *session, const char *path, const uint8_t *identity,
                                    int32_t identity_len);
luce_status luce_session_state_load(luce_session *session, const char *path, const uint8_t *identity,
                                    int32_t identity_len);
/* The bytes luce_session_state_save would write, copied into out (capacity bytes) for the caller
   to write later (the prompt cache writes them on a background thread): *n_bytes gets their
   count. With out NULL only the count; a capacity below it is LUCE_ERR_INVALID_ARGUMENT. */
luce_status luce_session_state_image(const luce_session *session, const uint8_t *identity, int32_t identity_len,
                                     void *out, uint64_t capacity, uint64_t *n_bytes);

/* ---- drafter -------------------------------------------------------------------------- */

typedef struct luce_drafter luce_drafter;

typedef struct {
    int32_t kind;               /* 0 DFlash, 1 DFlash 2, 2 DSpark, 3 MTP (the target's own block) */
    int32_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff;
    int32_t block_size;         /* checkpoint horizon */
    int32_t n_target_layers;
    int32_t target_layer_ids[64];
    int32_t mask_token_id;
    int32_t sample_from_anchor; /* DSpark next-token slots */
    int32_t has_selector, selector_rank, selector_top_k;
    int32_t has_conv, conv_kernel_size, conv_group_size;
    int32_t has_markov, markov_rank, has_confidence, confidence_dim;
} luce_drafter_info;

/* Loads a drafter GGUF and binds it to a target (borrows its token embedding and LM head).
   An invalid drafter or one that does not fit the target is refused before any compute, with the
   inspect finding as the message (LUCE_ERR_FORMAT / LUCE_ERR_INVALID_ARGUMENT). */
luce_status luce_drafter_load(const char *path, luce_model *target, luce_drafter **out);
/* The target's own MTP block (nextn_predict_layers = 1, blk.N.nextn.* tensors) as a drafter: no
   file, k drafts per step from the target's last hidden state. LUCE_ERR_UNSUPPORTED, naming the
   file, when the target has no MTP block. The drafter borrows the target, which must outlive it. */
luce_status luce_drafter_mtp(luce_model *target, luce_drafter **out);
void luce_drafter_free(luce_drafter *drafter);
luce_status luce_drafter_get_info(const luce_drafter *drafter, luce_drafter_info *out);

/* Test hook: one drafter forward, stateless. features [n_ctx][n_target_layers*n_embd] are captured
   target hidden states (layer outputs, before the final norm) of positions 0..n_ctx-1, in
   target_layer_ids order; block [n_block] are the token ids at positions n_ctx..n_ctx+n_block-1
   (normally [anchor, mask x (B-1)]). hidden_out [n_block][n_embd] receives the drafter's final-normed
   hidden states (what the target LM head is applied to). */
luce_status luce_drafter_forward(luce_drafter *drafter, const float *features, int32_t n_ctx,
                                 const int32_t *block, int32_t n_block, float *hidden_out);

/* Test hook: the greedy candidate chain the drafter's heads produce from final-normed hidden rows
   (one row per proposed token, in order), starting from `anchor` as the first predecessor: DFlash
   argmax of the target LM head; DFlash 2 selector walk (top-k of the logits rescored with
   <pred_cb[prev] * hproj(h), succ_cb[c]>); DSpark Markov chain (logits + W2 W1[prev]). tokens_out[n_rows];
   confidence_out[n_rows] (DSpark confidence sigmoid, may be NULL). */
luce_status luce_drafter_chain(luce_drafter *drafter, const float *hidden, int32_t n_rows,
                               int32_t anchor, int32_t *tokens_out, float *confidence_out);

/* ---- generation ---------------------------------------------------------------------------- */

typedef struct {
    int32_t max_tokens;
    float temperature;         /* 0 = greedy */
    int32_t top_k;             /* 0 = off */
    float top_p;               /* 1 = off */
    uint64_t seed;
    int32_t ignore_eos;
    const int32_t *stop_ids;   /* end-of-generation token ids */
    int32_t n_stop_ids;
    /* Speculative decoding (used only when luce_generate gets a drafter; zero = defaults). */
    int32_t draft_block_size;  /* block rows B: 0 = the drafter's checkpoint value, else 2..2x it (max 32) */
    int32_t draft_block_auto;  /* 1 = auto: the cost model chooses each spec step's width in 2..the
                                  checkpoint value (draft_block_size is ignored; DDTree and
                                  no_adaptive keep the checkpoint value) */
    int32_t no_adaptive;       /* 1 = always speculate (no measured plain steps, no fallback) */
    float dspark_confidence_threshold; /* DSpark: cut the chain at the first confidence below it; 0 = off */
    int32_t verify_cap_from;   /* committed tokens from which the verify width is capped to max(8, B/2);
                                  0 = default (8192), < 0 = never */
    int32_t ddtree;            /* 1 = DDTree tree verification (greedy or sampled) */
    int32_t ddtree_budget;     /* tree nodes, 1..63; 0 = default (22) */
    /* Step costs and acceptance an earlier run measured with this target, drafter and device (the
       cost cache, luce/cost_cache.py; zero = none): the policy starts from them instead of
       calibrating. Arrays are read during the call only. */
    double prior_plain_seconds;
    const double *prior_width_seconds; /* [n_prior_widths]: spec step seconds by block rows; <= 0 = unknown */
    int32_t n_prior_widths;
    const double *prior_acceptance;    /* [n_prior_acceptance]: proposal i+1 accepted given 1..i were */
    int32_t n_prior_acceptance;
    /* Test hook (greedy only): the proposal for generated token g is oracle_tokens[g] when
       g < n_oracle_tokens, instead of the drafter heads' (the drafter still runs). Tests use it to
       force long accepted runs, full-block accepts and rejections at chosen slots. */
    const int32_t *oracle_tokens;
    int32_t n_oracle_tokens;
    /* Test hook: when draft_log is set, each chain step writes q and then its q proposals there
       (as verified: after the oracle hook), while draft_log_capacity ints last. Tests compare the
       proposals with another runtime's (llama.cpp's draft-mtp). */
    int32_t *draft_log;
    int32_t draft_log_capacity;
} luce_generate_params;

typedef struct {
    int32_t n_prompt;
    int32_t n_generated;
    double prefill_seconds;
    double decode_seconds;
    int32_t stopped_by_eos;    /* an end-of-generation id ended the loop (it is not in the output) */
    /* Speculative decoding (zero without a drafter). */
    int32_t spec_steps;        /* draft + verify steps */
    int32_t plain_steps;       /* single-token steps (the adaptive policy's, or no room left to draft) */
    int32_t n_drafted;         /* proposals verified by the target */
    int32_t n_accepted;        /* proposals accepted */
    int32_t full_accept_steps; /* spec steps that accepted every proposal */
    int32_t zero_accept_steps; /* spec steps that accepted none (only the bonus token committed) */
    int32_t max_accepted;      /* longest accepted run in one step */
    int32_t block_size;        /* block rows B used */
    double tau;                /* mean tokens committed per spec step, bonus included */
    double acceptance;         /* n_accepted / n_drafted (over the verified width) */
    double draft_seconds;      /* drafter: context projection, block forward, heads */
    double verify_seconds;     /* target forward over the verify block */
    double rollback_seconds;   /* DeltaNet state restore after a partial accept */
    /* The adaptive policy's measurements (spec_policy.h; 0 where not measured). */
    double plain_step_seconds; /* decayed mean of a plain step in this loop */
    double spec_step_seconds;  /* decayed mean of a draft + verify step */
    double step_cost_ratio;    /* spec_step_seconds / plain_step_seconds */
    double expected_speedup;   /* tokens/s of a spec step over a plain step's: decayed tokens per
                                  spec step / step_cost_ratio (> 1: speculation pays) */
    double achieved_speedup;   /* decode tok/s x plain_step_seconds */
    /* The cost model behind the width choice (spec_policy.h), by block rows 0..32 (32 = the most
       a block has). block_size above is the width the policy ended at. */
    int32_t block_auto;              /* 1 = the width was chosen by the cost model (auto) */
    double width_seconds[33];        /* measured spec step seconds (0 = no step of that width ran) */
    double width_model_seconds[33];  /* the model's step cost: measured, else interpolated (0 = unknown) */
    double width_tokens[33];         /* expected tokens a spec step of that width commits */
    int32_t n_positions;             /* proposal positions whose acceptance was observed (or seeded) */
    double position_acceptance[32];  /* [i]: proposal i+1 accepted given 1..i were (decayed) */
} luce_generate_stats;

/* Called with newly committed tokens as they are produced; return nonzero to stop early
   (luce_generate then returns LUCE_ERR_CANCELLED with the tokens so far in out_tokens/stats). */
typedef int32_t (*luce_token_callback)(void *user_data, const int32_t *tokens, int32_t n_tokens);

/* Evaluates the prompt in the session (which must be empty or hold a prefix the caller
   manages), then decodes. out_tokens (capacity out_capacity >= max_tokens) receives the
   generated ids; drafter may be NULL for plain decoding. The prompt plus max_tokens must fit
   the session's context (else LUCE_ERR_CONTEXT_FULL before any work). */
luce_status luce_generate(luce_session *session, luce_drafter *drafter,
                          const int32_t *prompt, int32_t n_prompt,
                          const luce_generate_params *params,
                          luce_token_callback callback, void *user_data,
                          int32_t *out_tokens, int32_t out_capacity,
                          luce_generate_stats *stats);

/* ---- batch: many sequences in one forward (continuous batching) ----------------------------- */

/* Up to n_parallel sequences (1 .. 64) in flight, each with n_ctx positions of its own (KV pages
   from one pool, DeltaNet state per sequence). Each decode step runs one forward over the newest
   token of every active sequence: the weight matmuls over all their rows at once, attention and
   the DeltaNet recurrence per sequence. A prompt is prefilled alone when it enters a free slot.
   Greedy tokens equal luce_generate's, token for token. Free before luce_model_free. */
typedef struct luce_batch luce_batch;

luce_status luce_batch_create(luce_model *model, int32_t n_parallel, int32_t n_ctx, int32_t kv_type,
                              luce_batch **out);
void luce_batch_free(luce_batch *batch);
/* Speculative decoding of every sequence with this drafter (bound to the batch's model; NULL: plain
   decoding again). Each step every sequence drafts its own block, or takes a plain step where its
   adaptive policy says so; one forward verifies the blocks of all sequences (a further one for
   blocks past the 64 rows a forward returns logits for); acceptance, rollback and the policy are
   per sequence, as in luce_generate, whose speculative params each request's params carry. Chain
   drafting only: a request with ddtree is refused. Greedy tokens equal plain decoding's. The
   drafter must outlive the batch's runs. */
luce_status luce_batch_set_drafter(luce_batch *batch, luce_drafter *drafter);

/* One prompt of a batch run: its own params (max_tokens, sampling, seed, stop ids; the
   speculative fields only with a drafter set), output buffer (capacity >= max_tokens) and stats (may be
   NULL; n_generated counts the tokens in out_tokens; decode_seconds is wall time from the end of
   its prefill to its last token, steps shared with the other sequences and pauses for their
   prefills included). */
typedef struct {
    const int32_t *prompt;
    int32_t n_prompt;
    const luce_generate_params *params;
    int32_t *out_tokens;
    int32_t out_capacity;
    luce_generate_stats *stats;
} luce_batch_request;

/* Called when request `index` has finished (its out_tokens and stats are final); return nonzero
   to stop the run (luce_batch_generate then returns LUCE_ERR_CANCELLED). */
typedef int32_t (*luce_batch_done_callback)(void *user_data, int32_t index);

/* Generates every request, n_parallel at a time in request order; a finished sequence's slot
   takes the next request before the next step. Every request is checked first (prompt, ids,
   max_tokens, sampling, prompt + max_tokens within n_ctx). */
luce_status luce_batch_generate(luce_batch *batch, const luce_batch_request *requests, int32_t n_requests,
                                luce_batch_done_callback done, void *user_data);

/* ---- test hooks: quantized blocks against gguf.quants ---------------------------------------- */

/* What a KV cache of luce_kv_type `kv_type` (one type, no flags) gives back for the n values x
   stored as rows of n_dim (n a multiple of n_dim; n_dim a multiple of 32 for the block types). */
luce_status luce_kv_round_trip(int32_t kv_type, const float *x, int64_t n, int32_t n_dim, float *out);

/* Dequantizes n elements of ggml type `type` from data (nbytes long) into out. */
luce_status luce_dequantize(int32_t type, const void *data, size_t nbytes, float *out, int64_t n);
/* y[r] = sum_c W[r][c] * x[c] with W in ggml type `type`, rows of n_cols elements. */
luce_status luce_matvec(int32_t type, const void *weights, size_t nbytes, int64_t n_rows,
                        int64_t n_cols, const float *x, float *y);
/* The same for n_tok activation rows at once (what decode/verify/prefill run):
   y[t][r] = sum_c W[r][c] * x[t][c], x row-major [n_tok][n_cols], y row-major [n_tok][n_rows]. */
luce_status luce_matmul(int32_t type, const void *weights, size_t nbytes, int64_t n_rows,
                        int64_t n_cols, const float *x, int64_t n_tok, float *y);
/* The same with the kernels prompt prefill runs: some types sum in another fp32 order there
   (same error bound; docs/architecture-quants.md). */
luce_status luce_matmul_prefill(int32_t type, const void *weights, size_t nbytes, int64_t n_rows,
                                int64_t n_cols, const float *x, int64_t n_tok, float *y);

/* ---- the host sampler (sampling.h; what luce_generate runs at temperature > 0) --------------- */

/* The first token luce_generate would sample from a row of n logits with this seed. temperature
   > 0, top_k >= 0 (0 = all), top_p in (0, 1]. */
luce_status luce_sample(const float *logits, int32_t n, float temperature, int32_t top_k, float top_p,
                        uint64_t seed, int32_t *out);
/* The distribution it samples from as probs[n] (zero outside the top-k / nucleus set), as
   speculative decoding's rejection sampling uses it. */
luce_status luce_sample_probs(const float *logits, int32_t n, float temperature, int32_t top_k, float top_p,
                              float *probs);

/* ---- test hook: the adaptive speculation policy (spec_policy.h) ------------------------------ */

/* Runs the policy over a synthetic decode of n_steps steps: before step i it chooses
   (choices_out[i] = 1 speculate, 0 plain); a plain step then takes plain_seconds[i], a spec step
   spec_seconds[i] and commits committed[i] tokens (>= 1). adaptive = 0 is --no-adaptive. */
luce_status luce_spec_policy_trace(int32_t adaptive, const double *plain_seconds, const double *spec_seconds,
                                   const int32_t *committed, int32_t n_steps, int32_t *choices_out);

/* The auto block width over a synthetic decode: blocks of 2..max_width rows (w - 1 proposals),
   a spec step of w rows taking width_seconds[w] (array of max_width + 1), a plain step
   plain_seconds; at step i the drafter's first accept_run[i] proposals are right (the step accepts
   min(accept_run[i], w - 1)). widths_out[i] = the width chosen before step i (0 = plain). With
   prior_acceptance (n_prior entries) the policy is seeded as from the cost cache with these costs
   and that acceptance: after its 3 plain steps, widths_out[3] is the width the cache selects. */
luce_status luce_spec_policy_trace_auto(int32_t max_width, double plain_seconds, const double *width_seconds,
                                        const int32_t *accept_run, const double *prior_acceptance,
                                        int32_t n_prior, int32_t n_steps, int32_t *widths_out);

/* LUCE_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* LUCE_H */
