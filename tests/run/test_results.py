"""What a finished run reports (fedfew.run.results): below the initial model, the two scores are shown
apart."""

from __future__ import annotations

from fedfew.run.results import below_initial_message


# -- a warning whose two numbers print the same --------------------------------------------------------
def test_below_the_initial_model_shows_the_two_scores_apart() -> None:
    summary = {"name": "x", "initial_score": {"split": "test", "accuracy": 0.49170}, "final_score": 0.491667,
               "selected_round": 3}
    text = below_initial_message(summary)
    assert "49.167%" in text and "49.170%" in text, text
    summary = {**summary, "final_score": 0.40}
    assert "40.00%" in below_initial_message(summary) and "49.17%" in below_initial_message(summary)
