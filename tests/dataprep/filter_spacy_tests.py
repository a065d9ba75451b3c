#!/usr/bin/python3
"""spaCy's own English tokenizer tests, run against Kiln's C++ tokenizer (dataprep/filter/spacy_en).

    filter_spacy_tests.py FILTER_SPACY_TEST_BINARY [pytest args]

The test files are read from an unpacked spaCy source tree (SPACY_SRC, default /tmp/peers/spacy;
../shared/peers/datatrove/README.md says how to unpack it) and run by Debian's pytest with an
`en_tokenizer` fixture whose documents come from the C++ code: the gtest binary
filter_spacy_test in its serving mode (KILN_SPACY_SERVE=1) tokenizes each text. Tests of what the
tokenizer here does not model (lexeme attributes such as norm_ / like_num, Tokenizer.explain,
customised tokenizers, the language-independent `xx` rules) are skipped, not passed. Exits 77
(skipped) when spaCy's sources or pytest are missing.
"""
import os
import shutil
import subprocess
import sys
import tempfile

SPACY_SRC = os.environ.get("SPACY_SRC", "/tmp/peers/spacy")
FILES = [
    "lang/en/test_exceptions.py",
    "lang/en/test_indices.py",
    "lang/en/test_prefix_suffix_infix.py",
    "lang/en/test_punct.py",
    "lang/en/test_tokenizer.py",
    "lang/en/test_text.py",
    "tokenizer/test_naughty_strings.py",
    "tokenizer/test_urls.py",
    "tokenizer/test_whitespace.py",
]

CONFTEST = r'''
import os
import subprocess

import pytest


class _Server:
    def __init__(self, binary):
        env = dict(os.environ, KILN_SPACY_SERVE="1")
        self.p = subprocess.Popen([binary, "--gtest_filter=SpacyEnglish.Serve"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, env=env)
        # (gtest's banner lines come first: skipped up to the first record)

    def tokenize(self, text):
        b = text.encode("utf-8", "surrogatepass")
        self.p.stdin.write(str(len(b)).encode() + b"\n" + b)
        self.p.stdin.flush()
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError("the tokenizer process ended")
            if line.strip().isdigit():
                break
        data = self.p.stdout.read(int(line)).decode("utf-8", "surrogatepass")
        toks, _, starts = data.rpartition("\x1d")
        words, spaces = [], []
        if toks or text:
            for t in toks.split("\x1f") if toks else []:
                sp = t.endswith("\x1e")
                words.append(t[:-1] if sp else t)
                spaces.append(sp)
        return words, spaces


def _unmodelled(self, name):
    if name.startswith("__"):
        raise AttributeError(name)
    pytest.skip(f"{type(self).__name__}.{name} is not modelled here")


class Token:
    def __init__(self, doc, i):
        self.doc, self.i = doc, i
        self.text = doc._words[i]
        self.whitespace_ = " " if doc._spaces[i] else ""
        self.idx = doc._idx[i]
        self.orth_ = self.text

    text_with_ws = property(lambda self: self.text + self.whitespace_)
    __len__ = lambda self: len(self.text)
    __str__ = lambda self: self.text
    __repr__ = __str__
    __getattr__ = _unmodelled


class Doc:
    def __init__(self, words, spaces):
        self._words, self._spaces = words, spaces
        self._idx, pos = [], 0
        for w, s in zip(words, spaces):
            self._idx.append(pos)
            pos += len(w) + (1 if s else 0)
        self.text = "".join(w + (" " if s else "") for w, s in zip(words, spaces))
        self.text_with_ws = self.text

    def __len__(self):
        return len(self._words)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return Token(self, i)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    __getattr__ = _unmodelled


class _Tok:
    def __init__(self, server):
        self.s = server

    def __call__(self, text):
        return Doc(*self.s.tokenize(text))

    __getattr__ = _unmodelled


def pytest_configure(config):
    config.addinivalue_line("markers", "issue(n): spaCy issue number")
    config.addinivalue_line("markers", "slow: slow test")


@pytest.fixture(scope="session")
def en_tokenizer():
    return _Tok(_Server(os.environ["KILN_SPACY_TEST_BINARY"]))


@pytest.fixture(scope="session")
def tokenizer():
    pytest.skip("the language-independent (xx) rules are not part of Kiln")


@pytest.fixture(scope="session")
def es_tokenizer():
    pytest.skip("only English is modelled")
'''


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    binary = os.path.abspath(sys.argv[1])
    tests = os.path.join(SPACY_SRC, "spacy", "tests")
    try:
        import pytest
    except ImportError:
        print("python3-pytest missing: skipped")
        return 77
    if not all(os.path.isfile(os.path.join(tests, f)) for f in FILES):
        print(f"spaCy's tests not under {tests}: skipped")
        return 77
    tmp = tempfile.mkdtemp(prefix="kiln_spacy_tests_")
    try:
        with open(os.path.join(tmp, "conftest.py"), "w") as f:
            f.write(CONFTEST)
        # the spaCy modules these test files import, from the same source tree
        stubs = os.path.join(tmp, "stubs")
        os.makedirs(os.path.join(stubs, "spacy", "lang", "en"))
        for pkg in ("spacy", "spacy/lang", "spacy/lang/en"):
            open(os.path.join(stubs, pkg, "__init__.py"), "w").close()
        with open(os.path.join(stubs, "spacy", "util.py"), "w") as f:
            f.write("import pytest\ndef compile_prefix_regex(e): pytest.skip(\"the Python regexes are not Kiln's\")\n"
                    "compile_suffix_regex = compile_infix_regex = compile_prefix_regex\n"
                    "def update_exc(base, *adds):\n"
                    "    out = dict(base)\n"
                    "    for a in adds: out.update(a)\n"
                    "    return out\n")
        with open(os.path.join(stubs, "spacy", "symbols.py"), "w") as f:
            f.write("ORTH, NORM = 65, 67\n")
        for rel in ("char_classes.py", "punctuation.py", "tokenizer_exceptions.py"):
            shutil.copy(os.path.join(SPACY_SRC, "spacy", "lang", rel), os.path.join(stubs, "spacy", "lang", rel))
        with open(os.path.join(stubs, "spacy", "lang", "en", "lex_attrs.py"), "w") as f:
            f.write("import pytest\ndef like_num(t): pytest.skip('like_num is not modelled')\n")
        with open(os.path.join(stubs, "spacy", "tokens.py"), "w") as f:
            f.write("import pytest\nclass Doc:\n    def __init__(self, *a, **k): pytest.skip('Doc')\n")
        targets = []
        for rel in FILES:
            dst = os.path.join(tmp, rel.replace("/", "__"))
            shutil.copy(os.path.join(tests, rel), dst)
            targets.append(dst)
        env = dict(os.environ, KILN_SPACY_TEST_BINARY=binary,
                   PYTHONPATH=stubs + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", tmp,
               "-rfE", "--tb=line"] + sys.argv[2:] + targets
        return subprocess.call(cmd, env=env, cwd=tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
