"""The CI workflow `gates ci init` writes into a researcher's own project: on every push and pull request,
install the project and run `gates verify`, so that CI fails when a claim loses its evidence.

GitHub Actions, because that is where most research code lives; the steps are plain shell commands, so
the same lines run in any CI (tests/test_ci_init.py runs them in a fresh project of its own). The
checkout keeps the whole history (`fetch-depth: 0`): `gates verify` checks that the claims history
runs/INDEX.jsonl only grew across commits, which a shallow clone cannot show.
"""

from __future__ import annotations

WORKFLOW_PATH = ".github/workflows/gates-verify.yml"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def workflow(
    *,
    python: str = "3.11",
    install: str = "pip install -e .",
    audit_seconds: int = 300,
    replay: bool = False,
    strict_code: bool = False,
    corpora: list[str] | None = None,
) -> str:
    """The workflow's YAML text. `install`: the command that installs the project (its studies and
    treeheap-gates); `audit_seconds`: the spot-check audit's budget (0: none); `replay`: also re-run the
    contracts marked `replay: {ci: true}`; `strict_code`: fail on claims whose code changed since their
    evidence (stale) until `gates certify` re-runs them; `corpora`: registered corpora to fetch first."""
    verify = ["gates verify"]
    if replay:
        verify.append("--replay")
    if audit_seconds:
        verify.append(f"--audit-seconds {audit_seconds}")
    if strict_code:
        verify.append("--strict-code")
    steps = [
        "      - uses: actions/checkout@v4",
        "        with:",
        "          fetch-depth: 0  # the whole history: verify checks that runs/INDEX.jsonl only grew",
        "      - uses: actions/setup-python@v5",
        "        with:",
        f'          python-version: "{python}"',
        "          cache: pip",
        "      - name: Install (CPU torch first, as the default wheels bring CUDA, which CI does not need)",
        "        run: |",
        f"          pip install torch --index-url {TORCH_CPU_INDEX}",
        f"          {install}",
    ]
    if corpora:
        steps += [
            "      - name: Corpora the studies read",
            "        run: |",
            *[f"          gates data fetch {name}" for name in corpora],
        ]
    steps += [
        "      - name: Every claim still holds its evidence",
        f"        run: {' '.join(verify)}",
    ]
    return "\n".join(
        [
            "# Written by `gates ci init`: fails when a claim in runs/ loses its evidence (a contract edited",
            "# after its runs, evidence changed or gone, a verdict that no longer reproduces, a rewritten",
            "# claims history). See the treeheap-gates docs: verify.md, 'CI in your own project'.",
            "name: gates verify",
            "on: [push, pull_request]",
            "jobs:",
            "  verify:",
            "    runs-on: ubuntu-latest",
            "    timeout-minutes: 60",
            "    steps:",
            *steps,
            "",
        ]
    )


def workflow_commands(text: str) -> list[str]:
    """The shell commands of a workflow's `run` steps, in order (what CI executes after checkout and
    Python setup)."""
    import yaml

    data = yaml.safe_load(text)
    commands = []
    for job in data["jobs"].values():
        for step in job["steps"]:
            if "run" in step:
                commands += [line for line in step["run"].splitlines() if line.strip()]
    return commands
