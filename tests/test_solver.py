"""The one solver (hf_ckpt.solver.knapsack): the exact choice on small hand-made menus, both ways (quantised for the
block planners, exact for the op-level planner), the cheapest fitting plan against brute force, and the error where
no plan fits."""

import itertools
import random
import re

import pytest

from hf_ckpt.solver.knapsack import BlockProfile, Option, solve, solve_menu


def _menu(*blocks):
    return [[Option(*option) for option in options] for options in blocks]


@pytest.mark.any_release
def test_the_cheapest_options_that_fit_are_chosen_both_ways():
    """Three blocks keep 100 bytes each (base 10); a budget of 190 needs 120 saved. Checkpointing block 0 fully
    (saves 80, cost 50) and block 2 selectively (saves 40, cost 5) costs 55; every other fitting plan costs more."""
    menu = _menu(
        [("none", 100, 0), ("selective", 60, 30), ("full", 20, 50)],
        [("none", 100, 0), ("selective", 70, 40), ("full", 20, 90)],
        [("none", 100, 0), ("selective", 60, 5), ("full", 20, 60)],
    )
    for exact in (False, True):
        assert solve_menu(menu, 10, 190, exact=exact) == ("full", "none", "selective")
        assert solve_menu(menu, 10, 310, exact=exact) == ("none", "none", "none")  # the baseline fits
        assert solve_menu(menu, 10, 70, exact=exact) == ("full", "full", "full")  # only the smallest fits


@pytest.mark.any_release
def test_ties_go_to_fewer_checkpointed_blocks_then_to_less_overhead():
    one = _menu([("none", 100, 0), ("a", 50, 10, 2), ("b", 50, 10, 1)], [("none", 100, 0), ("a", 40, 0, 0)])
    # block 1's "a" saves 60 at no cost: enough alone, so block 0 keeps "none" (fewer checkpointed blocks)
    assert solve_menu(one, 0, 140) == ("none", "a")
    # both must save: block 0's options cost the same, "b" has less overhead
    assert solve_menu(one, 0, 90, exact=True) == ("b", "a")


@pytest.mark.any_release
def test_the_block_profile_is_solved_through_its_menu():
    profile = BlockProfile(
        base_bytes=10,
        retained={"none": (100, 100), "full": (20, 30), "selective": (60, 50)},
        recompute_flops={"none": (0, 0), "full": (9, 8), "selective": (3, 4)},
        unusable={},
    )
    assert [[option.name for option in options] for options in profile.menu()] == [["none", "selective", "full"]] * 2
    assert profile.menu()[1][2] == Option("full", 30, 8, 0, 8)
    chosen = solve(profile, 100)  # 110 saved: selective then full (cost 11), not full then selective (13)
    assert chosen == ("selective", "full") and profile.predicted_bytes(chosen) == 100
    assert profile.predicted_recompute_flops(chosen) == 11


@pytest.mark.any_release
def test_an_unreachable_budget_names_the_smallest_memory_reachable():
    menu = _menu([("none", 2**20, 0), ("full", 2**19, 1)], [("none", 2**20, 0), ("partition:0.5", 2**18, 1)])
    assert solve_menu(menu, 0, 3 * 2**18) == ("full", "partition:0.5")
    for exact in (False, True):
        with pytest.raises(ValueError, match=re.escape(
            "no plan fits a budget of 0.75 MiB (37.5% of the 2.00 MiB retained without checkpointing): the smallest "
            "activation memory reachable with none, full, partition is 0.75 MiB (37.5%)"
        )):
            solve_menu(menu, 0, 3 * 2**18 - 1, exact=exact)


@pytest.mark.any_release
def test_the_exact_way_finds_the_cheapest_plan_whose_exact_bytes_fit():
    """Savings rounded to a byte unit lost plans that fit to the byte (BERT at the correct compile's bytes + 65,632:
    two blocks at `partition:0.9:norms` and two at `partition:0.5` fit exactly, and were not seen). Against brute
    force on random menus: the plan fits, and no plan that fits costs less."""
    block = [("none", 10_000, 0, 0, 0), ("a", 10_000 - 4_097, 10, 2, 10), ("b", 10_000 - 9_000, 100, 2, 100)]
    assert solve_menu(_menu(block, block), 0, 20_000 - 8_194, exact=True) == ("a", "a")  # rounded, 'b' was taken
    # quantised (the block planners; the op-level planner where its front gives way): 'a' saves 1,365 units of 3
    # bytes, two of them 2,730 of the 2,732 required
    assert solve_menu(_menu(block, block), 0, 20_000 - 8_194) == ("none", "b")
    assert solve_menu(_menu(block, block), 0, 20_000 - 8_194, exact=True, max_states=0) == ("none", "b")
    rng = random.Random(0)
    for _ in range(200):
        menu = []
        for _ in range(rng.randint(1, 4)):
            none = rng.randint(1_000, 50_000)
            options = [Option("none", none, 0, 0, 0)]
            for k in range(rng.randint(1, 5)):
                cost = rng.randint(1, 1_000)
                options.append(Option(f"o{k}", rng.randint(0, none), cost, rng.randint(1, 2), cost))
            menu.append(options)
        base = rng.randint(0, 10_000)
        smallest = base + sum(min(o.retained for o in options) for options in menu)
        budget = rng.randint(smallest, base + sum(options[0].retained for options in menu))

        def cost(plan):
            return (sum(o.cost for o in plan), sum(o.name != "none" for o in plan), sum(o.overhead for o in plan))

        fitting = [plan for plan in itertools.product(*menu) if base + sum(o.retained for o in plan) <= budget]
        chosen = [next(o for o in options if o.name == name)
                  for options, name in zip(menu, solve_menu(menu, base, budget, exact=True))]
        assert base + sum(o.retained for o in chosen) <= budget
        assert cost(chosen) == min(cost(plan) for plan in fitting)
