"""attn.prefill and attn.decode: causal GQA attention over the paged KV cache (Qwen3.5 gated
full-attention layers; the gate, norms and RoPE are applied elsewhere).

attn_prefill_kernel is the portable path: on a compute-capability 9.0 device the wrapper runs the
sm_90a CUDA kernel csrc/attn/prefill_sm90.cu instead (same semantics; DELTAKIT_ATTN_PREFILL=triton
forces this one).

Mirrors HF `Qwen3_5Attention`'s core (`sdpa` with `is_causal` and a cache) / vLLM's
`flash_attn_varlen_func` with a block table; the CPU twins are
`deltakit_ref::attn::{prefill_paged, decode_paged}`.

Layouts (bf16 unless noted):
  q, out       [T, HQ, HD]   contiguous (T new tokens of N sequences packed by cu_seqlens)
  k/v cache    [num_pages, page_size, HKV, HD]; absolute position p of sequence i lives in page
               table[i * max_pages + p // page_size], row p % page_size
  cu_seqlens   i32 [N + 1]; ctx_lens i32 [N] (tokens already cached before this call; -1 = padding
               sequence: zero output); decode: seq_lens i32 [N] (context incl. the new token; -1 =
               padding row)
Query head h reads kv head h // (HQ // HKV). Scores and softmax in f32 (online softmax, exp2),
P cast to bf16 for the PV product, f32 accumulation, one rounding of the output.
Bad table entries (outside [0, num_pages)) are masked out, never dereferenced.

Kernels:
  attn_prefill_kernel       grid (N * max_q_blocks, HQ): one BLOCK_M query block of one head
  attn_decode_kernel        grid (N, HKV, S): all G = HQ / HKV query heads of a kv head (rows padded
                            to BLOCK_G) over split s of the context; writes f32 partial outputs
                            and log-sum-exps (split-K, "flash decoding")
  attn_decode_merge_kernel  grid (N, HQ): combines the S partials into the bf16 output
"""
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _kv_rows(table_ptr, seq, pos, kv_end, page_size, max_pages, num_pages):
    """Cache row index (int64) of each position in `pos` and its validity mask."""
    inb = pos < kv_end
    page = tl.load(table_ptr + seq * max_pages + pos // page_size, mask=inb, other=-1).to(tl.int64)
    ok = inb & (page >= 0) & (page < num_pages)
    row = page * page_size + (pos % page_size)
    return tl.where(ok, row, 0), ok


@triton.jit
def attn_prefill_kernel(q_ptr, k_ptr, v_ptr, o_ptr, cu_ptr, ctx_ptr, table_ptr,
                        T, max_q_blocks, max_pages, num_pages, page_size, HQ, HKV, scale,
                        HD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    seq = pid // max_q_blocks
    qb = max_q_blocks - 1 - pid % max_q_blocks  # heaviest causal blocks launch first
    bos = tl.minimum(tl.maximum(tl.load(cu_ptr + seq).to(tl.int64), 0), T)
    eos = tl.minimum(tl.maximum(tl.load(cu_ptr + seq + 1).to(tl.int64), bos), T)
    seqlen = eos - bos
    if qb * BLOCK_M >= seqlen:
        return
    ctx = tl.load(ctx_ptr + seq).to(tl.int64)
    kvh = h // (HQ // HKV)
    offs_m = qb * BLOCK_M + tl.arange(0, BLOCK_M)  # token index within the sequence
    offs_d = tl.arange(0, HD)
    m_ok = offs_m < seqlen
    o_rows = (bos + offs_m) * HQ + h
    if ctx < 0:
        zero = tl.zeros([BLOCK_M, HD], dtype=tl.float32)
        tl.store(o_ptr + o_rows[:, None] * HD + offs_d[None, :], zero.to(tl.bfloat16), mask=m_ok[:, None])
        return
    q = tl.load(q_ptr + o_rows[:, None] * HD + offs_d[None, :], mask=m_ok[:, None], other=0.0)
    qk_scale = scale * 1.4426950408889634
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HD], dtype=tl.float32)
    q_pos = ctx + offs_m  # absolute positions
    kv_end = ctx + tl.minimum((qb + 1) * BLOCK_M, seqlen)
    # Positions before the block's first query are visible to every row: no causal mask there.
    full_end = ((ctx + qb * BLOCK_M) // BLOCK_N) * BLOCK_N
    for start in range(0, full_end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        rows, ok = _kv_rows(table_ptr, seq, pos, kv_end, page_size, max_pages, num_pages)
        kv_off = (rows * HKV + kvh)[:, None] * HD + offs_d[None, :]
        k = tl.load(k_ptr + kv_off, mask=ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(ok[None, :], s, -1.0e30)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv_off, mask=ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)
        m_i = m_new
    for start in range(full_end, kv_end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        rows, ok = _kv_rows(table_ptr, seq, pos, kv_end, page_size, max_pages, num_pages)
        kv_off = (rows * HKV + kvh)[:, None] * HD + offs_d[None, :]
        k = tl.load(k_ptr + kv_off, mask=ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        valid = ok[None, :] & (pos[None, :] <= q_pos[:, None])
        s = tl.where(valid, s, -1.0e30)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        p = tl.where(valid, p, 0.0)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv_off, mask=ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)
        m_i = m_new
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    tl.store(o_ptr + o_rows[:, None] * HD + offs_d[None, :], out.to(tl.bfloat16), mask=m_ok[:, None])


@triton.jit
def attn_decode_kernel(q_ptr, k_ptr, v_ptr, po_ptr, plse_ptr, seqlens_ptr, table_ptr,
                       max_pages, num_pages, page_size, HQ, HKV, num_splits, scale,
                       HD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2).to(tl.int64)
    G = HQ // HKV
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HD)
    g_ok = offs_g < G
    heads = kvh * G + offs_g
    seqlen = tl.load(seqlens_ptr + row).to(tl.int64)
    # Split s covers whole BLOCK_N tiles [lo, hi) of the context.
    tiles = (tl.maximum(seqlen, 0) + BLOCK_N - 1) // BLOCK_N
    per = (tiles + num_splits - 1) // num_splits
    lo = split * per * BLOCK_N
    hi = tl.minimum(lo + per * BLOCK_N, tl.maximum(seqlen, 0))
    part = (row * HQ + heads) * num_splits + split
    q = tl.load(q_ptr + (row * HQ + heads)[:, None] * HD + offs_d[None, :], mask=g_ok[:, None], other=0.0)
    qk_scale = scale * 1.4426950408889634
    m_i = tl.full([BLOCK_G], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, HD], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        rows, ok = _kv_rows(table_ptr, row, pos, hi, page_size, max_pages, num_pages)
        kv_off = (rows * HKV + kvh)[:, None] * HD + offs_d[None, :]
        k = tl.load(k_ptr + kv_off, mask=ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(ok[None, :], s, -1.0e30)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        p = tl.where(ok[None, :], p, 0.0)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv_off, mask=ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)
        m_i = m_new
    # Empty split (or padding row): l = 0, lse = -inf-like, contributes nothing in the merge.
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    lse = tl.where(l_i > 0.0, m_i + tl.math.log2(l_safe), -1.0e30)
    tl.store(po_ptr + part[:, None] * HD + offs_d[None, :], acc / l_safe[:, None], mask=g_ok[:, None])
    tl.store(plse_ptr + part, lse, mask=g_ok)


@triton.jit
def attn_decode_merge_kernel(po_ptr, plse_ptr, o_ptr, seqlens_ptr, HQ, num_splits,
                             HD: tl.constexpr, BLOCK_S: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs_d = tl.arange(0, HD)
    offs_s = tl.arange(0, BLOCK_S)
    seqlen = tl.load(seqlens_ptr + row)
    base = (row * HQ + h) * num_splits
    m_all = -1.0e30
    for s0 in range(0, num_splits, BLOCK_S):
        ss = s0 + offs_s
        lse = tl.load(plse_ptr + base + ss, mask=ss < num_splits, other=-1.0e30)
        m_all = tl.maximum(m_all, tl.max(lse, 0))
    acc = tl.zeros([HD], dtype=tl.float32)
    wsum = 0.0
    for s in range(0, num_splits):
        lse = tl.load(plse_ptr + base + s)
        w = tl.where(lse > -1.0e29, tl.math.exp2(lse - m_all), 0.0)
        o = tl.load(po_ptr + (base + s) * HD + offs_d)
        acc += w * o
        wsum += w
    out = tl.where(wsum > 0.0, acc / tl.where(wsum > 0.0, wsum, 1.0), 0.0)
    out = tl.where(seqlen > 0, out, 0.0)
    tl.store(o_ptr + (row * HQ + h) * HD + offs_d, out.to(tl.bfloat16))
