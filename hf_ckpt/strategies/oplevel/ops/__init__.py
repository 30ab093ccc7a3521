"""The op-level kind's op records: ``profile`` (each op occurrence's kept bytes and recompute FLOPs, measured on
one block per type) and ``frontier`` (the op sets that avoid the most recompute per byte kept). The planner that
uses them is :mod:`hf_ckpt.planning.menus.oplevel`.
"""
