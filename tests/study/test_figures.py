"""A study's figures (fedfew.study.figures): curves as the mean over seeds in their own unit, panels cut
evenly, and a curve of a key no record keeps is one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfew.study.figures import setting_panels
from tests.study.common import (
    DIGITS_STUDY,
    T1,
    _errors,
    _put,
    angular,
    run_cli,
    write_study,
)


def test_a_curve_is_the_mean_over_seeds_at_the_rounds_every_seed_has() -> None:
    from fedfew.study.figures import mean_curve

    per_seed = {0: [{"round": 2, "test_accuracy": 0.5}, {"round": 4, "test_accuracy": 0.6}],
                1: [{"round": 2, "test_accuracy": 0.7}, {"round": 4, "train_loss": 1.0}]}
    (point,) = mean_curve(per_seed, "test_accuracy")  # round 4: seed 1 has no test score
    assert point[0] == 2 and point[1] == pytest.approx(60.0)
    assert f"{point[1]:.2f} [{point[2]:.2f}, {point[3]:.2f}]" == angular([50.0, 70.0], T1)  # inside [0, 100]


def test_a_figure_of_many_settings_is_cut_into_even_panels_in_order() -> None:
    names = [f"s{i}" for i in range(12)]
    assert setting_panels(names) == [names[0:4], names[4:8], names[8:12]]  # the benchmark's 12 columns
    assert setting_panels(names[:6]) == [names[0:3], names[3:6]]
    assert setting_panels(names[:5]) == [names[0:3], names[3:5]]
    assert setting_panels(names[:4]) == [names[:4]] and setting_panels(names[:1]) == [names[:1]]
    for n in range(1, 13):
        panels = setting_panels(names[:n])
        assert [s for panel in panels for s in panel] == names[:n] and max(map(len, panels)) <= 4


def test_a_loss_curve_is_drawn_in_its_own_unit_and_skips_switched_off_terms() -> None:
    """An accuracy is a fraction shown in percent; a training loss (F2L's L_MI) is not scaled, and a
    round where a variant's term is off (nan) counts as missing for that seed."""
    from fedfew.study.figures import mean_curve

    per_seed = {0: [{"round": 2, "train_l_mi": 1.5}, {"round": 4, "train_l_mi": 1.0}],
                1: [{"round": 2, "train_l_mi": 1.3}, {"round": 4, "train_l_mi": float("nan")}]}
    (point,) = mean_curve(per_seed, "train_l_mi")  # round 4: seed 1's value is nan
    assert point[0] == 2 and point[1] == pytest.approx(1.4)  # not a fraction: Student's t as it is
    assert point[2] == pytest.approx(1.4 - T1 * 0.1) and point[3] == pytest.approx(1.4 + T1 * 0.1)


def test_a_curve_of_a_key_no_record_keeps_is_one_line_naming_it(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, DIGITS_STUDY)
    store = tmp_path / "store"
    _put(store, path, "smoke", {("fl-proto", "IID 1-shot", 0): 0.6, ("fl-proto", "IID 1-shot", 1): 0.7}, history=True)
    png = tmp_path / "c.png"
    code, out, err = run_cli(["study", "report", str(path), "--store", str(store), "--budget", "smoke",
                              "--curve", "nosuchkey", str(png)], capsys)
    assert code == 2 and "nosuchkey" in err and "test_accuracy, train_loss" in err and len(_errors(err)) == 1, err
    assert not png.exists()
    code, out, err = run_cli(["study", "report", str(path), "--store", str(store), "--budget", "smoke",
                              "--curve", "train_loss", str(png)], capsys)
    assert code == 0 and png.is_file(), err
