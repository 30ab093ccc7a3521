"""The one solver (hf_ckpt.solver.knapsack): the exact choice on small hand-made menus, the tie order, the cheapest
fitting plan against brute force (with and without the front's units), the Pareto front against brute force, and
the error where no plan fits."""

import itertools
import random
import re

import pytest

from hf_ckpt.solver.knapsack import BlockProfile, Choice, FrontState, Option, pareto_front, solve, solve_menu


def _menu(*blocks):
    return [[Option(*option) for option in options] for options in blocks]


@pytest.mark.any_release
def test_the_cheapest_options_that_fit_are_chosen():
    """Three blocks keep 100 bytes each (base 10); a budget of 190 needs 120 saved. Checkpointing block 0 fully
    (saves 80, cost 50) and block 2 selectively (saves 40, cost 5) costs 55; every other fitting plan costs more."""
    menu = _menu(
        [("none", 100, 0), ("selective", 60, 30), ("full", 20, 50)],
        [("none", 100, 0), ("selective", 70, 40), ("full", 20, 90)],
        [("none", 100, 0), ("selective", 60, 5), ("full", 20, 60)],
    )
    for max_states in (2_000, 0):  # exact; one state per unit from the first block
        assert solve_menu(menu, 10, 190, max_states=max_states) == ("full", "none", "selective")
        assert solve_menu(menu, 10, 310, max_states=max_states) == ("none", "none", "none")  # the baseline fits
        assert solve_menu(menu, 10, 70, max_states=max_states) == ("full", "full", "full")  # only the smallest fits


@pytest.mark.any_release
def test_ties_go_to_fewer_checkpointed_blocks_then_to_less_overhead():
    one = _menu([("none", 100, 0), ("a", 50, 10, 2), ("b", 50, 10, 1)], [("none", 100, 0), ("a", 40, 0, 0)])
    # block 1's "a" saves 60 at no cost: enough alone, so block 0 keeps "none" (fewer checkpointed blocks)
    assert solve_menu(one, 0, 140) == ("none", "a")
    # both must save: block 0's options cost the same, "b" has less overhead
    assert solve_menu(one, 0, 90) == ("b", "a")


@pytest.mark.any_release
def test_ties_between_equal_totals_go_to_the_plan_whose_later_blocks_save_more():
    """Four twin blocks must save 240 bytes: the cheapest plans checkpoint two fully and two selectively (cost 26;
    three fully cost 27): the later blocks take "full", as the block planners always chose; and on a front."""
    twin = [("none", 100, 0), ("selective", 60, 4), ("full", 20, 9)]
    assert solve_menu(_menu(twin, twin, twin, twin), 0, 160) == ("selective", "selective", "full", "full")
    front = pareto_front([[Choice("x", 0, (0,)), Choice("y", 5, (1,))], [Choice("x", 0, (0,)), Choice("y", 5, (1,))]])
    assert front == [FrontState(0, (0,), ("x", "x")), FrontState(5, (1,), ("x", "y")), FrontState(10, (2,), ("y", "y"))]


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
    with pytest.raises(ValueError, match=re.escape(
        "no plan fits a budget of 0.75 MiB (37.5% of the 2.00 MiB retained without checkpointing): the smallest "
        "activation memory reachable with none, full, partition is 0.75 MiB (37.5%)"
    )):
        solve_menu(menu, 0, 3 * 2**18 - 1)


@pytest.mark.any_release
def test_the_cheapest_plan_whose_exact_bytes_fit_is_found():
    """Savings rounded to a byte unit lost plans that fit to the byte (BERT at the correct compile's bytes + 65,632:
    two blocks at `partition:0.9:norms` and two at `partition:0.5` fit exactly, and were not seen). Against brute
    force on random menus, with the exact front and with one state per unit from the first block: the plan fits,
    and no plan that fits costs less."""
    block = [("none", 10_000, 0, 0, 0), ("a", 10_000 - 4_097, 10, 2, 10), ("b", 10_000 - 9_000, 100, 2, 100)]
    # rounded down to units of 3 bytes, 'a' saved 1,365 units, two of them 2,730 of the 2,732 required: 'b' was taken
    for max_states in (2_000, 0):
        assert solve_menu(_menu(block, block), 0, 20_000 - 8_194, max_states=max_states) == ("a", "a")
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
                  for options, name in zip(menu, solve_menu(menu, base, budget))]
        assert base + sum(o.retained for o in chosen) <= budget
        assert cost(chosen) == min(cost(plan) for plan in fitting)
        units = [next(o for o in options if o.name == name)
                 for options, name in zip(menu, solve_menu(menu, base, budget, quanta=64, max_states=0))]
        assert base + sum(o.retained for o in units) <= budget


@pytest.mark.any_release
def test_the_front_of_a_0_1_knapsack_is_every_pareto_point_of_brute_force():
    """The op frontier's use: items kept or not; per avoided cost, the least (bytes, kept items) of all subsets,
    and no point another beats; the units (max_states=0) keep exact figures that brute force can reach."""
    rng = random.Random(1)
    for _ in range(100):
        items = [(rng.randint(1, 50) * 8, rng.choice((0, 1, 2, 3, 5, 8))) for _ in range(rng.randint(1, 7))]
        groups = [[Choice("", 0, (0, 0)), Choice("kept", cost, (size, 1))] for size, cost in items]
        best: dict[int, tuple[int, int]] = {}
        for kept in itertools.product((0, 1), repeat=len(items)):
            gain = sum(cost for (_, cost), k in zip(items, kept) if k)
            total = (sum(size for (size, _), k in zip(items, kept) if k), sum(kept))
            best[gain] = min(best.get(gain, total), total)
        pareto = [(gain, best[gain]) for gain in sorted(best) if all(best[more] > best[gain] for more in best
                                                                     if more > gain)]
        front = pareto_front(groups)
        assert [(state.gain, state.total) for state in front] == pareto
        for state in front:
            assert sum(cost for (_, cost), name in zip(items, state.names) if name) == state.gain
            assert (sum(size for (size, _), name in zip(items, state.names) if name),
                    sum(bool(name) for name in state.names)) == state.total
        for state in pareto_front(groups, quanta=4, max_states=0):
            assert state.total >= best[state.gain]
