#!/usr/bin/env python3
"""What each way of compressing a tree's files would store, at zstd level 3.

Usage: scripts/density-options.py TREE [--dict]   (needs: pip install zstandard)

The figures behind the store's groups (docs/store-format.md, "Groups"; the table in
docs/BENCHMARKS.md): distinct file contents, walked in the import's order (sorted by
name, depth first), compressed
  - one by one (files up to 256 KiB) and in 64 KiB pieces (larger files): format 1;
  - small files in groups of G bytes (files over T alone), larger files in pieces of
    64 KiB, 256 KiB and 1 MiB (the runs of a large file's chunks);
  - as one solid stream (the bound a solid archive approaches);
  - with --dict, also with a dictionary trained on 20,000 sampled small files (slow:
    a minute or two per size).
"""

import hashlib
import os
import random
import sys

import zstandard as zs

MIB = 2**20


def walk(root):
    out = []

    def rec(d):
        for e in sorted(os.listdir(d), key=os.fsencode):
            p = os.path.join(d, e)
            if os.path.islink(p):
                continue
            if os.path.isdir(p):
                rec(p)
            elif os.path.isfile(p):
                out.append(p)

    rec(root)
    return out


def alone(datas, c):
    return sum(min(len(c.compress(b)), len(b)) for b in datas)


def grouped(datas, c, g, t):
    total, cur, n = 0, [], 0
    for b in datas:
        if len(b) > t:
            total += min(len(c.compress(b)), len(b))
            continue
        cur.append(b)
        n += len(b)
        if n >= g:
            raw = b"".join(cur)
            total += min(len(c.compress(raw)), len(raw))
            cur, n = [], 0
    if cur:
        raw = b"".join(cur)
        total += min(len(c.compress(raw)), len(raw))
    return total


def pieces(datas, c, size):
    return sum(len(c.compress(b[i : i + size])) for b in datas for i in range(0, len(b), size))


def main():
    root = sys.argv[1]
    seen, small, large = set(), [], []
    for p in walk(root):
        with open(p, "rb") as f:
            b = f.read()
        h = hashlib.blake2b(b, digest_size=16).digest()
        if h in seen:
            continue
        seen.add(h)
        (small if len(b) <= 256 * 1024 else large).append(b)
    c = zs.ZstdCompressor(level=3)
    print(f"distinct contents: {len(small)} up to 256 KiB ({sum(map(len, small)) / MIB:.1f} MiB), "
          f"{len(large)} larger ({sum(map(len, large)) / MIB:.1f} MiB)")
    print(f"small files one by one:                {alone(small, c) / MIB:7.1f} MiB")
    for g, t in [(32768, 16384), (65536, 32768), (131072, 65536), (262144, 131072)]:
        print(f"small files in groups of {g >> 10:3} KiB (<= {t >> 10:3} KiB): "
              f"{grouped(small, c, g, t) / MIB:7.1f} MiB")
    for size in [65536, 262144, 1048576]:
        print(f"large files in pieces of {size >> 10:4} KiB:      {pieces(large, c, size) / MIB:7.1f} MiB")
    print(f"small files as one stream:             {len(c.compress(b''.join(small))) / MIB:7.1f} MiB")
    print(f"large files as one stream:             {len(c.compress(b''.join(large))) / MIB:7.1f} MiB")
    if "--dict" in sys.argv:
        random.seed(1)
        sample = random.sample(small, min(len(small), 20000))
        for size in [112 * 1024, 1024 * 1024]:
            d = zs.train_dictionary(size, sample, level=3)
            cd = zs.ZstdCompressor(level=3, dict_data=d)
            print(f"dictionary of {size >> 10} KiB, small files one by one:       "
                  f"{alone(small, cd) / MIB:7.1f} MiB")
            print(f"dictionary of {size >> 10} KiB, groups of 64 KiB (<= 32 KiB): "
                  f"{grouped(small, cd, 65536, 32768) / MIB:7.1f} MiB")


if __name__ == "__main__":
    main()
