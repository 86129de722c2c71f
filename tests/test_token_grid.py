"""The token grid (``token_parallel``): the direct and fused kernels' GPU launch, in which
program i maps batch tokens [i * tile, (i + 1) * tile) and finds each token's request itself.

Its three ways of finding a request (a checked guess for a run of decode requests at the
batch's front or back, one request for the whole tile, a histogram of the request ends) each
get hand cases built to need exactly that way, with small tiles; hypothesis then draws
decode-heavy batches (runs of one-token requests before or after a few long or empty ones)
in every mode. Outputs are poisoned and guarded; everything is compared with the oracle.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
import triton
import triton.language as tl
from conftest import (
    DEVICE,
    MULTI_GROUP_MODES,
    SINGLE_GROUP_MODES,
    assert_slots_equal,
    make_case,
    multi_group_cases,
    slot_mapping_cases,
)
from hypothesis import example, given
from hypothesis import strategies as st

import slotmap
from slotmap.kernels.token_grid import (
    PAD_TILE,
    _sample_request_ends,
    _sampled_request,
    token_launch_shape,
    use_token_grid,
)

TOKEN_TILES = (2, 4, 8, 16, 32, 64)


def direct_tokens(tile: int, **extra):
    def run(*args, **kwargs):
        return slotmap.compute_slot_mapping_direct(
            *args, token_parallel=True, tile_size=tile, **kwargs, **extra
        )

    return run


# (request lengths, tile, padding past num_tokens, what the case needs)
HAND = {
    # guess, batch front: token t is request t
    "decode-front": ([1] * 37, 8, 3),
    # guess, batch back: token t is request t - (num_tokens - num_reqs)
    "decode-back": ([9, 9, 9] + [1] * 20, 4, 0),
    "decode-both-ends": ([1] * 9 + [20] + [1] * 9, 4, 5),
    # The guessed requests' ends all match, but the first guessed request is empty and
    # starts after the tile's first token (qsl = 0 2 3 3 4 5): token 2 is request 1, not 2.
    "empty-request-under-a-right-looking-guess": ([2, 1, 0, 1, 1], 2, 1),
    # The guess's two scalar checks pass (its first start and its last end match) but a
    # two-token request and an empty one sit between them: the lanes' own ends catch it,
    # in a batch that can be all decode and in one that cannot.
    "likely-run-hiding-a-two-token-request": ([1] * 4 + [2, 0, 1, 1] + [1] * 4, 4, 2),
    "likely-run-hiding-a-two-token-request-early-ends": (
        [1] * 4 + [2, 0, 1, 1] + [1] * 4 + [9],
        4,
        2,
    ),
    # one request for the whole tile
    "tile-inside-one-request": ([100], 16, 7),
    "tiles-inside-two-requests": ([40, 40], 8, 0),
    # a request ends at the tile's last token: the last lane belongs to the next request
    "end-at-tiles-last-token": ([7, 9], 8, 0),
    # histogram: ends before, inside and past the tile
    "ends-past-the-tile": ([3, 2, 50], 8, 2),
    "empty-requests-everywhere": ([0, 0, 3, 0, 1, 0, 0, 2, 0], 4, 4),
    # padding programs (PAD_TILE each) cover exactly up to max_num_tokens
    "padding-programs-end-at-the-output": ([1] * 5, 4, 3 + 3 * PAD_TILE),
    "only-padding": ([0, 0], 4, 10),
    "no-requests": ([], 4, 6),
}


@pytest.mark.parametrize("name", HAND)
@pytest.mark.parametrize("launcher", ["direct", "fused"])
def test_hand_case(name: str, launcher: str) -> None:
    lengths, tile, pad = HAND[name]
    case = make_case(lengths, 16, seed=len(name), extra_tokens=pad, large_blocks=True)
    if launcher == "direct":
        run = direct_tokens(tile)
    else:

        def run(qsl, positions, table, block_size, out, **options):
            slotmap.compute_slot_mappings(
                qsl,
                positions,
                [table],
                [block_size],
                out=out.view(1, -1),
                token_parallel=True,
                tile_size=tile,
                **options,
            )
            return out

    assert_slots_equal(case.run(run), case.expected(), f"{name} tile {tile}")


def decode_heavy_lengths() -> st.SearchStrategy[list[int]]:
    """A run of one-token requests (a few empty) before or after a few longer ones."""
    run = st.lists(st.sampled_from([1, 1, 1, 1, 0]), max_size=24)
    others = st.lists(st.sampled_from([0, 2, 3, 7, 8, 9, 16, 17, 33]), max_size=3)
    return st.tuples(run, others, st.booleans()).map(
        lambda t: t[0] + t[1] if t[2] else t[1] + t[0]
    )


@pytest.mark.parametrize("mode", SINGLE_GROUP_MODES)
@given(data=st.data(), tile=st.sampled_from(TOKEN_TILES), hot=st.booleans())
def test_direct_token_grid_matches_oracle(mode: str, data, tile: int, hot: bool) -> None:
    lengths = st.one_of(decode_heavy_lengths(), st.lists(st.integers(0, 40), max_size=5))
    case = data.draw(
        slot_mapping_cases(mode, orders=("contiguous", "scattered"), lengths=lengths), label="case"
    )
    expected = case.expected()
    if hot:  # the hot path: num_tokens given, validation off, the plan cached on a 2nd call
        case = dataclasses.replace(case, options=dict(case.options, num_tokens=case.num_tokens))
        case.run(direct_tokens(tile, validate=False))
    actual = case.run(direct_tokens(tile, validate=not hot))
    assert_slots_equal(actual, expected)


@pytest.mark.parametrize("mode", MULTI_GROUP_MODES)
@given(data=st.data(), tile=st.sampled_from(TOKEN_TILES))
def test_fused_token_grid_matches_oracle(mode: str, data, tile: int) -> None:
    case = data.draw(multi_group_cases(mode, lengths=decode_heavy_lengths()), label="case")
    actual = case.run(slotmap.compute_slot_mappings, token_parallel=True, tile_size=tile)
    assert_slots_equal(actual, case.run(slotmap.slot_mappings_oracle))


def test_the_grid_each_batch_gets() -> None:
    # Decode and mixed batches take the token grid by default, long requests the request grid;
    # the NPU never takes it by default (its production design is the request grid).
    npu = slotmap.BACKEND.name == "npu"
    assert use_token_grid(1024, 1024, None, None) is not npu
    assert use_token_grid(6400, 260, None, None) is not npu  # 4 x 1536 + 256 x 1
    assert not use_token_grid(8192, 1, None, None)  # one long prefill
    assert not use_token_grid(64 * 65536, 64, None, None)
    assert not use_token_grid(1024, 1024, None, 2)  # parallel tiles ask for the request grid
    assert not use_token_grid(5000, 5000, None, None)  # more request ends than a tile loads
    assert use_token_grid(8192, 1, True, None)  # asked for: given


def test_token_grid_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="parallel_tiles belongs to the request grid"):
        use_token_grid(4, 4, True, 2)
    with pytest.raises(ValueError, match="token_parallel takes at most 4096 requests"):
        use_token_grid(5000, 5000, True, None)
    with pytest.raises(ValueError, match="tile_size must be a power of two, got 24"):
        token_launch_shape(10, 10, 10, 24, None)


def test_token_grid_covers_the_output_exactly() -> None:
    # Token tiles, then padding programs of PAD_TILE: enough programs, and not one more.
    for num_tokens, max_num_tokens, tile in [
        (5, 5, 4),
        (5, 8, 4),
        (5, 3080, 4),
        (0, 0, 4),
        (0, 1, 32),
        (1000, 1000, 32),
        (1000, 5000, 64),
    ]:
        _, (programs,), _ = token_launch_shape(num_tokens, max_num_tokens, 7, tile, None)
        token_tiles = -(-num_tokens // tile)
        covered = token_tiles * tile + (programs - token_tiles) * PAD_TILE
        assert covered >= max_num_tokens, (num_tokens, max_num_tokens, tile)
        assert programs == 1 or covered - PAD_TILE < max_num_tokens


def test_token_grid_positions_stay_int64_in_the_hot_path() -> None:
    # The hot path re-checks the tensors' structure: an int32 positions tensor falls through
    # to the full checks, which name it.
    case = make_case([1, 1, 1], 16, seed=3)
    qsl, positions, table, block_size = case.args()
    out = torch.empty(case.max_num_tokens, dtype=torch.int32, device=positions.device)
    run = direct_tokens(4, validate=False, num_tokens=3)
    run(qsl, positions, table, block_size, out=out)
    with pytest.raises(ValueError, match="positions"):
        run(qsl, positions.to(torch.int32), table, block_size, out=out)


@triton.jit
def _sampled_request_probe(qsl_ptr, num_reqs, num_tokens, out_ptr, TILE: tl.constexpr):
    # The token grid's sampled answer for every tile, by itself: out = (request, settled).
    tile_idx = tl.program_id(0)
    ends, back_first, middle = _sample_request_ends(qsl_ptr, num_reqs, TILE)
    req, settled = _sampled_request(
        ends, back_first, middle, num_reqs, num_tokens, tile_idx * TILE, TILE
    )
    tl.store(out_ptr + 2 * tile_idx, req)
    tl.store(out_ptr + 2 * tile_idx + 1, settled)


@given(
    lengths=st.one_of(decode_heavy_lengths(), st.lists(st.integers(0, 40), max_size=40)),
    tile=st.sampled_from(TOKEN_TILES),
)
# The back half's first end (request 6's, token 8) is exactly the tile's first token.
@example(lengths=[1] * 6 + [2, 8], tile=4)
def test_sampled_request_is_exact_where_it_settles(lengths: list[int], tile: int) -> None:
    # The sample holds the first tile / 2 request ends and the last tile / 2. A tile inside
    # one request must settle exactly when that request's end was sampled (the first tile / 2
    # requests, or requests past the back half's first end, or any request when every end
    # was sampled), with the right request; every other tile must not settle: it falls back
    # to the histogram. A wrong "settled" is a wrong output; a missing one costs a load.
    num_tokens = sum(lengths)
    if num_tokens == 0:
        return
    qsl = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    num_reqs, tiles = len(lengths), -(-num_tokens // tile)
    out = torch.full((2 * tiles,), -7, dtype=torch.int32, device=DEVICE)
    _sampled_request_probe[(tiles,)](qsl.to(DEVICE), num_reqs, num_tokens, out, TILE=tile)
    got = out.cpu().view(tiles, 2).tolist()
    half, middle = tile // 2, max(num_reqs - tile, 0)
    for i, (req, settled) in enumerate(got):
        first, last = i * tile, min((i + 1) * tile, num_tokens) - 1
        want = int(torch.searchsorted(qsl[1:], first, right=True))
        inside = int(torch.searchsorted(qsl[1:], last, right=True)) == want
        sampled = middle == 0 or want < half or want > half + middle
        assert settled == int(inside and sampled), (lengths, tile, i, req, settled, want)
        if settled:
            assert req == want, (lengths, tile, i, req, want)
