"""Budgets: what ``enable(budget=...)`` accepts (``forms``: bytes, fractions, ``"auto"`` and the free memory it
reads) and a budget planned at the first real training batch when no ``sample_inputs`` are given: its record, plan
file and log line (``record``), each plan made from the estimate, the optimizer's first-step state counted by
``hf_ckpt.meters.optimizer_states`` (``from_estimate``), and the hook that plans (``deferred``). This is the one way
from the public layer into the lab.
"""
