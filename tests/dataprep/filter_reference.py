#!/usr/bin/python3
"""Reference definitions of Kiln's quality filters, written from the published rules in plain
Python (str methods, re, collections.Counter, ipaddress, urllib), independently of the C++ code.

The rules are datatrove's (GopherQualityFilter, GopherRepetitionFilter, C4QualityFilter,
FineWebQualityFilter, PIIFormatter, URL and regex filters) with the defaults it uses, and with
the choices docs/PREP.md "Quality filters" documents where datatrove leans on NLTK or leaves CJK
text out: the word splitter (words()), the sentence counter (count_sentences()), CJK characters
as words, the CJK sentence terminators, and line widths with CJK characters counted twice.

  filter_reference.py FILTERS_JSON < docs.jsonl > decisions.jsonl
      FILTERS_JSON: the chain, as the prep config's `filters:` list in JSON
      one decision per input line: {"id", "keep", "filter", "rule", "value", "threshold", "text"}
      (filter/rule/value/threshold of the dropping filter; text: the kept text after edits)
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
from collections import Counter


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


def _pieces(s, out):
    if not s:
        return
    i = 0
    while i < len(s) and is_punct(s[i]):
        i += 1
    if i == len(s):
        out.append(s)
        return
    j = len(s)
    while is_punct(s[j - 1]):
        j -= 1
    if i:
        out.append(s[:i])
    out.append(s[i:j])
    if j < len(s):
        out.append(s[j:])


def words(text):
    """White-space tokens; leading/trailing punctuation runs split off; CJK chars one word each."""
    out = []
    for token in text.split():
        run = ""
        for ch in token:
            if is_cjk(ch):
                _pieces(run, out)
                out.append(ch)
                run = ""
            else:
                run += ch
        _pieces(run, out)
    return out


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
    non_symbol = [w for w in ws if any(not is_punct(c) for c in w)]
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
SENTENCE_BREAK = re.compile("[.!?\u3002\uff01\uff1f]*[\u3002\uff01\uff1f][.!?\u3002\uff01\uff1f]*"
                            r"|[.!?]+(?=\s|$)")


def count_sentences(line):
    return sum(1 for piece in SENTENCE_BREAK.split(line) if piece.strip())


def c4(text, p):
    if p["split_paragraph"]:
        lines = text.splitlines()
    else:
        lines = [m.group(0) for m in re.finditer(
            "(?s).*?(?:[.!?\u3002\uff01\uff1f]*[\u3002\uff01\uff1f][.!?\u3002\uff01\uff1f]*"
            r"|[.!?]+(?=\s|$)|$)", text) if m.group(0)]
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
    out = "\n".join(kept).strip()
    if not out:
        raise Drop("empty", 0, 0)
    return out


# ---- fineweb -----------------------------------------------------------------------------------
FINEWEB = dict(line_punct_thr=0.12, line_punct_exclude_zero=False, short_line_thr=0.67,
               short_line_length=30, char_duplicates_ratio=0.01, new_line_ratio=0.3,
               stop_chars=[".", "'", '"', "!", "?", "\u3002", "\uff01", "\uff1f"])


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
URL = dict(domains_file="", domains=[], words=[])
ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def url_filter(text, p, url):
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
        n = sum(1 for w in words(text) if any(not is_punct(c) for c in w))
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


def run_chain(chain, doc):
    text = doc["text"]
    for label, name, params, fn in chain:
        try:
            text = url_filter(text, params, doc.get("url") or "") if name == "url" else fn(text, params)
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
    out = sys.stdout
    for line in sys.stdin:
        if line.strip():
            out.write(json.dumps(run_chain(chain, json.loads(line)), ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
