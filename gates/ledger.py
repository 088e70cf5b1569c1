"""The evidence ledger: `runs/<id>/evidence.json` and its human-readable `verdict.md`.

Files are written atomically (temporary file in the same folder, fsync, rename), so a crash or a
kill leaves either the old evidence or the new one, never a half-written file.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

import gates

EVIDENCE = "evidence.json"
REPORT = "verdict.md"
FORMAT = 1


@contextlib.contextmanager
def atomic_writer(path: Path):
    """Yield a text file; on a clean exit it replaces `path` in one rename, else it is discarded."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform can fsync a directory
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_writer(path) as f:
        f.write(text)


def signature(evidence: dict) -> str:
    """A sacrebleu-style signature: everything needed to know how the verdict was computed."""
    s = evidence["settings"]
    tests = ",".join(sorted({c["test"] for c in evidence["conditions"]}))
    parts = [
        f"contract:{evidence['contract_id']}",
        f"sha256:{evidence['contract_sha256'][:16]}",
        f"commit:{evidence['git_commit'][:12]}{'+dirty' if evidence['git_dirty'] == 'true' else ''}",
        f"code:{evidence['code_sha256'][:12]}",
        f"eval:{s['evaluation']}",
        f"test:{tests}",
        f"correction:{s['correction']}",
        f"alpha:{s['alpha']}",
        f"seeds:{','.join(str(x) for x in s['seeds'])}",
        f"gates:{evidence.get('gates_version', gates.__version__)}",
    ]
    return "|".join(parts)


def evidence_dir(runs_root: Path, contract_id: str) -> Path:
    return runs_root / contract_id


def write_evidence(runs_root: Path, evidence: dict) -> Path:
    """Write verdict.md, then evidence.json (the commit point) for one contract."""
    folder = evidence_dir(runs_root, evidence["contract_id"])
    atomic_write_text(folder / REPORT, render_report(evidence))
    atomic_write_text(folder / EVIDENCE, json.dumps(evidence, indent=2, sort_keys=False, allow_nan=False) + "\n")
    return folder / EVIDENCE


REQUIRED = ("contract_id", "contract_sha256", "verdict", "git_commit", "created_at", "runs", "conditions", "settings")


def read_evidence(path: Path) -> dict:
    """Parse an evidence file; ValueError naming what is wrong if it is not valid evidence."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"unreadable evidence: {e}") from None
    if not isinstance(data, dict):
        raise ValueError("evidence is not a JSON object")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise ValueError(f"evidence lacks {', '.join(missing)}")
    if data["verdict"] not in ("supported", "refuted", "inconclusive"):
        raise ValueError(f"evidence has an unknown verdict {data['verdict']!r}")
    return data


def _fmt(x, digits=4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def render_report(ev: dict) -> str:
    """verdict.md: the verdict, why, each condition's statistics, per-seed values, signature."""
    lines = [
        f"# {ev['contract_id']}: **{ev['verdict'].upper()}**",
        "",
        f"> {ev.get('claim', '')}",
        "",
        f"Source: {ev.get('source', '-')}  ",
        f"Study: `{ev.get('study', '-')}`, contract `{ev.get('contract_path', '-')}`, "
        f"recorded {ev['created_at']}",
        "",
        "## Why",
        "",
    ]
    lines += [f"- {r}" for r in ev.get("reasons", [])]
    if ev.get("settle"):
        lines += ["", "What would settle it:", ""] + [f"- {s}" for s in ev["settle"]]
    lines += [
        "",
        "## Conditions",
        "",
        f"Holm-corrected across all {len(ev['conditions'])} conditions; intervals are two-sided at "
        f"1 - 2*alpha (their ends are the one-sided bounds at alpha).",
        "",
        "| condition | outcome | estimate | interval | p(holds) adj | p(fails) adj | test |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in ev["conditions"]:
        ci = f"[{_fmt(c.get('ci_low'))}, {_fmt(c.get('ci_high'))}]" if c.get("ci_low") is not None else "-"
        lines.append(
            f"| {c['list_name']}[{c['index']}]: `{c['description']}` | **{c['outcome']}** | "
            f"{_fmt(c.get('estimate'))} | {ci} | {_fmt(c.get('p_hold_adj'), 3)} | "
            f"{_fmt(c.get('p_fail_adj'), 3)} | {c['test']} |")
    lines += ["", "## Runs", "", "| arm | seed | status | halt | metrics |", "|---|---|---|---|---|"]
    for r in ev["runs"]:
        metrics = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(r["metrics"].items()))
        lines.append(f"| {r['arm']} | {r['seed']} | {r['status']} | {r.get('halt_reason') or '-'} | {metrics} |")
    point = ev.get("falsifiable_point")
    if point:
        sign = ">=" if point["direction"] == "higher" else "<="
        lines += ["", "## Falsifiable point (gate 5)", "",
                  f"`{point['arm']}.{point['metric']} {sign} {point['threshold']}` by step {point['by_step']}:", ""]
        lines += [f"- seed {r['seed']}: {_fmt(r['value'])} at step {r['step']}: {'met' if r['met'] else 'NOT met'}"
                  for r in point["runs"]]
    pre = ev.get("preflight", {})
    if pre:
        lines += ["", "## Preflight", ""]
        for arm, p in pre.get("arms", {}).items():
            lines.append(f"- `{arm}`: {p['params']} trainable parameters, params ratio {p['params_ratio']:.3g}"
                         + (f", FLOPs ratio {p['flops_ratio']:.3g}" if p.get("flops_ratio") is not None else ""))
    lines += ["", "---", "", f"`{signature(ev)}`", ""]
    return "\n".join(lines)
