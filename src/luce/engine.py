"""`luce.Engine`: load a qwen35 target GGUF into the native runtime and generate with it.

    from luce import Engine
    with Engine("target.gguf", threads=4) as eng:
        print(eng.generate("Hello", max_tokens=32).text)
        logits = eng.logits([1, 2, 3])          # [3, n_vocab] float32
        outs = eng.generate(["a", "b", "c"], max_tokens=32, parallel=2)   # continuous batching

    with Engine("target.gguf", draft="drafter.gguf") as eng:   # speculative decoding
        g = eng.generate("Hello", max_tokens=64)     # draft_block_size="auto", or a number
        print(g.stats["tau"], g.stats["acceptance"], g.stats["block_size"])
    with Engine("target.gguf", draft="mtp") as eng:            # the target's own MTP block drafts

The engine owns one native model and one session (KV cache + DeltaNet state, `ctx_size`
positions; `kv_cache="f16"` halves the attention cache at a ~1e-3 relative cost in accuracy, "q8_0"
and "q4_0" store llama.cpp's blocks; `cache_type_k` / `cache_type_v` set K and V apart, and
`kv_rotate=True` stores K rotated by a Walsh-Hadamard matrix, which spreads a row's outliers
before it is quantized; docs/formats.md, "KV cache"). Every call to `generate` or `logits` starts from an empty context. The tokenizer and
chat template come from the GGUF itself. Errors are LuceError with one line from the runtime.
`progress=callable(done, total)` reports the weights being placed (bytes; per tensor while they
upload to a GPU; `luce generate` draws it as a progress bar).
Speculative runs read and update the cost cache (luce/cost_cache.py): the step costs measured with
this target, drafter and device, so the next run's policy starts from them.
"""
from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from luce.binding import check, ffi, lib
from luce.errors import LuceError

DEVICES = ("cpu", "gpu", "auto")
KV_CACHE_TYPES = {"f32": 0, "f16": 1, "q8_0": 2, "q4_0": 3}  # luce_kv_type
DEFAULT_CTX_SIZE = 4096
DEFAULT_MAX_TOKENS = 128
MAX_PARALLEL = 64          # sequences one batch forward holds (luce_batch_create)
DEFAULT_PARALLEL = 8       # Engine.generate(list) without parallel=

_DEVICE_IDS = {"cpu": 0, "gpu": 1}


@dataclass(frozen=True)
class ModelInfo:
    """Mirror of luce_model_info (native/include/luce.h)."""
    n_vocab: int
    n_embd: int
    n_layer: int            # main layers (an MTP block is not counted)
    n_full_attention: int
    n_recurrent: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_ctx_train: int
    n_params: int
    weight_bytes: int
    eos_token_id: int       # -1 if the file names none
    tied_head: bool
    n_layer_file: int       # block_count as stored (main + MTP)

    @classmethod
    def _from_native(cls, info) -> "ModelInfo":
        values = {f.name: getattr(info, f.name) for f in fields(cls)}
        values["tied_head"] = bool(values["tied_head"])
        return cls(**values)


@dataclass(frozen=True)
class MemoryUse:
    """Mirror of luce_memory_info (native/include/luce.h): bytes the backend holds (on a GPU the
    weights too; the CPU maps them from the file), now and at most since the model was loaded,
    and the whole device's free and total bytes (None on the CPU)."""
    in_use_bytes: int
    peak_bytes: int
    device_free_bytes: int | None
    device_total_bytes: int | None

    @classmethod
    def _from_native(cls, m) -> "MemoryUse":
        device = (None, None) if m.device_total_bytes < 0 else (m.device_free_bytes, m.device_total_bytes)
        return cls(m.in_use_bytes, m.peak_bytes, *device)


@dataclass
class Generation:
    text: str
    tokens: list[int]          # generated ids (an end-of-generation id is not included)
    prompt_tokens: int
    stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class DrafterInfo:
    """Mirror of luce_drafter_info (native/include/luce.h)."""
    kind: str                  # DFlash | DFlash 2 | DSpark | MTP
    n_layer: int
    block_size: int            # checkpoint horizon
    target_layer_ids: tuple
    mask_token_id: int
    sample_from_anchor: bool
    has_selector: bool
    has_conv: bool
    has_markov: bool
    has_confidence: bool

    @classmethod
    def _from_native(cls, info) -> "DrafterInfo":
        return cls(kind=DRAFTER_KINDS[info.kind], n_layer=info.n_layer, block_size=info.block_size,
                   target_layer_ids=tuple(info.target_layer_ids[i] for i in range(info.n_target_layers)),
                   mask_token_id=info.mask_token_id, sample_from_anchor=bool(info.sample_from_anchor),
                   has_selector=bool(info.has_selector), has_conv=bool(info.has_conv),
                   has_markov=bool(info.has_markov), has_confidence=bool(info.has_confidence))


DRAFTER_KINDS = ("DFlash", "DFlash 2", "DSpark", "MTP")
# draft=MTP_DRAFT drafts with the target's own MTP block (no drafter file).
MTP_DRAFT = "mtp"


class FaWindowWarning(UserWarning):
    """A prompt longer than Engine(fa_window=N): its head is outside the full-attention window."""


def kv_type_argument(type_k: str, type_v: str, rotate: bool) -> int:
    """luce.h's packed kv_type: the K type, the V type and the rotation flag."""
    for name in (type_k, type_v):
        if name not in KV_CACHE_TYPES:
            raise LuceError(f"unknown KV cache type '{name}' (choose from {', '.join(KV_CACHE_TYPES)})")
    lib()
    return (KV_CACHE_TYPES[type_k] | KV_CACHE_TYPES[type_v] << lib().LUCE_KV_V_SHIFT | lib().LUCE_KV_V_GIVEN
            | (lib().LUCE_KV_ROTATE if rotate else 0))


class PromptCacheWarning(UserWarning):
    """The prompt cache could not store a head (disk full, folder removed): the generation goes
    on without it."""


class Engine:
    def __init__(self, model: str | os.PathLike, *, device: str = "cpu", threads: int = 0,
                 ctx_size: int = DEFAULT_CTX_SIZE, kv_cache: str = "f32",
                 cache_type_k: str | None = None, cache_type_v: str | None = None, kv_rotate: bool = False,
                 fa_window: int = 0,
                 draft: str | os.PathLike | None = None,
                 prompt_cache: str | os.PathLike | None = None,
                 progress: Callable[[int, int], None] | None = None):
        kv_type = kv_type_argument(cache_type_k or kv_cache, cache_type_v or kv_cache, kv_rotate)
        if prompt_cache is not None and draft is not None:
            raise LuceError("a prompt cache does not combine with a drafter yet: speculative decoding needs the "
                            "target's features of the whole prompt")
        if device not in DEVICES:
            raise LuceError(f"unknown device '{device}' (choose from {', '.join(DEVICES)})")
        if not isinstance(threads, int) or threads < 0:
            raise LuceError(f"threads must be >= 0 (0 = one per core), got {threads}")
        self.path = Path(model)
        if not self.path.is_file():
            raise LuceError(f"model file not found: {self.path}")
        self._model = self._session = self._drafter = None
        self._tokenizer = None
        self.draft_info = None
        self._cost_key = None  # the cost cache's key, once a drafter is loaded
        lib()  # loads the library and declares luce.h's types before ffi.new below
        # auto: the GPU when its backend is built and a device with enough memory is present
        # (the native loader says so with LUCE_ERR_DEVICE before uploading anything), else the CPU.
        # gpu_unavailable keeps the reason auto passed over an installed GPU backend (None when
        # it ran on the GPU, or when luce was built for the CPU only and there was nothing to skip).
        self.gpu_unavailable: str | None = None
        candidates = ("gpu", "cpu") if device == "auto" else (device,)
        for i, dev in enumerate(candidates):
            try:
                self._model = self._load(dev, threads, progress)
                self.device = dev
                break
            except LuceError as e:
                if e.status != lib().LUCE_ERR_DEVICE or i + 1 == len(candidates):
                    raise
                if lib().luce_gpu_backend_installed():
                    self.gpu_unavailable = str(e)
        info = ffi.new("luce_model_info *")
        check(lib().luce_model_get_info(self._model, info))
        self.info = ModelInfo._from_native(info)
        try:
            self._check_tokenizer_arrays()
        except LuceError:
            self.close()
            raise
        sess = ffi.new("luce_session **")
        try:
            check(lib().luce_session_create(self._model, int(ctx_size), kv_type, sess))
        except LuceError:
            self.close()
            raise
        self._session = sess[0]
        self.ctx_size = int(ctx_size)
        self.fa_window, self._fa_window_warned = int(fa_window), False
        if fa_window:
            try:
                check(lib().luce_session_set_fa_window(self._session, int(fa_window)))
            except LuceError:
                self.close()
                raise
        self._kv_type = kv_type
        self._prompt_cache = None
        if prompt_cache is not None:
            from luce.prompt_cache import PromptCache, identity

            try:
                self._prompt_cache = PromptCache(prompt_cache, identity(self.path, f"kv_type {kv_type}"))
            except BaseException:
                self.close()
                raise
        if draft is not None:
            mtp = str(draft) == MTP_DRAFT
            try:
                if mtp:
                    self._bind_mtp()
                else:
                    self._load_drafter(Path(draft))
            except BaseException:
                self.close()
                raise
            from luce import cost_cache

            # MTP's costs belong to the target file alone: its identity stands in the drafter's place.
            device_id = cost_cache.device_identity(self.device, threads)
            self._cost_key = cost_cache.cache_key(self.path, self.path if mtp else Path(draft),
                                                  device_id + ("/mtp" if mtp else ""))

    def _check_tokenizer_arrays(self) -> None:
        """The target rules only Python applies (converters/target_rules.py; the native loader
        does not read the tokenizer): `luce inspect` refuses the same files for the same reason."""
        from luce.converters.gguf_reader import GGUFFile
        from luce.converters.target_rules import Refused, check_tokenizer

        with GGUFFile.open(self.path) as f:
            try:
                check_tokenizer(f, self.info.n_vocab)
            except Refused as e:
                raise LuceError(f"{self.path}: {e}", status=lib().LUCE_ERR_FORMAT) from None

    def _bind_mtp(self) -> None:
        """Draft with the target's own MTP block (the native side refuses a target without one,
        naming the file)."""
        out = ffi.new("luce_drafter **")
        check(lib().luce_drafter_mtp(self._model, out), str(self.path))
        self._drafter = out[0]
        info = ffi.new("luce_drafter_info *")
        check(lib().luce_drafter_get_info(self._drafter, info))
        self.draft_info = DrafterInfo._from_native(info)

    def _load_drafter(self, path: Path) -> None:
        """Validate the drafter and the pair with `luce inspect`'s rules (the first error finding
        is the message), then bind it natively (which re-checks everything it touches)."""
        from luce.converters.gguf_reader import GGUFFormatError
        from luce.converters.validate import ERROR, inspect_gguf

        if not path.is_file():
            raise LuceError(f"drafter file not found: {path}")
        try:
            report = inspect_gguf(path, self.path)
        except GGUFFormatError as e:  # the reader's messages may name the file already
            raise LuceError(str(e) if str(path) in str(e) else f"{path}: {e}") from None
        if report.kind != "drafter":
            raise LuceError(f"{path} is not a drafter GGUF (architecture {report.arch!r})")
        errors = [f for f in report.findings if f.severity == ERROR]
        if errors:
            raise LuceError(f"{path}: {errors[0].message}")
        out = ffi.new("luce_drafter **")
        check(lib().luce_drafter_load(os.fsencode(path), self._model, out), str(path))
        self._drafter = out[0]
        info = ffi.new("luce_drafter_info *")
        check(lib().luce_drafter_get_info(self._drafter, info))
        self.draft_info = DrafterInfo._from_native(info)

    def _load(self, device: str, threads: int, progress: Callable[[int, int], None] | None):
        """progress(done, total) in bytes as the weights are placed (per tensor on the GPU, once on
        the CPU). An exception it raises is re-raised once the model is loaded (and freed)."""
        failed: list[BaseException] = []

        def report(_user_data, done, total):
            if not failed:
                try:
                    progress(int(done), int(total))
                except BaseException as e:  # noqa: BLE001 - carried across the C frame, re-raised below
                    failed.append(e)

        callback = ffi.callback("void(void *, int64_t, int64_t)", report) if progress else ffi.NULL
        params = ffi.new("luce_model_params *", {"device": _DEVICE_IDS[device], "n_threads": threads,
                                                 "gpu_index": 0, "progress": callback})
        out = ffi.new("luce_model **")
        check(lib().luce_model_load(os.fsencode(self.path), params, out), str(self.path))
        if failed:
            lib().luce_model_free(out[0])
            raise failed[0]
        return out[0]

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        self.flush_prompt_cache()
        if self._drafter is not None:
            lib().luce_drafter_free(self._drafter)
            self._drafter = None
        if self._session is not None:
            lib().luce_session_free(self._session)
            self._session = None
        if self._model is not None:
            lib().luce_model_free(self._model)
            self._model = None

    def flush_prompt_cache(self) -> None:
        """Waits for the prompt cache's write in flight (close() does too): a prompt's head is
        written on a background thread while its answer is generated."""
        if getattr(self, "_prompt_cache", None) is not None:
            _warn_store_failed(self._prompt_cache.wait())

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _live_session(self):
        if self._session is None:
            raise LuceError("the engine is closed")
        return self._session

    def memory(self) -> MemoryUse:
        """Backend memory now and at its peak since loading: weights (GPU), KV cache, DeltaNet
        state, drafter and scratch."""
        if self._model is None:
            raise LuceError("the engine is closed")
        out = ffi.new("luce_memory_info *")
        check(lib().luce_model_memory(self._model, out))
        return MemoryUse._from_native(out)

    # -- tokenizer ---------------------------------------------------------------------------

    @property
    def tokenizer(self):
        """The byte-level BPE tokenizer stored in the GGUF (built on first use)."""
        if self._tokenizer is None:
            from luce.converters.gguf_reader import GGUFFile
            from luce.tokenizer import Tokenizer

            with GGUFFile.open(self.path) as f:
                self._tokenizer = Tokenizer.from_gguf(f)
        return self._tokenizer

    def _stop_ids(self) -> list[int]:
        return sorted(self.tokenizer.eog_ids)

    # -- logits ------------------------------------------------------------------------------

    def logits(self, token_ids: Sequence[int], *, state: str | os.PathLike | None = None,
               identity: bytes = b"") -> np.ndarray:
        """Logits of every position of `token_ids`: [n, n_vocab] float32. From an empty context,
        or after the tokens of a session state file (`state`, written by save_state with the same
        `identity`)."""
        ids = self._ids_array(token_ids)
        session = self._live_session()
        check(lib().luce_session_reset(session))
        if state is not None:
            check(lib().luce_session_state_load(session, os.fsencode(state), identity, len(identity)))
        out = np.empty((len(ids), self.info.n_vocab), dtype=np.float32)
        check(lib().luce_session_eval(session, ffi.from_buffer("int32_t[]", ids), len(ids),
                                      ffi.from_buffer("float[]", out), len(ids)))
        return out

    def save_state(self, token_ids: Sequence[int], path: str | os.PathLike, *, identity: bytes = b"") -> None:
        """Evaluates `token_ids` from an empty context and writes the session's state after them
        to `path` (the attention KV rows and the DeltaNet state; luce.h luce_session_state_save):
        whole or not at all. `identity` (up to 64 bytes) tags the file; loading it needs the same."""
        ids = self._ids_array(token_ids)
        session = self._live_session()
        check(lib().luce_session_reset(session))
        check(lib().luce_session_eval(session, ffi.from_buffer("int32_t[]", ids), len(ids), ffi.NULL, 0))
        check(lib().luce_session_state_save(session, os.fsencode(path), identity, len(identity)))

    def hidden_states(self, token_ids: Sequence[int], layers: Sequence[int]) -> np.ndarray:
        """Outputs of the given main layers (residual stream before the final norm) at every
        position of `token_ids`, from an empty context: [n, len(layers), n_embd] float32.
        This is what drafters are fed; layers must increase strictly."""
        ids = self._ids_array(token_ids)
        layer_ids = np.ascontiguousarray(list(layers), dtype=np.int32)
        session = self._live_session()
        check(lib().luce_session_reset(session))
        out = np.empty((len(ids), len(layer_ids), self.info.n_embd), dtype=np.float32)
        check(lib().luce_session_eval_hidden(
            session, ffi.from_buffer("int32_t[]", ids), len(ids), ffi.NULL, 0,
            ffi.from_buffer("int32_t[]", layer_ids), len(layer_ids), ffi.from_buffer("float[]", out)))
        return out

    def _ids_array(self, token_ids: Sequence[int]) -> np.ndarray:
        ids = np.asarray(list(token_ids), dtype=np.int64)
        if ids.size == 0:
            raise LuceError("the prompt is empty")
        bad = np.flatnonzero((ids < 0) | (ids >= self.info.n_vocab))
        if bad.size:
            raise LuceError(f"token id {int(ids[bad[0]])} is out of range "
                            f"(vocabulary has {self.info.n_vocab} tokens)")
        return np.ascontiguousarray(ids, dtype=np.int32)

    # -- generation --------------------------------------------------------------------------

    def encode_prompt(self, prompt: str, *, chat: bool = False) -> list[int]:
        """Token ids for a text prompt, rendered with the GGUF's chat template when chat=True."""
        if not prompt:
            raise LuceError("the prompt is empty")
        if chat:
            from luce.chat import render_chat

            template = self.tokenizer.chat_template
            if not template:
                raise LuceError(f"{self.path.name} has no chat template (tokenizer.chat_template)")
            prompt = render_chat(template, [{"role": "user", "content": prompt}],
                                 add_generation_prompt=True)
        return self.tokenizer.encode(prompt)

    def generate(self, prompt: str | Sequence[str] | None = None, *,
                 prompt_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
                 max_tokens: int | Sequence[int] = DEFAULT_MAX_TOKENS, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, ignore_eos: bool = False, chat: bool = False,
                 on_text: Callable[[str], None] | None = None, speculative: bool = True,
                 draft_block_size: int | str = "auto", adaptive: bool = True,
                 dspark_confidence_threshold: float = 0.0, verify_cap_from: int = 0,
                 ddtree: bool = False, ddtree_budget: int = 0,
                 oracle_tokens: Sequence[int] | None = None, draft_log: list | None = None,
                 parallel: int | None = None,
                 on_result: Callable[[int, Generation], None] | None = None) -> Generation | list[Generation]:
        """Prefill the prompt, then decode up to max_tokens (greedy when temperature == 0).

        A list of prompts (texts, or id lists in prompt_ids) gives a list of Generations, one per
        prompt in order, run `parallel` at a time (default min(len, 8), at most 64) by continuous
        batching: one forward per decode step over every sequence in flight; max_tokens may then
        be a list too, and so may temperature, top_k, top_p and seed (one value per prompt, as
        vLLM's per-request sampling parameters). on_result(i, generation) is called as prompt i
        finishes. Greedy results
        equal one-by-one generation's. With a drafter loaded (and speculative=True) every sequence of
        the batch decodes speculatively (chain drafting; ddtree is refused), each with its own
        acceptance, rollback and adaptive policy, one target forward verifying all their blocks;
        each result's stats then carry its own tau and acceptance.

        Exactly one of `prompt` (text) and `prompt_ids` is given. on_text(str) receives decoded
        text as tokens are committed (incomplete UTF-8 is held back until it completes).
        With a drafter loaded (and speculative=True) decoding is speculative; the knobs are those
        of luce_generate_params (0 = default). draft_block_size="auto" lets the cost model choose
        each step's block width; a number is exactly that width (0: the drafter's checkpoint
        value). oracle_tokens and draft_log are test hooks (see luce.h): a draft_log list receives
        each chain step's proposals, one list per step."""
        if (prompt is None) == (prompt_ids is None):
            raise LuceError("give exactly one of prompt and prompt_ids")
        if _is_many(prompt, prompt_ids):
            return self._generate_many(
                prompt, prompt_ids, max_tokens=max_tokens, parallel=parallel, on_result=on_result, chat=chat,
                speculative=speculative,
                settings=dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, ignore_eos=ignore_eos,
                              draft_block_size=draft_block_size, adaptive=adaptive,
                              dspark_confidence_threshold=dspark_confidence_threshold,
                              verify_cap_from=verify_cap_from, ddtree=ddtree, ddtree_budget=ddtree_budget))
        if parallel is not None or on_result is not None:
            raise LuceError("parallel and on_result go with a list of prompts")
        for name, value in dict(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                seed=seed).items():
            _per_prompt(name, value, 1, many=False)
        ids = self._ids_array(prompt_ids if prompt is None else self.encode_prompt(prompt, chat=chat))
        self._warn_fa_window(len(ids))
        if max_tokens < 0:
            raise LuceError(f"max_tokens must be >= 0, got {max_tokens}")
        block, block_auto = _block_size_param(draft_block_size)
        session = self._live_session()
        check(lib().luce_session_reset(session))
        n_prompt, cached, cache_seconds = len(ids), 0, 0.0
        if self._prompt_cache is not None:
            t0 = time.perf_counter()
            ids, cached = self._prefill_from_cache(session, ids)
            cache_seconds = time.perf_counter() - t0

        stop = self._stop_ids() if not ignore_eos else []
        stop_buf = ffi.new("int32_t[]", stop or [0])
        oracle = list(oracle_tokens or [])
        oracle_buf = ffi.new("int32_t[]", oracle or [0])
        params = ffi.new("luce_generate_params *", {
            "max_tokens": int(max_tokens), "temperature": float(temperature), "top_k": int(top_k),
            "top_p": float(top_p), "seed": int(seed) & (2**64 - 1), "ignore_eos": int(ignore_eos),
            "stop_ids": stop_buf, "n_stop_ids": len(stop),
            "draft_block_size": block, "draft_block_auto": int(block_auto), "no_adaptive": int(not adaptive),
            "dspark_confidence_threshold": float(dspark_confidence_threshold),
            "verify_cap_from": int(verify_cap_from), "ddtree": int(ddtree), "ddtree_budget": int(ddtree_budget),
            "oracle_tokens": oracle_buf, "n_oracle_tokens": len(oracle)})
        # A step writes q + 1 ints (q <= 32 proposals) and commits at least one token.
        log_capacity = max(1, max_tokens) * 34 if draft_log is not None else 0
        log_buf = ffi.new("int32_t[]", max(1, log_capacity))
        if draft_log is not None:
            params.draft_log, params.draft_log_capacity = log_buf, log_capacity
        drafter = self._drafter if (speculative and self._drafter is not None) else ffi.NULL
        prior = self._cost_prior(params) if drafter != ffi.NULL else None
        out_tokens = ffi.new("int32_t[]", max(1, max_tokens))
        stats = ffi.new("luce_generate_stats *")

        decoder = self.tokenizer.decoder() if on_text is not None else None
        failure: list[BaseException] = []

        @ffi.callback("int32_t(void *, const int32_t *, int32_t)")
        def on_tokens(_user, tokens, n):
            try:
                text = decoder.feed([tokens[i] for i in range(n)])
                if text:
                    on_text(text)
                return 0
            except BaseException as e:  # surfaced after the native call returns
                failure.append(e)
                return 1

        status = lib().luce_generate(session, drafter, ffi.from_buffer("int32_t[]", ids), len(ids),
                                     params, on_tokens if on_text is not None else ffi.NULL,
                                     ffi.NULL, out_tokens, max(1, max_tokens), stats)
        if failure:
            raise failure[0]
        check(status)
        if decoder is not None:
            tail = decoder.flush()  # bytes held back as incomplete UTF-8 at the very end
            if tail:
                on_text(tail)
        tokens = [out_tokens[i] for i in range(stats.n_generated)]
        if draft_log is not None:
            draft_log.extend(_read_draft_log(log_buf, log_capacity))
        speculative_run = drafter != ffi.NULL
        result = _stats_dict(stats, speculative_run)
        if speculative_run:
            self._store_costs(prior, result)
        if self._prompt_cache is not None:  # the native counts cover the tokens luce_generate prefilled
            result.update(prompt_cached_tokens=cached, prompt_cache_seconds=cache_seconds)
        return Generation(text=self.tokenizer.decode(tokens) if tokens else "", tokens=tokens,
                          prompt_tokens=n_prompt,
                          stats=result | self._memory_stats()
                          | ({"adaptive": bool(adaptive), "costs_from_cache": prior is not None}
                             if speculative_run else {}))

    def _prefill_from_cache(self, session, ids: np.ndarray) -> tuple[np.ndarray, int]:
        """The prompt cache's part of a prefill (luce.prompt_cache): loads the longest cached head
        of the prompt (all of it but the last token, whose logits luce_generate needs), evaluates
        the prompt up to its last whole block and stores that head. Returns the ids left for
        luce_generate and the number of prompt tokens the cache gave."""
        from luce.prompt_cache import BLOCK

        cache, n = self._prompt_cache, 0
        _warn_store_failed(cache.failures())
        hit = cache.lookup(ids[:-1])
        if hit is not None:
            try:
                check(lib().luce_session_state_load(session, os.fsencode(hit[0]), cache.tag, len(cache.tag)))
                n = hit[1]
            except LuceError:  # cut short, or written by another luce: prefill in full
                cache.drop(hit[0])
                check(lib().luce_session_reset(session))
        head = (len(ids) - 1) // BLOCK * BLOCK
        if head > n:
            rest = np.ascontiguousarray(ids[n:head], dtype=np.int32)
            check(lib().luce_session_eval(session, ffi.from_buffer("int32_t[]", rest), len(rest), ffi.NULL, 0))
            try:
                cache.store(ids[:head], _state_image(session, cache.tag))
            except (LuceError, MemoryError) as e:  # the cache's loss, not the answer's
                _warn_store_failed([str(e).splitlines()[0] if str(e) else type(e).__name__])
            return ids[head:], n
        return ids[n:], n

    def _warn_fa_window(self, n_prompt: int) -> None:
        """The first prompt that outgrows fa_window: one FaWindowWarning naming both numbers (its
        head is then invisible to the full-attention layers, which looks like a model that
        forgets, not a setting)."""
        if self.fa_window and n_prompt > self.fa_window and not self._fa_window_warned:
            self._fa_window_warned = True
            warnings.warn(FaWindowWarning(
                f"the prompt ({n_prompt} tokens) outgrows fa_window {self.fa_window}: the full-attention "
                f"layers see only its last {self.fa_window} positions"), stacklevel=3)

    def check_fits(self, token_ids: Sequence[int], max_tokens: int) -> None:
        """Refuses, as generate() would, a prompt whose tokens plus max_tokens exceed the context."""
        if len(token_ids) + max_tokens > self.ctx_size:
            raise LuceError(f"prompt ({len(token_ids)} tokens) + max_tokens ({max_tokens}) exceed the context "
                            f"size {self.ctx_size} (0 already used)")

    def _generate_many(self, prompts, prompt_ids, *, max_tokens, parallel, on_result, chat, speculative,
                       settings) -> list[Generation]:
        """generate() of a list: the prompts' ids and budgets checked, then the batch runtime
        (speculative with the drafter, when there is one and speculative is True)."""
        ids_list = ([self._ids_array(self.encode_prompt(p, chat=chat)) for p in prompts] if prompt_ids is None
                    else [self._ids_array(ids) for ids in prompt_ids])
        if not ids_list:
            return []
        if self.fa_window:
            raise LuceError("fa_window is not applied inside a batch yet: generate the prompts one by one")
        per_prompt = {name: _per_prompt(name, value, len(ids_list))
                      for name, value in (settings | {"max_tokens": max_tokens}).items() if name in PER_PROMPT}
        speculative = speculative and self._drafter is not None
        n_parallel = min(len(ids_list), DEFAULT_PARALLEL) if parallel is None else parallel
        if isinstance(n_parallel, bool) or not isinstance(n_parallel, int) or not 1 <= n_parallel <= MAX_PARALLEL:
            raise LuceError(f"parallel must be an integer in 1..{MAX_PARALLEL}, got {parallel!r}")
        return self._run_batch(ids_list, per_prompt, n_parallel, on_result, settings, speculative)

    def _run_batch(self, ids_list, per_prompt, n_parallel, on_result, settings, speculative) -> list[Generation]:
        """The prompts through luce_batch_generate, each result built as its sequence finishes.
        Speculative batches neither read nor write the cost cache: a step's cost there is that of a
        forward shared with the other sequences, not a lone sequence's."""
        if self._model is None:
            raise LuceError("the engine is closed")
        stop = self._stop_ids() if not settings["ignore_eos"] else []
        stop_buf = ffi.new("int32_t[]", stop or [0])
        n = len(ids_list)
        keep = [stop_buf]  # cffi buffers the requests point into, alive through the call
        requests = ffi.new("luce_batch_request[]", n)
        for i, ids in enumerate(ids_list):
            budget = per_prompt["max_tokens"][i]
            if budget < 0:
                raise LuceError(f"max_tokens must be >= 0, got {budget}")
            params = ffi.new("luce_generate_params *", {
                "max_tokens": budget, "temperature": per_prompt["temperature"][i],
                "top_k": per_prompt["top_k"][i], "top_p": per_prompt["top_p"][i],
                "seed": per_prompt["seed"][i] & (2**64 - 1), "ignore_eos": int(settings["ignore_eos"]),
                "stop_ids": stop_buf, "n_stop_ids": len(stop)} | (_spec_params(settings) if speculative else {}))
            prompt = ffi.from_buffer("int32_t[]", ids)
            out = ffi.new("int32_t[]", max(1, budget))
            stats = ffi.new("luce_generate_stats *")
            keep += [params, prompt, out, stats]
            requests[i] = {"prompt": prompt, "n_prompt": len(ids), "params": params, "out_tokens": out,
                           "out_capacity": max(1, budget), "stats": stats}
        results: list[Generation | None] = [None] * n
        failure: list[BaseException] = []

        @ffi.callback("int32_t(void *, int32_t)")
        def on_done(_user, index):
            try:
                r = requests[index]
                tokens = [r.out_tokens[k] for k in range(r.stats.n_generated)]
                results[index] = Generation(text=self.tokenizer.decode(tokens) if tokens else "", tokens=tokens,
                                            prompt_tokens=r.n_prompt,
                                            stats=_stats_dict(r.stats, speculative) | {"parallel": n_parallel}
                                            | self._memory_stats())
                if on_result is not None:
                    on_result(index, results[index])
                return 0
            except BaseException as e:  # surfaced after the native call returns
                failure.append(e)
                return 1

        batch = ffi.new("luce_batch **")
        check(lib().luce_batch_create(self._model, n_parallel, self.ctx_size, self._kv_type, batch))
        try:
            if speculative:
                check(lib().luce_batch_set_drafter(batch[0], self._drafter))
            status = lib().luce_batch_generate(batch[0], requests, n, on_done, ffi.NULL)
        finally:
            lib().luce_batch_free(batch[0])
        if failure:
            raise failure[0]
        check(status)
        return results

    def _cost_prior(self, params):
        """Seed params with the cost cache's entry for this target, drafter and device; returns
        (entry, the arrays params point to, which must live through the call), or None."""
        from luce import cost_cache

        entry = cost_cache.load(self._cost_key)
        if entry is None:
            return None
        widths = [0.0] * (cost_cache.MAX_WIDTH + 1)
        for w, s in entry["width_seconds"].items():
            widths[int(w)] = float(s)
        width_buf = ffi.new("double[]", widths)
        accept_buf = ffi.new("double[]", [float(a) for a in entry["acceptance"]] or [0.0])
        params.prior_plain_seconds = float(entry["plain_seconds"])
        params.prior_width_seconds, params.n_prior_widths = width_buf, len(widths)
        params.prior_acceptance, params.n_prior_acceptance = accept_buf, len(entry["acceptance"])
        return entry, width_buf, accept_buf

    def _store_costs(self, prior, stats: dict) -> None:
        from luce import cost_cache

        entry = cost_cache.merged(prior[0] if prior else None, stats)
        if entry is not None:
            cost_cache.save(self._cost_key, entry)

    def _memory_stats(self) -> dict:
        """The stats' memory fields: the backend's peak so far, and where that memory is."""
        return {"peak_memory_bytes": self.memory().peak_bytes,
                "memory_on": "device" if self.device == "gpu" else "host"}


SPEC_STATS = ("spec_steps", "plain_steps", "n_drafted", "n_accepted", "full_accept_steps",
              "zero_accept_steps", "max_accepted", "block_size", "tau", "acceptance", "draft_seconds",
              "verify_seconds", "rollback_seconds", "plain_step_seconds", "spec_step_seconds",
              "step_cost_ratio", "expected_speedup", "achieved_speedup")
WIDTH_STATS = ("width_seconds", "width_model_seconds", "width_tokens")  # by block rows 0..32


def _state_image(session, tag: bytes) -> np.ndarray:
    """The session's state as luce_session_state_save would write it, in host memory."""
    n = ffi.new("uint64_t *")
    check(lib().luce_session_state_image(session, tag, len(tag), ffi.NULL, 0, n))
    image = np.empty(n[0], dtype=np.uint8)
    check(lib().luce_session_state_image(session, tag, len(tag), ffi.from_buffer(image), len(image), n))
    return image


def _warn_store_failed(reasons: list[str]) -> None:
    for reason in reasons:
        warnings.warn(PromptCacheWarning(f"the prompt cache could not store a prompt's head: {reason}"))


def _read_draft_log(buf, capacity: int) -> list[list[int]]:
    """luce_generate_params.draft_log as one list of proposals per step (a step's q is >= 1; the
    buffer is zeroed past the last step)."""
    steps, i = [], 0
    while i < capacity and buf[i] > 0:
        q = buf[i]
        steps.append([buf[i + 1 + j] for j in range(q)])
        i += q + 1
    return steps


def _is_many(prompt, prompt_ids) -> bool:
    """Whether generate() got a list of prompts: texts, or id lists."""
    if prompt is not None:
        return not isinstance(prompt, str)
    items = list(prompt_ids)
    return bool(items) and not isinstance(items[0], (int, np.integer))


# The settings a list of prompts may give one per prompt, and the type each takes.
PER_PROMPT = {"max_tokens": int, "temperature": float, "top_k": int, "top_p": float, "seed": int}


def _per_prompt(name: str, value, n: int, many: bool = True) -> list:
    """`name` for each of n prompts: one number for all, or (many: a list of prompts) one each."""
    kind = PER_PROMPT[name]

    def number(v) -> bool:
        if isinstance(v, bool):
            return False
        return isinstance(v, (int, np.integer)) or (kind is float and isinstance(v, (float, np.floating)))

    if number(value):
        return [kind(value)] * n
    if not many:
        raise LuceError(f"{name} must be a number (a list of them goes with a list of prompts)")
    values = list(value) if isinstance(value, (list, tuple, np.ndarray)) else None
    if values is None or len(values) != n or not all(number(v) for v in values):
        raise LuceError(f"{name} must be a number or a list of {n} numbers (one per prompt)")
    return [kind(v) for v in values]


def _spec_params(settings: dict) -> dict:
    """The speculative fields of luce_generate_params from generate()'s keyword settings."""
    block, block_auto = _block_size_param(settings["draft_block_size"])
    return {"draft_block_size": block, "draft_block_auto": int(block_auto), "no_adaptive": int(not settings["adaptive"]),
            "dspark_confidence_threshold": float(settings["dspark_confidence_threshold"]),
            "verify_cap_from": int(settings["verify_cap_from"]), "ddtree": int(settings["ddtree"]),
            "ddtree_budget": int(settings["ddtree_budget"])}


def _block_size_param(value) -> tuple[int, bool]:
    """draft_block_size as luce_generate_params has it: (rows, auto). A number's range is the
    drafter's, checked natively."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return 0, True
    if isinstance(value, bool) or not isinstance(value, int):
        raise LuceError(f"draft_block_size must be 'auto' or a number of block rows, got {value!r}")
    return int(value), False


def _stats_dict(st, speculative: bool = False) -> dict:
    """Stats as the CLI prints them. Decode speed counts the n_generated - 1 steps after the
    first token (which comes out of prefill), as llama.cpp does. Speculative runs add the
    luce_generate_stats draft fields (tau includes the bonus token)."""
    decode_steps = max(st.n_generated - 1, 0)
    spec = {name: getattr(st, name) for name in SPEC_STATS} if speculative else {}
    if speculative:
        spec["block_auto"] = bool(st.block_auto)
        spec.update({name: list(getattr(st, name)) for name in WIDTH_STATS})
        spec["position_acceptance"] = [st.position_acceptance[i] for i in range(st.n_positions)]
    return {
        **spec,
        "prompt_tokens": st.n_prompt,
        "prefill_seconds": st.prefill_seconds,
        "prefill_tok_s": st.n_prompt / st.prefill_seconds if st.prefill_seconds > 0 else 0.0,
        "generated_tokens": st.n_generated,
        "decode_seconds": st.decode_seconds,
        "decode_tok_s": decode_steps / st.decode_seconds if st.decode_seconds > 0 else 0.0,
        "stopped_by_eos": bool(st.stopped_by_eos),
    }
