"""Which code wrote a run: the checkout's git commit (or the one pip recorded for a wheel), the version
line ``ddlib --version`` prints, and the tags every run carries. Imports ``specs`` and ``store.paths``, ``store.tags``."""

from __future__ import annotations

import json
import subprocess

from ddlib.specs.version import VERSION
from ddlib.store import paths
from ddlib.store.tags import TAG

def git_commit() -> str:
    """The checkout's commit (``-dirty`` with uncommitted changes); for an installed wheel, the
    commit pip recorded where it installed from a git URL (PEP 610's direct_url.json); else "unknown".
    A wheel's folder is never asked: git would answer for whatever repository holds the venv."""
    if not paths.IN_CHECKOUT:
        return _installed_commit() or "unknown"
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=paths.PROJECT_ROOT, capture_output=True, text=True, timeout=5)
        commit = out.stdout.strip()
        if not commit:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=paths.PROJECT_ROOT,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _installed_commit() -> str | None:
    import importlib.metadata

    try:
        text = importlib.metadata.distribution("ddlib").read_text("direct_url.json")
        return (json.loads(text or "{}").get("vcs_info") or {}).get("commit_id")
    except (importlib.metadata.PackageNotFoundError, ValueError, AttributeError):
        return None


def code_version() -> str:
    """``ddlib <version>``, with `` (commit <sha>)`` where the commit is known: what ``ddlib
    --version`` prints and a leaderboard bundle records."""
    commit = git_commit()
    return f"ddlib {VERSION}" + (f" (commit {commit})" if commit != "unknown" else "")


def default_tags(protocol: str, device: str | None = None) -> dict[str, str]:
    """The tags every run carries: its protocol, ddlib's version and commit, and the device when known."""
    tags = {TAG["protocol"]: protocol, TAG["version"]: VERSION, TAG["commit"]: git_commit()}
    if device is not None:
        tags[TAG["device"]] = str(device)
    return tags
