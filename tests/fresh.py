"""Scripts run as a user's fresh interpreter would run them, several at the cost of one interpreter start.

A test that asks "which hf_ckpt modules does this script load?" needs a process where no hf_ckpt module is loaded
yet; starting one interpreter per case costs the import of torch and transformers each time (seconds on 5.x).
:func:`run_fresh` starts one interpreter, imports there what every such script imports first (torch,
transformers, its Llama classes) and nothing of hf_ckpt, then forks one child per case: each child starts with the
same modules loaded as a fresh interpreter that has run those imports, runs the script as ``__main__`` with its
own ``sys.argv``, and exits. The children run one after another (each is the only one using torch's threads).
"""

from __future__ import annotations

import json
import subprocess
import sys

_RUNNER = r"""
import io, json, os, sys, traceback
import torch, transformers
from transformers import LlamaConfig, LlamaForCausalLM
assert not [name for name in sys.modules if name.startswith("hf_ckpt")], "the runner must not load hf_ckpt"
script, cases = json.loads(sys.stdin.read())
results = []
for argv in cases:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        out, status = io.StringIO(), 0
        sys.argv, sys.stdout = ["-c", *argv], out
        try:
            exec(compile(script, "<string>", "exec"), {"__name__": "__main__"})
        except BaseException:
            status = 1
            out.write(traceback.format_exc())
        with os.fdopen(write, "wb") as pipe:
            pipe.write(out.getvalue().encode())
        os._exit(status)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        printed = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    results.append({"argv": argv, "exit_status": os.waitstatus_to_exitcode(status), "stdout": printed})
print(json.dumps(results))
"""


def run_fresh(script: str, cases: list[list[str]]) -> list[str]:
    """What ``script`` prints, run once per argument list in ``cases`` (``sys.argv[1:]``), each in a child that
    starts without any hf_ckpt module loaded; raises ``AssertionError`` with the child's output if one fails."""
    done = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps([script, cases]), capture_output=True,
                          text=True, check=True)
    results = json.loads(done.stdout.strip().splitlines()[-1])
    failed = [result for result in results if result["exit_status"] != 0]
    assert not failed, "\n".join(f"{r['argv']}: exit status {r['exit_status']}\n{r['stdout']}" for r in failed)
    return [result["stdout"] for result in results]
