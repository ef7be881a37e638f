"""Small talk: the closed set of messages that need none of the tenant's documents.

The route policy answers a message directly only when it is one of these; anything else the
classifier calls direct is a question for the documents (an everyday search phrasing such as
"inventor of dynamite", "Canberra" or "Explain photosynthesis" reads like chat to a classifier,
and answering it without the documents loses its grounding, while a needless lookup costs a
retrieval). The kinds:

- `social`: greetings, thanks, farewells and acknowledgements, alone or strung together
  ("OK, thanks, bye!");
- `assistant`: questions about the assistant itself ("who are you?", "what can you do?");
- `conversation`: talk about the conversation so far ("what did I just ask?", "rephrase your
  last answer", "tell me more", "shorten that to two sentences");
- `transform`: an instruction to transform text the user sends with it, after a colon or in
  quotes ("translate this into French: ...", 'rewrite "..." in plain English').

Every pattern is anchored or bounded, so a check is linear in the message's length.
"""

from __future__ import annotations

import re
from typing import Literal

SmallTalk = Literal["social", "assistant", "conversation", "transform"]

_CLAUSE_BREAK = re.compile(r"[,.!?;:…]+|\s-+\s")
_POLITE = r"(?:please |(?:can|could|would|will) you (?:please )?)?"

_SOCIAL = re.compile(
    r"(?:hi|hello|hey|hiya|howdy|yo|sup|greetings|hey hey|(?:good )?(?:morning|afternoon|evening)"
    r"|good day)(?: there| again| everyone| all| you| friend)?"
    r"|(?:hello |hey )?(?:is )?(?:any ?one|you|are you) (?:there|around)"
    r"|how are you(?: doing)?(?: today)?|how(?:'s| is) it going|what'?s up|how have you been"
    r"|how(?:'s| is| was) your day(?: been)?|nice to meet you|good to see you"
    r"|i(?:'m| am) (?:back|here)|(?:can|do) you hear me|is this (?:thing )?on|ping"
    r"|test(?:ing)?(?: test(?:ing)?)*"
    r"|(?:thanks|thank you|thank u|thx|ty|cheers|many thanks|much appreciated|(?:i )?appreciate it)"
    r"(?: (?:so|very) much| a lot| a bunch| a million| again| anyway)?"
    r"(?: for (?:the|your|all the|all your|that) (?:help|answer|answers|time|patience|"
    r"explanation|info|information|support|reply))?"
    r"|that helps|that(?:'s| is| was) (?:exactly )?what i (?:needed|wanted|was looking for)"
    r"|that(?:'s| is| was) (?:very |really |super |so )?(?:helpful|great|perfect|useful|fine|"
    r"all|it|enough|everything|nice|cool|good|funny|interesting|amazing|awesome)"
    r"(?: for (?:now|today))?|that was a (?:bad|good|great|terrible|helpful) answer"
    r"|this is (?:cool|great|nice|amazing|awesome)|i love (?:this|it)|interesting|really"
    r"|hold on|wait|one moment(?: please)?|give me a (?:second|sec|minute|moment)"
    r"|(?:hm+ )?let me think|why not|not now|maybe later|i changed my mind|stop|cancel(?: that)?"
    r"|undo(?: that)?|one more thing|guess what"
    r"|bye(?: bye| for now| now)?|goodbye|good ?night|take care|later|catch you later"
    r"|see (?:you|ya)(?: later| soon| tomorrow| around)?|talk (?:to you )?(?:later|soon|tomorrow)"
    r"|have a (?:good|nice|great|lovely) (?:day|evening|night|weekend|one)|i(?:'m| am) done"
    r"|ok(?:ay)?(?: then| cool| great)?|k|cool|nice|great|perfect|awesome|excellent|brilliant"
    r"|wonderful|fine|fair enough|noted|will do|right|got it|understood|makes sense|sounds good"
    r"|al(?:l ?)?right|sure(?: thing)?|yes(?: please)?|yeah|yep|no(?: thanks| thank you)?|nope"
    r"|never ?mind|forget it|wow|haha+|lol|i see|hm+|oh|ah|oops|sorry|my bad|good job|well done"
    r"|nice work|you(?:'re| are) (?:welcome|awesome|great|the best|a lifesaver|doing great"
    r"|(?:not )?(?:very )?helpful)"
)
_ASSISTANT = re.compile(
    r"(?:who|what) are you|what(?:'s| is) your name|what should i call you"
    r"|are you (?:a |an )?(?:bot|robot|human|person|ai|chatbot|real|machine)"
    r"|are you (?:chatgpt|gpt|claude|an? llm|a language model)|what (?:model|llm) are you"
    r"|who (?:made|built|created|trained) (?:you|this(?: assistant| bot)?)"
    r"|what (?:can|do) you do(?: for me)?|who am i talking to|what are you good at"
    r"|what are your limitations|what kinds? of questions can i ask(?: you)?"
    r"|can you (?:browse|search) the (?:internet|web)|do you store what i (?:type|say|write)"
    r"|can you speak (?:other|different|many) languages|let me ask you something"
    r"|how should i (?:phrase|ask|word) my questions(?: to get the best answers)?"
    rf"|{_POLITE}(?:help(?: me)?(?: with something)?)|what can you help(?: me)? with"
    r"|how (?:can|could) you help(?: me)?|how does this work|how do i use (?:you|this)"
    r"|i (?:have|'ve got|got) a question|(?:can|may) i ask (?:you )?something|i need help"
)
_CONVERSATION_WHOLE = re.compile(
    r"tell me more|go on|continue(?: where you left off)?|keep going|more|and|what else"
    r"|anything else|(?:let'?s )?start (?:over|again)|(?:let'?s )?change the subject|new topic"
    r"|(?:let'?s )?start a new (?:topic|conversation|chat)|(?:please )?continue where you left off"
    r"|elaborate|go ahead|try again|again|are you sure(?: about (?:that|this|it))?"
    r"|(?:that'?s|you'?re|you are) wrong|you misunderstood(?: me| my question)?"
    r"|i don'?t (?:understand|get it)(?: your answer| that)?"
    r"|that (?:doesn'?t|does not) make sense(?: to me)?"
)
_CONVERSATION_MENTION = re.compile(
    r"\b(?:what|which)\b[^.?!]{0,20}\b(?:did|have|was) (?:i|we)\b[^.?!]{0,15}"
    r"\b(?:ask|asked|say|said|type|typed|write|wrote|talk(?:ed)? about|discuss(?:ed)?)\b"
    r"|\bmy (?:last|previous|first|earlier|original) (?:question|message|request|query)\b"
    r"|\byour (?:last|previous|earlier|first|original) (?:answer|message|reply|response|point)\b"
    r"|\b(?:our|this) (?:(?:previous|earlier|past|last) )?(?:conversations?|chats?|discussions?)\b"
    r"|\bwhat (?:did|do) you mean\b|\byou (?:just )?said\b|\bwhat did you (?:just )?say\b"
    r"|\b(?:that|this)(?:'s| is) not what i (?:asked|meant|wanted)\b"
)
# A command on the last answer ("shorten that to two sentences"): a few words may follow it.
_ON_THE_ANSWER = re.compile(
    rf"{_POLITE}(?:repeat|rephrase|reword|shorten|simplify|summari[sz]e|translate|explain"
    r"|expand on|elaborate on|clarify|say|put|turn|format|make|write|give|cut|split|redo)"
    r" (?:that|it|your (?:last |previous )?(?:answer|reply|response))(?: again| back)?"
    r"(?P<tail>(?:,? [\w'-]+){0,6})"
)
_TRANSFORM = re.compile(
    rf"{_POLITE}(?P<verb>translate|summari[sz]e|rewrite|rephrase|paraphrase|reword|proofread"
    r"|shorten|simplify|condense|correct|fix|edit|polish|improve|format|convert|turn|make|put"
    r"|capitali[sz]e|spell-?check|reverse|sort|count)\b(?P<how>[^:\"“”\n]{0,80}?)\s*"
    r"(?P<mark>[:\"“])\s*\S",
    re.IGNORECASE,
)
# Before a colon, the instruction must point at the text ("fix this:", "translate into French:"):
# "Fix: printer not printing" is a search.
_POINTS_AT_TEXT = re.compile(
    r"\b(?:this|these|that|following|it|my|text|sentence|paragraph|passage|email|message|into|to"
    r"|in|grammar|spelling|typos|punctuation|tone)\b",
    re.IGNORECASE,
)


def small_talk(text: str) -> SmallTalk | None:
    """Which kind of small talk `text` is, or None: a message for the documents."""
    message = text.strip()
    if _transforms_text(message):
        return "transform"
    flat = " ".join(message.casefold().replace("\u2019", "'").split())
    bare = flat.rstrip(" ?!.…")
    if not bare:
        return None
    if _ON_THE_ANSWER.fullmatch(bare) or _CONVERSATION_MENTION.search(flat):
        return "conversation"
    # Otherwise every clause must be small talk ("hello, what can you do for me?"); the
    # message is of the first kind that is not merely social.
    kinds = [_clause_kind(c.strip()) for c in _CLAUSE_BREAK.split(flat) if c.strip()]
    if not kinds or None in kinds:
        return None
    return next((k for k in kinds if k != "social"), "social")


def _clause_kind(clause: str) -> SmallTalk | None:
    if _SOCIAL.fullmatch(clause):
        return "social"
    if _ASSISTANT.fullmatch(clause):
        return "assistant"
    if _CONVERSATION_WHOLE.fullmatch(clause):
        return "conversation"
    return None


def _transforms_text(message: str) -> bool:
    found = _TRANSFORM.match(message)
    if found is None:
        return False
    if found["mark"] != ":":
        return True
    return found["verb"].casefold() == "translate" or bool(_POINTS_AT_TEXT.search(found["how"]))
