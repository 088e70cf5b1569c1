"""Contract loading: every validation error path names file:line: field and exits 2 from the CLI."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from gates.contract import load_contract
from gates.errors import UserError
from tests.conftest import C05, small_c05, write_contract


def error_of(tmp_path, text: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as info:
        load_contract(path)
    return info.value.render()


def c05_text() -> str:
    return C05.read_text()


def test_committed_contract_loads():
    loaded = load_contract(C05)
    assert loaded.id == "c05-structural-probe"
    assert set(loaded.arm_configs) == {
        "flat_address",
        "path_only",
        "subheap_kernel",
        "path_subheap_kernel",
    }
    assert len(loaded.sha256) == 64


def test_hash_ignores_comments_key_order_and_formatting(tmp_path):
    data = yaml.safe_load(c05_text())
    reordered = dict(reversed(list(data.items())))
    path = write_contract(tmp_path, reordered)
    path.write_text("# a new comment\n" + path.read_text())
    assert load_contract(path).sha256 == load_contract(C05).sha256


def test_hash_changes_with_a_threshold(tmp_path):
    data = yaml.safe_load(c05_text())
    data["decision"]["supported_if"][0]["value"] = 0.9
    assert load_contract(write_contract(tmp_path, data)).sha256 != load_contract(C05).sha256


def test_bad_yaml_syntax_names_the_line(tmp_path):
    msg = error_of(tmp_path, "id: x\nclaim: [unclosed\nstudy: c05_probe\n")
    assert "c.yaml:" in msg and "invalid YAML" in msg


def test_unknown_field_points_at_its_line_and_suggests(tmp_path):
    text = c05_text().replace("seeds: [0, 1, 2]", "seeds: [0, 1, 2]\nseed: 3")
    line = text.splitlines().index("seed: 3") + 1
    msg = error_of(tmp_path, text)
    assert f"c.yaml:{line}: seed: unknown field (did you mean 'seeds'?)" in msg


def test_unknown_arm_config_field(tmp_path):
    text = c05_text().replace(
        "sigma: 1.0, train_depths: [2, 3], test_depths: [5, 6], train_trees: 900, test_trees: 400}\n  path_only",
        "sigmaa: 1.0, train_depths: [2, 3], test_depths: [5, 6], train_trees: 900, test_trees: 400}\n  path_only",
    )
    msg = error_of(tmp_path, text)
    assert "arms.flat_address.sigmaa: unknown field (did you mean 'sigma'?)" in msg
    assert "c.yaml:14:" in msg


def test_wrong_type(tmp_path):
    msg = error_of(tmp_path, c05_text().replace("steps: 300", "steps: many"))
    assert "budget.steps:" in msg and "integer" in msg and "'many'" in msg


def test_dangling_arm_reference(tmp_path):
    data = yaml.safe_load(c05_text())
    data["decision"]["supported_if"][0]["arm"] = "subheap_kernal"
    msg = error_of(tmp_path, yaml.safe_dump(data, sort_keys=False))
    assert (
        "decision.supported_if.0.arm: no arm named 'subheap_kernal' (did you mean 'subheap_kernel'?)"
        in msg
    )


def test_unknown_metric(tmp_path):
    data = yaml.safe_load(c05_text())
    data["decision"]["refuted_if"][0]["metric"] = "test_accuracy"
    msg = error_of(tmp_path, yaml.safe_dump(data, sort_keys=False))
    assert (
        "decision.refuted_if.0.metric: study 'c05_probe' reports no metric 'test_accuracy'" in msg
    )


def test_unrefutable_contract_is_rejected(tmp_path):
    data = yaml.safe_load(c05_text())
    data["decision"]["refuted_if"] = []
    msg = error_of(tmp_path, yaml.safe_dump(data, sort_keys=False))
    assert "decision.refuted_if:" in msg and "at least 1" in msg
    del data["decision"]["refuted_if"]
    msg = error_of(tmp_path, yaml.safe_dump(data, sort_keys=False))
    assert "decision.refuted_if: required field is missing" in msg


@pytest.mark.parametrize("bad_id", ["../evil", "/abs", "a/../../b", "Upper", "-lead", ""])
def test_path_traversal_and_bad_ids(tmp_path, bad_id):
    data = yaml.safe_load(c05_text())
    data["id"] = bad_id
    msg = error_of(tmp_path, yaml.safe_dump(data, sort_keys=False))
    assert ": id:" in msg


def test_object_building_tag_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    text = (
        f"id: !!python/object/apply:os.system ['touch {marker}']\n" + c05_text().split("\n", 4)[4]
    )
    msg = error_of(tmp_path, text)
    assert "c.yaml:1:" in msg and "not allowed" in msg
    assert not marker.exists()
    assert "not allowed" in error_of(tmp_path, "id: !custom x\n")


def test_duplicate_keys_are_refused(tmp_path):
    msg = error_of(tmp_path, c05_text().replace("seeds: [0, 1, 2]", "seeds: [0, 1, 2]\nseeds: [3]"))
    assert "duplicate key 'seeds'" in msg


def test_alias_bomb_is_bounded(tmp_path):
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 9):
        bomb += f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}"] * 9) + "]\n"
    msg = error_of(tmp_path, bomb)
    assert "alias" in msg or "too many values" in msg


def test_size_is_capped(tmp_path):
    msg = error_of(tmp_path, "claim: '" + "x" * 300_000 + "'\n")
    assert "bytes; expected at most" in msg


def test_duplicate_seeds_and_eval_interval(tmp_path):
    data = small_c05(seeds=[1, 1])
    assert "seeds must be distinct" in error_of(tmp_path, yaml.safe_dump(data))
    data = small_c05(budget={"steps": 10, "eval_every": 20})
    assert "eval_every (20) must not exceed steps (10)" in error_of(tmp_path, yaml.safe_dump(data))


def test_two_seeds_are_refused_before_any_run(tmp_path):
    """Issue #38: two seeds never reach a verdict, so a contract that would decide on them is refused."""
    msg = error_of(tmp_path, yaml.safe_dump(small_c05(seeds=2)))
    assert "c.yaml:" in msg and "seeds: 2 seed(s) never reach a verdict" in msg
    data = small_c05(seeds=5)
    data["sequential"] = {"looks": [2, 5]}
    assert "looks must increase and start at 3 seeds or more" in error_of(
        tmp_path, yaml.safe_dump(data)
    )


def test_a_section_check_names_its_values_not_the_section_s_type(tmp_path):
    # a check of a whole section (budget: a dict) says what is wrong with its values; the type of the
    # section ("got dict") is noise there, but stays where the type itself is the error (arms: a list)
    data = small_c05(budget={"steps": 10, "eval_every": 20})
    assert "got dict" not in error_of(tmp_path, yaml.safe_dump(data))
    data = small_c05()
    data["arms"] = list(data["arms"])
    assert "arms: input should be a valid dictionary, got list" in error_of(
        tmp_path, yaml.safe_dump(data)
    )


def test_unknown_study_suggests(tmp_path):
    data = small_c05(study="c05_prob")
    assert "unknown study 'c05_prob' (did you mean 'c05_probe'?)" in error_of(
        tmp_path, yaml.safe_dump(data)
    )


def test_unknown_condition_kind(tmp_path):
    data = small_c05()
    data["decision"]["supported_if"][0]["kind"] = "thresh"
    msg = error_of(tmp_path, yaml.safe_dump(data))
    assert "decision.supported_if.0:" in msg and "threshold, compare, trend" in msg


def test_cli_prints_one_line_errors_and_exits_2(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(c05_text().replace("seeds: [0, 1, 2]", "seeds: [0, 1, 2]\nseed: 3"))
    done = subprocess.run(
        [sys.executable, "-m", "gates", "check", str(path)], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().startswith("error: ") and "bad.yaml:" in done.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "gates", "check", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
    )
    assert (
        missing.returncode == 2
        and "Traceback" not in missing.stderr
        and "cannot read file" in missing.stderr
    )


def test_futility_window_must_fit_after_the_first_evaluation(tmp_path):
    data = small_c05()  # eval every 20 steps
    data["stop_rules"]["futility"][0].update(at_step=40, window=30)
    msg = error_of(tmp_path, yaml.safe_dump(data))
    assert "stop_rules.futility.0.window: window 30 reaches back before the first evaluation" in msg


def test_a_loaded_contract_is_immutable_and_changes_go_to_a_copy(tmp_path):
    """What a run learns (tuned configs, the tuning record, the claim family) goes to a copy: no
    caller's contract changes under it."""
    loaded = load_contract(write_contract(tmp_path, small_c05()))
    with pytest.raises(AttributeError, match="immutable"):
        loaded.tuning_record = {"arms": {}}
    tuned = loaded.replace(tuning_record={"arms": {}})
    assert tuned.tuning_record == {"arms": {}} and loaded.tuning_record is None
    assert tuned.sha256 == loaded.sha256 and tuned.contract is loaded.contract
    with pytest.raises(AttributeError, match="no 'tuned'"):
        loaded.replace(tuned=True)
