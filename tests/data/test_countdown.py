"""countdown: generation (constraints, determinism, at least k solutions), the solution counts
against an independent enumeration of expression trees, reachability, diverse references, and
the group statistic of distinct right solutions."""

import itertools
import random

import pytest

from ibpo_jax.data import countdown

SMALL = countdown.CountdownConfig(min_numbers=4, max_numbers=5)


def _trees(numbers: tuple[int, ...], max_value: int) -> dict[frozenset, set]:
    """{subset of positions: {(value, canonical text)}} by explicit enumeration: children of
    + and * (and of equal-valued - and /) sorted by text, - and / larger value first."""
    out = {frozenset([i]): {(x, str(x))} for i, x in enumerate(numbers)}
    for size in range(2, len(numbers) + 1):
        for subset in itertools.combinations(range(len(numbers)), size):
            trees = set()
            for k in range(1, size):
                for left in itertools.combinations(subset, k):
                    right = frozenset(subset) - frozenset(left)
                    for (a, ta), (b, tb) in itertools.product(out[frozenset(left)], out[right]):
                        (a, ta), (b, tb) = sorted([(a, ta), (b, tb)], key=lambda p: p[1])
                        hi, lo = ((a, ta), (b, tb)) if a >= b else ((b, tb), (a, ta))
                        for value, text in ((a + b, f"({ta}+{tb})"), (a * b, f"({ta}*{tb})"),
                                            (hi[0] - lo[0], f"({hi[1]}-{lo[1]})"),
                                            (hi[0] // lo[0] if hi[0] % lo[0] == 0 else 0,
                                             f"({hi[1]}/{lo[1]})")):
                            if 1 <= value <= max_value:
                                trees.add((value, text))
            out[frozenset(subset)] = trees
    return out


@pytest.mark.parametrize("numbers", [(2, 3, 7, 9), (4, 5, 6, 8), (2, 3, 5, 7, 9)])
def test_solution_counts_match_an_enumeration_of_trees(numbers):
    counts = countdown.solution_counts(list(numbers), 99)
    trees = _trees(numbers, 99)
    for mask, vector in counts.items():
        subset = frozenset(i for i in range(len(numbers)) if mask >> i & 1)
        expected = [0] * 100
        for value, _ in trees[subset]:
            expected[value] += 1
        assert vector.tolist() == expected, subset


def test_reachable_agrees_with_the_counts():
    rng = random.Random(0)
    for _ in range(30):
        numbers = rng.sample(range(2, 10), 4)
        counts = countdown.solution_counts(numbers, 99)
        for target in range(1, 100):
            by_counts = target in numbers or any(
                c[target] for m, c in counts.items() if m & (m - 1))
            assert countdown.reachable(tuple(sorted(numbers)), target, 99) == by_counts


def test_generated_problems_obey_the_config():
    records = countdown.generate(SMALL, 7, 60, id_prefix="t/")
    assert [r["id"] for r in records[:2]] == ["t/0", "t/1"]
    assert len({r["question"] for r in records}) == 60
    for r in records:
        numbers, target = r["numbers"], r["target"]
        assert SMALL.min_numbers <= len(numbers) <= SMALL.max_numbers
        assert len(set(numbers)) == len(numbers) and all(2 <= x <= 12 for x in numbers)
        assert 10 <= target <= 99 and target not in numbers
        assert r["question"] == f"Make {target} from {' '.join(map(str, numbers))}."
        assert numbers == sorted(numbers)
        counts = countdown.solution_counts(numbers, 99)
        by_size = {}  # solutions per number of steps, from the subset counts directly
        for m, c in counts.items():
            if m & (m - 1) and c[target]:
                steps = bin(m).count("1") - 1
                by_size[steps] = by_size.get(steps, 0) + int(c[target])
        assert r["num_steps"] == min(by_size)
        assert r["num_solutions"] == by_size[min(by_size)] >= SMALL.min_solutions
        assert r["num_solutions_all"] == sum(by_size.values())
        verdict = countdown.check(r["reference"], r)
        assert verdict.correct and verdict.first_wrong_step is None, (r, verdict.reason)
        assert r["reference"].count("\n") == r["num_steps"]  # a shortest solution
    assert countdown.generate(SMALL, 7, 60, id_prefix="t/") == records
    assert countdown.generate(SMALL, 8, 60)[0]["question"] != records[0]["question"]


def test_min_solutions_filters_and_exclude_is_respected():
    many = countdown.CountdownConfig(min_numbers=6, max_numbers=6, min_solutions=8)
    records = countdown.generate(many, 1, 30)
    assert min(r["num_solutions"] for r in records) >= 8
    again = countdown.generate(many, 1, 30, exclude={records[0]["question"]})
    assert records[0]["question"] not in {r["question"] for r in again}
    with pytest.raises(ValueError, match="could only draw"):
        countdown.generate(countdown.CountdownConfig(
            min_numbers=2, max_numbers=2, max_number=3, min_target=10), 0, 1)


def test_references_of_one_problem_are_the_shortest_solutions_in_every_order():
    # 42 from 2 3 7 9 in two steps, by hand: 7*3*2 three ways and (9-3)*7.
    numbers, target = [2, 3, 7, 9], 42
    counts = countdown.solution_counts(numbers, 99)
    rng = random.Random(0)
    record = {"numbers": numbers, "target": target, "max_value": 99}
    texts = [countdown.random_solution(counts, target, 99, rng) for _ in range(80)]
    assert all(countdown.check(t, record).correct for t in texts)
    assert {countdown.solution_key(t) for t in texts} == {
        ("21*2=42", "7*3=21"), ("14*3=42", "7*2=14"), ("3*2=6", "7*6=42"),
        ("7*6=42", "9-3=6")}
    # 41 = 9*3 + 7*2 is its one shortest solution: its two independent steps come in both orders
    texts = {countdown.random_solution(counts, 41, 99, rng) for _ in range(40)}
    assert texts == {"9*3=27\n7*2=14\n27+14=41\nAnswer: 41",
                     "7*2=14\n9*3=27\n27+14=41\nAnswer: 41"}
    with pytest.raises(ValueError, match="no solution reaches 97"):
        countdown.random_solution(counts, 97, 99, rng)


def test_solution_key_ignores_order_and_operand_order():
    a = countdown.solution_key("7*3=21\n9-2=7\nAnswer: 42")
    assert a == countdown.solution_key("9-2=7\n3*7=21\nAnswer: 42")
    assert a != countdown.solution_key("9-3=6\n7*6=42\nAnswer: 42")


def test_group_solution_stats():
    s1, s1_reordered, s2 = ("7*3=21\n21*2=42\nAnswer: 42", "3*7=21\n2*21=42\nAnswer: 42",
                            "9-3=6\n7*6=42\nAnswer: 42")
    texts = [s1, s1_reordered, s2, "x",  # group 0: 3 right, 2 solutions, 3 texts
             s1, s1, "y", "z",           # group 1: 2 right, one solution
             "a", "b", "c", "d"]         # group 2: none right, not counted
    correct = [True, True, True, False, True, True, False, False, False, False, False, False]
    stats = countdown.group_solution_stats(texts, correct, 4)
    assert stats == {"groups_with_right": 2, "right_per_group": 2.5,
                     "distinct_solutions_per_group": 1.5, "distinct_texts_per_group": 2.0,
                     "frac_groups_one_solution": 0.5}
    with pytest.raises(ValueError, match="group_size 5"):
        countdown.group_solution_stats(texts, correct, 5)


def test_config_checks():
    with pytest.raises(ValueError, match="min_numbers <= max_numbers"):
        countdown.CountdownConfig(min_numbers=5, max_numbers=4)
    with pytest.raises(ValueError, match="max_number=5 leaves fewer"):
        countdown.CountdownConfig(max_number=5)
    with pytest.raises(ValueError, match=r"min_target in \[1, max_value\]"):
        countdown.CountdownConfig(min_target=0)
