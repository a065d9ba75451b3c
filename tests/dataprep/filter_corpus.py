#!/usr/bin/python3
"""A mixed English corpus for comparing Kiln's quality filters with datatrove's, decision by
decision (tests/dataprep/filter_datatrove_test.cc).

    filter_corpus.py OUT.jsonl [--seed N] [--docs N]

One {"id", "text", "source"} per line. Sources, all of this machine or generated here:
  man       man page sources (/usr/share/man/man*/*.gz), roff requests stripped to text
  readme    READMEs, changelogs and copyright files under /usr/share/doc
  code      C headers and Python modules (/usr/include, /usr/lib/python3*)
  prose     paragraphs assembled from the docstrings and comments of Python modules
  web       web-like pages made here: navigation, menus, lists, cookie banners, citations,
            abbreviations (Mr., U.S., e.g.), URLs and e-mail addresses, emoticons, contractions,
            repeated lines and n-grams, ellipses, hashes and bullets, in amounts drawn to fall on
            both sides of every default threshold of gopher_quality, gopher_repetition, c4 and
            fineweb.
Documents with CJK characters are left out (Kiln's CJK rules differ from datatrove's on purpose).
Deterministic for a seed and a machine's files.
"""
import argparse
import glob
import gzip
import json
import random
import re

WORDS = ("the be to of and a in that have it for not on with he as you do at this but his by "
         "from they we say her she or an will my one all would there their what so up out if "
         "about who get which go me when make can like time no just him know take people into "
         "year your good some could them see other than then now look only come its over think "
         "also back after use two how our work first well way even new want because any these "
         "give day most us river market history garden winter number village science season "
         "thought morning station library council picture problem language mountain company "
         "government development information university children important different").split()
LONG = ("internationalization responsibilities characteristically incomprehensibilities "
        "telecommunications counterrevolutionary electroencephalograph").split()
ABBREV = ["Mr.", "Mrs.", "Dr.", "St.", "U.S.", "U.K.", "e.g.", "i.e.", "etc.", "a.m.", "p.m.",
          "Jan.", "Feb.", "Inc.", "Ltd.", "vs.", "No.", "Prof.", "Gen.", "Sen."]
CONTRACT = ["don't", "can't", "won't", "I'm", "it's", "you're", "they've", "we'd", "isn't",
            "Let's", "gonna", "y'all", "o'clock", "ma'am", "'90s", "she'll"]
ODD = ["10km", "5kg", "$5.00", "US$10", "20°C", "100%", "1+2=3", "3.14", "1,000", "I/O", "a-b",
       "x[edit]", "=====", "**", "--", "...", "…", ":)", ":-(", "<3", "^_^", "(a)", "1)",
       "e-mail", "state-of-the-art", "and/or", "C++", "std::vector<int>", "#include", "#tag",
       "@user", "—", "–", "“quoted”", "‘single’", "«guillemets»", "¿Qué?", "naïve", "café",
       "Ελληνικά", "кириллица", "→", "©", "™", "½", "\u00a0", "\t"]
NAV = ["Home", "About us", "Contact", "Blog", "Products", "Services", "Login", "Sign up",
       "Search", "Menu", "Next page", "Previous", "Share on Facebook", "Tweet", "Subscribe",
       "Read more", "Back to top", "Skip to content", "FAQ", "Careers"]
POLICY = ["This site uses cookies to improve your experience.", "Read our privacy policy.",
          "By continuing you accept the terms of use.", "We use cookies.",
          "Please enable JavaScript to view the comments.", "Cookie policy and settings.",
          "Lorem ipsum dolor sit amet, consectetur adipiscing elit."]
TLDS = ["com", "org", "net", "io", "co.uk", "de"]


def has_cjk(text):
    return re.search("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef]", text)


class Gen:
    def __init__(self, rng):
        self.r = rng

    def word(self, odd=0.0):
        r = self.r
        x = r.random()
        if x < odd:
            return r.choice(ODD)
        if x < odd + 0.03:
            return r.choice(CONTRACT)
        if x < odd + 0.05:
            return r.choice(ABBREV)
        if x < odd + 0.06:
            return r.choice(LONG)
        if x < 0.8:
            return r.choice(WORDS)
        return "".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randint(1, 12)))

    def sentence(self, odd=0.0, lo=4, hi=22):
        r = self.r
        ws = [self.word(odd) for _ in range(r.randint(lo, hi))]
        ws[0] = ws[0][:1].upper() + ws[0][1:]
        s = " ".join(ws)
        if r.random() < 0.1:
            s = s.replace(" ", ", ", 1)
        if r.random() < 0.05:
            s += " [" + str(r.randint(1, 40)) + "]"
        end = r.choices([".", "?", "!", "...", "…", '."', ".'", "", ":", ";", " :)", ".)"],
                        [60, 6, 5, 4, 2, 3, 2, 8, 3, 2, 1, 2])[0]
        return s + end

    def paragraph(self, odd=0.0, n=None):
        return " ".join(self.sentence(odd) for _ in range(n or self.r.randint(1, 7)))

    def url(self):
        r = self.r
        host = "".join(r.choice("abcdefghij") for _ in range(r.randint(3, 9)))
        path = "/".join(r.choice(WORDS) for _ in range(r.randint(0, 3)))
        pre = r.choice(["https://", "http://", "www.", "https://www.", ""])
        return f"{pre}{host}.{r.choice(TLDS)}/{path}" + (r.choice(["", "?id=3", "#top"]))

    def line(self, kind):
        r = self.r
        if kind == "prose":
            return self.paragraph(odd=r.choice([0, 0.02, 0.1]))
        if kind == "nav":
            return r.choice(NAV)
        if kind == "bullet":
            return r.choice(["- ", "• ", "* ", "1. ", "  - "]) + self.sentence(lo=1, hi=8)
        if kind == "short":
            return " ".join(self.word() for _ in range(r.randint(1, 4)))
        if kind == "policy":
            return r.choice(POLICY)
        if kind == "url":
            return r.choice(["See ", "Source: ", "", "Link: "]) + self.url()
        if kind == "email":
            return f"Contact {r.choice(WORDS)}.{r.choice(WORDS)}@{self.url().split('/')[0]} today."
        if kind == "hash":
            return " ".join("#" + self.word() for _ in range(r.randint(1, 6)))
        if kind == "ellipsis":
            return self.sentence()[:-1] + r.choice(["...", "…", " ..."])
        if kind == "heading":
            return r.choice(["", "## ", "=== ", "**"]) + self.sentence(lo=1, hi=5).rstrip(".!?")
        if kind == "symbols":
            return " ".join(r.choice(ODD) for _ in range(r.randint(2, 12)))
        if kind == "code":
            return r.choice(["if (x > 0) { return y; }", "for i in range(10):", "    print(i)",
                             "x = [1, 2, 3];", "}", "int main(void) {", "// TODO: fix this",
                             "return 0;", "def f(a, b=2):", "<div class=\"nav\">"])
        if kind == "dialog":
            return f'"{self.sentence()}" said {r.choice(ABBREV)} {r.choice(WORDS).title()}.'
        return self.sentence()

    def page(self):
        r = self.r
        kinds = ["prose", "nav", "bullet", "short", "policy", "url", "email", "hash", "ellipsis",
                 "heading", "symbols", "code", "dialog", "sentence"]
        # a mix drawn per page: most pages near one dominant kind, in random proportions
        weights = [r.random() ** 3 for _ in kinds]
        weights[0] += r.random() * 2
        n = int(r.choice([3, 5, 8, 12, 20, 35, 60, 100]) * (0.5 + r.random()))
        lines = [self.line(k) for k in r.choices(kinds, weights, k=n)]
        # repetition on both sides of gopher_repetition's thresholds
        rep = r.random()
        if rep < 0.25 and lines:
            k = r.randint(1, max(1, len(lines) // 2))
            for _ in range(k):
                lines.insert(r.randrange(len(lines) + 1), r.choice(lines))
        elif rep < 0.4 and lines:
            phrase = " ".join(self.word() for _ in range(r.randint(2, 6)))
            lines = [l + (" " + phrase) * r.randint(0, 3) for l in lines]
        sep = r.choice(["\n", "\n", "\n\n", "\n", " \n", "\r\n"])
        text = sep.join(lines)
        if r.random() < 0.1:
            text = "   " + text + "\n\n  "
        return text


def strip_roff(text):
    out = []
    for line in text.splitlines():
        if line.startswith(('.\\"', "'\\\"")):
            continue
        if line.startswith("."):
            parts = line.split(None, 1)
            if len(parts) == 1:
                continue
            line = parts[1].replace('"', "")
        line = re.sub(r"\\f[BIRP]|\\\(..|\\[&e-]|\\s[-+]?\d", "", line)
        out.append(line)
    return "\n".join(out)


def read(path):
    try:
        b = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
        return b.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError):
        return None


def files(rng):
    pools = {
        "man": sorted(glob.glob("/usr/share/man/man[1-8]/*.gz")),
        "readme": sorted(glob.glob("/usr/share/doc/*/README*") + glob.glob("/usr/share/doc/*/changelog*")
                         + glob.glob("/usr/share/doc/*/copyright")),
        "code": sorted(glob.glob("/usr/include/*.h") + glob.glob("/usr/lib/python3*/*.py")),
    }
    for k in pools:
        rng.shuffle(pools[k])
    return pools


def prose_from_python(rng, paths, n):
    out = []
    for p in paths:
        t = read(p)
        if not t:
            continue
        for m in re.finditer(r'"""(.*?)"""', t, re.S):
            s = " ".join(m.group(1).split())
            if len(s) > 200 and len(out) < n:
                out.append(s)
    rng.shuffle(out)
    return out[:n]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--docs", type=int, default=2400)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    g = Gen(rng)
    pools = files(rng)
    share = {"man": 0.12, "readme": 0.12, "code": 0.12, "prose": 0.09, "web": 0.55}
    docs = []
    for src, frac in share.items():
        want = int(a.docs * frac)
        if src == "web":
            got = [g.page() for _ in range(want)]
        elif src == "prose":
            got = prose_from_python(rng, pools["code"], want)
            # paragraphs joined into documents of a few paragraphs each
            got = ["\n\n".join(got[i:i + rng.randint(1, 4)]) for i in range(0, len(got), 3)]
        else:
            got = []
            for p in pools[src]:
                if len(got) >= want:
                    break
                t = read(p)
                if not t or not t.strip():
                    continue
                if src == "man":
                    t = strip_roff(t)
                got.append(t[: rng.choice([1500, 5000, 15000])])
        for t in got:
            if t.strip() and not has_cjk(t):
                docs.append((src, t))
    rng.shuffle(docs)
    with open(a.out, "w", encoding="utf-8") as f:
        for i, (src, t) in enumerate(docs):
            f.write(json.dumps({"id": f"{src}-{i:05d}", "text": t, "source": src}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
