"""Budgets: what ``enable(budget=...)`` accepts (``forms``: bytes, fractions, ``"auto"`` and the free memory it
reads), what the optimizer will need beside the activations (counted by ``hf_ckpt.meters.optimizer_states``), and a budget planned at the first real training batch when no ``sample_inputs`` are given
(``deferred``). This is the one way from the public layer into the lab.
"""
