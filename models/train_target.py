"""The reference target: a small model with the real Qwen3.5 architecture, trained on the corpus.

transformers' Qwen3_5ForCausalLM / Qwen3_5TextConfig, unchanged: Gated DeltaNet layers with
HK != HV (grouped value heads, as in every real Qwen3.5), gated full-attention layers every 4th
layer with partial NeoX RoPE, zero-centred RMSNorms. The LM head is UNTIED, like the 27B, so the
GGUF has its own `output.weight` and the converter and runtime take the exact path they take
for a real checkpoint (a tied head would cost 2M fewer parameters and test a path no real
Qwen3.5-27B file takes).

Training: next-token CE on random 512-token windows of the train split, AdamW (betas 0.9/0.95,
weight decay 0.1 on matrices), linear warm-up then cosine to 10%, grad clip 1.0, bf16 autocast on
CUDA, as many steps as fit in the wall-clock budget (models/schedule.py). Validation loss on
fixed windows of the validation split. Saved as an HF checkpoint dir in bf16 (config.json,
model.safetensors, generation_config.json) plus the tokenizer files.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from models.data import Windows, autocast, sync
from models.schedule import TimedCosine
from models.tokenizer import ENDOFTEXT, IM_END, load

log = logging.getLogger("models.target")


@dataclass(frozen=True)
class TargetShape:
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int          # full-attention q heads
    kv_heads: int
    head_dim: int
    lin_k_heads: int    # HK
    lin_v_heads: int    # HV (HK != HV: grouped value heads as in Qwen3.5)
    lin_head_dim: int   # DK = DV
    full_attention_interval: int = 4
    rope_theta: float = 1e7
    max_positions: int = 4096


@dataclass(frozen=True)
class TargetTrain:
    seq_len: int
    batch: int
    lr: float
    budget_s: float
    max_steps: int
    warmup: int
    valid_windows: int
    seed: int = 0


def mrope_section(shape: TargetShape) -> list[int]:
    """T/H/W split of the rotary frequency pairs; must sum to rotary_dim/2 (inert for text, where
    all three position streams are equal, but validated by the config)."""
    pairs = int(shape.head_dim * 0.25) // 2
    t = (pairs + 2) // 3
    h = (pairs - t + 1) // 2
    return [t, h, pairs - t - h]


def make_config(shape: TargetShape, tokenizer_dir: Path):
    from transformers import Qwen3_5TextConfig
    tok = load(tokenizer_dir)
    layer_types = ["full_attention" if (i + 1) % shape.full_attention_interval == 0
                   else "linear_attention" for i in range(shape.layers)]
    return Qwen3_5TextConfig(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
        linear_num_key_heads=shape.lin_k_heads, linear_num_value_heads=shape.lin_v_heads,
        linear_key_head_dim=shape.lin_head_dim, linear_value_head_dim=shape.lin_head_dim,
        linear_conv_kernel_dim=4, layer_types=layer_types, rms_norm_eps=1e-6,
        max_position_embeddings=shape.max_positions, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta,
                         "partial_rotary_factor": 0.25, "mrope_section": mrope_section(shape),
                         "mrope_interleaved": True},
        bos_token_id=tok.token_to_id(ENDOFTEXT), eos_token_id=tok.token_to_id(IM_END),
        pad_token_id=tok.token_to_id(ENDOFTEXT),
        architectures=["Qwen3_5ForCausalLM"],
    )


def lm_loss(model, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token CE over (N, S) windows; logits upcast to fp32 for the softmax."""
    logits = model(input_ids=ids).logits
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                           ids[:, 1:].reshape(-1))


@torch.no_grad()
def validation_loss(model, valid: Windows, n: int, batch: int, device) -> float:
    model.eval()
    ids = valid.fixed(n, device)
    total = 0.0
    with autocast(device):
        for i in range(0, n, batch):
            chunk = ids[i:i + batch]
            total += lm_loss(model, chunk).item() * len(chunk)
    model.train()
    return total / n


def _param_groups(model, weight_decay: float):
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    rest = [p for n, p in model.named_parameters() if p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def train(shape: TargetShape, cfg: TargetTrain, tokenizer_dir: Path, train_stream, valid_stream,
          device) -> tuple[object, dict]:
    from transformers import Qwen3_5ForCausalLM
    torch.manual_seed(cfg.seed)
    model = Qwen3_5ForCausalLM(make_config(shape, tokenizer_dir)).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    windows = Windows(train_stream, cfg.seq_len, cfg.seed)
    valid = Windows(valid_stream, cfg.seq_len, cfg.seed + 1)
    opt = torch.optim.AdamW(_param_groups(model, 0.1), lr=cfg.lr, betas=(0.9, 0.95),
                            fused=torch.device(device).type == "cuda")
    sched = TimedCosine(cfg.lr, cfg.budget_s, cfg.max_steps, cfg.warmup)
    log.info("target: %.2fM params, layers %s", n_params / 1e6, model.config.layer_types)
    losses, step, t0 = [], 0, None
    model.train()
    while not sched.done(step):
        for g in opt.param_groups:
            g["lr"] = sched.rate(step)
        ids = windows.batch(cfg.batch, device)
        with autocast(device):
            loss = lm_loss(model, ids)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())  # the .item() syncs, so step timings are honest
        if step == 0:
            t0 = sync(device)
        step += 1
        sched.observe(step - 1, sync(device) - t0)
        if step % 50 == 0 or step == sched.total:
            log.info("target step %d/%s loss %.4f lr %.2e", step, sched.total, loss.item(),
                     sched.rate(step))
    train_s = sync(device) - t0
    report = {
        "params": n_params, "steps": step, "tokens_per_step": cfg.batch * cfg.seq_len,
        "tokens_seen": step * cfg.batch * cfg.seq_len,
        "seconds_per_step": sched.seconds_per_step, "train_seconds": round(train_s, 1),
        "tokens_per_second": round((step - 1) * cfg.batch * cfg.seq_len / max(train_s, 1e-9)),
        "train_loss_first": losses[0],
        "loss_curve": [round(x, 4) for x in losses[::max(1, len(losses) // 100)]], "train_loss_last10": sum(losses[-10:]) / len(losses[-10:]),
        "valid_loss": validation_loss(model, valid, cfg.valid_windows, cfg.batch, device),
        "shape": asdict(shape), "train": asdict(cfg),
    }
    log.info("target done: %s", json.dumps({k: report[k] for k in
                                            ("steps", "train_loss_last10", "valid_loss")}))
    return model, report


def save(model, out: Path, tokenizer_dir: Path) -> None:
    """HF checkpoint dir in bf16 (half the bytes; the converter quantizes from it anyway)."""
    import shutil
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)


def load_frozen(folder: Path, device):
    """The saved target back from disk (what drafters must be trained against: the bf16
    weights that get converted), fp32 on the device, frozen, eval mode."""
    from transformers import Qwen3_5ForCausalLM
    model = Qwen3_5ForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device)
    model.eval().requires_grad_(False)
    return model
