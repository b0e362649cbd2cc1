"""The one command git_ssh.py's key may run (its `command=` in authorized_keys): the
git-upload-pack or git-receive-pack that ssh asked for (SSH_ORIGINAL_COMMAND), of a bare
repository under the served root, its path taken as relative to that root (as
`git daemon --base-path` does); anything else refused. The standard library only: it runs
once per connection, as `python -I -S`.

    python -I -S git_ssh_command.py ROOT GIT
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

VERBS = ("git-upload-pack", "git-receive-pack")


def repository(root: Path, asked: str) -> Path | None:
    """`asked` (ssh's command's path: `/model.git`, `~/model.git`) under `root`, or None when
    it is no bare repository there."""
    rel = asked.removeprefix("~").lstrip("/")
    repo = (root / rel).resolve()
    if not rel or not repo.is_relative_to(root) or not (repo / "HEAD").is_file():
        return None
    return repo


def main(argv: list[str]) -> int:
    root, git = Path(argv[0]).resolve(), argv[1]
    try:
        words = shlex.split(os.environ.get("SSH_ORIGINAL_COMMAND", ""))
    except ValueError:
        words = []
    if len(words) != 2 or words[0] not in VERBS:
        print("fatal: only git fetch and push are served here", file=sys.stderr)
        return 1
    repo = repository(root, words[1])
    if repo is None:
        print(f"fatal: repository '{words[1]}' not found", file=sys.stderr)
        return 1
    verb = words[0].removeprefix("git-")
    os.execv(git, [git, verb, str(repo)])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
