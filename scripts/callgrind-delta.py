#!/usr/bin/env python3
"""Per-release instructions by function: (self cost in the long run - in the short run) / N,
from two callgrind files of scripts/instructions.sh (ANNOTATE=1 keeps them).
Usage: scripts/callgrind-delta.py LONG.out SHORT.out RELEASES [TOP=40] [--inclusive]"""
import re, subprocess, sys

def costs(path, inclusive):
    out = subprocess.run(["callgrind_annotate", f"--inclusive={'yes' if inclusive else 'no'}",
                          "--threshold=100", "--auto=no", path], capture_output=True, text=True).stdout
    table = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)", line)
        if m and "PROGRAM TOTALS" not in line:
            name = re.sub(r"\s*\[[^\]]*\]$", "", m.group(2))
            name = re.sub(r"^.*?:(?=[^/]*$)", "", name, count=1) if ":" in name else name
            cost = int(m.group(1).replace(",", ""))
            # A function is listed once per source file its code comes from: its own cost
            # is the sum of those rows, but each row's inclusive cost is already the whole.
            table[name] = max(table.get(name, 0), cost) if inclusive else table.get(name, 0) + cost
    return table

long, short, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
top = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4].isdigit() else 40
inclusive = "--inclusive" in sys.argv
a, b = costs(long, inclusive), costs(short, inclusive)
delta = sorted(((a.get(k, 0) - b.get(k, 0)) / n, k) for k in set(a) | set(b))
for per, name in reversed(delta[-top:]):
    print(f"{per:12,.0f}  {name[:150]}")
