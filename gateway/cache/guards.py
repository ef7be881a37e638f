"""When two questions close in meaning may still not share an answer.

Embeddings place "What is the population of France?" next to "… of Spain?", "Which countries
use the euro?" next to "… do not use the euro?" and "revenue in 2019" next to "… in 2020". A
semantic hit is refused when the two questions differ in any of these, each read from the
text alone, deterministically, in one linear pass over a bounded question:

- numbers: digits (1,000 = 1000; 1st = 1) and number words (two … billion, second … twelfth);
- dates: month and weekday names, and time words (today, last, next, before, after, ago …);
- negation: how many negating words (not, n't, never, no, without, except, non- …);
- comparison: superlatives and comparatives (largest, most, fewer, older …), which flip what
  is asked while keeping every noun;
- scope: how many things are asked for ("and", "or", "as well as") and quantifiers (each,
  every, all, both, total, average …): "the five largest cities and their mayors" asks more
  than "the five largest cities";
- entities: a capitalised word (not a common word such as a question word) or a quoted string
  in one question that the other does not contain, whatever its case there;
- identifiers: error codes, SKUs and snake_case names (`routers.features.identifiers_in`, the
  router's own detection) and any word mixing letters and digits;
- order: the same names, identifiers and numbers in another order ("Did Germany invade France"
  vs "Did France invade Germany", "USD to EUR" vs "EUR to USD"), or the same content words
  permuted ("dogs chase cats" vs "cats chase dogs").

Negation also counts words without their apostrophe ("dont", "isnt") and a word that is the
other question's word with a negating prefix ("legal" vs "illegal", "able" vs "unable").
Numbers read hyphenated number words and ordinals ("twenty-first" = 21, "nineteenth" = 19)
and a decimal comma ("1,5" = 1.5; "1,500" = 1500).

A refusal costs a recomputed answer; a false hit serves a wrong one. So a guard errs towards
refusing: "biggest" vs "largest" is refused too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from routers.features import identifiers_in

# Only the semantic tier reads these, and only for questions this long or shorter; longer
# ones are cached exactly only (and an embedding truncates long text, so two long questions
# that differ near their end could look identical to it).
MAX_SEMANTIC_CHARS = 500

# A word, or a number with its separators ("1,000.5", "ERR-4471", "don't"); each part is a run
# of letters or digits and each separator one character that no part contains: linear.
_TOKEN = re.compile(r"[^\W_]+(?:['\u2019.,_-][^\W_]+)*")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_AS_WELL_AS = re.compile(r"\bas well as\b", re.IGNORECASE)
_QUOTED = re.compile(r"\"([^\"]*)\"|“([^”“]*)”|«([^»«]*)»")

_NUMBER_WORDS = {
    **{
        w: str(n)
        for n, w in enumerate(
            "zero _ two three four five six seven eight nine ten eleven twelve thirteen "
            "fourteen fifteen sixteen seventeen eighteen nineteen twenty".split()
        )
        if w != "_"  # "one" is a pronoun more often than a number ("which one")
    },
    **{w: str(n * 10) for n, w in enumerate("_ _ _ thirty forty fifty sixty seventy eighty "
                                              "ninety".split()) if w != "_"},
    "hundred": "100", "thousand": "1000", "million": "1e6", "billion": "1e9",
    "trillion": "1e12", "dozen": "12", "half": "0.5", "twice": "2", "thrice": "3",
    **{w: str(n) for n, w in enumerate("_ first second third fourth fifth sixth seventh "
                                         "eighth ninth tenth eleventh twelfth".split()) if n},
}  # fmt: skip
# Ordinals past twelfth from their cardinals: thirteenth … nineteenth, twentieth … ninetieth,
# hundredth, thousandth, millionth, billionth.
_NUMBER_WORDS.update(
    {
        (w[:-1] + "ieth" if w.endswith("ty") else w + "th"): v
        for w, v in list(_NUMBER_WORDS.items())
        if w.endswith(("teen", "ty", "hundred", "thousand", "million", "billion"))
    }
)
# In a hyphenated number ("twenty-one") "one" is a number.
_COMPOUND_PARTS = {**_NUMBER_WORDS, "one": "1"}
_MONTHS = frozenset(
    "january february march april june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
_WEEKDAYS = frozenset(
    "monday tuesday wednesday thursday friday saturday sunday mon tue tues wed thu thur thurs "
    "fri sat sun".split()
)
_TIME_WORDS = frozenset(
    "today yesterday tomorrow tonight now currently current recent recently ago before after "
    "since until till during last next previous former prior later earlier latest earliest "
    "upcoming past future weekly monthly yearly annual annually daily quarterly century "
    "decade".split()
)
_NEGATIONS = frozenset(
    "not no never none nobody nothing nowhere neither nor without cannot except excluding "
    "unless lack lacks lacking absent "
    # contractions typed without their apostrophe
    "dont doesnt didnt isnt arent wasnt werent cant couldnt wouldnt shouldnt wont hasnt "
    "havent hadnt mustnt neednt aint".split()
)
# A word that is another with one of these in front negates it ("illegal", "unable").
_NEGATING_PREFIXES = ("un", "in", "im", "ir", "il", "dis", "non")
_MIN_STEM = 3  # "unit" is not "un" + "it"
_QUANTIFIERS = frozenset(
    "each every all both either respectively per total totals combined overall average "
    "altogether sum".split()
)
_CONJUNCTIONS = frozenset(("and", "or", "plus", "&"))
_COMPARISON = frozenset(
    "most least more less fewer greater larger smaller higher lower bigger biggest largest "
    "smallest highest lowest maximum minimum max min best worst better worse older oldest "
    "younger youngest newer newest longer longest shorter shortest faster fastest slower "
    "slowest cheaper cheapest top bottom only".split()
)
# Capitalised at the start of a question or a sentence without naming anything.
_COMMON = frozenset(
    "what who whom whose which when where why how is are was were be been do does did can "
    "could would should will shall may might must has have had the a an in on at of for to "
    "from by with about as and or but if then than that this these those there here it its "
    "i me my we our you your he his she her they their them tell please list name give show "
    "explain describe find compare summarise summarize define according between among during "
    "hi hello hey thanks yes no ok okay so also any all some each every".split()
)


@dataclass(frozen=True, slots=True)
class Facts:
    """What the guards compare, read once per question."""

    words: frozenset[str]  # every token, casefolded
    numbers: frozenset[str]
    dates: frozenset[str]
    negations: int
    comparison: frozenset[str]
    scope: tuple[int, frozenset[str]]  # conjunctions counted, quantifiers
    entities: frozenset[str]  # casefolded capitalised words and quoted strings
    identifiers: frozenset[str]
    # Every token in order, casefolded (a number as its value): what the order guard reads.
    sequence: tuple[str, ...] = ()


def facts(question: str) -> Facts:
    text = question[:MAX_SEMANTIC_CHARS]
    tokens = _TOKEN.findall(text)
    folded = [t.casefold().replace("\u2019", "'") for t in tokens]
    numbers: set[str] = set()
    dates: set[str] = set()
    comparison: set[str] = set()
    entities: set[str] = set()
    identifiers = {i.casefold() for i in identifiers_in(text)}
    negations = conjunctions = 0
    quantifiers: set[str] = set()
    words = set(folded)
    sequence: list[str] = []
    for i, (token, word) in enumerate(zip(tokens, folded, strict=True)):
        # A possessive or a contraction with "'s" ("Paris's", "What's") is its word.
        base = word[:-2] if word.endswith("'s") and len(word) > 2 else word
        words.add(base)
        has_digit = any(c.isdigit() for c in word)
        if has_digit:
            found = [_number_value(n) for n in _NUMBER.findall(word)]
            numbers.update(found)
            if any(c.isalpha() for c in word) and not _is_ordinal(word):
                identifiers.add(word)
                sequence.append(word)
            sequence.extend(found)
        elif (value := _NUMBER_WORDS.get(word) or _compound_number(word)) is not None:
            numbers.add(value)
            sequence.append(value)
        else:
            sequence.append(base)
        if word in _MONTHS or word in _WEEKDAYS or word in _TIME_WORDS:
            dates.add(word)
        elif word == "may" and token[0].isupper() and i > 0:
            dates.add(word)  # the month, not the verb
        if word in _NEGATIONS or word.endswith("n't") or word.startswith("non-"):
            negations += 1
        if word in _COMPARISON:
            comparison.add(word)
        if word in _QUANTIFIERS:
            quantifiers.add(word)
        conjunctions += word in _CONJUNCTIONS
        if token[0].isupper() and base not in _COMMON and not has_digit:
            entities.update(base.split("-"))
    for match in _QUOTED.finditer(text):
        quoted = next(g for g in match.groups() if g is not None)
        if quoted.strip():
            entities.add(" ".join(quoted.casefold().split()))
    conjunctions += text.count("&") + len(_AS_WELL_AS.findall(text))
    return Facts(
        frozenset(words),
        frozenset(numbers),
        frozenset(dates),
        negations,
        frozenset(comparison),
        (conjunctions, frozenset(quantifiers)),
        frozenset(entities),
        frozenset(identifiers),
        tuple(sequence),
    )


def _number_value(digits: str) -> str:
    """A number's digits as one value: "1,000" (groups of three) is 1000, "1,5" is 1.5."""
    if "," not in digits:
        return digits
    head, *groups = digits.split(",")
    if all(len(g) == 3 or (len(g) > 3 and g[3] == ".") for g in groups) and len(head) <= 3:
        return digits.replace(",", "")
    return digits.replace(",", ".")  # a decimal comma


def _compound_number(word: str) -> str | None:
    """ "twenty-one" = 21, "twenty-first" = 21, "forty-two" = 42; None when not a number."""
    if "-" not in word:
        return None
    parts = word.split("-")
    if len(parts) < 2 or any(p not in _COMPOUND_PARTS for p in parts):
        return None
    total = 0.0
    for part in parts:
        total += float(_COMPOUND_PARTS[part])
    return str(int(total)) if total.is_integer() else str(total)


def _is_ordinal(word: str) -> bool:
    """1st, 22nd, 3rd, 4th: a number, not an identifier."""
    digits = word.rstrip("stndrh")
    return digits.isdigit() and word[len(digits) :] in ("st", "nd", "rd", "th")


def refusal(a: Facts, b: Facts) -> str | None:
    """The first guard that tells the two questions apart, or None: they may share an answer."""
    if a.numbers != b.numbers:
        return "numbers"
    if a.dates != b.dates:
        return "dates"
    if a.negations != b.negations or _prefix_negated(a, b) or _prefix_negated(b, a):
        return "negation"
    if a.comparison != b.comparison:
        return "comparison"
    if a.scope != b.scope:
        return "scope"
    if a.identifiers != b.identifiers:
        return "identifiers"
    if not _contained(a.entities, b) or not _contained(b.entities, a):
        return "entities"
    if _reordered(a, b):
        return "order"
    return None


def _prefix_negated(a: Facts, b: Facts) -> bool:
    """A word of `a` is a word of `b` with a negating prefix ("illegal" vs "legal")."""
    for word in a.words - b.words:
        for prefix in _NEGATING_PREFIXES:
            stem = word[len(prefix) :].removeprefix("-")
            if word.startswith(prefix) and len(stem) >= _MIN_STEM and stem in b.words:
                return True
    return False


def _reordered(a: Facts, b: Facts) -> bool:
    """The same names, identifiers and numbers, or the same content words, in another
    order: who does what to whom, or what converts to what, has changed."""
    marks = a.entities | b.entities | a.identifiers | b.identifiers | a.numbers | b.numbers
    if _ordered(a.sequence, marks) != _ordered(b.sequence, marks):
        return True
    content_a = [w for w in a.sequence if _content(w, a.numbers)]
    content_b = [w for w in b.sequence if _content(w, b.numbers)]
    return content_a != content_b and sorted(content_a) == sorted(content_b)


def _ordered(sequence: tuple[str, ...], marks: frozenset[str]) -> list[str]:
    """The marks as they first occur in the sequence."""
    return list(dict.fromkeys(w for w in sequence if w in marks))


def _content(word: str, numbers: frozenset[str]) -> bool:
    return word not in _COMMON and word not in numbers and word not in _NEGATIONS


def _contained(entities: frozenset[str], other: Facts) -> bool:
    """Every entity of one question occurs in the other, in any case (a quoted string only
    quoted alike)."""
    for entity in entities:
        if entity in other.words or entity in other.entities:
            continue
        return False
    return True


GUARDS = (
    "numbers",
    "dates",
    "negation",
    "comparison",
    "scope",
    "identifiers",
    "entities",
    "order",
)
