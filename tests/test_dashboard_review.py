"""What a reviewer reads on the dashboard (issue #27): controls beside the conditions, colours by what
a result means for the claim, a condition merged with its mirror, the arm's value apart from the
margin, flags and attempts, the change from the superseded version, learning curves as per-arm means
with a band, round tick labels, and a board that filters, sorts and folds superseded versions
server-side (a GET form, no scripts).

Unit tests for the pieces (ticks, mirrors, meanings, the contract diff, the board's query), and the
pages in headless Chromium (Playwright driving Debian's /usr/bin/chromium, as tests/test_dashboard.py
does) over the frozen claims (tests/fixtures/claims) served by `make_server`."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from gates.dashboard import svg
from gates.dashboard.board import BoardQuery, select
from gates.dashboard.data import Claim
from gates.dashboard.diff import ADDED, CHANGED, REMOVED, contract_diff
from gates.entities import ConditionRecord
from gates.record import (
    INVALIDATES,
    REFUTES,
    SOUND,
    SUPPORTS,
    UNDETERMINED,
    condition_rows,
)
from tests.conftest import FIXTURE_CLAIMS
from tests.test_dashboard import browser, open_page  # noqa: F401 (browser: a fixture)

# the colours the page gives each meaning (render.CSS), as the browser computes them
RED, GREEN, BROWN = "rgb(198, 40, 40)", "rgb(46, 125, 50)", "rgb(109, 76, 65)"


# ---------------------------------------------------------------------------------- ticks
@pytest.mark.parametrize(
    "lo, hi, labels",
    [
        (0, 1, ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]),
        (-0.004266, 0.05, ["0.00", "0.02", "0.04"]),  # the interval axis the review found
        (0.95, 1.0, ["0.95", "0.96", "0.97", "0.98", "0.99", "1.00"]),
        (0, 300, ["0", "100", "200", "300"]),
        (12000, 14567, ["12000", "13000", "14000"]),
        (-3.2, -1.1, ["-3.0", "-2.5", "-2.0", "-1.5"]),
        (0, 1.2e-5, ["0", "2.5e-6", "5e-6", "7.5e-6", "1e-5"]),
        (1.2e6, 1.55e6, ["1.2e6", "1.3e6", "1.4e6", "1.5e6"]),
    ],
)
def test_ticks_are_round_numbers_with_short_labels(lo, hi, labels):
    ticks = svg.nice_ticks(lo, hi)
    assert svg.tick_labels(ticks) == labels
    assert all(lo <= t <= hi for t in ticks)
    assert all(repr(t) == repr(round(t, 12)) for t in ticks)  # never 0.6000000000000001


def test_a_degenerate_range_has_one_tick():
    assert svg.nice_ticks(2.3, 2.3) == [2.3] and svg.tick_labels([2.3]) == ["2.3"]
    assert svg.nice_ticks(1.0, float("nan")) == [1.0]


def test_the_interval_axis_shows_round_ticks_never_its_padded_ends():
    chart = svg.condition_interval(
        {"estimate": 0.0498, "ci_low": 0.048, "ci_high": 0.05, "description": "x"},
        colour=svg.MEANING_COLOUR[SUPPORTS],
        right=SUPPORTS,
        left=REFUTES,
    )
    labels = re.findall(r'class="xl[^"]*">([^<]+)</text>', chart)
    assert "0" in labels and all(len(x) <= 5 for x in labels), labels
    assert "-0.004" not in chart


# ---------------------------------------------------------------------------------- conditions
def record(list_name: str, index: int, description: str, outcome: str, **more) -> ConditionRecord:
    terms = re.findall(r"[a-z_]+\.[a-z_]+", description)
    return ConditionRecord.model_validate(
        {
            "list_name": list_name,
            "index": index,
            "kind": more.pop("kind", "compare" if len(terms) == 2 else "threshold"),
            "description": description,
            "test": "welch",
            "outcome": outcome,
            "values": {t: [1.0, 2.0] for t in terms},
            **more,
        }
    )


def frozen_conditions(contract_id: str) -> tuple[list[ConditionRecord], list[str]]:
    ev = json.loads(
        (Path(__file__).parent / "fixtures/claims/runs" / contract_id / "evidence.json").read_text()
    )
    records = [ConditionRecord.model_validate(c) for c in ev["conditions"]]
    return records, list(ev["settings"]["arm_configs"])


def test_a_condition_and_its_mirror_share_a_row():
    records, arms = frozen_conditions("c05-structural-probe")  # 4 thresholds and their mirrors
    rows = condition_rows(records, arms)
    assert [[(r.list_name, r.index) for r in row.records] for row in rows] == [
        [("supported_if", i), ("refuted_if", i)] for i in range(4)
    ]
    assert rows[0].bar.terms == (("subheap_kernel", "test_acc"),)
    assert (rows[0].bar.op, rows[0].bar.bar) == (">=", "0.95")
    # a compare whose refuted_if has another bar (+ 0.1 against + 0.5) is no mirror
    records, arms = frozen_conditions("c05-baseline-control")
    assert [len(row.records) for row in condition_rows(records, arms)] == [1, 1]


def test_a_mirror_named_the_other_way_round_is_found_and_a_same_side_one_is_not():
    a_over_b = record("supported_if", 0, "a.m >= b.m + 0.1", "holds")
    mirror = record("refuted_if", 0, "b.m >= a.m - 0.1", "fails")  # a <= b + 0.1
    same_side = record("refuted_if", 1, "b.m <= a.m - 0.1", "fails")  # a >= b + 0.1 again
    rows = condition_rows([a_over_b, same_side, mirror], ["a", "b"])
    assert [[(r.list_name, r.index) for r in row.records] for row in rows] == [
        [("supported_if", 0), ("refuted_if", 0)],
        [("refuted_if", 1)],
    ]
    ratio = record("supported_if", 0, "a.m <= b.m * (1 - 0.3)", "holds")
    plain = record("refuted_if", 0, "a.m >= b.m", "fails")  # another bar: not merged
    assert len(condition_rows([ratio, plain], ["a", "b"])) == 2
    trend = record("supported_if", 0, "trend lower: a.m > b.m", "holds", kind="trend")
    assert condition_rows([trend, plain], ["a", "b"])[0].bar.mirror is None


def test_colours_follow_what_a_result_means_for_the_claim():
    def meaning(*records):
        return condition_rows(list(records), ["x"])[0].meaning

    holds_s = record("supported_if", 0, "x.m >= 1", "holds")
    fails_s = record("supported_if", 0, "x.m >= 1", "fails")
    holds_r = record("refuted_if", 0, "x.m <= 1", "holds")
    fails_r = record("refuted_if", 0, "x.m <= 1", "fails")
    undetermined = record("supported_if", 0, "x.m >= 1", "undetermined")
    assert meaning(holds_s) == SUPPORTS and meaning(fails_s) == REFUTES
    assert meaning(holds_r) == REFUTES  # a refuted_if condition that holds refutes: red
    assert meaning(fails_r) == SUPPORTS and meaning(undetermined) == UNDETERMINED
    control = record("controls", 0, "x.m >= 1", "fails", control="positive")
    assert meaning(control) == INVALIDATES
    assert meaning(record("controls", 0, "x.m >= 1", "holds")) == SOUND
    # merged: which side of the bar it landed on, in one row
    row = condition_rows([undetermined, holds_r], ["x"])[0]
    assert row.meaning == REFUTES and row.landed == "refuted side: refuted_if[0] holds"
    row = condition_rows([holds_s, fails_r], ["x"])[0]
    assert row.landed == "supported side: supported_if[0] holds, refuted_if[0] fails"
    row = condition_rows([undetermined, fails_r], ["x"])[0]
    assert row.meaning == UNDETERMINED and row.landed.startswith("neither side")


# ---------------------------------------------------------------------------------- curves
def test_curves_draw_one_mean_and_one_band_per_arm_and_a_legend_of_what_is_drawn():
    histories = {
        ("a", 0): {"loss": [(0, 3.0), (10, 2.0), (20, 1.0)]},
        ("a", 1): {"loss": [(0, 3.4), (10, 2.2), (20, 1.4)]},
        ("b", 0): {"loss": [(0, 3.0), (10, 2.8)]},
        ("b", 1): {"loss": [(0, 3.2), (10, 2.6), (20, 2.5)]},
    }
    bands = svg.arm_bands(histories, "loss", ["a", "b"])
    assert [b.arm for b in bands] == ["a", "b"]
    assert bands[0].mean == pytest.approx([3.2, 2.1, 1.2]) and bands[0].low == [3.0, 2.0, 1.0]
    assert bands[1].seeds == [2, 2, 1]  # seed 0 of b stopped early
    chart = svg.learning_curves("loss", ["a", "b"], bands)
    assert chart.count('class="mean"') == 2 and chart.count('class="band"') == 2
    legend = re.findall(r'class="lg">([^<]+)<', chart)
    assert legend == ["a", "b"]  # nothing that is not drawn
    marks = svg.Marks(
        bars=[("a", 1.5, "supported_if[0]: a.loss <= 1.5")],
        gate5={"arm": "a", "threshold": 1.2, "by_step": 20, "direction": "lower"},
        halts=[("b", 0, 10, 2.8)],
    )
    chart = svg.learning_curves("loss", ["a", "b"], bands, marks)
    legend = re.findall(r'class="lg">([^<]+)<', chart)
    assert legend == ["a", "b", "condition bar", "gate 5: &lt;= 1.2 by 20", "halted run"]
    assert chart.count('<g class="gate5">') == 1 and "futility" not in chart


# ---------------------------------------------------------------------------------- the diff
def test_the_contract_diff_names_each_changed_added_and_removed_field():
    old = {
        "id": "c-v1",
        "seeds": [0, 1, 2],
        "budget": {"steps": 300, "eval_every": 25},
        "decision": {"supported_if": [{"arm": "a", "margin": 0.5}]},
        "replay": {"ci": True},
    }
    new = {
        "id": "c-v2",
        "supersedes": "c-v1",
        "seeds": [0, 1, 2, 3],
        "budget": {"steps": 300, "eval_every": 50},
        "decision": {"supported_if": [{"arm": "a", "margin": 0.3}, {"arm": "b", "margin": 0}]},
        "controls": [{"kind": "threshold", "arm": "a"}],
    }
    changes = [(c.path, c.kind, c.old, c.new) for c in contract_diff(old, new)]
    assert changes == [
        ("id", CHANGED, "c-v1", "c-v2"),
        ("supersedes", ADDED, None, "c-v1"),
        ("seeds", CHANGED, [0, 1, 2], [0, 1, 2, 3]),
        ("budget.eval_every", CHANGED, 25, 50),
        ("decision.supported_if[0].margin", CHANGED, 0.5, 0.3),
        ("decision.supported_if[1]", ADDED, None, {"arm": "b", "margin": 0}),
        ("replay", REMOVED, {"ci": True}, None),
        ("controls", ADDED, None, [{"kind": "threshold", "arm": "a"}]),
    ]
    assert contract_diff(new, new) == []


# ---------------------------------------------------------------------------------- the board
def claim(cid: str, verdict: str | None, date: str | None, **more) -> Claim:
    return Claim(cid, more.pop("text", f"claim of {cid}"), verdict, date, "ok", "ok", **more)


def test_the_board_query_is_parsed_leniently():
    q = BoardQuery.parse(
        "q=+Subheap++kernel&verdict=invalid&study=c05&flag=stale&flag=nope&sort=date"
    )
    assert q == BoardQuery("Subheap kernel", "invalid", "c05", ("stale",), "date")
    assert BoardQuery.parse("verdict=maybe&sort=random&flag=") == BoardQuery()
    assert BoardQuery.parse("&".join(["q=x"] * 100)) == BoardQuery()  # more fields than a form
    assert parse_qs(urlsplit(q.url("/")).query) == {
        "q": ["Subheap kernel"],
        "verdict": ["invalid"],
        "study": ["c05"],
        "flag": ["stale"],
        "sort": ["date"],
    }


def test_the_board_filters_sorts_and_folds_superseded_versions():
    claims = [
        claim("p-v1", "refuted", "2026-01-01", superseded_by=["p-v2"], study="s"),
        claim(
            "p-v2", "invalid", "2026-02-01", supersedes="p-v1", superseded_by=["p-v3"], study="s"
        ),
        claim("p-v3", "supported", "2026-03-01", supersedes="p-v2", study="s", certified="x"),
        claim("q", "refuted", "2026-02-15", study="t", stale=True, text="Subheap wins"),
        claim("r", None, None, study="t"),
    ]

    def shown(query: str) -> list[tuple[str, list[str]]]:
        entries = select(claims, BoardQuery.parse(query))
        return [(x.claim.contract_id, [c.contract_id for c in x.folded]) for x in entries]

    assert shown("") == [("p-v3", ["p-v2", "p-v1"]), ("q", []), ("r", [])]
    assert shown("sort=date") == [("p-v3", ["p-v2", "p-v1"]), ("q", []), ("r", [])]
    assert shown("sort=verdict") == [("p-v3", ["p-v2", "p-v1"]), ("q", []), ("r", [])]
    # a superseded version whose successor is not listed stands on its own
    assert shown("verdict=refuted") == [("p-v1", []), ("q", [])]
    assert shown("verdict=refuted&sort=date") == [("q", []), ("p-v1", [])]
    assert shown("flag=superseded") == [("p-v1", []), ("p-v2", [])]
    assert shown("q=subheap") == [("q", [])] and shown("q=P-V2") == [("p-v2", [])]
    assert shown("study=t&flag=stale") == [("q", [])] and shown("flag=certified") == [("p-v3", [])]
    assert shown("verdict=pending") == [("r", [])]


# ---------------------------------------------------------------------------------- the pages
@pytest.fixture(scope="module")
def project(make_project) -> Path:
    return make_project(claims=True, name="dash-review")


@pytest.fixture(scope="module")
def site(project):
    from gates.dashboard.site import Site

    return Site(
        project / "runs", project / "contracts", f"sqlite:///{project / 'mlflow.db'}", "http://x"
    )


@pytest.fixture(scope="module")
def server(site):
    """The dashboard's own server (server.py) over the copied claims."""
    from gates.dashboard.server import make_server

    httpd = make_server(site, "127.0.0.1", 0)
    threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def board_ids(page) -> list[str]:
    """The ids of the board's visible rows."""
    rows = page.locator("table.claims:not(.folded) > tbody > tr[id^=row-]")
    return [x.removeprefix("row-") for x in rows.evaluate_all("rs => rs.map(r => r.id)")]


def test_an_invalid_claims_failing_control_is_in_its_controls_table(browser, server):  # noqa: F811
    page, dialogs = open_page(browser)
    page.goto(server + "contract/c05-baseline-control")
    rows = page.locator("table.controls tbody tr")
    assert rows.count() == 1
    row = rows.first
    cells = [row.locator(f"td.{c}").inner_text() for c in ("label", "arm", "metric", "bar")]
    assert cells[0].startswith("controls[0]") and "threshold; positive control" in cells[0]
    assert cells[1:] == ["flat_address", "val_acc", ">= 0.9"]
    assert row.locator("td.seeds").inner_text().startswith("0.255, 0.175, 0.23")
    badge = row.locator(".m")
    assert badge.inner_text() == "invalidates" and "fails: invalidates" in row.inner_text()
    assert badge.evaluate("b => getComputedStyle(b).backgroundColor") == BROWN
    # the decision's conditions decide nothing on an invalid verdict: shown, greyed, and said so
    conditions = page.locator("table.conditions tbody tr")
    assert conditions.count() == 2 and page.locator("table.conditions tr.moot").count() == 2
    assert "the verdict is invalid" in page.locator("table.conditions").inner_text()
    assert page.locator("h2", has_text="Controls").count() == 1
    assert dialogs == []


def test_a_refuted_if_condition_that_holds_is_red_and_shares_its_mirrors_row(browser, server):  # noqa: F811
    page, _ = open_page(browser)
    page.goto(server + "contract/biic-algebra-gates")
    rows = page.locator("table.conditions tbody tr")
    assert rows.count() == 2  # 4 conditions: 2 thresholds and their mirrors
    refuting = page.locator('table.conditions tr[data-meaning="refutes"]')
    assert refuting.count() == 1
    text = refuting.inner_text()
    assert "supported_if[0] + refuted_if[0]" in text and "refuted side: refuted_if[0] holds" in text
    badge = refuting.locator(".m")
    assert badge.evaluate("b => getComputedStyle(b).backgroundColor") == RED
    # the arm's value and the margin beyond the bar, apart and labelled
    assert "(mean of" in refuting.locator("td.value").inner_text()
    assert refuting.locator("td.margin").inner_text().startswith("-")
    heads = page.locator("table.conditions thead th").all_inner_texts()
    assert "value across seeds" in heads and "margin beyond the bar" in heads


def test_flags_attempts_and_the_change_from_the_superseded_version(browser, server, site):  # noqa: F811
    page, _ = open_page(browser)
    page.goto(server + "contract/c05-structural-probe-v2")
    record = page.locator("dl.record").inner_text()
    assert "attempts" in record and "certified" in record and "flags" in record
    changes = page.locator("table.diff tbody tr")
    assert changes.count() >= 1
    heading = page.locator("h2", has_text="Changes from")
    assert heading.inner_text() == "Changes from c05-structural-probe"
    fields = changes.locator("td:first-child").all_inner_texts()
    assert "id" in fields and "supersedes" in fields
    row = changes.filter(has=page.locator("td", has_text=re.compile("^id$")))
    assert row.locator("td.old").inner_text() == "c05-structural-probe"
    assert row.locator("td.new").inner_text() == "c05-structural-probe-v2"
    view = site.claims.view("c05-structural-probe-v2")
    assert view.predecessor is not None and view.predecessor.contract_id == "c05-structural-probe"
    # its claim family: the first version spent the family's alpha, so this one was judged at 0
    family = page.locator("p.family").inner_text()
    assert (
        "version 2 of claim family c05-structural-probe" in family and "tested at alpha 0" in family
    )


def test_problems_show_with_their_codes_and_stale_in_brief():
    """A problem that does not lose the claim (`unlinked_successor`) is a badge on the board and a
    coded line on the page; stale code is a count on the board, the files on the page."""
    from gates.dashboard import render
    from gates.verify import UNLINKED_SUCCESSOR, Problem

    said = "says nearly what withdrawn c-old claimed on the same study"
    files = ["models/a.py", "models/b.py", "gates/record/_x.py"]
    c = claim(
        "c-new",
        "supported",
        "2026-01-01",
        problems=[Problem(UNLINKED_SUCCESSOR, said)],
        stale=True,
        stale_files=files,
        certified="2026-01-02: 3 of 3 re-run",
    )
    cell = render.verdict_cell(c, render.SERVER)
    assert f'class="flag flag-problem" title="{said}">{UNLINKED_SUCCESSOR}</span>' in cell
    assert ">stale (3 files)</span>" in cell and ">certified</span>" in cell
    assert all(f"<code>{f}</code>" not in cell for f in files)
    page = render.record_flags(c) + render.history_notes(c, render.SERVER)
    assert f'<code class="code">{UNLINKED_SUCCESSOR}</code> {said}' in page
    assert all(f"<code>{f}</code>" in page for f in files) and "2026-01-02: 3 of 3 re-run" in page


def test_the_board_filters_by_query_string_and_its_form_submits(browser, server, site):  # noqa: F811
    page, dialogs = open_page(browser)
    page.goto(server)
    everything = board_ids(page)
    # superseded versions are folded under their successor, in a row of their own
    assert "c05-structural-probe" not in everything and "c05-structural-probe-v2" in everything
    folded = page.locator("#versions-c05-structural-probe-v2 details")
    assert folded.count() == 1 and not page.locator("#row-c05-structural-probe").is_visible()
    folded.locator("summary").click()
    assert page.locator("#row-c05-structural-probe").is_visible()
    # a query string narrows the rows, server-side
    page.goto(server + "?verdict=supported")
    supported = board_ids(page)
    assert supported and set(supported) < set(everything)
    for cid in supported:
        assert page.locator(f"#row-{cid} .verdict .v").first.inner_text() == "supported"
    assert f"of {len(FIXTURE_CLAIMS)} contracts match" in page.locator("p.listed").inner_text()
    # the form (no script): a search and a verdict, submitted with its button
    page.goto(server)
    page.fill("input[name=q]", "flat address")
    page.select_option("select[name=verdict]", "invalid")
    page.click("form.board button[type=submit]")
    page.wait_for_load_state()
    query = parse_qs(urlsplit(page.url).query)
    assert query == {"q": ["flat address"], "verdict": ["invalid"], "sort": ["id"]}
    assert board_ids(page) == ["c05-baseline-control"]
    page.check("input[name=flag][value=superseded]")  # and a flag no invalid claim has
    page.click("form.board button[type=submit]")
    page.wait_for_load_state()
    assert parse_qs(urlsplit(page.url).query)["flag"] == ["superseded"] and board_ids(page) == []
    assert page.locator("input[name=q]").input_value() == "flat address"  # the form keeps it
    # sorted by date: newest first
    page.goto(server + "?sort=date")
    dates = [page.locator(f"#row-{cid} td.date").inner_text() for cid in board_ids(page)]
    assert dates == sorted(dates, reverse=True)
    assert dialogs == []


def test_the_static_board_lists_everything_without_a_form(site):
    from gates.dashboard import render

    html = site.index(render.STATIC_INDEX)
    assert "<form" not in html and "gates dashboard</code> serves the same board" in html
    # a served board without a query lists every claim too, with the form
    served = site.index(render.SERVER, "")
    assert '<form class="board" method="get" action="/"' in served
    assert len(re.findall(r'<tr id="row-', served)) == len(re.findall(r'<tr id="row-', html))
