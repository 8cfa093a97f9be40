#!/usr/bin/env python3
"""Generate tiny random Qwen3.5 checkpoints and HF golden log-probabilities (tests/fixtures/).

Run wherever torch and transformers >= 5.17 exist (e.g. the GPU host; everything here runs on the
CPU for determinism):

    python3 tools/make_fixtures.py --out tests/fixtures
    python3 tools/make_fixtures.py --trained DIR     # goldens of a trained checkpoint only

With `--trained DIR` (a checkpoint of tools/train_tiny.py: config.json, model.safetensors,
tokenizer.json) it only adds DIR/golden_f32.json and DIR/golden_bf16.json, for the prompts in
TRAINED_PROMPTS whose HF greedy continuation (f32 and bf16) does not reach `<|endoftext|>`
within the 32 decode steps (the engine's scheduler would stop there); the random fixtures are
left alone. Otherwise, for each random fixture it writes <out>/<name>/{config.json, model.safetensors, tokenizer.json,
golden_f32.json, golden_bf16.json}:
  - the model is built with HF transformers' own classes (Qwen3_5ForCausalLM or
    Qwen3_5ForConditionalGeneration), given random weights at scales that keep activations O(1)
    and the next-token distribution peaked, rounded to bf16 and saved with save_pretrained (bf16);
  - a byte-level BPE tokenizer trained here with HF tokenizers on a small built-in corpus;
  - goldens: for fixed prompts, HF's top-k (k=20) log-probabilities at every prefill position and
    for 32 greedy decode steps computed with HF's cache, once in float32 and once in bfloat16.
    Each step also records the gap between the top two log-probs, so a consumer can tell a real
    disagreement from a near tie.
"""
import argparse
import json
import math
import os
import shutil
import sys
from pathlib import Path

import torch

TOPK = 20
DECODE_STEPS = 32
SEED = 20261129

CORPUS = [
    "The gated delta rule updates a matrix-valued state with a decayed rank-one correction.",
    "Each value head reads one key head; grouped heads share keys and queries.",
    "A chunkwise prefill must agree with the token by token recurrence.",
    "Linear attention layers alternate with gated full attention every fourth layer.",
    "The quick brown fox jumps over the lazy dog while the kernel streams its state.",
    "Tensor parallel ranks own whole heads, and the recurrent state never leaves its rank.",
    "Decode runs all sequences in one batched step; padding rows carry slot minus one.",
    "Numbers like 12, 345 and 6789 appear in text, as do symbols: +, -, *, /, =, (, ).",
    "Once upon a time a small model learned to count: one, two, three, four, five, six.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
]

PROMPTS = [
    "The gated delta rule",
    "Once upon a time",
    "def add(a, b):",
]

# Prompts of the trained fixture (tests/fixtures/tiny-trained, trained on the Python docs):
# each <= 24 tokens, so prompt + 32 decode steps fit the gates' 64-token contexts.
TRAINED_PROMPTS = [
    "The gated delta rule",
    "The following example shows how to",
    "def add(a, b):",
    "A list comprehension is",
    "If the file does not exist,",
    ">>> import os\n>>> os.path.join(",
    "Changed in version",
    "The return value of this function is",
    "Exceptions are raised when",
    "class Point:\n    def __init__(self, x, y):",
]


def train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    return tok


def text_config_kwargs(spec, vocab_size):
    kw = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=spec["layers"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_conv_kernel_dim=4,
        linear_num_key_heads=spec["h_k"],
        linear_num_value_heads=spec["h_v"],
        linear_key_head_dim=spec["k"],
        linear_value_head_dim=spec["v"],
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        tie_word_embeddings=spec.get("tied", False),
        eos_token_id=0,
        bos_token_id=None,
        pad_token_id=None,
    )
    rope = {"rope_type": "default", "rope_theta": 1.0e6, "partial_rotary_factor": 0.25}
    if spec.get("mrope"):
        # rotary_dim = 64 * 0.25 = 16 -> 8 frequencies split over (t, h, w)
        rope.update({"mrope_section": [4, 2, 2], "mrope_interleaved": True})
    kw["rope_parameters"] = rope
    if "layer_types" in spec:
        kw["layer_types"] = spec["layer_types"]
    return kw


def randomize(model, gen):
    """Random weights at scales that give O(1) activations and peaked logits."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = p.shape
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.empty(shape).uniform_(1.0, 16.0, generator=gen)))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(shape, generator=gen) * 0.5)
            elif "norm" in name and p.dim() == 1:
                # (1+w) norms centred at 0, the gated norm (plain w) centred at 1
                centre = 1.0 if "linear_attn.norm" in name else 0.0
                p.copy_(centre + 0.2 * torch.randn(shape, generator=gen))
            elif "conv1d" in name:
                p.copy_(torch.randn(shape, generator=gen) * 0.5)
            elif "embed_tokens" in name:
                p.copy_(torch.randn(shape, generator=gen))
            elif "lm_head" in name:
                p.copy_(torch.randn(shape, generator=gen) * (3.0 / math.sqrt(shape[-1])))
            elif p.dim() >= 2:
                fan_in = shape[-1] if p.dim() == 2 else int(torch.tensor(shape[1:]).prod())
                p.copy_(torch.randn(shape, generator=gen) / math.sqrt(fan_in))
            else:
                p.copy_(torch.randn(shape, generator=gen) * 0.1)


def topk_row(logits_row):
    lp = torch.log_softmax(logits_row.float(), dim=-1)
    vals, ids = torch.topk(lp, TOPK)
    gap = float(vals[0] - vals[1])
    return [[int(i), float(v)] for i, v in zip(ids.tolist(), vals.tolist())], gap


def golden(model, prompts_ids, dtype):
    model = model.to(dtype).eval()
    out = []
    with torch.no_grad():
        for ids in prompts_ids:
            inp = torch.tensor([ids], dtype=torch.long)
            res = model(input_ids=inp, use_cache=True)
            logits = res.logits[0]
            prefill = []
            for t in range(logits.shape[0]):
                row, gap = topk_row(logits[t])
                prefill.append({"topk": row, "gap": gap})
            past = res.past_key_values
            nxt = int(torch.argmax(logits[-1].float()))
            tokens, steps = [], []
            for _ in range(DECODE_STEPS):
                tokens.append(nxt)
                res = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past = res.past_key_values
                row, gap = topk_row(res.logits[0, -1])
                steps.append({"topk": row, "gap": gap})
                nxt = int(torch.argmax(res.logits[0, -1].float()))
            out.append({"prompt_ids": ids, "prefill": prefill, "greedy_tokens": tokens, "decode": steps})
    return out


FIXTURES = [
    # (a) CausalLM layout, H_k=2, H_v=4, K=V=32, hd 64, 8 layers (full attention every 4th)
    {"name": "tiny-causal", "arch": "causal", "layers": 8, "h_k": 2, "h_v": 4, "k": 32, "v": 32},
    # (b) ConditionalGeneration layout (model.language_model.*), H_v/H_k = 3, K != V, mrope keys
    {"name": "tiny-cond", "arch": "cond", "layers": 4, "h_k": 2, "h_v": 6, "k": 32, "v": 16, "mrope": True},
    # (c) tied embeddings, explicit layer_types (full attention every 2nd layer)
    {"name": "tiny-tied", "arch": "causal", "layers": 4, "h_k": 1, "h_v": 2, "k": 32, "v": 32, "tied": True,
     "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"]},
]


def build(spec, vocab_size, gen):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    text_kw = text_config_kwargs(spec, vocab_size)
    if spec["arch"] == "causal":
        cfg = Qwen3_5TextConfig(**text_kw)
        model = Qwen3_5ForCausalLM(cfg)
    else:
        from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                      num_position_embeddings=64, patch_size=16, temporal_patch_size=2, spatial_merge_size=2)
        cfg = Qwen3_5Config(text_config=text_kw, vision_config=vision, tie_word_embeddings=False)
        model = Qwen3_5ForConditionalGeneration(cfg)
    model = model.float()
    randomize(model, gen)
    if spec.get("tied"):
        model.tie_weights()
    # Make the f32 weights exactly bf16-representable: both goldens use the stored weights.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return model


def trained(d: Path):
    """HF f32 and bf16 goldens of the trained checkpoint in `d` (see the module docstring)."""
    import transformers
    from tokenizers import Tokenizer
    from transformers import Qwen3_5ForCausalLM

    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    model = Qwen3_5ForCausalLM.from_pretrained(d, dtype=torch.float32)
    # The stored weights are bf16, so the f32 model holds them exactly and .to(bf16) is lossless.
    cand = [tok.encode(p).ids for p in TRAINED_PROMPTS]
    assert all(len(c) <= 24 for c in cand), [len(c) for c in cand]
    g32 = golden(model, cand, torch.float32)
    g16 = golden(model, cand, torch.bfloat16)
    keep = [i for i in range(len(cand))
            if eos not in g32[i]["greedy_tokens"] and eos not in g16[i]["greedy_tokens"]]
    dropped = [TRAINED_PROMPTS[i] for i in range(len(cand)) if i not in keep]
    prompts = [TRAINED_PROMPTS[i] for i in keep]
    meta = {"fixture": {"name": d.name, "arch": "causal", "trained": True}, "prompts": prompts,
            "topk": TOPK, "decode_steps": DECODE_STEPS, "torch": torch.__version__,
            "transformers": transformers.__version__,
            "attn_implementation": model.config._attn_implementation}
    for dtype, g, f in (("float32", g32, "golden_f32.json"), ("bfloat16", g16, "golden_bf16.json")):
        (d / f).write_text(json.dumps({**meta, "dtype": dtype, "cases": [g[i] for i in keep]}))
    for i in keep:
        a, b = g32[i]["greedy_tokens"], g16[i]["greedy_tokens"]
        agree = next((k for k in range(len(a)) if a[k] != b[k]), len(a))
        gaps = [s["gap"] for s in g32[i]["decode"]]
        print(f"{TRAINED_PROMPTS[i]!r}: HF bf16 greedy = f32 for {agree}/{len(a)} tokens; "
              f"min / median decode top-2 gap {min(gaps):.3f} / {sorted(gaps)[len(gaps) // 2]:.3f}")
        print(f"   -> {tok.decode(a)!r}")
    if dropped:
        print(f"dropped (greedy reaches <|endoftext|>): {dropped}")
    if len(keep) < 3:
        sys.exit(f"only {len(keep)} prompts kept")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures")
    ap.add_argument("--vocab", type=int, default=384)
    ap.add_argument("--trained", help="add goldens to this trained checkpoint only")
    args = ap.parse_args()
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    if args.trained:
        trained(Path(args.trained))
        return
    out = Path(args.out)
    tok = train_tokenizer(args.vocab)
    vocab_size = tok.get_vocab_size()
    prompts_ids = [tok.encode(p).ids for p in PROMPTS]
    for spec in FIXTURES:
        gen = torch.Generator().manual_seed(SEED + len(spec["name"]))
        d = out / spec["name"]
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        model = build(spec, vocab_size, gen)
        meta = {"fixture": spec, "prompts": PROMPTS, "topk": TOPK, "decode_steps": DECODE_STEPS,
                "torch": torch.__version__, "transformers": transformers.__version__,
                "attn_implementation": model.config._attn_implementation}
        g32 = golden(model, prompts_ids, torch.float32)
        (d / "golden_f32.json").write_text(json.dumps({**meta, "dtype": "float32", "cases": g32}))
        g16 = golden(model, prompts_ids, torch.bfloat16)
        (d / "golden_bf16.json").write_text(json.dumps({**meta, "dtype": "bfloat16", "cases": g16}))
        model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
        tok.save(str(d / "tokenizer.json"))
        for f in d.iterdir():
            if f.name not in ("config.json", "model.safetensors", "tokenizer.json", "golden_f32.json",
                              "golden_bf16.json"):
                f.unlink()
        size = sum(f.stat().st_size for f in d.iterdir())
        greedy = [c["greedy_tokens"][:8] for c in g32]
        min_gap = min(s["gap"] for c in g32 for s in c["decode"])
        print(f"{spec['name']}: {size / 1e6:.2f} MB, greedy f32 {greedy}, min decode top-2 gap {min_gap:.3f}")
        if size > 2_000_000:
            sys.exit(f"{spec['name']} is {size} bytes, over the 2 MB fixture limit")


if __name__ == "__main__":
    main()
