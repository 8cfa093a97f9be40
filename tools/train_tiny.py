#!/usr/bin/env python3
"""Train the bundled tiny Qwen3.5 (tests/fixtures/tiny-trained) from a fixed seed.

The model is HF transformers' own `Qwen3_5ForCausalLM` (transformers 5.17; on a host without
flash-linear-attention / causal-conv1d HF runs its torch reference paths, which is what we
want: the engine is gated against exactly those). Shapes (tensor-parallel friendly: every head
count, the MLP width and the vocabulary divisible by 4):

  vocab 4096 (byte-level BPE of tools/make_corpus.py), hidden 192, 4 layers (3 Gated DeltaNet :
  1 gated full attention, the real models' 3:1 pattern), GDN H_k = 4, H_v = 8, K = V = 64, conv
  kernel 4; attention 8 q heads / 4 kv heads (GQA group 2), head_dim 64, partial rotary 0.25
  (rotary dim 16), rope_theta 1e7; SwiGLU MLP 512; tied embeddings. 3.56 M parameters, 7.1 MB in
  bf16.

Training: next-token cross-entropy on random 256-token windows of `train.txt` (documents joined
with `<|endoftext|>` = id 0), batch 64, AdamW (betas 0.9 / 0.95, weight decay 0.1 on matrices),
lr 3e-3 with 100 warmup steps and a cosine decay to 10%, grad-norm clip 1.0; bf16 autocast on
CUDA (f32 master weights), f32 on the CPU. Everything random comes from `--seed` (init, window
starts). The step count is fixed with `--steps N`, or (default) chosen once from the speed of the
steps 11-40 to fit `--budget-seconds` (at most `--max-steps`; the log records it, and `--steps N`
with that number reruns the same schedule). `--max-seconds` is a hard stop (logged).

The bundled checkpoint (2026-12-01, one H200): `--steps 650` (chosen by an earlier version of
this rule that timed steps 1-30, CUDA warm-up included: 148 ms/step estimated, 72 ms/step real),
46.5 s of training, 10.6 M tokens (4.3 epochs); held-out perplexity 28.8 against 692 for the
unigram baseline (docs/benchmarks/2026-12-01-tiny-trained.md).

    python3 tools/make_corpus.py --out .tiny-kit         # here (CPU): corpus + tokenizer
    python3 tools/train_tiny.py --kit .tiny-kit --out DIR # on the GPU host (~2 min on an H200)
    python3 tools/make_fixtures.py --trained DIR          # HF f32 / bf16 goldens into DIR

Writes DIR/{config.json, model.safetensors (bf16), tokenizer.json, train_log.json}; the log has
the loss curve (mean train loss per 50 steps, held-out loss every 250 steps), the final held-out
perplexity of the bf16-rounded weights run in f32, and a unigram baseline (add-one smoothed
unigram of the training tokens) on the same held-out tokens.
"""
import argparse
import json
import math
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F

EOT = "<|endoftext|>"


def model_config(vocab_size):
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=vocab_size,
        hidden_size=192,
        intermediate_size=512,
        num_hidden_layers=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        linear_conv_kernel_dim=4,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=0,
        bos_token_id=None,
        pad_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": 1.0e7, "partial_rotary_factor": 0.25},
    )


def tokenize(tok, path):
    """Token ids of a corpus file: its documents, each followed by <|endoftext|> (id 0)."""
    text = Path(path).read_text(encoding="utf-8")
    docs = [d.strip("\n") for d in text.split(f"\n{EOT}\n")]
    eot = tok.token_to_id(EOT)
    ids = []
    for enc in tok.encode_batch(docs):
        ids.extend(enc.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.long)


def lr_at(step, steps, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * t)))


@torch.no_grad()
def eval_loss(model, data, seq, batch, device, autocast):
    """Mean next-token cross-entropy (nats) over non-overlapping `seq`-token windows of `data`."""
    model.eval()
    n = (len(data) - 1) // seq
    xs = data[: n * seq].view(n, seq)
    ys = data[1 : n * seq + 1].view(n, seq)
    tot, cnt = 0.0, 0
    for i in range(0, n, batch):
        x, y = xs[i : i + batch].to(device), ys[i : i + batch].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=x, use_cache=False).logits
        tot += float(F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum"))
        cnt += y.numel()
    model.train()
    return tot / cnt, cnt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kit", default=".tiny-kit", help="train.txt, valid.txt, tokenizer.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=0,
                    help="optimizer steps; 0 (default): as many as fit --budget-seconds at the "
                         "speed measured over steps 11-40, rounded down to a multiple of "
                         "50, at most --max-steps (the log records the number: rerun with it)")
    ap.add_argument("--budget-seconds", type=float, default=90.0)
    ap.add_argument("--max-steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--max-seconds", type=float, default=240.0, help="hard stop (logged)")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--valid-tokens", type=int, default=0, help="cut the held-out set (0: all)")
    args = ap.parse_args()

    from tokenizers import Tokenizer
    import transformers
    from transformers import Qwen3_5ForCausalLM

    t_start = time.time()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    autocast = device.type == "cuda"
    kit, out = Path(args.kit), Path(args.out)
    tok = Tokenizer.from_file(str(kit / "tokenizer.json"))
    train = tokenize(tok, kit / "train.txt")
    valid = tokenize(tok, kit / "valid.txt")
    valid_full = len(valid)
    if args.valid_tokens:
        valid = valid[: args.valid_tokens]
    vocab = tok.get_vocab_size()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device}; "
          f"train {len(train)} tokens, valid {len(valid)} tokens, vocab {vocab}", flush=True)

    torch.manual_seed(args.seed)
    cfg = model_config(vocab)
    model = Qwen3_5ForCausalLM(cfg).float().to(device)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda",
    )
    gen = torch.Generator().manual_seed(args.seed + 1)
    train_dev = train.to(device)
    offsets = torch.arange(args.seq + 1, device=device)

    curve, evals = [], []
    acc = torch.zeros((), device=device)
    acc_n = 0
    t_train = time.time()
    stopped_early = False
    steps = args.steps if args.steps > 0 else args.max_steps
    step = 0
    while step < steps:
        starts = torch.randint(0, len(train) - args.seq - 1, (args.batch,), generator=gen).to(device)
        win = train_dev[starts[:, None] + offsets]
        x, y = win[:, :-1], win[:, 1:]
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, args.lr, args.warmup)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        acc += loss.detach()
        acc_n += 1
        if args.steps == 0 and step + 1 in (10, 40):
            if device.type == "cuda":
                torch.cuda.synchronize()
            if step + 1 == 10:
                t10 = time.time()
            else:
                per_step = (time.time() - t10) / 30
                steps = max(50, min(args.max_steps,
                                    int(args.budget_seconds / per_step) // 50 * 50))
                print(f"{per_step * 1e3:.1f} ms/step over steps 11-40: training {steps} steps",
                      flush=True)
        last = step == steps - 1
        if (step + 1) % 50 == 0 or last:
            mean = float(acc) / acc_n
            el = time.time() - t_train
            curve.append({"step": step + 1, "train_loss": round(mean, 4), "seconds": round(el, 1)})
            print(f"step {step + 1:5d}  loss {mean:.4f}  lr {opt.param_groups[0]['lr']:.2e}  "
                  f"{el:6.1f} s", flush=True)
            acc.zero_()
            acc_n = 0
        if (step + 1) % args.eval_every == 0 and not last:
            vl, _ = eval_loss(model, valid, args.seq, args.batch, device, autocast)
            evals.append({"step": step + 1, "valid_loss": round(vl, 4)})
            print(f"step {step + 1:5d}  held-out loss {vl:.4f} (ppl {math.exp(vl):.2f})", flush=True)
        step += 1
        if time.time() - t_train > args.max_seconds and not last:
            stopped_early = True
            print(f"stopping at step {step}: over --max-seconds {args.max_seconds}", flush=True)
            if acc_n:
                curve.append({"step": step, "train_loss": round(float(acc) / acc_n, 4),
                              "seconds": round(time.time() - t_train, 1)})
            break
    train_seconds = time.time() - t_train
    steps_done = step

    # The saved model: bf16 weights. Evaluate exactly those, in f32 (what the engine's CPU f32
    # backend and HF's f32 golden run).
    model = model.to(torch.bfloat16).float()
    vl, vn = eval_loss(model, valid, args.seq, args.batch, device, autocast=False)
    n_train_eval = min(len(train), len(valid))
    tl, _ = eval_loss(model, train[:n_train_eval], args.seq, args.batch, device, autocast=False)
    counts = torch.bincount(train, minlength=vocab).double() + 1.0
    logp = torch.log(counts / counts.sum())
    uni = float(-logp[valid[1:]].mean())
    bytes_valid = len((kit / "valid.txt").read_bytes())
    print(f"held-out: loss {vl:.4f} nats/token, ppl {math.exp(vl):.2f} ({vn} tokens); unigram "
          f"baseline ppl {math.exp(uni):.2f}; train-slice ppl {math.exp(tl):.2f}", flush=True)

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.to(torch.bfloat16).cpu().save_pretrained(out, safe_serialization=True)
    for f in out.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            f.unlink()
    shutil.copy(kit / "tokenizer.json", out / "tokenizer.json")
    log = {
        "seed": args.seed, "steps": steps, "steps_done": steps_done,
        "stopped_early": stopped_early, "batch": args.batch, "seq": args.seq, "lr": args.lr,
        "warmup": args.warmup, "params": n_params, "device": str(device),
        "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "train_tokens": len(train), "valid_tokens": len(valid),
        "tokens_seen": steps_done * args.batch * args.seq,
        "train_seconds": round(train_seconds, 1), "total_seconds": round(time.time() - t_start, 1),
        "valid_loss": vl, "valid_ppl": math.exp(vl),
        "valid_bits_per_byte": vl / math.log(2) * valid_full / bytes_valid,
        "unigram_valid_loss": uni, "unigram_valid_ppl": math.exp(uni),
        "train_slice_ppl": math.exp(tl), "curve": curve, "evals": evals,
    }
    (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    size = (out / "model.safetensors").stat().st_size
    print(f"saved {out}: model.safetensors {size / 1e6:.2f} MB, {n_params} params, "
          f"{steps_done} steps in {train_seconds:.1f} s", flush=True)


if __name__ == "__main__":
    main()
