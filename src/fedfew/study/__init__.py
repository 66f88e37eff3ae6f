"""Studies: a paper's table or figure as data (a grid of ordinary runs over seeds), a result store,
reports with intervals over seeds and computed verdicts, and the docs blocks made from the store.
docs/studies.md describes the file format, the commands and the verdict rule."""

from fedfew.study.study_file import Study, load_study
from fedfew.study.study_sections import StudyError
from fedfew.study.verdict import HOLDS, NOT_RESOLVED, REVERSED, compare, judge_order, t_interval

__all__ = ["HOLDS", "NOT_RESOLVED", "REVERSED", "Study", "StudyError", "compare", "judge_order", "load_study",
           "t_interval"]
