"""`gates ci init`: write the CI workflow that runs `gates verify` in a researcher's own project.

Registered in gates/cli/_app.py as the group `ci`; the workflow's text is
gates.verify's (`workflow`).
"""

from __future__ import annotations

from pathlib import Path

import typer

from gates.cli._group import command_group, group_console
from gates.errors import UserError

ci_app = command_group(
    "CI for your own project: `gates ci init` writes a GitHub Actions workflow that installs the "
    "project and runs `gates verify` on every push, failing when a claim loses its evidence."
)
out = group_console()


@ci_app.command()
def init(
    path: Path = typer.Option(
        None, "--path", help="Where to write it (default: .github/workflows/gates-verify.yml)."
    ),
    python: str = typer.Option("3.11", "--python", help="Python version CI installs."),
    install: str = typer.Option(
        "pip install -e .",
        "--install",
        help="The command that installs your project (its studies and treeheap-gates).",
    ),
    audit_seconds: int = typer.Option(
        300,
        "--audit-seconds",
        min=0,
        help="Budget of the spot-check audit, which re-runs recorded runs (0: no audit).",
    ),
    replay: bool = typer.Option(
        False, "--replay", help="Also re-run the contracts marked `replay: {ci: true}`."
    ),
    strict_code: bool = typer.Option(
        False,
        "--strict-code",
        help="Fail on claims whose code changed since their evidence until `gates certify` re-runs them.",
    ),
    corpus: list[str] | None = typer.Option(
        None, "--corpus", help="A registered corpus the studies read, fetched first (repeatable)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
):
    """Write the workflow (GitHub Actions): checkout with the whole history, Python with a pip cache, CPU
    torch, your project, `gates verify`. Its steps are plain shell commands, usable in any CI."""
    from gates.verify import WORKFLOW_PATH, workflow

    target = Path(path or WORKFLOW_PATH)
    if target.exists() and not force:
        raise UserError(
            f"{target} exists; expected --force to overwrite it, or --path for another file",
            field="--path",
        )
    text = workflow(
        python=python,
        install=install,
        audit_seconds=audit_seconds,
        replay=replay,
        strict_code=strict_code,
        corpora=list(corpus or []),
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    out.print(
        f"wrote {target}: on every push, `gates verify` fails CI when a claim loses its evidence",
        markup=False,
    )
    out.print(
        "commit it with your contracts and runs/ (git add .github runs contracts)", markup=False
    )
