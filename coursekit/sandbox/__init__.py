"""Run untrusted notebook code in a sandbox; only data crosses back.

:mod:`coursekit.sandbox.host` is the trusted side (it starts sandboxes and talks to
them); :mod:`coursekit.sandbox.worker` runs inside the sandbox;
:mod:`coursekit.sandbox.protocol` is the data-only wire format between them.
"""

from coursekit.sandbox.host import (
    BUSY,
    CellFailed,
    Limits,
    MachineBusy,
    Remote,
    RemoteCrash,
    RemoteTimeout,
    SandboxError,
    Session,
    StudentError,
    StudentRaised,
    Worker,
    bubblewrap_works,
    choose_kind,
)

__all__ = [
    "BUSY",
    "CellFailed",
    "Limits",
    "MachineBusy",
    "Remote",
    "RemoteCrash",
    "RemoteTimeout",
    "SandboxError",
    "Session",
    "StudentError",
    "StudentRaised",
    "Worker",
    "bubblewrap_works",
    "choose_kind",
]
