"""Train an MTP block for the committed reference target, the way Qwen3.5/Qwen3-Next train theirs.

    python3 -m models.train_mtp --steps 300 --sequences 768 --out models/reference/mtp   # committed
    python3 -m models.train_mtp --budget 600 --out DIR       # as many steps as 600 s allow

The block (transformers' `mtp.*` layout, which `luce convert` turns into `blk.{n}.nextn.*`;
spec qwen35.md §1.7): for row q of a sequence,

    x_q = fc([ pre_fc_norm_embedding(embed(t_q)) ; pre_fc_norm_hidden(h_{q-1}) ])
    x_q = one full-attention decoder layer (the target's attention shape: gated q, q/k norms,
          partial interleaved-mrope rope, GQA 4/2 x 64, SwiGLU MLP), causal over rows 0..q
    logits_q = lm_head(norm(x_q))        -> predicts t_{q+1}

where h_{q-1} is the target's final-normed hidden state at position q-1 (zeros at row 0) and
embed / lm_head are the target's own, frozen. h_{q-1} already predicts t_q, so the block learns
the token after next: the family's MTP loss (cross-entropy on t_{q+1}) with the main model
frozen, as MTP-only fine-tuning does. At inference luce drafts k tokens by recursion: the next
row is (draft, this row's normed output), so one trained block drafts any k.

Data: the target's own greedy continuations of corpus windows (models/pipeline.py's regenerated
data, at CPU sizes), so labels are what the target itself would say; the loss counts only rows
whose label is a generated token. The target runs once over all sequences (hidden states kept
in memory), then only the block trains: a CPU step is a few hundred milliseconds.

Initialisation: the decoder layer starts as a copy of the target's last full-attention layer
(layer 7; same shape, so the attention already reads this hidden space), fc as [0 ; I] (the
block starts by reading the hidden state alone), norms at their zero (= scale 1) init except the
output norm, a copy of the target's final norm. Seeded: with --steps the same command gives the
same weights on the same machine and torch build (tests/test_mtp.py); --budget lays the schedule
over as many steps as the measured step time allows, so that count varies with the machine.

Scored on the held-out HumanEval prompts (models/reference/prompts/code.jsonl, last 64 tokens,
continued greedily by the target): first-draft accuracy and the greedy speculative walk of
models/train_drafters.py with k = 1..4 recursive drafts (tau includes the bonus token).
"""
from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from models import corpus as corpus_mod
from models import tokenizer as tk
from models.data import Windows, autocast, sync, tokenize_split
from models.schedule import TimedCosine
from models.train_drafters import greedy_continue, walk

log = logging.getLogger("models.mtp")
ROOT = Path(__file__).parent
PROMPTS = ROOT / "reference" / "prompts" / "code.jsonl"


@dataclass(frozen=True)
class MtpTrain:
    budget_s: float = 600.0     # wall clock of the training loop (data generation not included)
    sequences: int = 768        # greedy continuations to train on
    prompt_len: int = 64        # corpus window before each continuation
    gen_len: int = 96           # generated tokens per continuation
    valid_share: float = 0.25   # prompts from the valid split (text the target has not seen)
    batch: int = 16             # sequences per step
    lr: float = 1e-3
    warmup: int = 20
    max_steps: int = 20000
    eval_prompts: int = 48
    eval_steps: int = 32        # anchors scored per held-out prompt
    seed: int = 0


class MtpBlock(nn.Module):
    """transformers' `mtp.*` tensors as a module (names match the checkpoint layout converters/
    qwen35.py reads). Built from the target's own classes so the layer is the target's layer."""

    def __init__(self, config, attn_layer: int):
        super().__init__()
        from transformers.models.qwen3_5.modeling_qwen3_5 import (
            Qwen3_5DecoderLayer, Qwen3_5RMSNorm, Qwen3_5TextRotaryEmbedding)
        if config.layer_types[attn_layer] != "full_attention":
            raise ValueError(f"layer {attn_layer} is not a full-attention layer")
        h, eps = config.hidden_size, config.rms_norm_eps
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(h, eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(h, eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(config, attn_layer)])
        self.norm = Qwen3_5RMSNorm(h, eps)
        self.rotary = Qwen3_5TextRotaryEmbedding(config)   # buffers only, not saved

    def forward(self, emb: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """emb (N, L, H) embeddings of t_0..t_{L-1}, hidden (N, L, H) = h_{-1}..h_{L-2} ->
        (N, L, H) normed outputs; row q sits at position q (causal over rows)."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(hidden)], -1))
        pos = torch.arange(x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
        x = self.layers[0](x, position_embeddings=self.rotary(x, pos), attention_mask=None)
        return self.norm(x)


def init_from_target(block: MtpBlock, target, attn_layer: int) -> None:
    h = target.config.hidden_size
    block.layers[0].load_state_dict(target.model.layers[attn_layer].state_dict())
    block.norm.load_state_dict(target.model.norm.state_dict())
    with torch.no_grad():
        block.fc.weight.zero_()
        block.fc.weight[:, h:] = torch.eye(h)


def last_attention_layer(config) -> int:
    return max(i for i, t in enumerate(config.layer_types) if t == "full_attention")


@torch.no_grad()
def target_hidden(target, seqs: torch.Tensor, batch: int) -> torch.Tensor:
    """(n, S) ids -> (n, S, H) float32 final-normed hidden states (what luce hands the block)."""
    out = []
    for i in range(0, len(seqs), batch):
        with autocast(seqs.device):
            out.append(target.model(input_ids=seqs[i:i + batch]).last_hidden_state.float())
    return torch.cat(out)


def shifted(hidden: torch.Tensor) -> torch.Tensor:
    """Row q reads h_{q-1}; row 0 reads zeros (luce's convention for the first row)."""
    return torch.cat([torch.zeros_like(hidden[:, :1]), hidden[:, :-1]], 1)


def mtp_loss(block, target, ids, hidden, first_label: int) -> torch.Tensor:
    """CE of row q's logits against t_{q+1}, over rows whose label is at index >= first_label."""
    emb = target.get_input_embeddings()(ids[:, :-1])
    out = block(emb, shifted(hidden)[:, :-1])
    logits = target.get_output_embeddings()(out[:, first_label - 1:]).float()
    return F.cross_entropy(logits.flatten(0, 1), ids[:, first_label:].flatten())


@torch.no_grad()
def acceptance(block, target, seqs, hidden, prompt_len: int, steps: int, k_max: int = 4) -> dict:
    """Greedy speculative decoding with recursive MTP drafts, simulated on the target's greedy
    continuations: anchor p drafts d_1..d_k (row p = (t_p, h_{p-1}), row p+i = (d_i, out of row
    p+i-1)), drafts accepted while they equal the target's tokens, then models/train_drafters.py's
    walk. Per k: tau (with the bonus token) and per-position accuracy over every anchor."""
    block.eval()
    embed = target.get_input_embeddings()
    head = target.get_output_embeddings()
    h_prev = shifted(hidden)
    n = seqs.shape[0]
    drafts = torch.zeros(n, steps, k_max, dtype=torch.long)
    for a in range(steps):
        p = prompt_len + a
        toks, hin = seqs[:, :p + 1], h_prev[:, :p + 1]
        for i in range(k_max):
            out = block(embed(toks), hin)[:, -1:]
            d = head(out).argmax(-1)
            drafts[:, a, i] = d[:, 0].cpu()
            toks, hin = torch.cat([toks, d], 1), torch.cat([hin, out], 1)
    anchors = prompt_len + torch.arange(steps)
    want = torch.stack([seqs[:, anchors + 1 + i] for i in range(k_max)], -1).cpu()
    hits = drafts == want
    report = {"draft_accuracy": [round(x, 3) for x in hits.float().mean((0, 1)).tolist()]}
    for k in range(1, k_max + 1):
        accepted = hits[..., :k].int().cumprod(-1).sum(-1)
        lengths = [m for row in accepted.tolist() for m in walk(row)]
        report[f"tau_k{k}"] = round(sum(lengths) / len(lengths), 3)
    block.train()
    return report


def eval_sequences(target, tok_dir: Path, cfg: MtpTrain, device) -> torch.Tensor:
    tok = tk.load(tok_dir)
    texts = [r["prompt"] for r in corpus_mod.read_jsonl(PROMPTS)]
    ids = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    rows = [x[-cfg.prompt_len:] for x in ids if len(x) >= cfg.prompt_len][:cfg.eval_prompts]
    return greedy_continue(target, torch.tensor(rows, device=device), cfg.eval_steps + 5, 64)


def training_sequences(target, corpus: Path, tok_dir: Path, cfg: MtpTrain, device) -> torch.Tensor:
    train_stream = tokenize_split(corpus, "train", tok_dir)
    valid_stream = tokenize_split(corpus, "valid", tok_dir)
    n_valid = int(cfg.sequences * cfg.valid_share)
    prompts = torch.cat([Windows(train_stream, cfg.prompt_len, seed=7).batch(cfg.sequences - n_valid, device),
                         Windows(valid_stream, cfg.prompt_len, seed=8).batch(n_valid, device)])
    return greedy_continue(target, prompts, cfg.gen_len, 128)


def train(block, target, seqs, hidden, cfg: MtpTrain, device) -> dict:
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(block.parameters(), lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.95))
    sched = TimedCosine(cfg.lr, cfg.budget_s, cfg.max_steps, cfg.warmup)
    losses, step, t0 = [], 0, None
    while not sched.done(step) and step < cfg.max_steps:
        for g in opt.param_groups:
            g["lr"] = sched.rate(step)
        idx = torch.randint(0, len(seqs), (cfg.batch,), generator=gen)
        with autocast(device):
            loss = mtp_loss(block, target, seqs[idx.to(seqs.device)], hidden[idx.to(seqs.device)], cfg.prompt_len)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(block.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step == 0:
            t0 = sync(device)
        else:
            sched.observe(step, sync(device) - t0)
        step += 1
        if step % 50 == 0:
            log.info("mtp step %d/%s loss %.3f", step, sched.total, sum(losses[-50:]) / 50)
    return {"steps": step, "seconds_per_step": sched.seconds_per_step,
            "first10": [round(x, 3) for x in losses[:10]], "last10": [round(x, 3) for x in losses[-10:]]}


def save(block: MtpBlock, out: Path, report: dict, command: str) -> None:
    from safetensors.torch import save_file
    out.mkdir(parents=True, exist_ok=True)
    state = {f"mtp.{k}": v.detach().to(torch.bfloat16).contiguous() for k, v in block.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "MODEL_CARD.md").write_text(model_card(report, command))


def model_card(r: dict, command: str) -> str:
    a, b = r["acceptance_code"], r["acceptance_code_before"]
    return f"""# Reference target MTP block

The multi-token-prediction block of the reference target (`models/reference/target-q8_0.gguf`):
transformers' `mtp.*` tensors (one gated full-attention decoder layer, `fc` over the normed
embedding and hidden state, output norm; embeddings and LM head are the target's), bf16.
`make reference-mtp` joins it to the target and converts (`luce convert`) to
`models/work/reference-target-mtp-q8_0.gguf`, which `luce generate --draft mtp` uses.

- Trained {r['date']} on {r['device']} ({r['threads']} threads), {r['train']['steps']} steps in
  {r['train_seconds']:.0f} s (+ {r['data_seconds']:.0f} s of data: the target's hidden states, and its
  continuations unless cached by an earlier run):
  `{command}`
- Loss: cross-entropy on the token after next, {r['config']['sequences']} greedy continuations of
  {r['config']['gen_len']} tokens by the frozen target ({r['config']['prompt_len']}-token corpus prompts); first 10
  steps {r['train']['first10'][0]:.2f}, last 10 {sum(r['train']['last10']) / len(r['train']['last10']):.2f}.
- Initialised from the target's last full-attention layer (layer {r['init_layer']}), fc = [0 ; I].
- Held-out HumanEval prompts ({r['eval_prompts']} x {r['config']['eval_steps']} anchors, PyTorch simulation of
  the greedy walk): first-draft accuracy {a['draft_accuracy'][0]} (at init {b['draft_accuracy'][0]}),
  tau k=1..4: {a['tau_k1']} / {a['tau_k2']} / {a['tau_k3']} / {a['tau_k4']}
  (at init {b['tau_k1']} / {b['tau_k2']} / {b['tau_k3']} / {b['tau_k4']}).
"""


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target-dir", type=Path, default=ROOT / "work" / "target",
                    help="the committed target as a transformers checkpoint (make reference-export)")
    ap.add_argument("--corpus", type=Path, default=ROOT / "work" / "corpus",
                    help="make reference-corpus")
    ap.add_argument("--out", type=Path, default=ROOT / "reference" / "mtp")
    ap.add_argument("--budget", type=float, default=MtpTrain.budget_s, help="seconds of training")
    ap.add_argument("--steps", type=int, default=None,
                    help="a fixed number of steps instead of --budget: the same weights on every run "
                         "(a wall-clock budget fits as many steps as the machine's speed allows)")
    ap.add_argument("--sequences", type=int, default=MtpTrain.sequences)
    ap.add_argument("--eval-prompts", type=int, default=MtpTrain.eval_prompts)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    for need in (args.target_dir / "model.safetensors", args.corpus / "train.jsonl"):
        if not need.is_file():
            sys.exit(f"error: {need} not found (make reference-export / make reference-corpus)")
    cfg = MtpTrain(budget_s=args.budget if args.steps is None else 1e9,
                   max_steps=args.steps or MtpTrain.max_steps, sequences=args.sequences,
                   eval_prompts=args.eval_prompts, seed=args.seed)
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    from models.train_target import load_frozen
    target = load_frozen(args.target_dir, args.device)

    t = time.perf_counter()
    # The continuations are most of a CPU run's time (~0.6 s each on 2 cores): kept, keyed by
    # everything they depend on, so a second run with other training settings starts at once.
    # Keyed by device type too: CUDA continuations run under bf16 autocast, CPU ones in fp32.
    cache = args.corpus.parent / (f"mtp-continuations-{cfg.sequences}x{cfg.prompt_len}+{cfg.gen_len}"
                                  f"-v{cfg.valid_share}-{torch.device(args.device).type}.pt")
    if cache.is_file():
        seqs = torch.load(cache).to(args.device)
    else:
        seqs = training_sequences(target, args.corpus, args.target_dir, cfg, args.device)
        torch.save(seqs.cpu(), cache)
    hidden = target_hidden(target, seqs, 64)
    evals = eval_sequences(target, args.target_dir, cfg, args.device)
    eval_hidden = target_hidden(target, evals, 64)
    data_s = time.perf_counter() - t
    log.info("data: %d x %d training tokens, %d eval sequences, %.0f s", *seqs.shape, len(evals), data_s)

    layer = last_attention_layer(target.config)
    block = MtpBlock(target.config, layer).to(args.device)
    init_from_target(block, target, layer)
    before = acceptance(block, target, evals, eval_hidden, cfg.prompt_len, cfg.eval_steps)
    log.info("at init: %s", json.dumps(before))
    t = time.perf_counter()
    rep = train(block, target, seqs, hidden, cfg, args.device)
    train_s = time.perf_counter() - t
    after = acceptance(block, target, evals, eval_hidden, cfg.prompt_len, cfg.eval_steps)
    log.info("trained: %s", json.dumps(after))
    report = {"date": time.strftime("%Y-%m-%d", time.gmtime()),
              "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else
              f"CPU ({platform.processor() or platform.machine()})",
              "threads": torch.get_num_threads(), "torch": torch.__version__,
              "config": {**asdict(cfg), "budget_s": None if args.steps else cfg.budget_s},
              "init_layer": layer, "eval_prompts": len(evals),
              "data_seconds": round(data_s, 1), "train_seconds": round(train_s, 1), "train": rep,
              "params": sum(p.numel() for p in block.parameters()),
              "acceptance_code_before": before, "acceptance_code": after}
    command = "python3 -m models.train_mtp " + " ".join(argv if argv is not None else sys.argv[1:])
    save(block.cpu(), args.out, report, command.strip())
    print(json.dumps({"out": str(args.out), **after}))


if __name__ == "__main__":
    main()
