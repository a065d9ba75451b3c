#!/usr/bin/python3
"""Reference definitions of Kiln's quality filters, written from the published rules in plain
Python (str methods, re, collections.Counter, ipaddress, urllib), independently of the C++ code.

The rules are datatrove's (GopherQualityFilter, GopherRepetitionFilter, C4QualityFilter,
FineWebQualityFilter, PIIFormatter, URL and regex filters) with the defaults it uses, and with
the choices docs/PREP.md "Quality filters" documents where datatrove leaves CJK text out: CJK
characters as words, the CJK sentence terminators, and line widths with CJK characters counted
twice. Words and sentences are spaCy's, as in datatrove: the pure-Python port of spaCy 3.8's
tokenizer and Sentencizer in ../shared/peers/datatrove/shims (on spaCy's rule files), and the
punctuation tables are read from datatrove's source (utils/text.py); both as that peer's README
unpacks them (/tmp/peers). Without them this script exits 77 (the C++ tests then skip).

  filter_reference.py FILTERS_JSON < docs.jsonl > decisions.jsonl
      FILTERS_JSON: the chain, as the prep config's `filters:` list in JSON
      one decision per input line: {"id", "keep", "filter", "rule", "value", "threshold", "text"}
      (filter/rule/value/threshold of the dropping filter; text: the kept text after edits)
      URL dedup (url, dedup: true) keeps the first document of each url_key() in input order
  filter_reference.py --bench FILTERS_JSON FILE.jsonl   prints MB/s of the chain (the peer of
      tools/bench/prep's filter stage)
"""
import ipaddress
import json
import re
import sys
import time
import unicodedata
import urllib.parse
import os
from collections import Counter


def _peer():
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (os.environ.get("KILN_DATATROVE_PEER", ""), os.path.join(here, "../../../shared/peers/datatrove"),
              os.path.join(here, "../../../../shared/peers/datatrove"), "/work/shared/peers/datatrove"):
        if p and os.path.isfile(os.path.join(p, "shims", "spacy", "_tokenizer.py")):
            return p
    return None


def _load_peer():
    peer = _peer()
    dt = os.environ.get("KILN_DATATROVE_SRC", "/tmp/peers/datatrove")
    text_py = os.path.join(dt, "src", "datatrove", "utils", "text.py")
    if not peer or not os.path.isfile(text_py):
        sys.stderr.write("filter_reference.py: needs ../shared/peers/datatrove and its sources\n")
        sys.exit(77)
    sys.path.insert(0, os.path.join(peer, "shims"))
    try:
        import spacy as port
        from spacy._tokenizer import sentence_starts
        tok = port.make_tokenizer("en")
    except ImportError as e:
        sys.stderr.write(f"filter_reference.py: {e}\n")
        sys.exit(77)
    src = open(text_py, encoding="utf-8").read()
    a = src.index("PUNCTUATION = ")
    b = src.index("\n\n", src.index("TERMINAL_PUNCTUATION = {"))
    ns = {}
    exec(src[a:b], ns)  # two literal constants
    return tok, sentence_starts, set(ns["PUNCTUATION"]) | ns["TERMINAL_PUNCTUATION"], ns["TERMINAL_PUNCTUATION"]


SPACY, SENTENCE_STARTS, PUNCTUATION_SET, TERMINAL_PUNCTUATION = _load_peer()


class Drop(Exception):
    def __init__(self, rule, value, threshold):
        super().__init__(rule)
        self.rule, self.value, self.threshold = rule, value, threshold


def is_punct(ch):
    return unicodedata.category(ch)[0] in "PS"


def is_cjk(ch):
    c = ord(ch)
    return (0x3040 <= c <= 0x30FF or 0x31F0 <= c <= 0x31FF or 0x3400 <= c <= 0x4DBF or
            0x4E00 <= c <= 0x9FFF or 0xF900 <= c <= 0xFAFF or 0x20000 <= c <= 0x2FA1F)


def spacy_tokens(text):
    with SPACY.memory_zone():
        return SPACY(text)


def words(text):
    """datatrove's word_tokenize (spaCy tokens, stripped, empty ones dropped); CJK chars one
    word each."""
    out = []
    for token in spacy_tokens(text)[0]:
        token = token.strip()
        if not token:
            continue
        run = ""
        for ch in token:
            if is_cjk(ch):
                if run:
                    out.append(run)
                out.append(ch)
                run = ""
            else:
                run += ch
        if run:
            out.append(run)
    return out


def is_symbol_word(w):
    return all(c in PUNCTUATION_SET for c in w)


def find_duplicates(items):
    seen, dup, chars = set(), 0, 0
    for x in items:
        if x in seen:
            dup += 1
            chars += len(x)
        else:
            seen.add(x)
    return dup, chars


# ---- gopher_quality ----------------------------------------------------------------------------
GOPHER_QUALITY = dict(min_doc_words=50, max_doc_words=100000, min_avg_word_length=3,
                      max_avg_word_length=10, max_symbol_word_ratio=0.1,
                      max_bullet_lines_ratio=0.9, max_ellipsis_lines_ratio=0.3,
                      max_non_alpha_words_ratio=0.8, min_stop_words=2,
                      stop_words=["the", "be", "to", "of", "and", "that", "have", "with"])


def gopher_quality(text, p):
    ws = words(text)
    n_words = len(ws)
    non_symbol = [w for w in ws if not is_symbol_word(w)]
    cjk_words = [w for w in non_symbol if len(w) == 1 and is_cjk(w)]
    if p["min_doc_words"] and len(non_symbol) < p["min_doc_words"]:
        raise Drop("doc_words", len(non_symbol), p["min_doc_words"])
    if p["max_doc_words"] and len(non_symbol) > p["max_doc_words"]:
        raise Drop("doc_words", len(non_symbol), p["max_doc_words"])
    measured = [len(w) for w in non_symbol if not (len(w) == 1 and is_cjk(w))]
    if measured:
        avg = sum(measured) / len(measured)
        if p["min_avg_word_length"] and avg < p["min_avg_word_length"]:
            raise Drop("avg_word_length", avg, p["min_avg_word_length"])
        if p["max_avg_word_length"] and avg > p["max_avg_word_length"]:
            raise Drop("avg_word_length", avg, p["max_avg_word_length"])
    if n_words == 0:
        return text
    if p["max_symbol_word_ratio"]:
        r = text.count("#") / n_words
        if r > p["max_symbol_word_ratio"]:
            raise Drop("hash_word_ratio", r, p["max_symbol_word_ratio"])
        r = (text.count("...") + text.count("\u2026")) / n_words
        if r > p["max_symbol_word_ratio"]:
            raise Drop("ellipsis_word_ratio", r, p["max_symbol_word_ratio"])
    lines = text.splitlines()
    if lines:
        if p["max_bullet_lines_ratio"]:
            r = sum(l.lstrip().startswith(("\u2022", "-")) for l in lines) / len(lines)
            if r > p["max_bullet_lines_ratio"]:
                raise Drop("bullet_lines_ratio", r, p["max_bullet_lines_ratio"])
        if p["max_ellipsis_lines_ratio"]:
            r = sum(l.rstrip().endswith(("...", "\u2026")) for l in lines) / len(lines)
            if r > p["max_ellipsis_lines_ratio"]:
                raise Drop("ellipsis_lines_ratio", r, p["max_ellipsis_lines_ratio"])
    if p["max_non_alpha_words_ratio"]:
        r = sum(any(c.isalpha() for c in w) for w in ws) / n_words
        if r < p["max_non_alpha_words_ratio"]:
            raise Drop("alpha_words_ratio", r, p["max_non_alpha_words_ratio"])
    if p["min_stop_words"] and len(cjk_words) * 2 <= n_words:
        found = len(set(p["stop_words"]) & set(ws))
        if found < p["min_stop_words"]:
            raise Drop("stop_words", found, p["min_stop_words"])
    return text


# ---- gopher_repetition -------------------------------------------------------------------------
GOPHER_REPETITION = dict(dup_line_frac=0.3, dup_para_frac=0.3, dup_line_char_frac=0.2,
                         dup_para_char_frac=0.2, top_n_grams=[[2, 0.2], [3, 0.18], [4, 0.16]],
                         dup_n_grams=[[5, 0.15], [6, 0.14], [7, 0.13], [8, 0.12], [9, 0.11],
                                      [10, 0.10]])


def gopher_repetition(text, p):
    if not text:
        return text
    paragraphs = re.split(r"\n{2,}", text.strip())
    dup, chars = find_duplicates(paragraphs)
    if p["dup_para_frac"] and dup / len(paragraphs) > p["dup_para_frac"]:
        raise Drop("dup_para_frac", dup / len(paragraphs), p["dup_para_frac"])
    if p["dup_para_char_frac"] and chars / len(text) > p["dup_para_char_frac"]:
        raise Drop("dup_para_char_frac", chars / len(text), p["dup_para_char_frac"])
    lines = re.split(r"\n+", text)
    dup, chars = find_duplicates(lines)
    if p["dup_line_frac"] and dup / len(lines) > p["dup_line_frac"]:
        raise Drop("dup_line_frac", dup / len(lines), p["dup_line_frac"])
    if p["dup_line_char_frac"] and chars / len(text) > p["dup_line_char_frac"]:
        raise Drop("dup_line_char_frac", chars / len(text), p["dup_line_char_frac"])
    ws = words(text)
    # mostly CJK characters: n-grams of 2n characters (a character is about half a word)
    scale = 2 if sum(1 for w in ws if len(w) == 1 and is_cjk(w)) * 2 > len(ws) else 1
    for n, frac in p["top_n_grams"]:
        label, n = n, n * scale
        grams = [" ".join(ws[i:i + n]) for i in range(len(ws) - n + 1)]
        if not grams:
            continue
        gram, count = Counter(grams).most_common(1)[0]
        r = len(gram) * count / len(text)
        if r > frac:
            raise Drop("top_%d_gram" % label, r, frac)
    for n, frac in p["dup_n_grams"]:
        label, n = n, n * scale
        seen, repeated, i = set(), 0, 0
        while i < len(ws) - n + 1:
            gram = "".join(ws[i:i + n])
            if gram in seen:
                repeated += len(gram)
                i += n
            else:
                seen.add(gram)
                i += 1
        if repeated / len(text) > frac:
            raise Drop("duplicated_%d_n_grams" % label, repeated / len(text), frac)
    return text


# ---- c4 ----------------------------------------------------------------------------------------
C4 = dict(split_paragraph=True, remove_citations=True, filter_no_terminal_punct=True,
          min_num_sentences=5, min_words_per_line=3, max_word_length=1000,
          filter_lorem_ipsum=True, filter_javascript=True, filter_curly_bracket=True,
          filter_policy=True)
C4_END = (".", "?", "!", '"', "'", "\u3002", "\uff01", "\uff1f", "\u300d", "\u300f")
POLICY = ["terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies",
          "use cookies"]
CITATION = re.compile(r"\[[0-9]*\]|\[edit\]|\[citation needed\]")
def count_sentences(line):
    """len(split_into_sentences(line)): spaCy's Sentencizer, at least one."""
    return max(1, len(SENTENCE_STARTS(spacy_tokens(line)[0])))


def spacy_sentences(text):
    """split_into_sentences(text): from the end of one sentence to the end of the next."""
    ws, sp = spacy_tokens(text)
    starts = SENTENCE_STARTS(ws)
    ends, pos, idx = [], 0, []
    for w, s_ in zip(ws, sp):
        idx.append(pos)
        pos += len(w) + (1 if s_ else 0)
    ends = [idx[e - 1] + len(ws[e - 1]) for e in starts[1:] + [len(ws)]] if ws else []
    return [text[a:b] for a, b in zip([0] + ends[:-1], ends[:-1] + [len(text)])]


def c4(text, p):
    if p["split_paragraph"]:
        lines = text.splitlines()
    else:
        lines = spacy_sentences(text)
    sentences, kept = 0, []
    for line in lines:
        line = line.strip()
        tokens = line.split()
        n_words = sum(max(1, sum(map(is_cjk, w))) for w in tokens)
        if p["max_word_length"] != -1 and any(len(w) > p["max_word_length"] for w in tokens):
            continue
        if p["remove_citations"]:
            line = CITATION.sub("", line)
        if p["filter_no_terminal_punct"] and (not line.endswith(C4_END) or line.endswith("...")):
            continue
        if n_words < p["min_words_per_line"]:
            continue
        low = line.lower()
        if p["filter_lorem_ipsum"] and "lorem ipsum" in low:
            raise Drop("lorem_ipsum", 1, 1)
        if p["filter_javascript"] and "javascript" in low:
            continue
        if p["filter_curly_bracket"] and "{" in line:
            raise Drop("curly_bracket", 1, 1)
        if p["filter_policy"] and any(x in low for x in POLICY):
            continue
        if p["min_num_sentences"] != -1:
            sentences += count_sentences(line) if p["split_paragraph"] else 1
        kept.append(line)
    if sentences < p["min_num_sentences"]:
        raise Drop("too_few_sentences", sentences, p["min_num_sentences"])
    out = ("\n" if p["split_paragraph"] else " ").join(kept).strip()
    if not out:
        raise Drop("empty", 0, 0)
    return out


# ---- fineweb -----------------------------------------------------------------------------------
FINEWEB = dict(line_punct_thr=0.12, line_punct_exclude_zero=False, short_line_thr=0.67,
               short_line_length=30, char_duplicates_ratio=0.01, new_line_ratio=0.3,
               stop_chars=sorted(TERMINAL_PUNCTUATION))


def fineweb(text, p):
    lines = [l for l in text.split("\n") if l.strip() != ""]
    if not lines:
        raise Drop("empty", 0, 0)
    r = sum(1 for l in lines if l.endswith(tuple(p["stop_chars"]))) / len(lines)
    if r < p["line_punct_thr"] and not (r == 0 and p["line_punct_exclude_zero"]):
        raise Drop("line_punct_ratio", r, p["line_punct_thr"])
    width = lambda l: sum(2 if is_cjk(c) else 1 for c in l)
    r = sum(1 for l in lines if width(l) <= p["short_line_length"]) / len(lines)
    if r > p["short_line_thr"]:
        raise Drop("short_line_ratio", r, p["short_line_thr"])
    rest = len(text.replace("\n", ""))
    r = find_duplicates(lines)[1] / rest if rest else 0.0
    if r > p["char_duplicates_ratio"]:
        raise Drop("char_dup_ratio", r, p["char_duplicates_ratio"])
    ws = words(text)
    r = text.count("\n") / len(ws) if ws else 0.0
    if r > p["new_line_ratio"]:
        raise Drop("list_ratio", r, p["new_line_ratio"])
    return text


# ---- pii ---------------------------------------------------------------------------------------
PII = dict(emails=True, ips=True, phones=False, only_public_ips=True,
           email_replacement="email@example.com", ip_replacement="22.214.171.124",
           phone_replacement="<PHONE>")
EMAIL = re.compile(r"\b[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@"
                   r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z0-9]"
                   r"(?:[A-Za-z0-9-]*[A-Za-z0-9])?", re.ASCII)
IPV4 = re.compile(r"\b(?:[0-9]{1,3}\.){3}[0-9]{1,3}\b", re.ASCII)
PHONE = re.compile(r"(?:\+?1[-. ])?(?:\([0-9]{3}\) ?|\b[0-9]{3}[-. ])[0-9]{3}[-. ][0-9]{4}\b",
                   re.ASCII)


def _address(s):
    try:
        return ipaddress.IPv4Address(s)
    except ValueError:
        return None


def pii(text, p):
    if p["emails"]:
        text = EMAIL.sub(lambda m: p["email_replacement"], text)
    if p["ips"]:
        def ip(m):
            a = _address(m.group(0))
            ok = a is not None and (a.is_global or not p["only_public_ips"])
            return p["ip_replacement"] if ok else m.group(0)
        text = IPV4.sub(ip, text)
    if p["phones"]:
        text = PHONE.sub(lambda m: p["phone_replacement"], text)
    return text


# ---- url, length, regex ------------------------------------------------------------------------
URL = dict(domains_file="", domains=[], words=[], dedup=False)
ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _host(authority):
    host = authority.rsplit("@", 1)[-1]
    if ":" in host and "]" not in host:
        host = host.rsplit(":", 1)[0]
    host = host.translate(ASCII_LOWER).rstrip(".")
    return host[4:] if host.startswith("www.") else host


def url_key(url):
    """URL dedup's normal form: no scheme, host as the block list sees it, no fragment, no
    trailing '/' in the path, the query kept."""
    rest = url.split("://", 1)[1] if "://" in url else url
    rest = rest.split("#", 1)[0]
    m = re.search(r"[/?]", rest)
    end = m.start() if m else len(rest)
    tail = rest[end:]
    path, _, query = tail.partition("?")
    return _host(rest[:end]) + path.rstrip("/") + ("?" + query if _ else "")


def url_filter(text, p, url, duplicate=False):
    if not url:
        return text
    domains = {d.translate(ASCII_LOWER) for d in p["domains"]}
    if p["domains_file"]:
        with open(p["domains_file"], encoding="utf-8") as f:
            for line in f:
                line = line.split("#")[0].strip()
                if line:
                    domains.add(line.translate(ASCII_LOWER))
    rest = url.split("://", 1)[1] if "://" in url else url
    host = re.split(r"[/?#]", rest, maxsplit=1)[0].rsplit("@", 1)[-1]
    if ":" in host and "]" not in host:
        host = host.rsplit(":", 1)[0]
    host = host.translate(ASCII_LOWER).rstrip(".")
    if host.startswith("www."):
        host = host[4:]
    parts = host.split(".")
    for i in range(len(parts)):
        if ".".join(parts[i:]) in domains and ".".join(parts[i:]):
            raise Drop("blocked_domain", 1, 1)
    if p["dedup"] and duplicate:
        raise Drop("duplicate_url", 1, 1)
    blocked = {w.translate(ASCII_LOWER) for w in p["words"]}
    for token in re.split(r"[^0-9A-Za-z\u0080-\U0010ffff]+", url.translate(ASCII_LOWER)):
        if token and token in blocked:
            raise Drop("blocked_word", 1, 1)
    return text


LENGTH = dict(min_chars=None, max_chars=None, min_words=None, max_words=None)


def length(text, p):
    n = len(text)
    if p["min_chars"] is not None and n < p["min_chars"]:
        raise Drop("chars", n, p["min_chars"])
    if p["max_chars"] is not None and n > p["max_chars"]:
        raise Drop("chars", n, p["max_chars"])
    if p["min_words"] is not None or p["max_words"] is not None:
        n = sum(1 for w in words(text) if not is_symbol_word(w))
        if p["min_words"] is not None and n < p["min_words"]:
            raise Drop("words", n, p["min_words"])
        if p["max_words"] is not None and n > p["max_words"]:
            raise Drop("words", n, p["max_words"])
    return text


REGEX = dict(drop=[], strip_lines=[])


def regex(text, p):
    for i, pattern in enumerate(p["drop"]):
        if re.search(pattern, text):
            raise Drop("drop_pattern", i, i)
    if not p["strip_lines"]:
        return text
    lines = text.split("\n")
    kept = [l for l in lines if not any(re.search(x, l) for x in p["strip_lines"])]
    if len(kept) == len(lines):
        return text
    out = "\n".join(kept)
    if not out.strip():
        raise Drop("empty", 0, 0)
    return out


FILTERS = {"gopher_quality": (GOPHER_QUALITY, gopher_quality),
           "gopher_repetition": (GOPHER_REPETITION, gopher_repetition),
           "c4": (C4, c4), "fineweb": (FINEWEB, fineweb), "pii": (PII, pii),
           "url": (URL, None), "length": (LENGTH, length), "regex": (REGEX, regex)}


def make_chain(spec):
    chain, seen = [], Counter()
    for entry in spec:
        entry = {"name": entry} if isinstance(entry, str) else dict(entry)
        name = entry.pop("name")
        defaults, fn = FILTERS[name]
        params = dict(defaults)
        params.update(entry)
        seen[name] += 1
        label = name if seen[name] == 1 else "%s#%d" % (name, seen[name])
        chain.append((label, name, params, fn))
    return chain


def run_chain(chain, doc, url_duplicate=False):
    text = doc["text"]
    for label, name, params, fn in chain:
        try:
            if name == "url":
                text = url_filter(text, params, doc.get("url") or "", url_duplicate)
            else:
                text = fn(text, params)
        except Drop as d:
            return {"id": doc.get("id"), "keep": False, "filter": label, "rule": d.rule,
                    "value": d.value, "threshold": d.threshold}
    return {"id": doc.get("id"), "keep": True, "text": text}


def main():
    if sys.argv[1] == "--bench":
        chain = make_chain(json.loads(sys.argv[2]))
        with open(sys.argv[3], encoding="utf-8") as f:
            docs = [json.loads(l) for l in f if l.strip()]
        size = sum(len(d["text"].encode("utf-8")) for d in docs)
        t0 = time.process_time()
        for d in docs:
            run_chain(chain, d)
        cpu = time.process_time() - t0
        print(json.dumps({"bytes": size, "cpu_s": cpu, "mb_per_cpu_s": size / 1e6 / cpu}))
        return
    chain = make_chain(json.loads(sys.argv[1]))
    docs = [json.loads(line) for line in sys.stdin if line.strip()]
    # URL dedup: of the documents with the same url_key, the first in input order is kept.
    seen, duplicate = set(), []
    for d in docs:
        key = url_key(d["url"]) if d.get("url") else ""
        duplicate.append(bool(key) and key in seen)
        if key:
            seen.add(key)
    out = sys.stdout
    for d, dup in zip(docs, duplicate):
        out.write(json.dumps(run_chain(chain, d, dup), ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
