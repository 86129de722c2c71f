"""End to end: write K/V into a paged cache through the slot mapping, read it back through the
block table in a paged decode attention, and merge partial attentions by log-sum-exp.

One concept per section, each with its Triton kernel, its launcher and its torch reference side
by side (same arguments, same result, so a test or a lesson swaps one for the other):

* ``reshape_and_cache``: token ``t``'s key and value go to slot ``slot_mapping[t]`` of the
  caches ``[num_blocks, block_size, num_heads, head_dim]``, i.e. physical block
  ``slot // block_size``, offset ``slot % block_size``; PAD slots (-1) are skipped. The
  structure of vLLM's Triton ``reshape_and_cache_flash``.
* ``paged_decode_attention``: one query token per request attends to the first
  ``seq_lens[q]`` positions of its request, found through the block table, with an online
  softmax. Returns the output and the log-sum-exp of the scores (natural log), the two
  things a context-parallel merge needs. ``dense_attention`` is the same attention on dense
  K/V, the ground truth.
* ``merge_attention_states``: partial attentions over disjoint sets of keys (one per
  context-parallel rank) combine exactly: ``lse = log sum_r exp(lse_r)`` and
  ``out = sum_r exp(lse_r - lse) * out_r``. A rank with no keys (``lse_r = -inf``) weighs 0.

The kernels use only elementwise arithmetic and reductions (no ``tl.dot``), so they run under
Triton's CPU interpreter at lesson sizes and compile unchanged for a GPU or an NPU.
"""

from __future__ import annotations

import math
import numbers

import torch
import triton
import triton.language as tl
from torch import Tensor

from slotmap.i18n import N_, _
from slotmap.layout import PAD_SLOT_ID
from slotmap.validate import _fail, as_int, check_no_overlap, check_tensor

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


# ---------------------------------------------------------------------------------------------
# Validation: a ValueError naming the offending tensor, token, request or value.
# ---------------------------------------------------------------------------------------------
def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_caches(key_cache: Tensor, value_cache: Tensor, device: torch.device, anchor: str):
    """Both caches [num_blocks, block_size, num_heads, head_dim], one dtype; returns the shape.
    ``anchor``: the tensor ``device`` is that of ("key is", marked with ``N_``)."""
    check_tensor("key_cache", key_cache, FLOAT_DTYPES, 4, device, anchor)
    check_tensor("value_cache", value_cache, FLOAT_DTYPES, 4, device, anchor)
    if key_cache.shape != value_cache.shape:
        _fail(
            _(
                "key_cache has shape {key} but value_cache {value}: "
                "both are [num_blocks, block_size, num_heads, head_dim]"
            ).format(key=tuple(key_cache.shape), value=tuple(value_cache.shape))
        )
    if key_cache.dtype != value_cache.dtype:
        _fail(
            _("key_cache is {key} but value_cache is {value}").format(
                key=_dtype_name(key_cache.dtype), value=_dtype_name(value_cache.dtype)
            )
        )
    if key_cache.shape[1] < 1:
        _fail(_("the caches have blocks of 0 slots (block_size must be >= 1)"))
    return tuple(key_cache.shape)


def check_reshape_and_cache_inputs(
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    *,
    pad_id: int = PAD_SLOT_ID,
    full: bool = True,
) -> None:
    """Shapes, dtypes, devices, contiguity; with ``full``, every slot (reads the tensor).
    ``pad_id`` is any int32 here: the slot value that writes nothing."""
    as_int("pad_id", pad_id)
    key_is = N_("key is")
    check_tensor("key", key, FLOAT_DTYPES, 3, getattr(key, "device", None), key_is)
    device = key.device
    check_tensor("value", value, FLOAT_DTYPES, 3, device, key_is)
    if key.shape != value.shape:
        _fail(
            _(
                "key has shape {key} but value {value}: both are [num_tokens, num_heads, head_dim]"
            ).format(key=tuple(key.shape), value=tuple(value.shape))
        )
    num_blocks, block_size, num_heads, head_dim = _check_caches(
        key_cache, value_cache, device, key_is
    )
    if (key.shape[1], key.shape[2]) != (num_heads, head_dim):
        _fail(
            _(
                "key has {heads} heads of {dim} but the cache holds "
                "{num_heads} heads of {head_dim}"
            ).format(heads=key.shape[1], dim=key.shape[2], num_heads=num_heads, head_dim=head_dim)
        )
    for name, tensor in (("key", key), ("value", value)):
        if tensor.dtype != key_cache.dtype:
            _fail(
                _("{name} is {dtype} but the cache is {cache}: cast one of them").format(
                    name=name, dtype=_dtype_name(tensor.dtype), cache=_dtype_name(key_cache.dtype)
                )
            )
    check_tensor("slot_mapping", slot_mapping, INDEX_DTYPES, 1, device, key_is)
    reads = {"key": key, "value": value, "slot_mapping": slot_mapping}
    for cache_name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        for name, tensor in reads.items():
            check_no_overlap(cache_name, cache, name, tensor)
    check_no_overlap("key_cache", key_cache, "value_cache", value_cache)
    num_tokens = key.shape[0]
    if slot_mapping.numel() < num_tokens:
        _fail(
            _("slot_mapping has {entries} entries for {num_tokens} tokens").format(
                entries=slot_mapping.numel(), num_tokens=num_tokens
            )
        )
    if not full or num_tokens == 0:
        return
    slots = slot_mapping[:num_tokens].to(torch.int64)
    num_slots = num_blocks * block_size
    bad = ((slots != pad_id) & ((slots < 0) | (slots >= num_slots))).nonzero()
    if bad.numel():
        t = int(bad[0, 0])
        _fail(
            _(
                "token {t}: slot {slot} is outside the cache ({num_blocks} blocks of "
                "{block_size} slots: 0..{last}, or PAD_ID {pad_id})"
            ).format(
                t=t,
                slot=int(slots[t]),
                num_blocks=num_blocks,
                block_size=block_size,
                last=num_slots - 1,
                pad_id=pad_id,
            )
        )
    real = (slots != pad_id).nonzero()[:, 0]
    ordered, order = torch.sort(slots[real], stable=True)
    same = (ordered[1:] == ordered[:-1]).nonzero()
    if same.numel():
        i = int(same[0, 0])
        first, second = int(real[order[i]]), int(real[order[i + 1]])
        _fail(
            _(
                "tokens {first} and {second} both write slot {slot}: which one the "
                "cache keeps would depend on the order the programs run in"
            ).format(first=first, second=second, slot=int(ordered[i]))
        )


def check_paged_attention_inputs(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    *,
    full: bool = True,
) -> None:
    """Shapes, dtypes, devices, contiguity; with ``full``, lengths and block numbers."""
    query_is = N_("query is")
    check_tensor("query", query, FLOAT_DTYPES, 3, getattr(query, "device", None), query_is)
    device = query.device
    num_blocks, block_size, num_heads, head_dim = _check_caches(
        key_cache, value_cache, device, query_is
    )
    num_reqs = query.shape[0]
    if (query.shape[1], query.shape[2]) != (num_heads, head_dim):
        _fail(
            _(
                "query has {heads} heads of {dim} but the cache holds "
                "{num_heads} heads of {head_dim}"
            ).format(
                heads=query.shape[1], dim=query.shape[2], num_heads=num_heads, head_dim=head_dim
            )
        )
    check_tensor("block_table", block_table, (torch.int32,), 2, device, query_is)
    check_tensor("seq_lens", seq_lens, (torch.int32,), 1, device, query_is)
    if seq_lens.numel() != num_reqs:
        _fail(
            _("seq_lens has {entries} entries for {num_reqs} requests (query rows)").format(
                entries=seq_lens.numel(), num_reqs=num_reqs
            )
        )
    if block_table.shape[0] < num_reqs:
        _fail(
            _("{num_reqs} requests but the block table has only {rows} rows").format(
                num_reqs=num_reqs, rows=block_table.shape[0]
            )
        )
    if not full or num_reqs == 0:
        return
    lengths = seq_lens.to(torch.int64)
    if (bad := (lengths < 0).nonzero()).numel():
        q = int(bad[0, 0])
        _fail(
            _("request {q}: seq_lens[{q}] = {length} is negative").format(
                q=q, length=int(lengths[q])
            )
        )
    row_length = block_table.shape[1]
    needed = (lengths + block_size - 1) // block_size
    if (bad := (needed > row_length).nonzero()).numel():
        q = int(bad[0, 0])
        _fail(
            _(
                "request {q}: {length} positions need {needed} logical blocks of "
                "{block_size}, but a block-table row holds {row_length}"
            ).format(
                q=q,
                length=int(lengths[q]),
                needed=int(needed[q]),
                block_size=block_size,
                row_length=row_length,
            )
        )
    used = torch.arange(row_length, device=device)[None, :] < needed[:, None]
    entries = block_table[:num_reqs].to(torch.int64)
    if (bad := (used & ((entries < 0) | (entries >= num_blocks))).nonzero()).numel():
        q, b = int(bad[0, 0]), int(bad[0, 1])
        _fail(
            _(
                "request {q}: block_table[{q}, {b}] = {entry} is not a physical "
                "block of the cache (0..{last})"
            ).format(q=q, b=b, entry=int(entries[q, b]), last=num_blocks - 1)
        )


# ---------------------------------------------------------------------------------------------
# 1. reshape_and_cache: write each token's key and value into its slot.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,  # [num_tokens, num_heads, head_dim], float
    value_ptr,  # [num_tokens, num_heads, head_dim], float
    key_cache_ptr,  # [num_blocks, block_size, num_heads, head_dim], float (written)
    value_cache_ptr,  # [num_blocks, block_size, num_heads, head_dim], float (written)
    slot_mapping_ptr,  # [>= num_tokens], int32 or int64: slot of each token, or PAD_ID
    block_size,  # int: slots per physical block
    num_slots,  # int: num_blocks * block_size
    block_stride,  # int: elements from one physical block to the next
    slot_stride,  # int: elements from one slot of a block to the next (num_heads * head_dim)
    ROW: tl.constexpr,  # num_heads * head_dim: elements of one token's key
    ROW_TILE: tl.constexpr,  # next_power_of_2(ROW): lanes of the copy
    PAD_ID: tl.constexpr,  # the slot value that means "no slot" (-1)
):
    # key_cache[slot // block_size, slot % block_size] = key[token], unless slot is PAD
    # e.g. block_size 4, slot 9 -> physical block 2, offset 1; slot -1 -> nothing written
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    # A PAD token (another rank's position under context parallelism, or the padding of a
    # fixed-size batch) has no slot: it writes nothing. A slot past the cache is dropped too,
    # so that unvalidated input can never write outside the caches.
    if (slot == PAD_ID) | (slot < 0) | (slot >= num_slots):
        return
    block = slot // block_size
    offset = slot % block_size
    lanes = tl.arange(0, ROW_TILE)
    mask = lanes < ROW  # ROW need not be a power of two
    target = block * block_stride + offset * slot_stride + lanes
    key = tl.load(key_ptr + token * ROW + lanes, mask=mask)
    value = tl.load(value_ptr + token * ROW + lanes, mask=mask)
    tl.store(key_cache_ptr + target, key, mask=mask)
    tl.store(value_cache_ptr + target, value, mask=mask)


def reshape_and_cache(
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    *,
    pad_id: int = PAD_SLOT_ID,
    validate: bool = True,
) -> None:
    """Write ``key[t]`` and ``value[t]`` into slot ``slot_mapping[t]`` of the caches, in place.

    key, value: [num_tokens, num_heads, head_dim]; key_cache, value_cache: [num_blocks,
    block_size, num_heads, head_dim], same dtype; slot_mapping: [>= num_tokens] int32 or
    int64 (a padded persistent buffer is fine: only the first num_tokens entries are read).
    Tokens whose slot is ``pad_id`` (-1) write nothing. ``validate=False`` skips the checks
    that read the slot mapping (the kernel still never writes outside the caches).
    """
    check_reshape_and_cache_inputs(
        key, value, key_cache, value_cache, slot_mapping, pad_id=pad_id, full=validate
    )
    pad_id = as_int("pad_id", pad_id)
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    num_blocks, block_size, num_heads, head_dim = key_cache.shape
    row = num_heads * head_dim
    _reshape_and_cache_kernel[(num_tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        block_size,
        num_blocks * block_size,
        key_cache.stride(0),
        key_cache.stride(1),
        ROW=row,
        ROW_TILE=triton.next_power_of_2(row),
        PAD_ID=pad_id,
    )


def reshape_and_cache_torch(
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    *,
    pad_id: int = PAD_SLOT_ID,
    validate: bool = True,
) -> None:
    """The reference of ``reshape_and_cache``: same arguments, same effect."""
    check_reshape_and_cache_inputs(
        key, value, key_cache, value_cache, slot_mapping, pad_id=pad_id, full=validate
    )
    num_tokens = key.shape[0]
    slots = slot_mapping[:num_tokens].to(torch.int64)
    real = slots != pad_id
    block_size = key_cache.shape[1]
    blocks, offsets = slots[real] // block_size, slots[real] % block_size
    key_cache[blocks, offsets] = key[real]
    value_cache[blocks, offsets] = value[real]


# ---------------------------------------------------------------------------------------------
# 2. Paged decode attention: read the cache back through the block table.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _paged_decode_attention_kernel(
    out_ptr,  # [num_reqs, num_heads, head_dim], float32 (written)
    lse_ptr,  # [num_reqs, num_heads], float32 (written): log sum_j exp(score_j)
    query_ptr,  # [num_reqs, num_heads, head_dim], float: one query token per request
    key_cache_ptr,  # [num_blocks, block_size, num_heads, head_dim], float
    value_cache_ptr,  # [num_blocks, block_size, num_heads, head_dim], float
    block_table_ptr,  # [max_num_reqs, block_table_stride], int32: logical -> physical block
    block_table_stride,  # int: entries per block-table row
    seq_lens_ptr,  # [num_reqs], int32: positions 0..seq_len-1 of each request are attended
    scale,  # float: multiplies q . k (usually 1 / sqrt(head_dim))
    block_size,  # int: slots per physical block
    num_blocks,  # int: physical blocks in the caches
    block_stride,  # int: elements from one physical block to the next
    slot_stride,  # int: elements from one slot to the next (num_heads * head_dim)
    HEAD_DIM: tl.constexpr,  # elements per head
    HEAD_DIM_TILE: tl.constexpr,  # next_power_of_2(HEAD_DIM)
    BLOCK_SIZE_TILE: tl.constexpr,  # next_power_of_2(block_size): lanes per logical block
):
    # out = sum_j softmax(scale * q . k_j) v_j over the request's positions j, where position
    # j is at slot block_table[q, j // block_size] * block_size + j % block_size
    # e.g. block_size 4, row [7, 2], seq_len 6: positions 0..5 are read from slots 28..31, 8, 9
    req = tl.program_id(0)
    head = tl.program_id(1)
    num_heads = tl.num_programs(1)
    seq_len = tl.load(seq_lens_ptr + req)

    dims = tl.arange(0, HEAD_DIM_TILE)
    dim_mask = dims < HEAD_DIM
    query = tl.load(query_ptr + (req * num_heads + head) * HEAD_DIM + dims, mask=dim_mask)
    query = query.to(tl.float32)
    lanes = tl.arange(0, BLOCK_SIZE_TILE)

    # Online softmax: the running maximum score, the running sum of exp(score - maximum) and
    # the running weighted sum of values, rescaled whenever the maximum grows.
    running_max = -float("inf")
    running_sum = 0.0
    acc = tl.zeros([HEAD_DIM_TILE], dtype=tl.float32)
    block_table_row_ptr = block_table_ptr + req * block_table_stride
    # Unvalidated seq_len: never read past the block-table row (nor loop that far). Not
    # tl.cdiv: seq_len + block_size - 1 overflows int32 near 2**31.
    num_logical_blocks = seq_len // block_size + (seq_len % block_size > 0)
    num_logical_blocks = tl.minimum(num_logical_blocks, block_table_stride)
    for logical_block in range(0, num_logical_blocks):
        # One block-table entry per logical block: where this block's slots are.
        physical_block = tl.load(block_table_row_ptr + logical_block).to(tl.int64)
        positions = logical_block * block_size + lanes
        valid = (lanes < block_size) & (positions < seq_len)
        # Unvalidated entry outside the caches: its lanes read nothing.
        in_cache = (physical_block >= 0) & (physical_block < num_blocks)
        valid = tl.where(in_cache, valid, False)
        base = tl.where(in_cache, physical_block, 0) * block_stride + head * HEAD_DIM
        offsets = base + lanes[:, None] * slot_stride + dims[None, :]
        mask = valid[:, None] & dim_mask[None, :]
        key = tl.load(key_cache_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        scores = tl.sum(key * query[None, :], axis=1) * scale
        scores = tl.where(valid, scores, -float("inf"))

        new_max = tl.maximum(running_max, tl.max(scores, axis=0))
        # No valid lane yet leaves the maximum at -inf: shift by 0, as -inf - -inf is NaN.
        shift = tl.where(new_max == -float("inf"), 0.0, new_max)
        rescale = tl.exp(running_max - shift)  # 0 on the first block (max was -inf)
        weights = tl.exp(scores - shift)  # 0 on masked lanes
        value = tl.load(value_cache_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        acc = acc * rescale + tl.sum(weights[:, None] * value, axis=0)
        running_sum = running_sum * rescale + tl.sum(weights, axis=0)
        running_max = new_max

    # An empty sequence (seq_len 0: a rank that owns none of the request's positions) has
    # no keys: output 0 and lse -inf, so that a log-sum-exp merge gives it weight 0. Dividing
    # by 1 instead of 0 keeps NaN out of it; a NaN score or value still gives NaN, as torch.
    denominator = tl.where(running_sum == 0, 1.0, running_sum)
    out = acc / denominator
    lse = running_max + tl.log(denominator)
    tl.store(out_ptr + (req * num_heads + head) * HEAD_DIM + dims, out, mask=dim_mask)
    tl.store(lse_ptr + req * num_heads + head, lse)


def _default_scale(head_dim: int, scale: float | None) -> float:
    """The scale as a float: 1/sqrt(head_dim) when None; else a finite real number (a NaN or
    an infinity would turn every output into NaN without a word)."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(
            _("scale must be a real number, got {type}").format(type=type(scale).__name__)
        )
    if not math.isfinite(scale):
        raise ValueError(_("scale must be a finite number, got {scale}").format(scale=scale))
    return float(scale)


def paged_decode_attention(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    scale: float | None = None,
    *,
    validate: bool = True,
) -> tuple[Tensor, Tensor]:
    """Decode attention over a paged KV cache: one query token per request.

    query: [num_reqs, num_heads, head_dim]; key_cache, value_cache: [num_blocks, block_size,
    num_heads, head_dim]; block_table: [>= num_reqs, max_blocks_per_req] int32;
    seq_lens: [num_reqs] int32, request q attends to its positions 0..seq_lens[q]-1, stored
    at slot ``block_table[q, j // block_size] * block_size + j % block_size``.
    ``scale`` defaults to 1/sqrt(head_dim).
    Returns (out [num_reqs, num_heads, head_dim] float32, lse [num_reqs, num_heads] float32,
    the natural log of the softmax's denominator); a request of length 0 gets out 0 and
    lse -inf. ``validate=False`` skips the checks that read seq_lens and the block table.
    """
    check_paged_attention_inputs(
        query, key_cache, value_cache, block_table, seq_lens, full=validate
    )
    num_reqs, num_heads, head_dim = query.shape
    scale = _default_scale(head_dim, scale)  # named even when there is nothing to attend
    block_size = key_cache.shape[1]
    out = torch.empty(num_reqs, num_heads, head_dim, dtype=torch.float32, device=query.device)
    lse = torch.empty(num_reqs, num_heads, dtype=torch.float32, device=query.device)
    if num_reqs == 0 or num_heads == 0:
        return out, lse
    _paged_decode_attention_kernel[(num_reqs, num_heads)](
        # The row length is a contiguous table's row stride, and 0 for rows of no entries.
        out,
        lse,
        query,
        key_cache,
        value_cache,
        block_table,
        block_table.shape[1],
        seq_lens,
        scale,
        block_size,
        key_cache.shape[0],
        key_cache.stride(0),
        key_cache.stride(1),
        HEAD_DIM=head_dim,
        HEAD_DIM_TILE=triton.next_power_of_2(head_dim),
        BLOCK_SIZE_TILE=triton.next_power_of_2(block_size),
    )
    return out, lse


def dense_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    seq_lens: Tensor,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """The ground truth: decode attention on dense K/V, in float64.

    query: [num_reqs, num_heads, head_dim]; key, value: [num_reqs, max_seq_len, num_heads,
    head_dim], request q's position j in row [q, j]; seq_lens: [num_reqs], request q attends
    to positions 0..seq_lens[q]-1. Returns (out [num_reqs, num_heads, head_dim] float32,
    lse [num_reqs, num_heads] float32); a request of length 0 gets out 0 and lse -inf.
    """
    head_dim = query.shape[-1]
    q, k, v = query.double(), key.double(), value.double()
    scores = torch.einsum("rhd,rjhd->rhj", q, k) * _default_scale(head_dim, scale)
    positions = torch.arange(key.shape[1], device=key.device)
    attended = positions[None, :] < seq_lens.to(key.device)[:, None].to(torch.int64)
    scores = scores.masked_fill(~attended[:, None, :], -math.inf)
    lse = torch.logsumexp(scores, dim=-1)  # -inf where nothing is attended, NaN from a NaN
    # No keys: weight 0 (not exp(-inf - -inf), NaN); a NaN score stays NaN, as in torch.
    empty = torch.isneginf(lse)[..., None]
    weights = torch.where(empty, 0.0, torch.exp(scores - torch.where(empty, 0.0, lse[..., None])))
    v = v.masked_fill(~attended[:, :, None, None], 0.0)  # positions not attended are not read
    out = torch.einsum("rhj,rjhd->rhd", weights, v)
    return out.float(), lse.float()


def gather_through_block_table(
    key_cache: Tensor, block_table: Tensor, seq_lens: Tensor
) -> tuple[Tensor, Tensor]:
    """The positions a paged attention reads, as a dense tensor: [num_reqs, max_seq_len,
    num_heads, head_dim] taken from ``key_cache`` through the block table (zeros past each
    request's length), and the [num_reqs, max_seq_len] slots they came from (-1 past it)."""
    num_reqs = seq_lens.numel()
    block_size = key_cache.shape[1]
    longest = int(seq_lens.max()) if num_reqs else 0
    positions = torch.arange(longest, device=key_cache.device)
    attended = positions[None, :] < seq_lens[:, None].to(torch.int64)
    blocks = torch.where(attended, positions // block_size, 0)
    physical = torch.gather(block_table[:num_reqs].to(torch.int64), 1, blocks)
    slots = torch.where(attended, physical * block_size + positions % block_size, -1)
    flat = key_cache.reshape(-1, *key_cache.shape[2:])
    dense = torch.where(attended[..., None, None], flat[slots.clamp(min=0)], 0.0)
    return dense, slots


def paged_decode_attention_torch(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    scale: float | None = None,
    *,
    validate: bool = True,
) -> tuple[Tensor, Tensor]:
    """The reference of ``paged_decode_attention``: gather the request's positions through
    the block table, then ``dense_attention``. Same arguments, same result."""
    check_paged_attention_inputs(
        query, key_cache, value_cache, block_table, seq_lens, full=validate
    )
    key, _key_lens = gather_through_block_table(key_cache, block_table, seq_lens)
    value, _value_lens = gather_through_block_table(value_cache, block_table, seq_lens)
    return dense_attention(query, key, value, seq_lens, scale)


# ---------------------------------------------------------------------------------------------
# 3. Merging partial attentions by log-sum-exp.
# ---------------------------------------------------------------------------------------------
def check_merge_inputs(outs: Tensor, lses: Tensor, *, full: bool = True) -> None:
    """Shapes, dtypes and devices; with ``full``, also the values of ``lses``: a partial state
    with no keys has lse -inf (FlashAttention-2 reports +inf there; vLLM's merge maps it to
    -inf), and NaN means the partial itself is broken."""
    outs_is = N_("outs is")
    check_tensor("outs", outs, (torch.float32,), 4, getattr(outs, "device", None), outs_is)
    check_tensor("lses", lses, (torch.float32,), 3, outs.device, outs_is)
    if tuple(lses.shape) != tuple(outs.shape[:3]):
        _fail(
            _(
                "outs has shape {outs} but lses {lses}: "
                "[num_states, num_reqs, num_heads, head_dim] and [num_states, num_reqs, num_heads]"
            ).format(outs=tuple(outs.shape), lses=tuple(lses.shape))
        )
    if outs.shape[0] < 1:
        _fail(_("nothing to merge: outs holds 0 partial states"))
    if full and lses.numel():
        bad = torch.isnan(lses) | (lses == math.inf)
        if bool(bad.any()):
            state, req, head = (int(i) for i in bad.nonzero()[0])
            _fail(
                _(
                    "lses[{state}, {req}, {head}] is {value}: a state with "
                    "no keys has lse -inf (map FlashAttention's +inf to -inf first)"
                ).format(state=state, req=req, head=head, value=float(lses[state, req, head]))
            )


@triton.jit
def _merge_attention_states_kernel(
    out_ptr,  # [num_reqs * num_heads, head_dim], float32 (written)
    lse_ptr,  # [num_reqs * num_heads], float32 (written)
    outs_ptr,  # [num_states, num_reqs * num_heads, head_dim], float32: partial outputs
    lses_ptr,  # [num_states, num_reqs * num_heads], float32: their log-sum-exps
    num_states,  # int: partial states (context-parallel ranks)
    num_rows,  # int: num_reqs * num_heads
    HEAD_DIM: tl.constexpr,  # elements per head
    HEAD_DIM_TILE: tl.constexpr,  # next_power_of_2(HEAD_DIM)
):
    # lse = log sum_r exp(lse_r);  out = sum_r exp(lse_r - lse) * out_r
    # e.g. lse_0 = lse_1: each partial output weighs 1/2; lse_1 = -inf (no keys): rank 1 weighs 0
    row = tl.program_id(0)
    dims = tl.arange(0, HEAD_DIM_TILE)
    dim_mask = dims < HEAD_DIM
    largest = -float("inf")
    for state in range(0, num_states):
        largest = tl.maximum(largest, tl.load(lses_ptr + state * num_rows + row))
    # Subtract the largest lse before exp (no overflow); if every state is empty it is -inf,
    # and -inf - -inf would be NaN: shift by 0 instead, so every weight is exp(-inf) = 0.
    shift = tl.where(largest == -float("inf"), 0.0, largest)
    total = 0.0
    acc = tl.zeros([HEAD_DIM_TILE], dtype=tl.float32)
    for state in range(0, num_states):
        weight = tl.exp(tl.load(lses_ptr + state * num_rows + row) - shift)
        partial = tl.load(outs_ptr + (state * num_rows + row) * HEAD_DIM + dims, mask=dim_mask)
        acc += weight * partial
        total += weight
    # Every state empty: out 0, lse -inf. A NaN lse or output gives NaN in both.
    denominator = tl.where(total == 0, 1.0, total)
    tl.store(out_ptr + row * HEAD_DIM + dims, acc / denominator, mask=dim_mask)
    tl.store(lse_ptr + row, tl.where(total == 0, -float("inf"), shift + tl.log(denominator)))


def merge_attention_states(
    outs: Tensor, lses: Tensor, *, validate: bool = True
) -> tuple[Tensor, Tensor]:
    """Merge partial attentions over disjoint sets of keys into the attention over all of them.

    outs: [num_states, num_reqs, num_heads, head_dim] float32; lses: [num_states, num_reqs,
    num_heads] float32 (-inf: that state saw no keys). Returns (out [num_reqs, num_heads,
    head_dim], lse [num_reqs, num_heads]), both float32. ``validate=False`` skips the check
    of the lse values (it reads them: a device synchronisation).
    """
    check_merge_inputs(outs, lses, full=validate)
    num_states, num_reqs, num_heads, head_dim = outs.shape
    out = torch.empty(num_reqs, num_heads, head_dim, dtype=torch.float32, device=outs.device)
    lse = torch.empty(num_reqs, num_heads, dtype=torch.float32, device=outs.device)
    if num_reqs * num_heads == 0:
        return out, lse
    _merge_attention_states_kernel[(num_reqs * num_heads,)](
        out,
        lse,
        outs,
        lses,
        num_states,
        num_reqs * num_heads,
        HEAD_DIM=head_dim,
        HEAD_DIM_TILE=triton.next_power_of_2(head_dim),
    )
    return out, lse


def merge_attention_states_torch(
    outs: Tensor, lses: Tensor, *, validate: bool = True
) -> tuple[Tensor, Tensor]:
    """The reference of ``merge_attention_states``: same arguments, same result."""
    check_merge_inputs(outs, lses, full=validate)
    lse = torch.logsumexp(lses.double(), dim=0)  # -inf where every state is empty
    # All states empty: weight 0 (not exp(-inf - -inf)); a NaN lse keeps its NaN.
    empty = torch.isneginf(lse)
    weights = torch.where(empty, 0.0, torch.exp(lses.double() - torch.where(empty, 0.0, lse)))
    out = (weights[..., None] * outs.double()).sum(dim=0)
    return out.float(), lse.float()


__all__ = [
    "check_paged_attention_inputs",
    "check_reshape_and_cache_inputs",
    "dense_attention",
    "gather_through_block_table",
    "merge_attention_states",
    "merge_attention_states_torch",
    "paged_decode_attention",
    "paged_decode_attention_torch",
    "reshape_and_cache",
    "reshape_and_cache_torch",
]
