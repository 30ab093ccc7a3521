"""Run the ```python blocks of Markdown pages, as ``tests/test_docs.py`` does: ``python _docs_runner.py PAGE...``.

All pages run in one interpreter (imports are paid once), each in its own directory; after a page, what it
switched on for the whole process is undone (``hf_ckpt.unpatch_transformers()``). Each block runs in a fresh namespace holding the fixture below (a tiny Llama ``model`` and ``base_model``, its
``config``, a ``batch`` and a ``dataset``, ``hf_ckpt``, ``torch`` and the transformers names the docs use), in the
current directory (files a block writes, such as ``plan.json``, stay for the next blocks of the same page).
A marker on the line directly above a block changes that:

* ``<!-- docs-test: skip (REASON) -->``: not run; the reason is required (say what the block needs);
* ``<!-- docs-test: continue -->``: run in the previous block's namespace (a page that builds on its last block);
* ``<!-- docs-test: process-group -->``: run inside a one-process gloo process group (DDP, FSDP2 on a CPU).

The first block of a page that raises ends that page: its page and line, and the traceback, on stderr; exit
status 1.
"""

from __future__ import annotations

import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

_FENCE = re.compile(r"^```python\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
_MARKER = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->$")
_SKIP = re.compile(r"^skip \((.+)\)$")


@dataclass
class Block:
    path: str
    line: int
    code: str
    marker: str | None  # "skip", "continue", "process-group" or None
    reason: str | None = None


def blocks(path: Path) -> list[Block]:
    """The ```python blocks of ``path`` with their markers; ValueError for a malformed marker."""
    text = path.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        above = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        marker = reason = None
        spelled = _MARKER.match(above)
        if spelled:
            word = spelled.group(1)
            skip = _SKIP.match(word)
            if skip:
                marker, reason = "skip", skip.group(1).strip()
            elif word in ("continue", "process-group"):
                marker = word
            else:
                raise ValueError(
                    f"{path}:{line - 1}: unknown docs-test marker {word!r}; use 'skip (REASON)', 'continue' or "
                    "'process-group'"
                )
        elif "docs-test" in above:
            raise ValueError(f"{path}:{line - 1}: malformed docs-test marker {above!r}")
        found.append(Block(str(path), line, match.group(1), marker, reason))
    return found


def fixture() -> dict:
    """A fresh namespace: what the docs' snippets assume exists."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    import hf_ckpt

    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, use_cache=False,
    )
    torch.manual_seed(0)
    torch.set_num_threads(1)  # a tiny model: threads only add contention on a loaded CI machine
    ids = torch.randint(0, 128, (2, 16))
    rows = torch.randint(0, 128, (4, 16))  # with the Trainer's defaults: one step per epoch, 3 epochs
    return {
        "__name__": "__docs__",
        "hf_ckpt": hf_ckpt,
        "torch": torch,
        "LlamaConfig": LlamaConfig,
        "LlamaForCausalLM": LlamaForCausalLM,
        "LlamaDecoderLayer": LlamaDecoderLayer,
        "Trainer": Trainer,
        "TrainingArguments": TrainingArguments,
        "config": config,
        "model": LlamaForCausalLM(config),
        "base_model": LlamaForCausalLM(config),
        "batch": {"input_ids": ids, "labels": ids.clone()},
        "dataset": [{"input_ids": row, "labels": row.clone()} for row in rows],
    }


def _process_group():
    import contextlib
    import os
    import socket

    import torch.distributed as dist

    @contextlib.contextmanager
    def group():
        with socket.socket() as probe:  # a free port
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()

    return group()


def run(path: Path, log: list[str]) -> bool:
    """Run the blocks of ``path``; False at the first block that raises (its traceback appended to ``log``)."""
    namespace: dict | None = None
    for block in blocks(path):
        if block.marker == "skip":
            log.append(f"{block.path}:{block.line}: skipped ({block.reason})")
            continue
        if block.marker != "continue" or namespace is None:
            namespace = fixture()
        try:
            compiled = compile(block.code, f"{block.path}:{block.line}", "exec")
            if block.marker == "process-group":
                with _process_group():
                    exec(compiled, namespace)
            else:
                exec(compiled, namespace)
        except BaseException:  # noqa: BLE001  (SystemExit included: a snippet that exits has failed too)
            log.append(f"{block.path}:{block.line}: the block raised\n{traceback.format_exc()}")
            return False
        log.append(f"{block.path}:{block.line}: ok")
    return True


def _reset() -> None:
    """Undo what a page may have switched on for the whole process (the next page starts as a user would)."""
    import hf_ckpt

    if hf_ckpt.is_patched():
        hf_ckpt.unpatch_transformers()


def main(argv: list[str]) -> int:
    """``_docs_runner.py [--json OUT] PAGE...``: each page in a subdirectory of the current one.

    Prints each block's outcome; with ``--json``, also writes ``{page: {"ok": bool, "log": [...]}}`` to OUT.
    Exit status 1 when any page failed.
    """
    import json
    import os

    out = None
    if argv[:1] == ["--json"]:
        out, argv = argv[1], argv[2:]
    results = {}
    home = Path.cwd()
    for index, page in enumerate(argv):
        workdir = home / f"page{index}"
        workdir.mkdir(exist_ok=True)
        os.chdir(workdir)
        log: list[str] = []
        try:
            ok = run(Path(page), log)
        finally:
            os.chdir(home)
            _reset()
        results[page] = {"ok": ok, "log": log}
        print("\n".join(log), file=sys.stdout if ok else sys.stderr, flush=True)
    if out is not None:
        Path(out).write_text(json.dumps(results, indent=1))
    return 0 if all(result["ok"] for result in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
