import pytest

from backends.embeddings.minilm import MiniLMEmbedder
from backends.retrieval.base import RRF_K, Hit
from routers import sufficiency
from routers.grading import EvidenceGrade, GradeThresholds, assess, best_possible_score, grade
from routers.rules import EscalationConfig
from routers.sufficiency import SufficiencyModelNotLoaded, use_model
from routers.types import Classification, Route

BEST = best_possible_score(1.0, 1.0)


def hit(text: str, score: float = BEST, title: str = "T") -> Hit:
    return Hit("d", "d#0", title, "", text, score)


def test_no_hits_is_insufficient() -> None:
    assert grade("anything", [], GradeThresholds(), BEST).reason == "no_hits"


def test_passages_covering_the_question_are_sufficient() -> None:
    evidence = grade(
        "Who designed the Eiffel Tower?",
        [hit("The Eiffel Tower was designed by the engineering firm of Gustave Eiffel.")],
        GradeThresholds(),
        BEST,
    )
    assert evidence.sufficient
    assert evidence.coverage == 1.0


def test_a_question_whose_words_the_passages_miss_escalates() -> None:
    evidence = grade(
        "Which Nobel laureate in chemistry was born in the same city as the tower's designer?",
        [hit("The Eiffel Tower is a wrought-iron lattice tower in Paris.")],
        GradeThresholds(),
        BEST,
    )
    assert not evidence.sufficient
    assert evidence.reason == "low_coverage"


def test_a_passage_only_one_arm_ranked_low_is_disagreement() -> None:
    one_arm_rank_ten = 1 / (RRF_K + 10)
    evidence = grade(
        "eiffel tower", [hit("eiffel tower", one_arm_rank_ten)], GradeThresholds(), BEST
    )
    assert evidence.reason == "arms_disagree"


def test_agreement_is_read_against_the_weighted_best_score() -> None:
    weighted_best = best_possible_score(3.0, 1.0)
    evidence = grade(
        "eiffel tower", [hit("eiffel tower", weighted_best)], GradeThresholds(), weighted_best
    )
    assert evidence.agreement == 1.0


def _assess(method: str, hits: list[Hit], **config: object) -> EvidenceGrade:
    classification = Classification(Route.LOOKUP, 0.9, scores={"multihop": 0.05})
    escalation = EscalationConfig.model_validate({"method": method, **config})
    return assess("Who designed the Eiffel Tower?", hits, classification, BEST, escalation)


EIFFEL = [hit("The Eiffel Tower was designed by the engineering firm of Gustave Eiffel.")]


@pytest.fixture
def learned_model() -> None:
    use_model(MiniLMEmbedder.model_id)


@pytest.mark.parametrize("method", ["learned", "signals"])
def test_assess_without_hits_says_no_hits_whatever_the_method(method: str) -> None:
    assert _assess(method, []).reason == "no_hits"


def test_assess_with_signals_is_the_signal_grade() -> None:
    evidence = _assess("signals", EIFFEL, min_coverage=0.4, min_agreement=0.95)
    assert evidence == grade(
        "Who designed the Eiffel Tower?", EIFFEL, GradeThresholds(0.4, 0.95), BEST
    )
    assert evidence.probability is None


@pytest.mark.usefixtures("learned_model")
def test_assess_learned_reports_its_probability_against_the_configured_limit() -> None:
    strict, lenient = (_assess("learned", EIFFEL, max_insufficiency=m) for m in (0.0, 1.0))
    assert (strict.reason, lenient.reason) == ("learned_insufficient", "sufficient")
    assert strict.probability == lenient.probability
    assert strict.probability is not None and 0.0 < strict.probability < 1.0


def test_assess_learned_before_the_model_is_loaded_fails_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sufficiency, "_current", None)
    with pytest.raises(SufficiencyModelNotLoaded, match="use_model"):
        _assess("learned", EIFFEL)
