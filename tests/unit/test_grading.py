from backends.retrieval.base import RRF_K, Hit
from routers.grading import GradeThresholds, best_possible_score, grade

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
