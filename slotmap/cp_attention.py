"""Context-parallel decode attention, end to end, on real processes or simulated in one.

Each of ``W`` ranks holds only the positions it owns (docs/semantics.md §2: position ``p`` lives
on rank ``(p mod (W * block_size)) // I mod W`` for interleave ``I``), packed contiguously in its
own paged cache. One decode step on every rank:

1. the slot mapping of the new tokens, with the production kernel and this rank's CP
   arguments (``compute_slot_mapping(..., cp_world_size=W, cp_rank=r, cp_interleave=I)``):
   a new token another rank owns gets PAD;
2. ``reshape_and_cache`` writes the new keys and values (PAD tokens write nothing);
3. ``paged_decode_attention`` over this rank's local sequence: the positions it owns;
4. the ranks exchange (out, lse) with one all_gather and merge them by log-sum-exp.

Every rank builds the same problem from a seed (``build_problem``), so nothing is broadcast.
The pieces are separate functions so that a benchmark can time ``decode_step`` alone:
``build_rank_state`` (allocations, the prompt written once by ``prefill``),
``decode_step`` (the four steps), ``check_rank`` (errors against dense attention).
``cp_decode_rank`` chains them for ``slotmap.distributed.run_ranks``; ``simulate_ranks``
runs the same functions for every rank in one process (the lesson's widgets), merging locally.
No function here prints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from torch import Tensor

from slotmap.attention import (
    dense_attention,
    merge_attention_states,
    paged_decode_attention,
    reshape_and_cache,
)
from slotmap.cp import local_length  # lesson 05: positions 0..n-1 a rank stores, counted
from slotmap.i18n import _
from slotmap.kernels.slot_mapping import compute_slot_mapping
from slotmap.layout import SlotLayout, cdiv


@dataclass(frozen=True)
class CPProblem:
    """A decode batch, small and picklable: every rank rebuilds the same tensors from it.

    ``seq_lens[q]`` is request q's length after this decode step: positions
    ``0..seq_lens[q]-2`` are its context (already in the cache), ``seq_lens[q]-1`` is the new
    token, whose query attends to all of them.
    """

    seq_lens: tuple[int, ...] = (13, 5, 30)
    num_heads: int = 2
    head_dim: int = 16
    block_size: int = 4  # tokens per physical block (= kv_cache_block_size: no hybrid blocks)
    interleave: int = 1  # CP interleave: consecutive positions per rank in each segment
    seed: int = 0
    dtype: str = "float32"
    spare_blocks: int = 3  # physical blocks per rank that no request uses
    stale_cache: bool = False  # unwritten slots hold old random K/V (True) or NaN (False)


@dataclass
class DenseProblem:
    """The whole batch, dense: the ground truth every rank can compute."""

    query: Tensor  # [num_reqs, num_heads, head_dim]: the new token's query
    key: Tensor  # [num_reqs, max_seq_len, num_heads, head_dim]: position j of request q
    value: Tensor  # [num_reqs, max_seq_len, num_heads, head_dim]
    seq_lens: Tensor  # [num_reqs] int32


@dataclass
class RankState:
    """One rank's cache and the persistent inputs of its decode step (fixed shapes)."""

    problem: CPProblem
    world_size: int
    rank: int
    dense: DenseProblem
    key_cache: Tensor  # [num_blocks, block_size, num_heads, head_dim]: this rank's only
    value_cache: Tensor
    block_table: Tensor  # [num_reqs, max_local_blocks] int32: local logical -> physical
    local_lens: Tensor  # [num_reqs] int32: positions this rank owns, the new token included
    query_start_loc: Tensor  # [num_reqs + 1] int32: one new token per request
    positions: Tensor  # [num_reqs] int64: the new tokens' positions
    new_key: Tensor  # [num_reqs, num_heads, head_dim]: the new tokens' keys
    new_value: Tensor
    slot_mapping: Tensor  # [num_reqs] int32: written by every decode step
    prompt_slots: Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int32))

    @property
    def device(self) -> torch.device:
        return self.key_cache.device


# ---------------------------------------------------------------------------------------------
# Who owns what
# ---------------------------------------------------------------------------------------------
def owned_positions(
    seq_len: int, world_size: int, rank: int, interleave: int, block_size: int
) -> list[int]:
    """The positions ``0..seq_len-1`` that ``rank`` stores, in order (the reference's formula)."""
    positions = torch.arange(seq_len, dtype=torch.int64)
    layout = SlotLayout(block_size, block_size, world_size, rank, interleave)
    _block, _offset, has_slot = layout.locate(positions)
    return positions[has_slot].tolist()


# ---------------------------------------------------------------------------------------------
# Building the problem and a rank's state
# ---------------------------------------------------------------------------------------------
def build_problem(problem: CPProblem, device: torch.device | str) -> DenseProblem:
    """The batch's query, keys and values from ``problem.seed``: the same on every rank
    (drawn on the CPU, then moved, so every device gets the same numbers)."""
    generator = torch.Generator().manual_seed(problem.seed)
    num_reqs, longest = len(problem.seq_lens), max(problem.seq_lens, default=0)
    shape = (num_reqs, longest, problem.num_heads, problem.head_dim)
    dtype = getattr(torch, problem.dtype)
    query = torch.randn(num_reqs, problem.num_heads, problem.head_dim, generator=generator)
    key = torch.randn(shape, generator=generator)
    value = torch.randn(shape, generator=generator)
    seq_lens = torch.tensor(problem.seq_lens, dtype=torch.int32)
    return DenseProblem(
        query.to(device, dtype),
        key.to(device, dtype),
        value.to(device, dtype),
        seq_lens.to(device),
    )


def build_rank_state(
    problem: CPProblem,
    world_size: int,
    rank: int,
    device: torch.device | str,
    *,
    write_prompt: bool = True,
) -> RankState:
    """Allocate rank ``rank``'s cache and block table and write the prompt into it (``prefill``;
    ``write_prompt=False`` leaves the cache as allocated).

    Each rank's physical blocks are a shuffle (seeded by seed and rank) of its own cache, so
    the block tables differ between ranks and from the identity."""
    if any(n < 1 for n in problem.seq_lens):
        raise ValueError(
            _("every request needs its new token: seq_lens {seq_lens}").format(
                seq_lens=problem.seq_lens
            )
        )
    dense = build_problem(problem, device)
    block_size = problem.block_size
    local_lens = [
        local_length(n, world_size, rank, problem.interleave, block_size) for n in problem.seq_lens
    ]
    blocks_needed = [cdiv(n, block_size) for n in local_lens]
    width = max(max(blocks_needed, default=0), 1)
    num_blocks = sum(blocks_needed) + problem.spare_blocks
    generator = torch.Generator().manual_seed(problem.seed * 1009 + rank + 1)
    physical = torch.randperm(num_blocks, generator=generator).tolist()
    rows, used = [], 0
    for count in blocks_needed:
        rows.append(physical[used : used + count] + [0] * (width - count))
        used += count
    block_table = torch.tensor(rows, dtype=torch.int32, device=device).view(-1, width)
    shape = (num_blocks, block_size, problem.num_heads, problem.head_dim)
    dtype = getattr(torch, problem.dtype)
    if problem.stale_cache:
        # A reused cache holds old keys and values: finite, plausible, wrong.
        key_cache = torch.randn(shape, generator=generator).to(device, dtype)
        value_cache = torch.randn(shape, generator=generator).to(device, dtype)
    else:
        # NaN everywhere: an attention that reads a slot nothing wrote returns NaN.
        key_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
        value_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    num_reqs = len(problem.seq_lens)
    last = dense.seq_lens.to(torch.int64) - 1
    requests = torch.arange(num_reqs, device=device)
    state = RankState(
        problem=problem,
        world_size=world_size,
        rank=rank,
        dense=dense,
        key_cache=key_cache,
        value_cache=value_cache,
        block_table=block_table,
        local_lens=torch.tensor(local_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.arange(num_reqs + 1, dtype=torch.int32, device=device),
        positions=last,
        new_key=dense.key[requests, last].contiguous(),
        new_value=dense.value[requests, last].contiguous(),
        slot_mapping=torch.empty(num_reqs, dtype=torch.int32, device=device),
    )
    if write_prompt:
        prefill(state)
    return state


def slot_mapping_of(
    state: RankState,
    query_start_loc: Tensor,
    positions: Tensor,
    *,
    out: Tensor | None = None,
    validate: bool = True,
) -> Tensor:
    """This rank's slot of every token: the production kernel with this rank's CP arguments."""
    problem = state.problem
    return compute_slot_mapping(
        query_start_loc,
        positions,
        state.block_table,
        problem.block_size,
        num_tokens=positions.numel(),
        kv_cache_block_size=problem.block_size,
        cp_world_size=state.world_size,
        cp_rank=state.rank,
        cp_interleave=problem.interleave,
        out=out,
        validate=validate,
    )


def batch_of(
    lengths: list[int] | tuple[int, ...], device: torch.device | str
) -> tuple[Tensor, Tensor, Tensor]:
    """Positions ``0..lengths[q]-1`` of every request as one batch: (query_start_loc int32,
    positions int64, the request of each token int64)."""
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    query_start_loc = torch.tensor(starts, dtype=torch.int32, device=device)
    positions = torch.cat(
        [torch.arange(n, dtype=torch.int64) for n in lengths]
        or [torch.empty(0, dtype=torch.int64)]
    )
    requests = torch.repeat_interleave(
        torch.arange(len(lengths)), torch.tensor(lengths, dtype=torch.int64)
    )
    return query_start_loc, positions.to(device), requests.to(device)


def prefill(state: RankState) -> None:
    """Write every request's context (positions 0..seq_len-2) into this rank's cache: the
    positions other ranks own get PAD and are skipped. Keeps the slots in ``prompt_slots``."""
    dense = state.dense
    context = [n - 1 for n in state.problem.seq_lens]
    query_start_loc, positions, requests = batch_of(context, state.device)
    slots = slot_mapping_of(state, query_start_loc, positions)
    key = dense.key[requests, positions].contiguous()
    value = dense.value[requests, positions].contiguous()
    reshape_and_cache(key, value, state.key_cache, state.value_cache, slots)
    state.prompt_slots = slots


# ---------------------------------------------------------------------------------------------
# One decode step
# ---------------------------------------------------------------------------------------------
def local_decode_step(state: RankState, *, validate: bool = True) -> tuple[Tensor, Tensor]:
    """Steps 1-3 on this rank: slot mapping of the new tokens, reshape_and_cache, paged
    attention over the local sequence. Returns this rank's partial (out, lse)."""
    slot_mapping_of(
        state, state.query_start_loc, state.positions, out=state.slot_mapping, validate=validate
    )
    reshape_and_cache(
        state.new_key,
        state.new_value,
        state.key_cache,
        state.value_cache,
        state.slot_mapping,
        validate=validate,
    )
    return paged_decode_attention(
        state.dense.query,
        state.key_cache,
        state.value_cache,
        state.block_table,
        state.local_lens,
        validate=validate,
    )


def all_gather_states(out: Tensor, lse: Tensor, world_size: int) -> tuple[Tensor, Tensor]:
    """Every rank's (out, lse), stacked in rank order: one all_gather of out and lse packed
    side by side. Returns ([W, num_reqs, num_heads, head_dim], [W, num_reqs, num_heads])."""
    import torch.distributed as dist

    packed = torch.cat([out, lse[..., None]], dim=-1).contiguous()
    # One buffer, the ranks' blocks one after another along the first dimension.
    gathered = packed.new_empty((world_size * packed.shape[0], *packed.shape[1:]))
    # torch 2.13 renamed all_gather_into_tensor to all_gather_single (same call).
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(gathered, packed)
    stacked = gathered.view(world_size, *packed.shape)
    return stacked[..., :-1].contiguous(), stacked[..., -1].contiguous()


def decode_step(
    state: RankState, *, validate: bool = True
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """One decode step on this rank, collectives included (call it on every rank at once).

    Returns ((merged out, merged lse), (local out, local lse)); with one rank the merge is
    the identity and no process group is needed."""
    local = local_decode_step(state, validate=validate)
    if state.world_size == 1:
        outs, lses = local[0][None], local[1][None]
    else:
        outs, lses = all_gather_states(*local, state.world_size)
    return merge_attention_states(outs, lses, validate=validate), local


# ---------------------------------------------------------------------------------------------
# Checking against dense attention
# ---------------------------------------------------------------------------------------------
def local_dense_attention(state: RankState) -> tuple[Tensor, Tensor]:
    """Dense attention over only the positions this rank owns: what its partial must be."""
    problem, dense = state.problem, state.dense
    owned = [
        owned_positions(n, state.world_size, state.rank, problem.interleave, problem.block_size)
        for n in problem.seq_lens
    ]
    width = max(max((len(o) for o in owned), default=0), 1)
    shape = (len(owned), width, problem.num_heads, problem.head_dim)
    key = torch.zeros(shape, dtype=dense.key.dtype, device=state.device)
    value = torch.zeros_like(key)
    for q, positions in enumerate(owned):
        key[q, : len(positions)] = dense.key[q, positions]
        value[q, : len(positions)] = dense.value[q, positions]
    lengths = torch.tensor([len(o) for o in owned], dtype=torch.int32, device=state.device)
    return dense_attention(dense.query, key, value, lengths)


def _max_error(got: Tensor, expected: Tensor) -> float:
    """Largest |got - expected|, with equal infinities (empty sequences) counting as 0."""
    same = (got == expected) | (torch.isnan(got) & torch.isnan(expected))
    difference = (got.double() - expected.double()).abs()
    return float(torch.where(same, 0.0, difference).max()) if got.numel() else 0.0


def check_rank(
    state: RankState, merged: tuple[Tensor, Tensor], local: tuple[Tensor, Tensor]
) -> dict[str, float]:
    """Max errors of this rank's results: merged vs dense attention over the whole sequence,
    and its own partial vs dense attention over the positions it owns (float, NaN if any)."""
    dense = state.dense
    expected_out, expected_lse = dense_attention(
        dense.query, dense.key, dense.value, dense.seq_lens
    )
    local_out, local_lse = local_dense_attention(state)
    return {
        "merged_out": _max_error(merged[0], expected_out),
        "merged_lse": _max_error(merged[1], expected_lse),
        "local_out": _max_error(local[0], local_out),
        "local_lse": _max_error(local[1], local_lse),
    }


# ---------------------------------------------------------------------------------------------
# The whole thing, on real processes or in one
# ---------------------------------------------------------------------------------------------
def cp_decode_rank(ctx, problem: CPProblem) -> dict:
    """The rank function for ``slotmap.distributed.run_ranks(cp_decode_rank, W, problem)``:
    build, prefill, one decode step with the all_gather and merge, check. Returns this rank's
    evidence (tensors come back on the CPU)."""
    state = build_rank_state(problem, ctx.world_size, ctx.rank, ctx.device)
    merged, local = decode_step(state)
    return {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "device": str(ctx.device),
        "communication": ctx.communication,
        "pid": os.getpid(),
        "out": merged[0],
        "lse": merged[1],
        "local_out": local[0],
        "local_lse": local[1],
        "local_lens": state.local_lens.tolist(),
        "decode_slots": state.slot_mapping.tolist(),
        "errors": check_rank(state, merged, local),
    }


def simulate_ranks(problem: CPProblem, world_size: int) -> dict:
    """Every rank's steps 1-3 in this process, one after the other, then the merge: the same
    functions as ``cp_decode_rank`` without processes (for figures and quick tests).

    Returns the states, the stacked partials ``outs`` [W, R, H, D] / ``lses`` [W, R, H], the
    merged (out, lse), dense attention's (out, lse) and the max errors."""
    from slotmap.backend import DEVICE

    states = [build_rank_state(problem, world_size, r, DEVICE) for r in range(world_size)]
    partials = [local_decode_step(state) for state in states]
    outs = torch.stack([p[0] for p in partials])
    lses = torch.stack([p[1] for p in partials])
    merged = merge_attention_states(outs, lses)
    dense = states[0].dense
    expected = dense_attention(dense.query, dense.key, dense.value, dense.seq_lens)
    return {
        "states": states,
        "outs": outs,
        "lses": lses,
        "merged": merged,
        "dense": expected,
        "errors": [check_rank(s, merged, p) for s, p in zip(states, partials, strict=True)],
    }
