"""Which answers may be stored: one test per reason an answer is refused."""

from backends.llm.base import ToolCall
from gateway.cache.policy import refusal
from routers.generation import NOT_FOUND
from routers.lookup import NO_EVIDENCE_TEXT
from routers.types import Answer, Citation, Route

CITED = (Citation("d", "d#0", "D", "text", 1.0),)


def test_a_complete_cited_answer_is_stored() -> None:
    assert refusal(Answer("Gustave Eiffel [1].", Route.LOOKUP, CITED)) is None


def test_an_incomplete_answer_is_not_stored() -> None:
    truncated = Answer("Gustave", Route.LOOKUP, CITED, complete=False)
    assert refusal(truncated) == "incomplete"


def test_an_escalated_answer_is_not_stored_even_when_complete() -> None:
    escalated = Answer("x [1]", Route.MULTIHOP, CITED, escalated=True, escalation_reason="low")
    assert refusal(escalated) == "escalated"


def test_a_capped_agent_answer_is_not_stored_even_when_complete() -> None:
    assert refusal(Answer("x [1]", Route.MULTIHOP, CITED, cap="steps")) == "capped"


def test_an_abstention_is_not_stored_whichever_route_wrote_it() -> None:
    for text in (NOT_FOUND, NO_EVIDENCE_TEXT, f"Sorry. {NOT_FOUND}"):
        assert refusal(Answer(text, Route.DIRECT)) == "abstention"


def test_an_answer_calling_the_clients_tools_or_cut_short_is_not_stored() -> None:
    call = ToolCall("c1", "lookup_weather", {})
    assert refusal(Answer("", Route.DIRECT, tool_calls=(call,), finish_reason="tool_calls")) == (
        "tool_calls"
    )
    assert refusal(Answer("Gustave [1]", Route.LOOKUP, CITED, finish_reason="length")) == (
        "incomplete"
    )


def test_a_models_refusal_on_the_direct_route_is_not_stored() -> None:
    for text in (
        "I don't know.",
        "I don’t know who won yesterday.",  # noqa: RUF001 (a typographic apostrophe)
        "I can't access real-time data, so I cannot tell you today's weather.",
        "I'm sorry, but I cannot browse the internet.",
        "Sorry, I do not have access to live prices.",
        "As an AI language model, I have no opinions.",
        "I am unable to help with that.",
        "Unfortunately, I cannot provide current stock prices.",
    ):
        assert refusal(Answer(text, Route.DIRECT)) == "abstention", text


def test_an_answer_that_only_mentions_not_knowing_is_stored() -> None:
    for text in (
        "Socrates said: I know that I know nothing.",
        "The Eiffel Tower is 330 m tall; I can't recommend climbing it in wind.",
        "Ice cannot float on alcohol because it is denser.",
    ):
        assert refusal(Answer(text, Route.DIRECT)) is None, text
