#!/usr/bin/python3
"""Web-like JSONL for tools/bench/prep_filters: prose paragraphs from a fixed vocabulary mixed with
the lines quality filters exist for (navigation, bullet lists, hashtags, cookie and policy notes,
repeated lines, e-mail addresses, "lorem ipsum"), deterministic for a seed.

  prep_filters_corpus.py OUT.jsonl MB
"""
import json
import random
import sys

COMMON = ("the be to of and a in that have it for not on with he as you do at this but his by "
          "from they we say her she or an will my one all would there their what so up out if "
          "about who get which go me river market history garden winter people between number "
          "village science season thought morning station library council picture problem "
          "language mountain company").split()


def main():
    out, mb = sys.argv[1], float(sys.argv[2])
    rng = random.Random(29)

    def word():
        if rng.random() < 0.75:
            return rng.choice(COMMON)
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 10)))

    def sentence():
        s = " ".join(word() for _ in range(rng.randint(6, 18)))
        return s[0].upper() + s[1:] + rng.choice(".!?.")

    kinds = [
        lambda: " ".join(sentence() for _ in range(rng.randint(1, 4))),
        lambda: word() + " " + word(),
        lambda: "- " + " ".join(word() for _ in range(rng.randint(2, 6))),
        lambda: "#%s #%s #%s" % (word(), word(), word()),
        lambda: "This site uses cookies. Read our privacy policy.",
        lambda: "Contact %s@mail.example.com or 93.184.216.34 today." % word(),
        lambda: "Lorem ipsum dolor sit amet, consectetur adipiscing elit.",
    ]
    weights = [10, 1.5, 1, 0.3, 0.3, 0.3, 0.02]
    target, size, n = int(mb * 1e6), 0, 0
    with open(out, "w", encoding="utf-8") as f:
        while size < target:
            w = list(weights)
            if rng.random() < 0.4:
                w[rng.randrange(len(w))] += rng.randint(2, 12)
            lines, earlier = [], []
            for _ in range(rng.randint(3, 60)):
                if earlier and rng.random() < 0.05:
                    lines.append(rng.choice(earlier))
                    continue
                line = rng.choices(kinds, w)[0]()
                earlier.append(line)
                lines.append(line)
            text = "\n".join(lines)
            url = "https://%s/%s" % (rng.choice(["news.example.org", "blog.test", "spam.example"]),
                                     word())
            f.write(json.dumps({"id": "web%d" % n, "text": text, "url": url}) + "\n")
            size += len(text.encode("utf-8"))
            n += 1


if __name__ == "__main__":
    main()
