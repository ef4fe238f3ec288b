"""Micro-batches for training: pack several sequences into one row without attention across them.

A packed row holds sequences back to back; each restarts its position ids at 0. With no 2-D attention mask,
transformers (≥ 5) reads the restarts in ``position_ids`` and builds a block-diagonal causal mask, so a
token attends only to earlier tokens of its own sequence (``tests/unit/trainer/test_packing.py`` proves
packed logprobs equal unpacked ones). The padded layout (one sequence per row, right padding and an
attention mask) is kept as the baseline the benchmark compares against.

Every per-token quantity of a sequence is stored at the position that *predicts* the token: token ``i + 1``
is predicted from position ``i``, so ``targets[i] = tokens[i + 1]`` and the masks/fields shift with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from shared.log import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class TrainSeq:
    """One sequence to train on, with per-token values aligned to ``tokens`` (as in a ``Sample``)."""

    tokens: list[int]
    mask: list[int]  # 1 where the token is trained
    fields: dict[str, list[float]] = field(default_factory=dict)  # per-token extras (sampler logprobs, …)
    index: int = 0  # position in the step's list, to map results back


@dataclass
class MicroBatch:
    """Tensors of one forward pass; ``[rows, length]`` each. ``seq`` is -1 on padding."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None  # None for packed rows (block-diagonal mask from position ids)
    targets: torch.Tensor
    target_mask: torch.Tensor  # float: 1 where targets[i] is a trained token
    seq: torch.Tensor  # which TrainSeq.index each position belongs to
    fields: dict[str, torch.Tensor]

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens: what tokens/s counts."""
        return int((self.seq >= 0).sum())

    @property
    def num_slots(self) -> int:
        return self.input_ids.numel()


def _row(seqs: list[TrainSeq], length: int, field_names: list[str]) -> dict[str, list]:
    """One row of ``length`` slots holding ``seqs`` back to back, padded at the end."""
    row = {"input_ids": [], "position_ids": [], "targets": [], "target_mask": [], "seq": []}
    row.update({name: [] for name in field_names})
    for s in seqs:
        n = len(s.tokens)
        row["input_ids"] += s.tokens
        row["position_ids"] += list(range(n))
        row["targets"] += [*s.tokens[1:], 0]
        row["target_mask"] += [*s.mask[1:], 0]
        row["seq"] += [s.index] * n
        for name in field_names:
            row[name] += [*s.fields[name][1:], 0.0]
    _pad_row(row, length, field_names)
    return row


def _pad_row(row: dict[str, list], length: int, field_names: list[str]) -> int:
    """Fill ``row`` up to ``length`` slots; returns how many were added. Padding restarts its positions at 0,
    so in a packed row it forms a block of its own; it is never trained."""
    pad = length - len(row["input_ids"])
    row["input_ids"] += [0] * pad
    row["position_ids"] += list(range(pad))
    row["targets"] += [0] * pad
    row["target_mask"] += [0] * pad
    row["seq"] += [-1] * pad
    for name in field_names:
        row[name] += [0.0] * pad
    return pad


def _batch(rows: list[list[TrainSeq]], length: int, field_names: list[str], packed: bool) -> MicroBatch:
    built = [_row(r, length, field_names) for r in rows]
    col = {k: [b[k] for b in built] for k in built[0]}
    seq = torch.tensor(col["seq"], dtype=torch.long)
    return MicroBatch(
        input_ids=torch.tensor(col["input_ids"], dtype=torch.long),
        position_ids=torch.tensor(col["position_ids"], dtype=torch.long),
        attention_mask=None if packed else (seq >= 0).long(),
        targets=torch.tensor(col["targets"], dtype=torch.long),
        target_mask=torch.tensor(col["target_mask"], dtype=torch.float32),
        seq=seq,
        fields={k: torch.tensor(col[k], dtype=torch.float32) for k in field_names},
    )


def pack(seqs: list[TrainSeq], token_budget: int, row_tokens: int | None = None) -> list[MicroBatch]:
    """Packed micro-batches: sequences first-fit-decreasing into rows, rows grouped up to ``token_budget`` slots.

    A row holds at most ``row_tokens`` tokens (default: the longest sequence, capped by the budget), so no
    row is longer than an unpacked one would be: attention, which is quadratic in the row length wherever
    no variable-length kernel exists (CPU), costs no more than with padding, while the padding itself is
    gone. A sequence longer than the budget gets a row and a micro-batch of its own (and a warning): it is
    never truncated.
    """
    if not seqs:
        return []
    field_names = sorted(seqs[0].fields)
    longest = max(len(s.tokens) for s in seqs)
    if longest > token_budget:
        log.warning("sequence longer than the micro-batch budget", extra={"tokens": longest, "budget": token_budget})
    cap = min(row_tokens or longest, token_budget)
    rows: list[list[TrainSeq]] = []
    used: list[int] = []
    for s in sorted(seqs, key=lambda s: (-len(s.tokens), s.index)):
        n = len(s.tokens)
        for i, u in enumerate(used):
            if u + n <= cap:
                rows[i].append(s)
                used[i] += n
                break
        else:
            rows.append([s])
            used.append(n)
    order = sorted(range(len(rows)), key=lambda i: -used[i])
    batches: list[MicroBatch] = []
    group: list[int] = []
    for i in order:  # longest row first, so a group's first row sets its padded length
        if group and used[group[0]] * (len(group) + 1) > token_budget:
            batches.append(_batch([rows[j] for j in group], used[group[0]], field_names, packed=True))
            group = []
        group.append(i)
    batches.append(_batch([rows[j] for j in group], used[group[0]], field_names, packed=True))
    return batches


def pad(seqs: list[TrainSeq], token_budget: int) -> list[MicroBatch]:
    """The plain layout: sequences in arrival order, one per row, right-padded to the longest of the batch.

    Rows are added while ``rows × longest`` stays within ``token_budget``.
    """
    if not seqs:
        return []
    field_names = sorted(seqs[0].fields)
    batches: list[MicroBatch] = []
    current: list[TrainSeq] = []
    for s in seqs:
        longest = max([len(s.tokens)] + [len(c.tokens) for c in current])
        if current and longest * (len(current) + 1) > token_budget:
            batches.append(_padded(current, field_names))
            current = []
        current.append(s)
    batches.append(_padded(current, field_names))
    return batches


def _padded(seqs: list[TrainSeq], field_names: list[str]) -> MicroBatch:
    length = max(len(s.tokens) for s in seqs)
    return _batch([[s] for s in seqs], length, field_names, packed=False)


def unpack(values: torch.Tensor, batch: MicroBatch, out: dict[int, list[float]]) -> None:
    """Scatter per-position ``values`` back to per-sequence lists aligned with the tokens.

    ``out[index][t]`` is the value for token ``t`` (token 0 has none: it stays 0.0).
    """
    flat_seq = batch.seq.reshape(-1).tolist()
    flat_val = values.detach().reshape(-1).tolist()
    flat_pos = batch.position_ids.reshape(-1).tolist()
    seen: set[int] = set()
    for s, v, p in zip(flat_seq, flat_val, flat_pos, strict=True):
        if s < 0:
            continue
        seen.add(s)
        row = out.setdefault(s, [0.0])
        if len(row) == p + 1:
            row.append(v)
    for s in seen:
        del out[s][-1:]  # the last position of a sequence predicts nothing


def empty_batch(field_names: list[str]) -> MicroBatch:
    """A one-token batch with nothing to train: keeps ranks in step when one has fewer micro-batches."""
    return _batch(
        [[TrainSeq(tokens=[0], mask=[0], fields={k: [0.0] for k in field_names}, index=-1)]],
        1,
        field_names,
        packed=True,
    )


# ------------------------------------------------------------------ shared prompts
# A GRPO group is n samples of one prompt: packed one by one, the prompt goes through the model n times with
# the same result. ``pack_shared`` puts a group's prompt in a row once and its n continuations after it, each
# attending to the prompt and to itself only (a 4-D mask). The prompt's activations then feed n continuations,
# so backward sums their n gradients through them: the same gradient as n separate copies, for one forward.


@dataclass
class _Tree:
    """One shared prefix and the sequences that continue it; ``prefix`` = 0 for a sequence on its own."""

    prefix: int  # tokens of branches[0].tokens[:prefix], identical in every branch
    branches: list[TrainSeq]

    @property
    def size(self) -> int:
        return self.prefix + sum(len(s.tokens) - self.prefix for s in self.branches)


def shared_prefix(s: TrainSeq) -> int:
    """Tokens of ``s`` that can be shared with other samples of its prompt: those before the position that
    predicts its first trained token (the prompt minus its last token, which each branch keeps so that its
    first trained token is predicted inside the branch)."""
    first = s.mask.index(1) if 1 in s.mask else len(s.tokens)
    return max(first - 1, 0)


def _trees(seqs: list[TrainSeq], cap: int, min_prefix: int) -> list[_Tree]:
    """Sequences whose untrained prompts are equal, as trees of at most ``cap`` tokens each."""
    groups: dict[tuple[int, ...], list[TrainSeq]] = {}
    for s in seqs:
        n = shared_prefix(s)
        key = tuple(s.tokens[: n + 1]) if n >= min_prefix else (-1 - s.index,)
        groups.setdefault(key, []).append(s)
    trees: list[_Tree] = []
    for members in groups.values():
        n = shared_prefix(members[0]) if len(members) > 1 else 0
        tree = _Tree(n, [])
        for s in sorted(members, key=lambda s: s.index):
            if tree.branches and tree.size + len(s.tokens) - n > cap:
                trees.append(tree)
                tree = _Tree(n, [])
            tree.branches.append(s)
        trees.append(tree)
    for t in trees:
        if len(t.branches) == 1:
            t.prefix = 0  # nothing to share: a plain sequence
    return trees


def _tree_row(trees: list[_Tree], length: int, field_names: list[str]) -> dict[str, list]:
    """``_row`` for trees, plus per position its tree (``tree``) and branch (``branch``: -1 in a prefix)."""
    row: dict[str, list] = {k: [] for k in ("input_ids", "position_ids", "targets", "target_mask", "seq")}
    row.update({name: [] for name in field_names} | {"tree": [], "branch": []})

    def put(s: TrainSeq, lo: int, hi: int, tree: int, branch: int) -> None:
        n = len(s.tokens)
        row["input_ids"] += s.tokens[lo:hi]
        row["position_ids"] += list(range(lo, hi))
        row["targets"] += [*s.tokens[lo + 1 : hi + 1], *([0] if hi == n else [])]
        if branch < 0:  # the prefix trains nothing; its positions are counted for its first branch
            row["target_mask"] += [0] * (hi - lo)
            for name in field_names:
                row[name] += [0.0] * (hi - lo)
        else:
            row["target_mask"] += [*s.mask[lo + 1 : hi], 0]
            for name in field_names:
                row[name] += [*s.fields[name][lo + 1 : hi], 0.0]
        row["seq"] += [s.index] * (hi - lo)
        row["tree"] += [tree] * (hi - lo)
        row["branch"] += [branch] * (hi - lo)

    for t, tree in enumerate(trees):
        if tree.prefix:
            put(tree.branches[0], 0, tree.prefix, t, -1)
        for b, s in enumerate(tree.branches):
            put(s, tree.prefix, len(s.tokens), t, b)
    pad = _pad_row(row, length, field_names)
    row["tree"] += [len(trees)] * pad  # padding: a causal block of its own
    row["branch"] += [-1] * pad
    return row


def tree_mask(tree: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
    """Boolean attention ``[rows, 1, L, L]`` (True = may attend): a query sees earlier keys of its own tree
    that are in the shared prefix or in its own branch."""
    q_tree, k_tree = tree.unsqueeze(-1), tree.unsqueeze(-2)
    q_branch, k_branch = branch.unsqueeze(-1), branch.unsqueeze(-2)
    length = tree.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    visible = (k_branch == -1) | (k_branch == q_branch)
    return ((q_tree == k_tree) & visible & causal).unsqueeze(1)


def pack_shared(seqs: list[TrainSeq], token_budget: int, min_prefix: int = 8) -> list[MicroBatch]:
    """Packed micro-batches in which samples of one prompt share a single copy of it (see above).

    A prompt is shared when ``min_prefix`` or more of its tokens can be; a tree (prompt and continuations)
    holds at most ``token_budget`` tokens (a larger group is split, each part with its own copy of the
    prompt). Values are only meaningful at trained positions: ``unpack`` (all positions of every sequence)
    needs ``pack``.
    """
    if not seqs:
        return []
    field_names = sorted(seqs[0].fields)
    longest = max(len(s.tokens) for s in seqs)
    if longest > token_budget:
        log.warning("sequence longer than the micro-batch budget", extra={"tokens": longest, "budget": token_budget})
    trees = _trees(seqs, max(token_budget, longest), min_prefix)
    # A row is as long as the largest tree (or sequence), no longer: attention on CPU computes the whole
    # row × row square, masked or not, so rows stay as short as the units they must hold.
    cap = max(t.size for t in trees)
    rows: list[list[_Tree]] = []
    used: list[int] = []
    for t in sorted(trees, key=lambda t: (-t.size, t.branches[0].index)):
        for i, u in enumerate(used):
            if u + t.size <= cap:
                rows[i].append(t)
                used[i] += t.size
                break
        else:
            rows.append([t])
            used.append(t.size)
    order = sorted(range(len(rows)), key=lambda i: -used[i])
    batches: list[MicroBatch] = []
    group: list[int] = []
    for i in [*order, -1]:
        if group and (i < 0 or used[group[0]] * (len(group) + 1) > token_budget):
            built = [_tree_row(rows[j], used[group[0]], field_names) for j in group]
            col = {k: torch.tensor([b[k] for b in built]) for k in built[0]}
            batches.append(
                MicroBatch(
                    input_ids=col["input_ids"].long(),
                    position_ids=col["position_ids"].long(),
                    attention_mask=tree_mask(col["tree"], col["branch"]),
                    targets=col["targets"].long(),
                    target_mask=col["target_mask"].float(),
                    seq=col["seq"].long(),
                    fields={k: col[k].float() for k in field_names},
                )
            )
            group = []
        if i >= 0:
            group.append(i)
    return batches
