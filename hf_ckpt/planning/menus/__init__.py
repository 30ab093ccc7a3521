"""The finer planner's menus: ``oplevel`` (the op-level planner: its options per block, then the solver), and the
options it takes from ``frontier`` (the op sets of one block type worth keeping), ``partition`` (each block type's
min-cut partitions) and ``outside`` (the cheap modules between the blocks), each measured in real steps. The kinds
they offer live in :mod:`hf_ckpt.strategies`.
"""
