#!/usr/bin/env python3
"""Checks the libFuzzer dictionaries in fuzz/dict/ parse as libFuzzer reads them (ctest
FuzzDictionaries): each line is blank, a # comment, or [name=]"bytes" where inside the quotes only
\\\\, \\" and \\xNN escapes are allowed. libFuzzer refuses a whole dictionary for one bad line and the
run then does not start (a "\\n" in yaml.dict did exactly that)."""
import pathlib
import re
import sys

ENTRY = re.compile(r'^(?:[A-Za-z0-9_]+=)?"((?:[^"\\]|\\\\|\\"|\\x[0-9A-Fa-f]{2})*)"$')

bad = 0
files = sorted(pathlib.Path(sys.argv[1]).glob("*.dict"))
for path in files:
    for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if not ENTRY.match(s):
            print(f"{path}:{no}: not a libFuzzer dictionary entry: {s}")
            bad += 1
print(f"check_dicts: {len(files)} dictionaries, {bad} bad line(s)")
sys.exit(1 if bad or not files else 0)
