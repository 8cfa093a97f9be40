"""smoke.vadd: out = a + b over f32 vectors (pipeline smoke op for the Triton AOT path, issue 2).

Shapes: a, b, out are contiguous f32 [n]. Grid: (cdiv(n, BLOCK), 1, 1).
"""
import triton
import triton.language as tl


@triton.jit
def vadd_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, a + b, mask=mask)
