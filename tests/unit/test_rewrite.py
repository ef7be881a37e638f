from backends.llm.base import Message
from routers.rewrite import looks_like_followup

HISTORY = (Message("user", "Tell me about Paris."), Message("assistant", "Paris is ..."))


def test_references_and_continuations_are_followups() -> None:
    assert looks_like_followup("What is its population?", HISTORY)
    assert looks_like_followup("and Berlin?", HISTORY)
    assert looks_like_followup("why?", HISTORY)


def test_a_self_contained_question_is_not() -> None:
    assert not looks_like_followup("Who designed the Eiffel Tower in Paris France?", HISTORY)


def test_without_a_previous_user_turn_nothing_is_a_followup() -> None:
    assert not looks_like_followup("What is its population?", ())
