"""The one solver: given a menu (per block, its options with retained bytes, cost and overhead), pick each block's
option within a budget (``knapsack``); and the one planning path around it (``verified``: solve, measure the
candidate, tighten, record the plan). Every planner (measured, estimated, op-level) builds a menu and hands it to
``verified``; the package imports only the runtime (units, the plan record) and the strategy registry.
"""
