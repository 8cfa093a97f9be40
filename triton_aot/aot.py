"""Ahead-of-time compiler for deltakit's Triton kernels (run by build.rs; needs no GPU).

Reads every manifest.toml under triton_aot/ (the top-level one and one per kernel family, e.g.
triton_aot/attn/manifest.toml), compiles each specialization to a cubin for every requested arch
with triton.compile(ASTSource(...), target=GPUTarget("cuda", sm, 32)), and writes to --out:

  dk_triton.h              prototypes of every launcher (read by bindgen beside deltakit.h)
  dk_triton_<name>.c       the cubins as byte arrays, a dk_tr_kernel table and the launcher
  triton_manifest.txt      one line per generated .c file (what build.rs compiles)

Compiled specializations are cached under --out/cache by a hash of the kernel source, the manifest
entry, the arch and the Triton version, so an unchanged kernel is not recompiled.

usage: aot.py --out DIR --archs "90a;80"
"""
import argparse
import hashlib
import importlib.util
import json
import os
import sys
import tomllib
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

HERE = Path(__file__).resolve().parent

C_TYPES = {"i32": "int32_t", "i64": "int64_t", "u32": "uint32_t", "u64": "uint64_t", "fp32": "float"}


def c_type(tt: str) -> str:
    if tt.startswith("*"):
        return "uint64_t"  # CUdeviceptr
    if tt not in C_TYPES:
        raise SystemExit(f"aot.py: unsupported Triton argument type {tt!r} (supported: *T, {', '.join(C_TYPES)})")
    return C_TYPES[tt]


def parse_arch(a: str):
    a = a.strip()
    specific = a.endswith("a")
    sm = int(a[:-1] if specific else a)
    return sm, specific


def load_kernel(module_rel: str, function: str):
    path = HERE / module_rel
    spec = importlib.util.spec_from_file_location(f"dk_triton_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not hasattr(mod, function):
        raise SystemExit(f"aot.py: {module_rel} has no function {function!r}")
    return getattr(mod, function), path


def compile_one(entry: dict, fn, sm: int, specific: bool, cache: Path, src_hash: str):
    """Returns (cubin bytes, metadata dict) for one arch, compiling only on a cache miss."""
    key = hashlib.sha256(
        json.dumps([entry, sm, specific, triton.__version__, src_hash], sort_keys=True).encode()
    ).hexdigest()[:24]
    cubin_path, meta_path = cache / f"{key}.cubin", cache / f"{key}.json"
    if cubin_path.exists() and meta_path.exists():
        return cubin_path.read_bytes(), json.loads(meta_path.read_text())
    sig = dict(entry["signature"])
    constexprs = dict(entry.get("constexprs", {}))
    arg_names = list(fn.arg_names)
    for name in arg_names:
        if name not in sig and name not in constexprs:
            raise SystemExit(f"aot.py: {entry['name']}: argument {name!r} has neither a signature type nor a constexpr")
    for name in list(sig) + list(constexprs):
        if name not in arg_names:
            raise SystemExit(f"aot.py: {entry['name']}: {name!r} is not an argument of {entry['function']}")
    full_sig = {n: ("constexpr" if n in constexprs else sig[n]) for n in arg_names}
    attrs = {(arg_names.index(n),): [["tt.divisibility", 16]] for n in entry.get("divisible_by_16", [])}
    src = ASTSource(fn=fn, signature=full_sig, constexprs=constexprs, attrs=attrs)
    # Triton's capability 90 emits sm_90a; other capabilities emit plain sm_XY.
    target = GPUTarget("cuda", sm, 32)
    options = {"num_warps": entry.get("num_warps", 4), "num_stages": entry.get("num_stages", 3)}
    k = triton.compile(src, target=target, options=options)
    md = k.metadata
    if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
        raise SystemExit(f"aot.py: {entry['name']}: kernels needing global/profile scratch are not supported")
    cluster = tuple(getattr(md, "cluster_dims", (1, 1, 1)) or (1, 1, 1))
    if cluster not in ((1, 1, 1), (1,), ()):
        raise SystemExit(f"aot.py: {entry['name']}: cluster launch {cluster} is not supported")
    meta = {"symbol": md.name, "shared": int(md.shared), "num_warps": int(md.num_warps)}
    cubin = k.asm["cubin"]
    cubin_path.write_bytes(cubin)
    meta_path.write_text(json.dumps(meta))
    return cubin, meta


def c_bytes(data: bytes) -> str:
    rows = []
    for i in range(0, len(data), 20):
        rows.append("  " + ", ".join(f"0x{b:02x}" for b in data[i:i + 20]) + ",")
    return "\n".join(rows)


def launcher_args(entry: dict, fn):
    """Non-constexpr arguments in declaration order: [(name, triton type)]."""
    consts = entry.get("constexprs", {})
    return [(n, entry["signature"][n]) for n in fn.arg_names if n not in consts]


def prototype(entry: dict, fn) -> str:
    params = ", ".join(f"{c_type(t)} {n}" for n, t in launcher_args(entry, fn))
    return (f"dk_status dk_triton_{entry['name']}(dk_stream_t stream, uint32_t grid_x, uint32_t grid_y, "
            f"uint32_t grid_z, {params})")


def write_c(out: Path, entry: dict, fn, images) -> Path:
    name = entry["name"]
    lines = [
        f"/* Generated by triton_aot/aot.py from {entry['module']}::{entry['function']}. Do not edit. */",
        "#include \"dk_triton.h\"",
        "#include \"dk_triton_runtime.h\"",
        "",
    ]
    for (sm, specific, cubin, _meta) in images:
        lines += [f"static const unsigned char k_cubin_sm{sm}{'a' if specific else ''}[] __attribute__((aligned(16))) = {{", c_bytes(cubin), "};", ""]
    lines.append("static const dk_tr_image k_images[] = {")
    for (sm, specific, _cubin, meta) in images:
        var = f"k_cubin_sm{sm}{'a' if specific else ''}"
        lines.append(f"  {{{sm}, {1 if specific else 0}, \"{meta['symbol']}\", {var}, sizeof({var}), "
                     f"{meta['shared']}u, {meta['num_warps']}u}},")
    lines += ["};", "",
              f"static dk_tr_kernel k_kernel = {{\"{name}\", k_images, {len(images)}, PTHREAD_MUTEX_INITIALIZER, 0, 0, {{{{0}}}}}};",
              "", prototype(entry, fn) + " {"]
    for n in entry.get("divisible_by_16", []):
        lines.append(f"  if (((uint64_t){n}) % 16u != 0) return DK_ERR_INVALID_ARGUMENT;")
    lines.append("  uint64_t global_scratch = 0, profile_scratch = 0;")
    ptrs = ", ".join([f"(void *)&{n}" for n, _ in launcher_args(entry, fn)]
                     + ["(void *)&global_scratch", "(void *)&profile_scratch"])
    lines += [f"  void *args[] = {{{ptrs}}};",
              "  return dk_tr_launch(&k_kernel, stream, grid_x, grid_y, grid_z, args);", "}", ""]
    path = out / f"dk_triton_{name}.c"
    path.write_text("\n".join(lines))
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--archs", default="90a")
    ap.add_argument("--manifest", action="append",
                    help="manifest file(s); default: every manifest.toml under triton_aot/")
    args = ap.parse_args()
    out = Path(args.out)
    cache = out / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    archs = [parse_arch(a) for a in args.archs.split(";") if a.strip()]
    paths = [Path(m) for m in args.manifest] if args.manifest else sorted(HERE.rglob("manifest.toml"))
    entries = []
    for path in paths:
        entries += tomllib.loads(path.read_text()).get("kernel", [])
    names = [e["name"] for e in entries]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise SystemExit(f"aot.py: duplicate kernel names across manifests: {dups}")
    protos, c_files = [], []
    for entry in entries:
        fn, path = load_kernel(entry["module"], entry["function"])
        src_hash = hashlib.sha256(path.read_bytes()).hexdigest()
        images = []
        for sm, specific in archs:
            cubin, meta = compile_one(entry, fn, sm, specific, cache, src_hash)
            images.append((sm, specific, cubin, meta))
            print(f"aot.py: {entry['name']}: sm_{sm}{'a' if specific else ''} {meta['symbol']} "
                  f"({len(cubin)} bytes cubin, {meta['num_warps']} warps, {meta['shared']} B smem)")
        c_files.append(write_c(out, entry, fn, images))
        protos.append(f"/** {entry['module']}::{entry['function']} {entry.get('constexprs', {})} */\n{prototype(entry, fn)};")
    header = ["/* Generated by triton_aot/aot.py from triton_aot/manifest.toml. Do not edit. */",
              "#ifndef DK_TRITON_H", "#define DK_TRITON_H", "#include \"deltakit.h\"",
              "#ifdef __cplusplus", "extern \"C\" {", "#endif", *protos,
              "#ifdef __cplusplus", "}", "#endif", "#endif", ""]
    (out / "dk_triton.h").write_text("\n".join(header))
    (out / "triton_manifest.txt").write_text("".join(f"{p}\n" for p in c_files))


if __name__ == "__main__":
    sys.exit(main())
