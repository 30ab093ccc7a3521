"""The one solver: given a menu (per block, its options with retained bytes, cost and overhead), pick each block's
option within a budget (``knapsack``). Every planner (measured, estimated, op-level) builds a menu and calls it; it
imports only the runtime's units and the strategy registry.
"""
