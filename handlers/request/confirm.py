"""Confirmations as people read them (the pending requests live in :mod:`pipeline.state.confirmations`)."""

from __future__ import annotations

from pipeline.fmt import who

# --- text ---------------------------------------------------------------------------------------


def confirm_ask(text: str, job: str, seconds: float) -> str:
    """A job configured with ``confirm = true`` asks before acting."""
    return f"`{text}` - {job} asks for confirmation: confirm within {seconds:g} s or it is cancelled"


def confirm_expired(text: str, seconds: float) -> str:
    """No confirmation came in time."""
    return f"not confirmed within {seconds:g} s - `{text}` was cancelled, nothing was done"


def confirm_not_yours(owner: str) -> str:
    """Someone else clicked another person's confirmation."""
    return f"only {who(owner)}, who asked, can answer this confirmation"


def confirm_cancelled(text: str, user: str) -> str:
    """The requester declined their own confirmation."""
    return f"`{text}` cancelled by {who(user)} - nothing was done"
