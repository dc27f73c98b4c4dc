"""Step 2, *run*: a submission's code cells, one at a time, in the sandbox.

A cell that hangs, kills its process or harms the sandbox is stopped, noted for the student, and
the notebook runs again without it. What comes back is hostile data: every cell's outputs are
rebuilt on the trusted side (:func:`coursekit.inert.clean_outputs`) before anything keeps them.
"""

from __future__ import annotations

import time

from coursekit import inert
from coursekit.sandbox import BUSY, CellFailed, Worker
from coursekit.sandbox.host import CellBusy

__all__ = ["run_notebook"]


def run_notebook(worker: Worker, cells, files, deadline: float, verdict: dict, watch=()):
    """Run the code cells; skip (and note) any that hang or kill the process. Returns the session.
    ``watch``: the references whose calls the sandbox records (see :meth:`Worker.session`).

    A cell that a busy machine kept from running in time (:class:`CellBusy`) is not the student's
    doing: the notebook runs again with it; busy twice, the notebook is not graded now
    (``verdict["busy"]`` says why, and ``None`` is returned): the instructor runs it again."""
    skipped: dict[str, str] = {}
    busy: set[str] = set()  # cells a busy machine stopped once
    noted: set[str] = set()  # cells whose dropped outputs were noted (once, whatever the attempts)
    for _attempt in range(4):
        if worker.broken or not worker.alive():  # the student's code stopped or killed the sandbox's template
            worker.restart()
        session = worker.session(files=files, watch=watch)
        failed = None
        images = inert.ImageBudget()  # the embedded images of this run's outputs, over the whole notebook
        for cid, source, label in cells:
            if cid in skipped:
                continue
            try:
                reply = session.run_cell(source, label, deadline)
            except CellBusy as e:
                if cid in busy:
                    session.close()
                    verdict["busy"] = f"{BUSY} to run the cell {label!r}, twice ({e})"
                    return None
                busy.add(cid)
                failed = (cid, label, None)
                break
            except CellFailed as e:
                failed = (cid, label, str(e))
                break
            # the sandbox's answer is hostile data: keep only well-formed, inert outputs
            outputs, dropped = inert.clean_outputs(reply.get("outputs", []), images=images)
            count = reply.get("execution_count")
            verdict["outputs"][cid] = {
                "outputs": outputs,
                "execution_count": count if type(count) is int else None,
            }
            if dropped and cid not in noted:
                noted.add(cid)
                where = f"the cell {label!r}" if not label.startswith("added cell") else "a cell you added"
                verdict["notes"].append(f"in {where}: {'; '.join(dropped[:3])}")
        if failed is None:
            session.revive = lambda: _revive(worker, cells, skipped, files, deadline, watch)
            return session
        cid, label, why = failed
        session.close()
        if why is None:  # stopped by a busy machine: run the notebook again, with this cell
            continue
        skipped[cid] = why
        where = f"the cell {label!r}" if not label.startswith("added cell") else "a cell you added"
        verdict["notes"].append(f"{where} was stopped: {why}; the rest of the notebook ran without it")
        verdict["outputs"][cid] = {
            "outputs": [_error_output("Stopped", f"this cell was stopped by the autograder: {why}")],
            "execution_count": None,
        }
        if time.monotonic() >= deadline:
            break
    verdict["notes"].append("your notebook could not be run to the end; the remaining checks failed")
    return None


def _revive(worker, cells, skipped, files, deadline, watch=()):
    """A fresh notebook process with the same state, after the sandbox killed the last one."""
    if worker.broken or not worker.alive():
        worker.restart()
    session = worker.session(files=files, watch=watch)
    for cid, source, label in cells:
        if cid not in skipped:
            session.run_cell(source, label, deadline)
    return session


def _error_output(ename: str, evalue: str) -> dict:
    return {"output_type": "error", "ename": ename, "evalue": evalue, "traceback": [f"{ename}: {evalue}"]}
