"""The wire header's algorithm codes: registry indices for flat algorithms, a checksum of the
whole description for two-level ones, so two different two-level algorithms are a mismatch."""

from hccl_py.algorithms.registry import ALL_ALGOS, TWO_LEVEL_CODES, algo_code, algo_label


def test_flat_algorithms_keep_their_index_and_two_level_ones_a_checksum():
    assert [algo_code(a) for a in ALL_ALGOS if a != "hier"] == [i for i, a in enumerate(ALL_ALGOS) if a != "hier"]
    assert max(range(len(ALL_ALGOS))) < TWO_LEVEL_CODES.start  # room for the flat names
    one = algo_code("hier:mesh/ring@server", "hier[0,1;2,3]:mesh/ring")
    assert one in TWO_LEVEL_CODES and one == algo_code("hier:mesh/ring@server", "hier[0,1;2,3]:mesh/ring")  # stable
    others = {
        algo_code("hier:mesh/hd@server", "hier[0,1;2,3]:mesh/hd"),
        algo_code("hier:mesh/ring", "hier[0,2;1,3]:mesh/ring"),
    }
    assert one not in others
    assert algo_label(one) == f"hier (two-level #{one})" and algo_label(0) == ALL_ALGOS[0]
