"""slotmap.attention and slotmap.cp_attention: the kernels against their references.

reshape_and_cache compares exactly (it copies numbers), with poisoned caches whose untouched
slots must stay poisoned; the attentions compare within float32 tolerance against dense
attention computed in float64; context parallelism runs on real gloo processes.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DEVICE, OTHER_DEVICE
from hypothesis import given, settings
from hypothesis import strategies as st

import slotmap
from slotmap.attention import (
    dense_attention,
    gather_through_block_table,
    merge_attention_states,
    merge_attention_states_torch,
    paged_decode_attention,
    paged_decode_attention_torch,
    reshape_and_cache,
    reshape_and_cache_torch,
)
from slotmap.cp import local_length
from slotmap.cp_attention import (
    CPProblem,
    build_rank_state,
    check_rank,
    cp_decode_rank,
    decode_step,
    owned_positions,
    simulate_ranks,
)
from slotmap.distributed import run_ranks

POISON = -999.0
ATOL = 2e-5


# ---------------------------------------------------------------------------------------------
# reshape_and_cache
# ---------------------------------------------------------------------------------------------
def cache_inputs(num_tokens, num_blocks, block_size, heads, dim, slots, seed=0):
    generator = torch.Generator().manual_seed(seed)
    key = torch.randn(num_tokens, heads, dim, generator=generator).to(DEVICE)
    value = torch.randn(num_tokens, heads, dim, generator=generator).to(DEVICE)
    shape = (num_blocks, block_size, heads, dim)
    caches = [torch.full(shape, POISON, device=DEVICE) for _ in range(4)]
    slot_mapping = torch.tensor(slots, dtype=torch.int32, device=DEVICE)
    return key, value, caches, slot_mapping


@st.composite
def cache_cases(draw):
    num_blocks, block_size = draw(st.integers(1, 6)), draw(st.sampled_from([1, 2, 3, 4, 16]))
    heads, dim = draw(st.integers(1, 3)), draw(st.sampled_from([1, 3, 8, 16]))
    chosen = draw(st.lists(st.integers(0, num_blocks * block_size - 1), unique=True, max_size=12))
    slots = [-1 if draw(st.booleans()) and i % 2 else s for i, s in enumerate(chosen)]
    slots += [-1] * draw(st.integers(0, 3))  # a padding tail
    return (
        num_blocks,
        block_size,
        heads,
        dim,
        slots,
        draw(st.sampled_from([torch.int32, torch.int64])),
    )


@settings(max_examples=20)
@given(cache_cases())
def test_reshape_and_cache_matches_the_reference_exactly(case):
    num_blocks, block_size, heads, dim, slots, index_dtype = case
    key, value, (kc, vc, kc_ref, vc_ref), slot_mapping = cache_inputs(
        len(slots), num_blocks, block_size, heads, dim, slots
    )
    slot_mapping = slot_mapping.to(index_dtype)
    reshape_and_cache(key, value, kc, vc, slot_mapping)
    reshape_and_cache_torch(key, value, kc_ref, vc_ref, slot_mapping)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)
    # Every slot no real token names is still poisoned: PAD tokens wrote nothing.
    written = {s for s in slots if s >= 0}
    for slot in range(num_blocks * block_size):
        row = kc.view(-1, heads, dim)[slot]
        assert bool((row == POISON).all()) == (slot not in written)


def test_reshape_and_cache_writes_each_token_into_its_slot():
    key, value, (kc, vc, _, _), slots = cache_inputs(4, 3, 4, 2, 3, [9, -1, 0, 11])
    reshape_and_cache(key, value, kc, vc, slots)
    assert torch.equal(kc[2, 1], key[0]) and torch.equal(vc[2, 1], value[0])
    assert torch.equal(kc[0, 0], key[2]) and torch.equal(kc[2, 3], key[3])
    assert int((kc != POISON).any(dim=(2, 3)).sum()) == 3


@pytest.mark.parametrize("write", [reshape_and_cache, reshape_and_cache_torch])
def test_a_pad_id_other_than_minus_one_is_skipped_too(write):
    key, value, (kc, vc, _, _), slots = cache_inputs(2, 2, 4, 2, 3, [0, 3])
    write(key, value, kc, vc, slots, pad_id=0)  # slot 0 is "no slot" here
    assert bool((kc[0, 0] == POISON).all()) and bool((vc[0, 0] == POISON).all())
    assert torch.equal(kc[0, 3], key[1]) and torch.equal(vc[0, 3], value[1])


def test_unvalidated_slots_past_the_cache_write_nothing():
    guard = torch.full((3 * 4 * 2 * 2 + 64,), POISON, device=DEVICE)
    kc = guard[32:-32].view(3, 4, 2, 2)
    vc = torch.full_like(kc, POISON)
    key, value = torch.ones(3, 2, 2, device=DEVICE), torch.ones(3, 2, 2, device=DEVICE)
    slots = torch.tensor([12, -5, 1000], dtype=torch.int32, device=DEVICE)
    reshape_and_cache(key, value, kc, vc, slots, validate=False)
    assert bool((guard == POISON).all())


# ---------------------------------------------------------------------------------------------
# Paged decode attention
# ---------------------------------------------------------------------------------------------
def paged_problem(seq_lens, block_size, heads, dim, seed=0, extra_blocks=2, dtype=torch.float32):
    """Dense K/V, and the same written into a shuffled paged cache (NaN where unwritten)."""
    generator = torch.Generator().manual_seed(seed)
    num_reqs, longest = len(seq_lens), max(seq_lens, default=0)
    query = torch.randn(num_reqs, heads, dim, generator=generator)
    key = torch.randn(num_reqs, longest, heads, dim, generator=generator)
    value = torch.randn(num_reqs, longest, heads, dim, generator=generator)
    blocks = [math.ceil(n / block_size) for n in seq_lens]
    width = max(max(blocks, default=0), 1)
    num_blocks = sum(blocks) + extra_blocks
    order = torch.randperm(num_blocks, generator=generator).tolist()
    table, used = [], 0
    for count in blocks:
        table.append(order[used : used + count] + [num_blocks - 1] * (width - count))
        used += count
    key_cache = torch.full((num_blocks, block_size, heads, dim), float("nan"))
    value_cache = torch.full_like(key_cache, float("nan"))
    for q, n in enumerate(seq_lens):
        for p in range(n):
            b, o = table[q][p // block_size], p % block_size
            key_cache[b, o], value_cache[b, o] = key[q, p], value[q, p]
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    to = {"device": DEVICE}
    return (
        query.to(dtype=dtype, **to),
        key.to(dtype=dtype, **to),
        value.to(dtype=dtype, **to),
        key_cache.to(dtype=dtype, **to),
        value_cache.to(dtype=dtype, **to),
        torch.tensor(table, dtype=torch.int32, **to).view(num_reqs, width),
        lens.to(**to),
    )


@settings(max_examples=15)
@given(
    seq_lens=st.lists(st.integers(0, 40), min_size=1, max_size=3),
    block_size=st.sampled_from([1, 3, 4, 16]),
    heads=st.integers(1, 3),
    dim=st.sampled_from([1, 5, 16, 32]),
    seed=st.integers(0, 100),
)
def test_paged_attention_matches_dense_attention(seq_lens, block_size, heads, dim, seed):
    query, key, value, kc, vc, table, lens = paged_problem(seq_lens, block_size, heads, dim, seed)
    out, lse = paged_decode_attention(query, kc, vc, table, lens)
    expected_out, expected_lse = dense_attention(query, key, value, lens)
    assert out.dtype == lse.dtype == torch.float32
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    torch.testing.assert_close(out, expected_out, atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(lse, expected_lse, atol=ATOL, rtol=1e-5)
    ref_out, ref_lse = paged_decode_attention_torch(query, kc, vc, table, lens)
    torch.testing.assert_close(ref_out, expected_out, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ref_lse, expected_lse, atol=1e-6, rtol=1e-6)


def test_an_empty_sequence_has_weight_zero_and_no_nan():
    query, key, value, kc, vc, table, lens = paged_problem([0, 5, 0], 4, 2, 8)
    out, lse = paged_decode_attention(query, kc, vc, table, lens)
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.equal(out[2], out[0])
    assert lse[0].tolist() == [-math.inf, -math.inf] and lse[2].tolist() == lse[0].tolist()
    assert torch.isfinite(lse[1]).all() and not torch.isnan(out).any()


def test_scale_and_half_precision_inputs():
    query, key, value, kc, vc, table, lens = paged_problem([7, 12], 4, 2, 16, dtype=torch.bfloat16)
    out, lse = paged_decode_attention(query, kc, vc, table, lens, scale=0.3)
    expected_out, expected_lse = dense_attention(query, key, value, lens, scale=0.3)
    torch.testing.assert_close(out, expected_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, expected_lse, atol=2e-2, rtol=2e-2)


def test_gather_through_block_table_names_the_slots_read():
    _, _, _, kc, _, table, lens = paged_problem([5], 2, 1, 2)
    dense, slots = gather_through_block_table(kc, table, lens)
    row = table[0].tolist()
    assert slots[0].tolist() == [row[p // 2] * 2 + p % 2 for p in range(5)]
    assert not torch.isnan(dense).any()


# ---------------------------------------------------------------------------------------------
# The log-sum-exp merge
# ---------------------------------------------------------------------------------------------
@settings(max_examples=15)
@given(
    states=st.integers(1, 4),
    reqs=st.integers(1, 3),
    dim=st.sampled_from([1, 4, 16]),
    empty=st.lists(st.booleans(), min_size=24, max_size=24),
    big=st.booleans(),
)
def test_merge_kernel_matches_the_reference(states, reqs, dim, empty, big):
    generator = torch.Generator().manual_seed(states * 100 + reqs)
    outs = torch.randn(states, reqs, 2, dim, generator=generator)
    lses = torch.randn(states, reqs, 2, generator=generator) * (200.0 if big else 2.0)
    mask = torch.tensor(empty[: states * reqs * 2]).view(states, reqs, 2)
    lses = torch.where(mask, -math.inf, lses)
    outs = torch.where(mask[..., None], 0.0, outs)
    outs, lses = outs.to(DEVICE), lses.to(DEVICE)
    out, lse = merge_attention_states(outs, lses)
    ref_out, ref_lse = merge_attention_states_torch(outs, lses)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-5)
    all_empty = mask.all(dim=0).to(DEVICE)
    assert bool((lse[all_empty] == -math.inf).all()) and bool((out[all_empty] == 0).all())


def test_merging_two_halves_gives_the_whole():
    query, key, value, _, _, _, lens = paged_problem([10], 4, 2, 8)
    first = dense_attention(query, key[:, :4], value[:, :4], torch.clamp(lens, max=4))
    second = dense_attention(query, key[:, 4:], value[:, 4:], lens - 4)
    out, lse = merge_attention_states(
        torch.stack([first[0], second[0]]), torch.stack([first[1], second[1]])
    )
    expected = dense_attention(query, key, value, lens)
    torch.testing.assert_close(out, expected[0], atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(lse, expected[1], atol=ATOL, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Context parallelism
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("seq_len", "world_size", "interleave", "block_size"),
    [(13, 2, 1, 4), (9, 3, 2, 4), (1, 4, 1, 2), (40, 4, 8, 8), (7, 1, 1, 3)],
)
def test_local_lengths_partition_the_sequence(seq_len, world_size, interleave, block_size):
    owned = [
        owned_positions(seq_len, world_size, r, interleave, block_size) for r in range(world_size)
    ]
    assert sorted(p for o in owned for p in o) == list(range(seq_len))
    lengths = [
        local_length(seq_len, world_size, r, interleave, block_size) for r in range(world_size)
    ]
    assert lengths == [len(o) for o in owned]


@pytest.mark.parametrize(
    "problem",
    [
        pytest.param(CPProblem(), id="3-requests"),
        pytest.param(CPProblem(seq_lens=(1, 2, 9), interleave=2), id="short-requests"),
        pytest.param(
            CPProblem(seq_lens=(17,), block_size=8, interleave=4, head_dim=32), id="interleave-4"
        ),
    ],
)
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_simulated_ranks_match_dense_attention(problem, world_size):
    run = simulate_ranks(problem, world_size)
    for errors in run["errors"]:
        assert all(e < ATOL for e in errors.values()), errors  # NaN fails too
    lengths = torch.stack([s.local_lens for s in run["states"]]).sum(0)
    assert lengths.tolist() == list(problem.seq_lens)


def cp_world_size() -> int:
    """3 ranks on the CPU (gloo); on accelerators one rank per device, 2 or 3 of them."""
    if DEVICE == "cpu":
        return 3
    count = torch.cuda.device_count() if slotmap.BACKEND.name == "cuda" else 0
    if count < 2:
        pytest.skip(f"context parallelism needs 2 {slotmap.BACKEND.name} devices, {count} seen")
    return min(count, 3)


def test_context_parallel_on_real_ranks_matches_dense_attention():
    world_size = cp_world_size()
    problem = CPProblem(seq_lens=(1, 6, 21), interleave=2)
    results = run_ranks(cp_decode_rank, world_size, problem)
    assert [r["rank"] for r in results] == list(range(world_size))
    assert len({r["pid"] for r in results}) == world_size
    for r in results:
        assert all(e < ATOL for e in r["errors"].values()), r["errors"]
        assert torch.equal(r["out"], results[0]["out"])  # every rank holds the same merge
    # The new token of each request is written by exactly one rank; the others got PAD.
    slots = torch.tensor([r["decode_slots"] for r in results])
    assert ((slots != -1).sum(0) == 1).all()
    assert torch.tensor([r["local_lens"] for r in results]).sum(0).tolist() == [1, 6, 21]
    state = build_rank_state(problem, 1, 0, DEVICE)
    expected = dense_attention(
        state.dense.query, state.dense.key, state.dense.value, state.dense.seq_lens
    )
    torch.testing.assert_close(results[0]["out"], expected[0].cpu(), atol=ATOL, rtol=1e-5)
    # The last rank owns no position of request 0 (length 1): an empty partial, without NaN.
    assert results[-1]["local_lse"][0].tolist() == [-math.inf, -math.inf]
    assert not torch.isnan(results[-1]["local_out"]).any()


# ---------------------------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------------------------
def _cache_args(**change):
    key, value, (kc, vc, _, _), slots = cache_inputs(3, 2, 4, 2, 4, [1, -1, 6])
    args = {"key": key, "value": value, "key_cache": kc, "value_cache": vc, "slot_mapping": slots}
    args.update(change)
    return args


BAD_CACHE_INPUTS = [
    pytest.param(
        {"slot_mapping": torch.tensor([1, -1, 8], dtype=torch.int32)},
        "token 2: slot 8 is outside the cache",
        id="slot-past-the-cache",
    ),
    pytest.param(
        {"slot_mapping": torch.tensor([1, -2, 6], dtype=torch.int32)},
        "token 1: slot -2 is outside the cache",
        id="negative-slot",
    ),
    pytest.param(
        {"slot_mapping": torch.tensor([6, -1, 6], dtype=torch.int32)},
        "tokens 0 and 2 both write slot 6",
        id="two-tokens-one-slot",
    ),
    pytest.param(
        {"slot_mapping": torch.tensor([1, 2], dtype=torch.int32)},
        "slot_mapping has 2 entries for 3 tokens",
        id="short-slot-mapping",
    ),
    pytest.param(
        {"slot_mapping": torch.tensor([1.0, 2, 3])},
        "slot_mapping must be int32 or int64, got float32",
        id="float-slots",
    ),
    pytest.param(
        {"key": torch.zeros(3, 2, 4, dtype=torch.float64)},
        "key must be float32 or float16 or bfloat16, got float64",
        id="float64-key",
    ),
    pytest.param(
        {"value": torch.zeros(3, 2, 5)},
        "key has shape (3, 2, 4) but value (3, 2, 5)",
        id="value-shape",
    ),
    pytest.param(
        {"key": torch.zeros(3, 3, 4), "value": torch.zeros(3, 3, 4)},
        "key has 3 heads of 4 but the cache holds 2 heads of 4",
        id="heads",
    ),
    pytest.param(
        {"key_cache": torch.zeros(2, 4, 2, 4, dtype=torch.float16)},
        "key_cache is float16 but value_cache is float32",
        id="cache-dtypes",
    ),
    pytest.param(
        {"value_cache": torch.zeros(3, 4, 2, 4)},
        "key_cache has shape (2, 4, 2, 4) but value_cache (3, 4, 2, 4)",
        id="cache-shapes",
    ),
    pytest.param(
        {
            "key_cache": torch.zeros(2, 2, 4, 4).transpose(1, 2),
            "value_cache": torch.zeros(2, 4, 2, 4),
        },
        "key_cache must be contiguous",
        id="non-contiguous-cache",
    ),
    pytest.param(
        {"key": torch.zeros(3, 2, 4), "value": torch.zeros(3, 2, 4), "other_device": True},
        "key_cache is on",
        id="devices",
    ),
]


@pytest.mark.parametrize(("change", "message"), BAD_CACHE_INPUTS)
def test_bad_reshape_and_cache_inputs_are_named(change, message):
    change = dict(change)
    # Every tensor goes to DEVICE, except in the case that is about another device.
    device = OTHER_DEVICE if change.pop("other_device", False) else DEVICE
    change = {k: v.to(device) for k, v in change.items()}
    for launcher in (reshape_and_cache, reshape_and_cache_torch):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            launcher(**_cache_args(**change))


def _attention_args(**change):
    query, _, _, kc, vc, table, lens = paged_problem([5, 3], 2, 2, 4)
    args = {
        "query": query,
        "key_cache": kc,
        "value_cache": vc,
        "block_table": table,
        "seq_lens": lens,
    }
    args.update(change)
    return args


BAD_ATTENTION_INPUTS = [
    pytest.param(
        {"seq_lens": torch.tensor([5, -1], dtype=torch.int32)},
        r"request 1: seq_lens\[1\] = -1 is negative",
        id="negative-length",
    ),
    pytest.param(
        {"seq_lens": torch.tensor([5, 9], dtype=torch.int32)},
        "request 1: 9 positions need 5 logical blocks of 2, but a block-table row holds 3",
        id="too-long",
    ),
    pytest.param(
        {"seq_lens": torch.tensor([5], dtype=torch.int32)},
        "seq_lens has 1 entries for 2 requests",
        id="seq-lens-count",
    ),
    pytest.param(
        {"seq_lens": torch.tensor([5, 3])},
        "seq_lens must be int32, got int64",
        id="seq-lens-dtype",
    ),
    pytest.param(
        {"block_table": torch.tensor([[0, 1, 99], [2, 3, 4]], dtype=torch.int32)},
        r"request 0: block_table\[0, 2\] = 99 is not a physical block",
        id="block",
    ),
    pytest.param(
        {"block_table": torch.zeros(1, 3, dtype=torch.int32)},
        "2 requests but the block table has only 1 rows",
        id="rows",
    ),
    pytest.param(
        {"query": torch.zeros(2, 2, 8)},
        "query has 2 heads of 8 but the cache holds 2 heads of 4",
        id="head-dim",
    ),
]


@pytest.mark.parametrize(("change", "message"), BAD_ATTENTION_INPUTS)
def test_bad_attention_inputs_are_named(change, message):
    change = {k: v.to(DEVICE) for k, v in change.items()}
    for launcher in (paged_decode_attention, paged_decode_attention_torch):
        with pytest.raises(ValueError, match=message):
            launcher(**_attention_args(**change))


def test_bad_merge_inputs_are_named():
    outs, lses = torch.zeros(2, 3, 2, 4, device=DEVICE), torch.zeros(2, 3, 2, device=DEVICE)
    with pytest.raises(ValueError, match=r"outs has shape \(2, 3, 2, 4\) but lses \(2, 3, 1\)"):
        merge_attention_states(outs, lses[..., :1].contiguous())
    with pytest.raises(ValueError, match="lses must be float32, got float64"):
        merge_attention_states(outs, lses.double())
    with pytest.raises(ValueError, match="nothing to merge"):
        merge_attention_states(outs[:0], lses[:0])
    for value, shown in ((math.inf, "inf"), (math.nan, "nan")):
        broken = lses.clone()
        broken[1, 2, 0] = value
        for merge in (merge_attention_states, merge_attention_states_torch):
            with pytest.raises(ValueError, match=rf"lses\[1, 2, 0\] is {shown}: .* -inf"):
                merge(outs, broken)
    merge_attention_states(outs, broken, validate=False)  # unchecked: the caller's problem


def test_check_rank_reports_a_wrong_merge_and_a_nan_partial():
    # check_rank is what cp_decode.py and the CP tests trust: it must see a wrong answer.
    state = build_rank_state(CPProblem(seq_lens=(5, 9), interleave=2), 1, 0, DEVICE)
    merged, local = decode_step(state)
    assert all(e < ATOL for e in check_rank(state, merged, local).values())
    shifted = (merged[0] + 0.5, merged[1])
    assert abs(check_rank(state, shifted, local)["merged_out"] - 0.5) < 1e-5
    broken = (local[0].clone(), local[1])
    broken[0][1, 0, 0] = math.nan
    assert math.isnan(check_rank(state, merged, broken)["local_out"])


# ---------------------------------------------------------------------------------------------
# Unvalidated lengths and block tables read nothing outside them (issue 15, item 10)
# ---------------------------------------------------------------------------------------------
def short_table_problem():
    """Request 0: 8 positions in a row of 2 blocks (of 4), a view of the first row of a table
    whose next row names a NaN block; the cache is the front of a NaN-filled buffer."""
    query, _, _, kc, vc, table, lens = paged_problem([8], 4, 1, 4, extra_blocks=0)
    num_blocks = kc.shape[0]
    big_k = torch.full((num_blocks + 4, *kc.shape[1:]), math.nan, device=DEVICE)
    big_v = torch.full_like(big_k, math.nan)
    big_k[:num_blocks], big_v[:num_blocks] = kc, vc
    rows = torch.tensor([table[0].tolist(), [num_blocks + 1] * 2], dtype=torch.int32)
    rows = rows.to(DEVICE)
    return query, big_k[:num_blocks], big_v[:num_blocks], rows[:1], lens


@pytest.mark.parametrize("seq_len", [9, 12, 100000, 2**31 - 1])
def test_unvalidated_length_past_the_row_reads_only_the_row(seq_len):
    query, kc, vc, table, lens = short_table_problem()
    expected = paged_decode_attention(query, kc, vc, table, lens)  # the row's 8 positions
    long = torch.tensor([seq_len], dtype=torch.int32, device=DEVICE)
    out, lse = paged_decode_attention(query, kc, vc, table, long, validate=False)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    torch.testing.assert_close((out, lse), expected, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("entry", [-1, -(2**31), 2, 10**6, 2**31 - 1])
def test_unvalidated_block_outside_the_cache_reads_nothing(entry):
    # The second block's entry is outside the cache: only the first block's 4 positions count.
    query, kc, vc, table, _ = short_table_problem()
    bad = table.clone()
    bad[0, 1] = entry
    lens = torch.tensor([8], dtype=torch.int32, device=DEVICE)
    out, lse = paged_decode_attention(query, kc, vc, bad, lens, validate=False)
    expected = paged_decode_attention(query, kc, vc, table, torch.clamp(lens, max=4))
    torch.testing.assert_close((out, lse), expected, atol=ATOL, rtol=1e-5)
    empty = torch.tensor([[entry, entry]], dtype=torch.int32, device=DEVICE)
    out, lse = paged_decode_attention(query, kc, vc, empty, lens, validate=False)
    assert torch.equal(out.cpu(), torch.zeros_like(out).cpu()) and lse.item() == -math.inf


# ---------------------------------------------------------------------------------------------
# NaN propagates as torch's attention propagates it (issue 15, item 13)
# ---------------------------------------------------------------------------------------------
def test_a_nan_key_gives_nan_output_and_lse_in_kernel_and_references():
    query, key, value, kc, vc, table, lens = paged_problem([6, 5], 4, 2, 8)
    poisoned = key.clone()
    poisoned[0, 4, 1, 3] = math.nan  # request 0, position 4, head 1
    b = table[0, 1].item()
    kc[b, 0, 1, 3] = math.nan
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        query[0, 1][None, None].double(),
        poisoned[0, :6, 1][None].double(),
        value[0, :6, 1][None].double(),
    )
    assert torch.isnan(sdpa).all()  # what torch does with a NaN key
    for out, lse in (
        paged_decode_attention(query, kc, vc, table, lens),
        paged_decode_attention_torch(query, kc, vc, table, lens),
        dense_attention(query, poisoned, value, lens),
    ):
        assert torch.isnan(out[0, 1]).all() and math.isnan(lse[0, 1].item())
        # The other head and the other request never saw the NaN.
        assert torch.isfinite(out[0, 0]).all() and torch.isfinite(lse[0, 0])
        assert torch.isfinite(out[1]).all() and torch.isfinite(lse[1]).all()


def test_a_nan_value_gives_nan_output_and_a_finite_lse():
    query, key, value, kc, vc, table, lens = paged_problem([6], 4, 1, 8)
    poisoned = value.clone()
    poisoned[0, 2, 0, 0] = math.nan
    vc[table[0, 0].item(), 2, 0, 0] = math.nan
    expected_lse = dense_attention(query, key, value, lens)[1]
    for out, lse in (
        paged_decode_attention(query, kc, vc, table, lens),
        paged_decode_attention_torch(query, kc, vc, table, lens),
        dense_attention(query, key, poisoned, lens),
    ):
        assert math.isnan(out[0, 0, 0].item()) and torch.isfinite(out[0, 0, 1:]).all()
        torch.testing.assert_close(lse, expected_lse, atol=ATOL, rtol=1e-5)


def test_nan_past_the_length_is_never_read():
    # Position 6 of the dense K/V (past seq_len 6) is NaN: no implementation reads it.
    query, key, value, kc, vc, table, _ = paged_problem([7], 4, 1, 8)
    lens = torch.tensor([6], dtype=torch.int32, device=DEVICE)
    key[0, 6], value[0, 6] = math.nan, math.nan
    kc[table[0, 1].item(), 2], vc[table[0, 1].item(), 2] = math.nan, math.nan
    results = [
        paged_decode_attention(query, kc, vc, table, lens),
        paged_decode_attention_torch(query, kc, vc, table, lens),
        dense_attention(query, key, value, lens),
    ]
    for out, lse in results:
        assert torch.isfinite(out).all() and torch.isfinite(lse).all()
        torch.testing.assert_close((out, lse), results[-1], atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("merge", [merge_attention_states, merge_attention_states_torch])
def test_merging_a_nan_partial_gives_nan(merge):
    # Unvalidated (validation names a NaN lse): the NaN reaches the merged state, as it
    # would reach attention over all the keys at once; empty and finite rows stay as they were.
    outs = torch.randn(2, 3, 1, 4, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    lses = torch.tensor([[[0.5], [1.0], [-math.inf]], [[math.nan], [2.0], [-math.inf]]])
    lses = lses.to(DEVICE)
    outs[:, 2] = 0.0
    outs[0, 1, 0, 2] = math.nan  # a NaN partial output with a finite lse
    out, lse = merge(outs, lses, validate=False)
    assert torch.isnan(out[0]).all() and math.isnan(lse[0, 0].item())
    assert math.isnan(out[1, 0, 2].item()) and torch.isfinite(lse[1]).all()
    assert torch.equal(out[2].cpu(), torch.zeros(1, 4)) and lse[2, 0].item() == -math.inf
