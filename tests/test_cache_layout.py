"""cache/layout.py: a sequence state cut at a position and joined again gives back its bytes."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from pyllama_cli.core.serving.cache import layout


def _state(positions: list[int], v_trans: int, n_layer: int = 2, n_stream: int = 2, row: int = 8,
           stream: int = 1) -> bytes:
    """A state in llama_state_seq_get_data's layout: the cells in `stream`, the other streams empty."""
    rng = np.random.default_rng(len(positions) + v_trans)
    n = len(positions)
    out = [struct.pack("<Ii", 0x12345678, 1), struct.pack("<I", n_stream), *[struct.pack("<I", 0)] * stream,
           struct.pack("<I", n)]
    out += [struct.pack("<iIi", pos, 1, 1) for pos in positions]
    out.append(struct.pack("<II", v_trans, n_layer))
    for _ in range(n_layer):
        out += [struct.pack("<iQ", 1, row), rng.bytes(n * row)]
    for _ in range(n_layer):
        if v_trans:
            out += [struct.pack("<iII", 1, 2, 4), rng.bytes(4 * n * 2)]  # 4 rows of n elements of 2 bytes
        else:
            out += [struct.pack("<iQ", 1, row), rng.bytes(n * row)]
    out += [struct.pack("<I", 0)] * (n_stream - stream - 1)
    return b"".join(out)


@pytest.mark.parametrize("v_trans", [0, 1])
def test_a_state_split_at_a_position_joins_back_to_the_same_bytes(v_trans: int) -> None:
    data = _state(list(range(10)), v_trans)
    low, high = layout.split(layout.parse(data), 6)
    assert [s.n_cells if s else 0 for s in low.streams] == [0, 6]
    assert [s.n_cells if s else 0 for s in high.streams] == [0, 4]
    assert bytes(layout.join(low, high)) == data
    assert bytes(layout.join(low, layout.above(layout.parse(data), 6))) == data
    headers = 8 + 4 + 2 * 4 + 8 + 4 * 12  # magic and seq id, n_stream, cell counts, v_trans and n_layer, 4 layer heads
    assert layout.nbytes(low) + layout.nbytes(high) == len(data) - headers


def test_cells_are_split_by_position_not_by_order() -> None:
    data = _state([5, 0, 6, 1], 1)
    low, high = layout.split(layout.parse(data), 2)
    assert low.streams[1].meta["pos"].tolist() == [0, 1]
    assert high.streams[1].meta["pos"].tolist() == [5, 6]
    again = layout.parse(layout.join(low, high))
    assert again.streams[1].meta["pos"].tolist() == [0, 1, 5, 6]


def test_a_layout_it_does_not_know_is_refused() -> None:
    data = _state(list(range(4)), 0)
    assert layout.parse(data[:-1]) is None  # cut short
    assert layout.parse(data + b"\0") is None  # trailing bytes
    extended = data.replace(struct.pack("<iIi", 2, 1, 1), struct.pack("<iIi", 2, 2, 1), 1)
    assert layout.parse(extended) is None  # a cell in two sequences, or another record size


@pytest.mark.parametrize("v_trans", [0, 1])
def test_the_cells_of_two_slots_states_join_into_one_stream(v_trans: int) -> None:
    # A restore clears the destination sequence at every stream it reads: two non-empty streams would
    # leave only the second one's cells.
    base = layout.split(layout.parse(_state(list(range(8)), v_trans, stream=0)), 5)[0]
    rest = layout.split(layout.parse(_state(list(range(9)), v_trans, stream=1)), 5)[1]
    joined = layout.parse(layout.join(base, rest))
    assert [s.n_cells if s else 0 for s in joined.streams] == [9, 0]
    assert joined.streams[0].meta["pos"].tolist() == list(range(9))
    whole = layout.parse(_state(list(range(9)), v_trans, stream=1)).streams[1]
    assert (joined.streams[0].k[1][1][5:] == whole.k[1][1][5:]).all()


@pytest.mark.parametrize("v_trans", [0, 1])
def test_same_cells_counts_the_positions_held_with_identical_bytes(v_trans: int) -> None:
    whole = layout.parse(_state(list(range(10)), v_trans))
    other_slot = layout.parse(_state(list(range(10)), v_trans, stream=0))  # the same bytes in another stream
    assert layout.same_cells(whole, other_slot, 10) == 10
    assert layout.same_cells(whole, other_slot, 6) == 6
    assert layout.same_cells(whole, layout.split(whole, 4)[0], 10) == 4  # the other holds only 4 cells
    data = bytearray(_state(list(range(10)), v_trans))
    last_layer_v = len(data) - (4 * 10 * 2 if v_trans else 10 * 8)  # the last layer's V (the state ends there)
    cell = 7 * 2 if v_trans else 7 * 8  # position 7's bytes in its first row (V transposed) or its row
    data[last_layer_v + cell] ^= 1  # one bit of one cell, as a batch split of another size rounds it
    assert layout.same_cells(whole, layout.parse(bytes(data)), 10) == 7
    assert layout.same_cells(whole, layout.parse(_state(list(range(11)), v_trans)), 10) == 0  # other bytes


@pytest.mark.parametrize(("flipped", "shared"), [(None, 280), (270, 270), (100, None)])
def test_ram_entries_share_only_the_cells_that_are_the_same_bytes(flipped: int | None, shared: int | None) -> None:
    # Two conversations over one 280-token system prompt. The second's cells of it are the first's
    # (copied from a slot or an entry), or were evaluated in another batch split: one bit differs
    # at `flipped`. A restore gives back exactly the cells the slot held either way.
    from pyllama_cli.core.serving.cache.ram import Entry, RamStore

    first_data = _state(list(range(300)), 0)
    second_data = bytearray(first_data)
    if flipped is not None:
        k_of_layer_0 = 8 + 4 + 4 + 4 + 300 * 12 + 8 + 12  # past the heads, cell counts, records, layer 0's head
        second_data[k_of_layer_0 + flipped * 8] ^= 1
    store = RamStore(None)
    system = [7] * 280
    store.put(Entry("m", np.asarray(system + [1] * 20, np.int32), first_data))
    store.put(Entry("m", np.asarray(system + [2] * 20, np.int32), bytes(second_data)))
    first, second = store._entries.values()
    assert (second.base.n if second.base else None) == shared
    assert bytes(first.state()) == first_data
    assert bytes(second.state()) == bytes(second_data)
