"""Helpers of the experiment tests: the shipped plans and a fake job."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLANS = sorted((REPO / "configs" / "experiments").glob("*.json"))


def job(name: str, code: str = "pass", **fields) -> dict:
    """A plan job that runs `code` in this interpreter."""
    return {"name": name, "run": ["python", "-c", code], **fields}
