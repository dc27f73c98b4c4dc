"""One-off: convert the three committed checkpoints to the one format of ``coursekit.checkpoints``.

    .venv/bin/python scripts/convert_checkpoints.py [checkpoints]

Until issue 18 each checkpoint had a format of its own: ``coursekit-pretrained`` (gpt-char),
``coursekit-seq2seq`` (seq2seq-numbers) and ``coursekit-bert`` / ``coursekit-bert-metrics``
(bert-small: weights wrapped in a dict with their config, the tokenizer in
``bert-small-tokenizer.json``). Nothing is retrained: the weights and every recorded metric
are copied as they are (the script checks that the converted checkpoints load to the very
same tensors), only the records are rewritten and bert-small's weights unwrapped. Kept for
the record; it refuses to run on files that are already converted.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch


def write_record(path: Path, record: dict) -> None:
    path.write_text(json.dumps(record, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def machine(text: str) -> dict:
    """``"x86_64, 1 threads, torch 2.13.0+cpu"`` -> the environment it describes."""
    m = re.fullmatch(r"(.+), (\d+) threads, torch (.+)", text)
    return {"torch": m[3], "threads": int(m[2]), "machine": m[1]}


def header(name: str, model: str) -> dict:
    return {"format": "coursekit-checkpoint", "version": 1, "name": name, "model": model}


def convert(folder: Path) -> dict[str, dict]:
    old = {n: json.loads((folder / f"{n}.json").read_text(encoding="utf-8"))
           for n in ("gpt-char", "seq2seq-numbers", "bert-small")}
    expected = {"gpt-char": "coursekit-pretrained", "seq2seq-numbers": "coursekit-seq2seq",
                "bert-small": "coursekit-bert-metrics"}
    for n, fmt in expected.items():
        if old[n]["format"] != fmt:
            raise SystemExit(f"{folder / n}.json is {old[n]['format']!r}, not {fmt!r}: already converted?")

    g = old["gpt-char"]
    write_record(folder / "gpt-char.json", {
        **header("gpt-char", "GPT"), "config": g["model"],
        "tokenizer": {"kind": "char", "file": "gpt-char.tokenizer.json"},
        "recipe": {"train": g["train"], "minutes": None}, "command": g["command"], "metrics": g["metrics"],
        "environment": machine(g["metrics"]["machine"]),
    })

    s = old["seq2seq-numbers"]
    write_record(folder / "seq2seq-numbers.json", {
        **header("seq2seq-numbers", "Seq2Seq"), "config": s["model"], "tokenizer": {"kind": "words", **s["vocab"]},
        "recipe": {k: s[k] for k in ("train", "smoothing", "sampling_rate", "val_numbers")},
        "command": s["command"], "metrics": s["metrics"], "environment": machine(s["metrics"]["machine"]),
    })

    b = old["bert-small"]
    state = torch.load(folder / "bert-small.pt", map_location="cpu", weights_only=True)
    assert state["format"] == "coursekit-bert" and state["config"] == b["config"] and state["special"] == b["special"]
    torch.save(state["model"], folder / "bert-small.pt")
    (folder / "bert-small-tokenizer.json").rename(folder / "bert-small.tokenizer.json")
    t, ft = b["train"], b["finetune"]
    short = t["phases"][0]
    write_record(folder / "bert-small.json", {
        **header("bert-small", "BertForMaskedLM"), "config": b["config"],
        "tokenizer": {"kind": "bpe", "file": "bert-small.tokenizer.json", "special": b["special"]},
        "recipe": {"base_vocab_size": b["base_vocab_size"], "preset": "small", "max_steps": t["max_steps"],
                   "batch_size": t["batch_size"], "lr": t["lr"], "short_len": short["seq_len"],
                   "short_fraction": short["steps"] / t["max_steps"], "finetune_steps": ft["steps"],
                   "finetune_lr": ft["lr"], "seed": t["seed"]},
        "command": "coursekit pretrain bert-small",
        "metrics": {k: b[k] for k in ("train", "validation", "baselines", "finetune")},
        "environment": {**b["versions"], "threads": t["threads"]},
    })
    return old


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "checkpoints")
    before = {n: torch.load(folder / f"{n}.pt", map_location="cpu", weights_only=True)
              for n in ("gpt-char", "seq2seq-numbers", "bert-small")}
    before["bert-small"] = before["bert-small"]["model"]
    old = convert(folder)

    from coursekit import checkpoints

    for name, weights in before.items():
        model, _, record = checkpoints.load(name, folder)
        state = model.state_dict()
        assert all(torch.equal(state[k], v.float()) for k, v in weights.items()), name
        recorded = old[name]["metrics"] if "metrics" in old[name] else {k: old[name][k] for k in record["metrics"]}
        assert record["metrics"] == recorded, name
        assert set(record["metrics"]) == set(checkpoints.REGISTRY[name].metrics), name
        print(f"{name}: {len(weights)} tensors and {len(record['metrics'])} metrics carried over unchanged")


if __name__ == "__main__":
    main()
