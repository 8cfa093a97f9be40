#!/usr/bin/env python3
"""Build the training corpus and the BPE tokenizer of the bundled trained tiny model (offline).

Source: the Python 3.11 documentation as Debian ships it, package `python3.11-doc`
(Debian 12 "bookworm", 3.11.2-6+deb12u9 when this was written): the reStructuredText sources
under `/usr/share/doc/python3.11/html/_sources/**/*.rst.txt` (~11 MB, 512 files).
License: the Python documentation is under the PSF License Agreement (Python 3.11's
`license.rst`, "Python software and documentation are licensed under the PSF License
Agreement"); since 3.8.6 its examples, recipes and other code are dual licensed under the PSF
License and the Zero-Clause BSD license. Debian's copyright file for the package:
`/usr/share/doc/python3.11-doc/copyright`. Nothing made here is committed except what the
trained model learned (tests/fixtures/tiny-trained) and this script.

    python3 tools/make_corpus.py --out .tiny-kit            # fetches the .deb with apt-get download
    python3 tools/make_corpus.py --out .tiny-kit --deb PATH # or uses a .deb at hand

Writes into `--out`: `train.txt` and `valid.txt` (documents separated by a line holding only
`<|endoftext|>`; every 20th source file, in sorted path order, starting at the 8th, is held
out), `tokenizer.json` (HF `tokenizers` byte-level BPE, vocab `--vocab`, `<|endoftext|>` = id 0,
trained on `train.txt` only) and `corpus.json` (source package file, sizes, sha256 of the
outputs). Deterministic: the same .deb gives byte-identical outputs.

Cleaning (a line-based reST reader, not a full parser): section adornments, comments, labels,
index/toctree/module/author/image/raw/... directives and directive options are dropped; roles
(``:func:`~a.b` `` -> `b`), literals, emphasis and hyperlink markup are reduced to their text;
`versionadded` / `versionchanged` / `deprecated` become sentences; admonitions become `Note:`,
`Warning:`, `See also:` ...; API description directives (`function`, `class`, `method`, ...)
keep their signature as a line; literal blocks (`::`, `code-block`, `doctest`) keep their code,
dedented; prose is dedented and keeps its line breaks.
"""
import argparse
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE = "python3.11-doc"
SOURCES = "usr/share/doc/python3.11/html/_sources"
VERSION = "3.11"
EOT = "<|endoftext|>"
HOLDOUT_EVERY = 20
HOLDOUT_OFFSET = 7

SKIP_WITH_BODY = {
    "toctree", "index", "only", "raw", "image", "figure", "include", "literalinclude",
    "productionlist", "tabularcolumns", "testsetup", "testcleanup", "highlight", "sectionauthor",
    "moduleauthor", "module", "currentmodule", "program", "audit-event", "audit-event-table",
    "availability", "c:namespace", "c:namespace-push", "c:namespace-pop", "limited-api-list",
    "csv-table", "list-table", "table", "rubric", "contents", "default-role", "role", "glossary",
    "centered", "hlist", "impl-detail", "deprecated-removed",
}
CODE = {"code-block", "sourcecode", "code", "doctest", "testcode", "testoutput"}
ADMONITIONS = {
    "note": "Note:", "warning": "Warning:", "seealso": "See also:", "tip": "Tip:",
    "important": "Important:", "attention": "Attention:", "caution": "Caution:",
    "hint": "Hint:", "danger": "Danger:", "admonition": None, "topic": None, "sidebar": None,
}
VERSIONS = {
    "versionadded": "New in version {}.",
    "versionchanged": "Changed in version {}.",
    "deprecated": "Deprecated since version {}.",
}
DESCRIBE = {
    "function", "method", "class", "attribute", "data", "exception", "decorator",
    "decoratormethod", "classmethod", "staticmethod", "abstractmethod", "coroutinefunction",
    "coroutinemethod", "opcode", "cmdoption", "option", "envvar", "describe", "pdbcommand",
    "object", "property", "awaitablefunction", "awaitablemethod", "c:function", "c:type",
    "c:macro", "c:member", "c:var", "c:struct", "c:data", "c:enum", "c:enumerator", "c:union",
    "c:func", "c:var", "2to3fixer", "fixer",
}

ADORNMENT = re.compile(r"^\s*([=\-~^\"'`#*+.:_<>])\1{2,}\s*$")
GRID = re.compile(r"^\s*(\+[-=+]+\+|=+( +=+)+|-+( +-+)+)\s*$")
DIRECTIVE = re.compile(r"^(\s*)\.\.\s+([\w:.-]+)::\s*(.*)$")
COMMENT = re.compile(r"^(\s*)\.\.(\s|$)")
OPTION = re.compile(r"^\s*:[\w-]+:(\s.*)?$")
ROLE = re.compile(r":[\w:.+-]+:`([^`]*)`")
LINK = re.compile(r"`([^`<]*?)\s*<[^>`]*>`__?")
REF = re.compile(r"`([^`]+)`__?")
LITERAL = re.compile(r"``(.+?)``")
STRONG = re.compile(r"\*\*(\S(?:[^*]*\S)?)\*\*")
EMPH = re.compile(r"(?<![\w*\\])\*(?![\s*])([^*\n]+?)(?<![\s\\])\*(?![\w*])")
TICK = re.compile(r"`([^`]+)`")


def role_text(m):
    t = m.group(1)
    tilde = t.startswith("~")
    t = t.lstrip("~!")
    named = re.match(r"^(.*?)\s*<[^>]*>$", t, re.S)
    if named and named.group(1):
        return named.group(1)
    if named:
        t = re.sub(r"^.*<([^>]*)>$", r"\1", t)
    if tilde:
        t = t.rsplit(".", 1)[-1]
    return t


def inline(s):
    s = ROLE.sub(role_text, s)
    s = LINK.sub(lambda m: m.group(1), s)
    s = LITERAL.sub(lambda m: m.group(1), s)
    s = REF.sub(lambda m: m.group(1), s)
    s = STRONG.sub(lambda m: m.group(1), s)
    s = EMPH.sub(lambda m: m.group(1), s)
    s = TICK.sub(lambda m: m.group(1), s)
    s = s.replace("|version|", VERSION).replace("|release|", VERSION)
    s = s.replace("\\ ", "").replace("\\*", "*").replace("\\`", "`").replace("\\\\", "\\")
    return s


def clean(text):
    """One .rst.txt file -> plain text (see the module docstring)."""
    out = []
    lines = text.replace("\t", "    ").splitlines()
    skip_indent = None  # drop lines indented deeper than this (a skipped directive's body)
    lit_indent = None  # a literal block: lines indented deeper than this
    lit = []
    after_directive = False

    def flush_literal():
        body = [x for x in lit]
        while body and not body[-1].strip():
            body.pop()
        if body:
            base = min(len(x) - len(x.lstrip()) for x in body if x.strip())
            out.extend(x[base:].rstrip() if x.strip() else "" for x in body)
            out.append("")
        lit.clear()

    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if skip_indent is not None:
            if not stripped or indent > skip_indent:
                continue
            skip_indent = None
        if lit_indent is not None:
            if not stripped or indent > lit_indent:
                if after_directive and OPTION.match(line):
                    continue
                after_directive = False
                lit.append(line)
                continue
            flush_literal()
            lit_indent = None
        if after_directive and stripped and OPTION.match(line):
            continue
        after_directive = False
        if not stripped:
            if out and out[-1] != "":
                out.append("")
            continue
        if ADORNMENT.match(line) or GRID.match(line):
            continue
        d = DIRECTIVE.match(line)
        if d:
            name, arg = d.group(2), d.group(3).strip()
            after_directive = True
            if name in CODE:
                lit_indent = indent
            elif name in VERSIONS:
                ver = arg.split()[0] if arg else ""
                out.append(VERSIONS[name].format(ver))
                rest = arg[len(ver):].strip()
                if rest:
                    out.append(inline(rest))
            elif name in ADMONITIONS:
                head = ADMONITIONS[name] or (inline(arg) + ":" if arg else None)
                if head:
                    out.append(head)
            elif name in DESCRIBE:
                if arg:
                    out.append(inline(arg))
            else:
                skip_indent = indent
            continue
        if COMMENT.match(line):
            skip_indent = indent
            continue
        if OPTION.match(line) and indent > 0:
            continue
        s = inline(stripped)
        if s.endswith("::"):
            s = s[:-2].rstrip()
            if s and not s.endswith(":"):
                s += ":"
            lit_indent = indent
        if s:
            out.append(s)
    if lit_indent is not None:
        flush_literal()
    text = "\n".join(out).strip()
    return re.sub(r"\n{3,}", "\n\n", text)


def train_tokenizer(train_path, vocab):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=2,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(train_path)], trainer=trainer)
    return tok


def sha256(p):
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".tiny-kit")
    ap.add_argument("--deb", help=f"a {PACKAGE} .deb (default: apt-get download into OUT/deb)")
    ap.add_argument("--vocab", type=int, default=4096)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deb = args.deb
    if deb is None:
        debdir = out / "deb"
        debdir.mkdir(exist_ok=True)
        found = sorted(debdir.glob(f"{PACKAGE}_*.deb"))
        if not found:
            subprocess.run(["apt-get", "download", PACKAGE], cwd=debdir, check=True)
            found = sorted(debdir.glob(f"{PACKAGE}_*.deb"))
        deb = str(found[-1])
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "-x", deb, tmp], check=True)
        root = Path(tmp) / SOURCES
        files = sorted(glob.glob("**/*.rst.txt", root_dir=root, recursive=True))
        if not files:
            sys.exit(f"{deb} has no {SOURCES}/**/*.rst.txt")
        train, valid = [], []
        for i, rel in enumerate(files):
            doc = clean((root / rel).read_text(encoding="utf-8"))
            if len(doc) < 200:
                continue
            (valid if i % HOLDOUT_EVERY == HOLDOUT_OFFSET else train).append(doc)
    sep = f"\n{EOT}\n"
    (out / "train.txt").write_text(sep.join(train) + "\n", encoding="utf-8")
    (out / "valid.txt").write_text(sep.join(valid) + "\n", encoding="utf-8")
    tok = train_tokenizer(out / "train.txt", args.vocab)
    tok.save(str(out / "tokenizer.json"))
    meta = {
        "source": f"Debian package {PACKAGE}: {os.path.basename(deb)} ({SOURCES})",
        "license": "PSF License Agreement (code examples also 0BSD)",
        "source_files": len(files),
        "train_docs": len(train),
        "valid_docs": len(valid),
        "train_bytes": (out / "train.txt").stat().st_size,
        "valid_bytes": (out / "valid.txt").stat().st_size,
        "vocab": tok.get_vocab_size(),
        "sha256": {f: sha256(out / f) for f in ("train.txt", "valid.txt", "tokenizer.json")},
    }
    (out / "corpus.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
