"""Direct is only for small talk: the closed set `routers.small_talk` recognises, and the route
policy step that keeps everything else the classifier calls direct on lookup."""

from __future__ import annotations

import pytest

from routers.policy import PolicyConfig, decide
from routers.rules import RouterConfig
from routers.small_talk import small_talk
from routers.types import Classification, Route

ROUTES = frozenset({Route.DIRECT, Route.LOOKUP, Route.MULTIHOP})


def policy(router: RouterConfig | None = None) -> PolicyConfig:
    return PolicyConfig(
        tenant="acme",
        allow_force_route=True,
        lexical_weight=1.0,
        dense_weight=1.0,
        identifier_lexical_weight=2.5,
        executable=ROUTES,
        router=router or RouterConfig(),
    )


def classified(route: Route, confidence: float = 0.9) -> Classification:
    return Classification(route, confidence, ("direct:p=0.90",))


SMALL_TALK = [
    ("hello!", "social"),
    ("Hey there, good morning", "social"),
    ("how are you doing today?", "social"),
    ("Thanks a lot for your help!", "social"),
    ("thank you, that's exactly what I was looking for", "social"),
    ("OK, thanks, bye", "social"),
    ("See you tomorrow!", "social"),
    ("have a great weekend", "social"),
    ("Got it, sounds good", "social"),
    ("never mind", "social"),
    ("alright", "social"),
    ("hi, I'm back", "social"),
    ("yes, go ahead", "conversation"),
    ("Who are you?", "assistant"),
    ("what can you help me with", "assistant"),
    ("Are you a bot?", "assistant"),
    ("are you ChatGPT?", "assistant"),
    # Clause by clause: the first kind that is not merely social names the message.
    ("hello, what can you do for me?", "assistant"),
    ("What did I just ask?", "conversation"),
    ("what was my previous question", "conversation"),
    ("Rephrase your last answer in plain words", "conversation"),
    ("Can you summarise our conversation so far?", "conversation"),
    ("Shorten that to two sentences", "conversation"),
    ("could you translate it into Spanish?", "conversation"),
    ("tell me more", "conversation"),
    ("That's not what I asked", "conversation"),
    ("that's wrong, try again", "conversation"),
    ("could you say that again, more slowly?", "conversation"),
    ("turn your answer into a numbered list", "conversation"),
    ("do you remember our previous conversations?", "conversation"),
    ("Translate this into French: The cat sleeps on the mat.", "transform"),
    ("translate to German: good morning", "transform"),
    ("Summarise the following paragraph: Canberra is the capital city of Australia.", "transform"),
    ("Fix the grammar in this: me and him goes to the shop", "transform"),
    ('Can you rewrite "send me the file now" more politely?', "transform"),
    ("Proofread my email:\nDear team, the meeting are at noon.", "transform"),
]

INFORMATION = [
    # Noun phrases and descriptions that name no page.
    "Italian astronomer who championed heliocentrism",
    "inventor of dynamite",
    "country in West Africa between the Sahel to the north",
    # Keywords and a bare title.
    "Canberra",
    "cyanobacteria photosynthesis",
    # Imperatives and how-tos.
    "Explain photosynthesis",
    "Tell me about the Holy Grail",
    "Summarize the history of Rome",
    "How do I reset the Zorblax 9000?",
    "How does Bitcoin work?",
    # A colon alone does not make a transform: the instruction must point at the text.
    "Fix: printer not printing",
    # A greeting carrying a question is a question.
    "hi, what is the capital of Mongolia?",
    "thanks! and who wrote Hamlet?",
    "",
]


@pytest.mark.parametrize(("text", "kind"), SMALL_TALK)
def test_each_kind_of_small_talk_is_recognised(text: str, kind: str) -> None:
    assert small_talk(text) == kind


@pytest.mark.parametrize("text", INFORMATION)
def test_a_question_for_the_documents_is_not_small_talk(text: str) -> None:
    assert small_talk(text) is None


@pytest.mark.parametrize("text", [t for t in INFORMATION if t])
def test_what_the_classifier_calls_direct_but_is_no_small_talk_goes_to_lookup(text: str) -> None:
    decision = decide(classified(Route.DIRECT), "auto", text, policy())
    assert (decision.route, decision.reason) == (Route.LOOKUP, "needs_documents")
    assert "not small talk" in decision.explanation


@pytest.mark.parametrize(("text", "kind"), SMALL_TALK)
def test_small_talk_stays_direct(text: str, kind: str) -> None:
    decision = decide(classified(Route.DIRECT), "auto", text, policy())
    assert (decision.route, decision.reason) == (Route.DIRECT, "classifier")


@pytest.mark.parametrize("route", [Route.LOOKUP, Route.MULTIHOP])
def test_small_talk_goes_direct_whatever_the_classifier_said(route: Route) -> None:
    text = "Summarise this: Canberra is the capital, and Sydney the largest city, of Australia."
    decision = decide(classified(route), "auto", text, policy())
    assert (decision.route, decision.reason) == (Route.DIRECT, "small_talk")
    assert "small talk (transform)" in decision.explanation


def test_a_threshold_or_an_identifier_still_sends_small_talk_to_lookup() -> None:
    router = RouterConfig.model_validate({"thresholds": {"direct": 0.7}})
    unsure = decide(classified(Route.DIRECT, 0.6), "auto", "hello", policy(router))
    assert (unsure.route, unsure.reason) == (Route.LOOKUP, "below_threshold")
    named = decide(classified(Route.DIRECT), "auto", "thanks for ERR-4471", policy())
    assert (named.route, named.reason) == (Route.LOOKUP, "identifier")
    looked_up = decide(classified(Route.LOOKUP), "auto", "thanks for ERR-4471", policy())
    assert looked_up.route is Route.LOOKUP


def test_a_configured_rule_or_a_forced_route_may_still_answer_directly() -> None:
    router = RouterConfig.model_validate(
        {
            "rules": [
                {
                    "name": "chat",
                    "when": {"query_regex": "(?i)dynamite"},
                    "then": {"route": "direct"},
                }
            ]
        }
    )
    ruled = decide(classified(Route.DIRECT), "auto", "inventor of dynamite", policy(router))
    assert (ruled.route, ruled.reason) == (Route.DIRECT, "rule:chat")
    forced = decide(classified(Route.DIRECT), "direct", "inventor of dynamite", policy())
    assert (forced.route, forced.reason) == (Route.DIRECT, "forced")
