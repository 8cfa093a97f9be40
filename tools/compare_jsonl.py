#!/usr/bin/env python3
"""Compare two `deltakit generate --json` outputs (JSON lines): greedy tokens and log-probabilities.

Usage: compare_jsonl.py A.jsonl B.jsonl
Prints one line: token counts, whether the (request, token) sequences are equal, and the largest
|logprob difference| over the tokens both files have. A missing or unreadable file counts as empty
(the caller's run failed; its exit status is reported separately). Exit status is always 0: the
device scripts put the line in their summary table.
"""
import json
import sys


def load(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.startswith("{") and '"kind":"token"' in l]
    except (OSError, ValueError):
        return []


def main():
    a, b = load(sys.argv[1]), load(sys.argv[2])
    key = lambda x: (x.get("request", 0), x["token"])  # noqa: E731
    same = len(a) > 0 and [key(x) for x in a] == [key(y) for y in b]
    d = max((abs(x["logprob"] - y["logprob"]) for x, y in zip(a, b)), default=float("nan"))
    print(f"{len(a)} / {len(b)} tokens, greedy tokens equal: {same}, max |d logprob| {d:.3g}")


if __name__ == "__main__":
    main()
