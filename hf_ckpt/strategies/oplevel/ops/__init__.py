"""The op-level kind's op records: ``profile`` (each op occurrence's kept bytes and recompute FLOPs, measured on
one block per type). The planner that uses them is :mod:`hf_ckpt.planning.menus.oplevel`, through the op sets that
avoid the most recompute per byte kept (:mod:`hf_ckpt.planning.menus.frontier`).
"""
