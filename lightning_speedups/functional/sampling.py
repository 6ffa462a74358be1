"""Pure index math behind repeat-factor sampling and curriculum ordering.

Everything here is vectorised (NumPy, and ``torch.randperm`` for permutations) over whole epochs, with no
Lightning and no global random state:

* **repeat factors** (Gupta et al., LVIS 2019): ``f(c)`` is the fraction of samples whose labels include
  class ``c``, ``r(c) = max(1, sqrt(t / f(c)))``, and a sample's factor is the largest ``r(c)`` over its
  labels (1 for a sample without labels);
* **stochastic rounding** of the factors, so a sample with factor 2.3 appears 2 or 3 times in an epoch, 2.3
  times on average;
* **epoch lists**: every random draw of an epoch comes from a generator seeded by ``(seed, epoch, stream)``,
  so any process (every DDP rank, a resumed run) derives the same list;
* **sharding**: rank ``r`` of ``W`` takes positions ``r, r + W, r + 2W, ...`` of the epoch list;
* **curricula**: an order from easiest to hardest (per-sample difficulty, optionally grouped by task),
  pacing functions giving the fraction of the easiest data available at each optimizer step (Hacohen &
  Weinshall 2019; Wu, Dyer & Neyshabur 2021), and epoch lists in which each position draws from the pool
  available at the step it will be trained at.

Labels are one class id per sample (a 1-D integer array or list, or an ``(N, 1)`` integer column), a list of
class ids per sample (multi-label; an empty list is a sample without labels), or a multi-hot matrix ``(N, C)``
of booleans or 0/1. An ``(N, 1)`` *integer* array is a column of class ids (what ``targets.unsqueeze(1)`` or
``df[["label"]].to_numpy()`` gives), never a one-class multi-hot matrix; an ``(N, 1)`` boolean or floating 0/1
array is a one-class multi-hot matrix (a binary target: the class is present or not).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from lightning_speedups._checks import is_integral, is_real

#: Random streams of an epoch; each gets its own generator so that skipping one never shifts another.
STREAM_ROUND, STREAM_SHUFFLE, STREAM_CURRICULUM, STREAM_TIES = 1, 2, 3, 4

#: Pacing functions: Hacohen & Weinshall's fixed exponential, and the families of Wu et al. (2021).
PACING_KINDS = ("fixed_exponential", "linear", "quad", "root", "step", "exp", "log")

_WU_C = 10.0  # the constant c of Wu et al.'s exp and log pacing

#: The dtype of index arrays whose entries all fit it (half the memory of int64); larger ones are int64.
_SMALL_INDEX = np.int32


def index_dtype(largest: int) -> type[np.signedinteger]:
    """The dtype of an index array whose entries are at most ``largest``: int32 when they fit, else int64.

    Choose it from the largest value the array will hold, not from a count of something else: the positions in
    an epoch's multiset of repeated samples go up to ``sum(counts) - 1``, which can pass 2**31 - 1 while the
    sample indices do not.

    Example::

        >>> index_dtype(2**31 - 1).__name__, index_dtype(2**31).__name__
        ('int32', 'int64')
    """
    return _SMALL_INDEX if int(largest) <= np.iinfo(_SMALL_INDEX).max else np.int64


# ---------------------------------------------------------------------------------------------- labels
def label_sets(labels: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """Normalise labels to ``(sample_ids, class_ids, num_samples)``: one entry per distinct (sample, class).

    Entries are sorted by sample. Raises ``ValueError`` for negative or non-integer class ids and for 2-D
    arrays that are not a 0/1 multi-hot matrix. An ``(N, 1)`` integer array is read as one class id per sample.

    Example::

        >>> label_sets(np.array([[0], [2]]))[1].tolist()  # an integer column: class ids
        [0, 2]
        >>> label_sets(np.array([[False], [True]]))[:2]  # a boolean column: one class, present in sample 1
        (array([1]), array([0]))
    """
    arr = _as_array(labels)
    if arr is not None and arr.ndim == 2 and arr.dtype == object:
        # a table of Python numbers (a mixed-type DataFrame's `to_numpy()`): read as its numeric twin would be,
        # never as lists of class ids (a 0/1 row would list classes 0 and 1)
        kinds = {type(v) for v in arr.flat}
        odd = tuple(k for k in kinds if not issubclass(k, _NUMBER))
        if odd:
            bad = next(v for v in arr.flat if isinstance(v, odd))
            raise ValueError(f"{_NOT_MULTI_HOT} Got {bad!r} in a 2-D object array.{_names_hint(bad)}")
        if all(issubclass(k, bool | np.bool_) for k in kinds):
            arr = arr.astype(np.bool_)  # a present/absent table, an (N, 1) one included
        else:
            arr = arr.astype(np.float64 if any(issubclass(k, float | np.floating) for k in kinds) else np.int64)
    if arr is not None and arr.ndim == 2 and arr.shape[1] == 1 and np.issubdtype(arr.dtype, np.integer):
        # Read as multi-hot, binary class ids 0/1 would turn class 0 into "no label" and class 1 into class 0.
        arr = arr[:, 0]
    if arr is not None and arr.ndim == 1 and arr.dtype != object:
        ids = _class_ids(arr)
        return np.arange(len(ids), dtype=np.int64), ids, len(ids)
    if arr is not None and arr.ndim == 2 and arr.dtype != object:
        if not np.isin(arr, (0, 1)).all():
            raise ValueError(_NOT_MULTI_HOT)
        samples, classes = np.nonzero(arr)
        return samples.astype(np.int64), classes.astype(np.int64), arr.shape[0]
    if arr is not None and arr.ndim > 2:
        raise ValueError(f"Labels must be 1-D or 2-D, got an array of shape {arr.shape}.")
    # Ragged: a sequence whose items are ints or sequences of ints.
    items = [_as_list(item) for item in (labels if arr is None else arr)]
    lengths = np.fromiter((len(item) for item in items), dtype=np.int64, count=len(items))
    flat = np.fromiter(itertools.chain.from_iterable(items), dtype=object, count=int(lengths.sum()))
    classes = _class_ids(flat)
    samples = np.repeat(np.arange(len(items), dtype=np.int64), lengths)
    # Deduplicate (sample, class) pairs: a class listed twice in one sample counts once.
    if len(classes):
        ids, inverse = _compact(classes)
        _, first = np.unique(samples * len(ids) + inverse, return_index=True)
        samples, classes = samples[first], classes[first]
    return samples, classes, len(items)


_NOT_MULTI_HOT = (
    "2-D labels must be a multi-hot matrix (N, C) of 0/1 or booleans, or an integer column (N, 1) of class ids; "
    "for lists of class ids per sample pass a list of lists."
)
_NAMES_HINT = (
    " Class names? Map them to ids first: `np.unique(labels, return_inverse=True)[1]` for one per sample, "
    "a `{name: id}` dict applied to each sample's list otherwise."
)


_NUMBER = (int, float, np.integer, np.floating, np.bool_)


def _whole_float(value: Any) -> bool:
    return isinstance(value, float | np.floating) and math.isfinite(value) and float(value).is_integer()


def _names_hint(value: Any) -> str:
    return _NAMES_HINT if isinstance(value, str) else ""


def tensor_numpy(tensor: torch.Tensor) -> np.ndarray:
    """``tensor`` as a NumPy array on the CPU; a dtype NumPy lacks (bfloat16, float8) as float32, which holds its
    values exactly."""
    tensor = tensor.detach().cpu()
    try:
        return tensor.numpy()
    except TypeError:  # "Got unsupported ScalarType BFloat16"
        if not tensor.dtype.is_floating_point:  # complex32: `.float()` would drop the imaginary part
            raise
        return tensor.float().numpy()


def _as_array(labels: Any) -> np.ndarray | None:
    if hasattr(labels, "detach"):  # torch tensor
        labels = tensor_numpy(labels)
    if isinstance(labels, np.ndarray):
        return labels
    if isinstance(labels, Sequence) and not isinstance(labels, str):
        # A Python sequence is one class id per sample or, if any item is a sequence, one list per sample
        # (never a multi-hot matrix: [[0, 1], [1, 0]] lists class ids).
        try:
            arr = np.asarray(labels)
        except (ValueError, TypeError, RuntimeError):  # ragged; tensors of a dtype NumPy lacks or that require
            # grad: read one sample at a time
            return None
        if len(labels) == 0:
            return np.zeros(0, dtype=np.int64)
        return arr if arr.ndim == 1 and arr.dtype != object else None
    if hasattr(labels, "__array__"):  # pandas / polars series and other array-likes
        return np.asarray(labels)
    raise TypeError(f"Labels must be an array, a tensor or a sequence, got {type(labels).__name__}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _as_list(item: Any) -> list[Any]:
    if hasattr(item, "detach"):
        item = tensor_numpy(item)
    if isinstance(item, np.ndarray):
        return item.reshape(-1).tolist()
    if _is_int(item) or isinstance(item, float | np.floating):  # `_class_ids` takes whole-number floats
        return [item]
    if isinstance(item, Sequence | set | frozenset) and not isinstance(item, str):
        # class ids held as 0-d tensors or arrays (`[tensor(2), tensor(3)]`): their numbers; any other entry as it
        # is (a multi-hot row inside the list is refused by `_class_ids`, not read as ids)
        return [
            _as_list(entry)[0]
            if (hasattr(entry, "detach") or isinstance(entry, np.ndarray)) and entry.ndim == 0
            else entry
            for entry in item
        ]
    raise TypeError(
        f"Each sample's labels must be a class id or a sequence of class ids, got {item!r}.{_names_hint(item)}"
    )


def _class_ids(values: np.ndarray) -> np.ndarray:
    if values.dtype == object:
        if any(not _is_int(v) for v in values):
            # whole-number floats pass, as in a float array (below); ints stay exact (no cast through float64)
            bad = next((v for v in values if not (_is_int(v) or _whole_float(v))), None)
            if bad is not None:
                raise ValueError(f"Class ids must be integers, got {bad!r}.{_names_hint(bad)}")
            values = np.array([int(v) for v in values], dtype=object)
        try:
            values = values.astype(np.int64)
        except OverflowError:
            raise ValueError(f"Class ids must be below 2**63, got {max(values)!r}.") from None
    if not np.issubdtype(values.dtype, np.number) and not np.issubdtype(values.dtype, np.bool_):
        raise ValueError(
            f"Class ids must be integers, got dtype {values.dtype} (e.g. class names): map them to ids first, "
            "e.g. `np.unique(labels, return_inverse=True)[1]`."
        )
    elif not np.issubdtype(values.dtype, np.integer):
        if np.issubdtype(values.dtype, np.bool_):
            raise ValueError(
                "Class ids must be integers, got booleans: `.astype(int)` for ids 0 and 1, or shape (N, 1) for one "
                "class that a sample has or not (read as multi-hot)."
            )
        whole = np.mod(values, 1) == 0
        if not np.all(whole):
            i = int(np.flatnonzero(~whole)[0])
            hint = " Give a sample without labels an empty list, not NaN." if np.isnan(values[i]) else ""
            raise ValueError(
                f"Class ids must be integers, got {values[i].item()!r} at sample {i} (dtype {values.dtype}).{hint}"
            )
        values = values.astype(np.int64)
    values = values.astype(np.int64, copy=False)
    if len(values) and values.min() < 0:
        raise ValueError(
            f"Class ids must be >= 0, got {int(values.min())}. Give a sample without labels an empty list "
            "instead of a negative id."
        )
    return values


def _compact(classes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(class_ids, inverse)`` with ``class_ids[inverse] == classes``; ids need not be contiguous."""
    if len(classes) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    top = int(classes.max())
    if top <= 4 * len(classes) + 1024:  # dense ids: a lookup table is cheaper than sorting
        present = np.bincount(classes, minlength=top + 1) > 0
        ids = np.flatnonzero(present)
        lookup = np.cumsum(present) - 1
        return ids, lookup[classes]
    ids, inverse = np.unique(classes, return_inverse=True)
    return ids, inverse


def class_frequencies(labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(class_ids, f)``: the classes present and the fraction of samples whose labels include each."""
    _, classes, n = label_sets(labels)
    if n == 0:
        raise ValueError("Labels are empty: there must be one entry per training sample.")
    ids, inverse = _compact(classes)
    return ids, np.bincount(inverse, minlength=len(ids)) / n


def class_repeat_factors(frequencies: np.ndarray, threshold: float, *, sqrt: bool = True) -> np.ndarray:
    """``r(c) = max(1, sqrt(t / f(c)))`` (or ``max(1, t / f(c))`` with ``sqrt=False``); 1 where ``f(c) = 0``."""
    if not (threshold > 0 and math.isfinite(threshold)):
        raise ValueError(f"`threshold` must be a finite number > 0, got {threshold!r}.")
    f = np.asarray(frequencies, dtype=np.float64)
    ratio = np.divide(threshold, f, out=np.ones_like(f), where=f > 0)
    return np.maximum(1.0, np.sqrt(ratio) if sqrt else ratio)


class RepeatFactorTable(NamedTuple):
    """Repeat factors per sample and per class, as :func:`repeat_factor_table` computes them."""

    sample_factors: np.ndarray  #: per sample, the largest factor over its labels (1 without labels)
    class_ids: np.ndarray  #: the classes present
    class_frequencies: np.ndarray  #: fraction of samples whose labels include each class
    class_factors: np.ndarray  #: r(c) for each class


def repeat_factor_table(labels: Any, threshold: float = 0.001, *, sqrt: bool = True) -> RepeatFactorTable:
    """Per-sample and per-class repeat factors of the LVIS rule; see :func:`repeat_factors`."""
    samples, classes, n = label_sets(labels)
    if n == 0:
        raise ValueError("Labels are empty: there must be one entry per training sample.")
    ids, inverse = _compact(classes)
    frequencies = np.bincount(inverse, minlength=len(ids)) / n
    r_class = class_repeat_factors(frequencies, threshold, sqrt=sqrt)
    out = np.ones(n, dtype=np.float64)
    if len(classes) == n and (n < 2 or bool(np.all(samples[1:] != samples[:-1]))):
        out = np.maximum(out, r_class[inverse])  # one label per sample: nothing to reduce
    elif len(classes):  # entries are sorted by sample: reduce each sample's run of entries
        starts = np.flatnonzero(np.r_[True, samples[1:] != samples[:-1]])
        out[samples[starts]] = np.maximum(1.0, np.maximum.reduceat(r_class[inverse], starts))
    return RepeatFactorTable(out, ids, frequencies, r_class)


def repeat_factors(labels: Any, threshold: float = 0.001, *, sqrt: bool = True) -> np.ndarray:
    """Per-sample repeat factors of the LVIS rule: the largest class factor over the sample's labels.

    Example::

        >>> r = repeat_factors([0] * 98 + [1, 1], threshold=0.1)   # f(1) = 0.02 -> r(1) = sqrt(5)
        >>> float(r[0]), round(float(r[-1]), 4)
        (1.0, 2.2361)
        >>> repeat_factors([[0], [0, 1], []], threshold=0.5).round(3).tolist()  # f(1) = 1/3; no labels -> 1
        [1.0, 1.225, 1.0]
    """
    return repeat_factor_table(labels, threshold, sqrt=sqrt).sample_factors


# ---------------------------------------------------------------------------------------------- randomness
def epoch_rng(seed: int, epoch: int, stream: int) -> np.random.Generator:
    """The generator of one random stream of one epoch: identical in every process that asks for it."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(epoch), int(stream)]))


def stochastic_round(values: np.ndarray, generator: np.random.Generator) -> np.ndarray:
    """Round each value down or up at random so that the expectation is the value: ``floor(v) + (u < frac)``.

    ``values`` may be an array or a scalar (which gives a 0-d array).
    """
    v = np.asarray(values, dtype=np.float64)
    if not np.isfinite(v).all():  # NaN and inf would become the most negative int64
        raise ValueError("`values` must be finite: found NaN or infinity.")
    if v.ndim == 0:  # a scalar: ufuncs with out= need arrays
        return stochastic_round(v.reshape(1), generator).reshape(())
    frac = np.floor(v)
    counts = frac.astype(np.int64)
    np.subtract(v, frac, out=frac)  # in place: one array fewer at 10M samples
    counts += generator.random(v.shape) < frac
    return counts


# ---------------------------------------------------------------------------------------------- epoch lists
def epoch_length(factors: np.ndarray) -> int:
    """The constant epoch length of repeat-factor sampling: ``round(sum(r))``, at least 1."""
    return max(1, round(float(np.sum(factors))))


def shard_size(length: int, num_replicas: int, *, drop_last: bool = False) -> int:
    """Samples per rank for an epoch list of ``length``: ``ceil(length / W)`` (``floor`` with ``drop_last``)."""
    if drop_last and length >= num_replicas:
        return length // num_replicas
    return -(-length // num_replicas)


def shard(indices: np.ndarray, num_replicas: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s positions of the epoch list: ``indices[rank::num_replicas]``.

    ``len(indices)`` must be a multiple of ``num_replicas`` (build the list at ``shard_size * W``), so that
    every rank gets the same number of samples and the shards are disjoint sets of positions.
    """
    _check_replicas(rank, num_replicas)
    if len(indices) % num_replicas:
        raise ValueError(f"The epoch list ({len(indices)}) is not a multiple of num_replicas ({num_replicas}).")
    return indices[rank::num_replicas]


def permutation(size: int, *, seed: int, epoch: int, stream: int = STREAM_SHUFFLE) -> np.ndarray:
    """A uniformly random permutation of ``range(size)``, seeded by ``(seed, epoch, stream)``.

    Drawn with ``torch.randperm`` on a CPU generator, about twice as fast as NumPy's shuffle at 10M entries.
    """
    state = np.random.SeedSequence([int(seed), int(epoch), int(stream)]).generate_state(2, np.uint32)
    generator = torch.Generator().manual_seed((int(state[0]) << 31) | (int(state[1]) >> 1))
    dtype = torch.int32 if index_dtype(size - 1) == np.int32 else torch.int64
    return torch.randperm(size, generator=generator, dtype=dtype).numpy()


def _check_replicas(rank: int, num_replicas: int) -> None:
    if num_replicas < 1:
        raise ValueError(f"`num_replicas` must be >= 1 (the number of processes), got {num_replicas}.")
    if not 0 <= rank < num_replicas:
        raise ValueError(f"`rank` must be in [0, {num_replicas}) (`num_replicas`), got {rank}.")


def _positions(length: int, rank: int, num_replicas: int) -> slice:
    return slice(rank, length, num_replicas) if num_replicas > 1 or rank else slice(0, length)


def shuffled_epoch(
    num_samples: int,
    length: int,
    *,
    seed: int,
    epoch: int,
    counts: np.ndarray | None = None,
    rank: int = 0,
    num_replicas: int = 1,
) -> np.ndarray:
    """A shuffled epoch list of ``length``: each sample ``counts[i]`` times (once if ``counts`` is None),
    permuted by ``(seed, epoch)``, then truncated or padded cyclically to ``length``.

    With ``num_replicas > 1``, only the positions ``rank, rank + num_replicas, ...`` of that list.
    """
    _check_replicas(rank, num_replicas)
    if length < 0:
        raise ValueError(f"`length` must be >= 0, got {length}.")
    dtype = index_dtype(num_samples - 1)  # of the sample indices returned
    if counts is not None and np.shape(counts) != (num_samples,):  # a shorter one would broadcast, silently
        raise ValueError(f"`counts` must hold one count per sample, shape ({num_samples},); got {np.shape(counts)}.")
    size = num_samples if counts is None else int(np.sum(counts))
    if size == 0:
        raise ValueError("Cannot build an epoch list without samples.")
    perm = permutation(size, seed=seed, epoch=epoch)  # positions in the multiset, up to size - 1: their own dtype
    where = _positions(length, rank, num_replicas)
    picked = perm[where] if length <= size else perm[np.arange(length)[where] % size]
    if counts is None:
        return picked.astype(dtype, copy=False)
    counts = np.asarray(counts, dtype=np.int64)
    if counts.min(initial=1) < 1:
        return np.repeat(np.arange(num_samples, dtype=dtype), counts)[picked]
    # The multiset is every sample once, then the extra copies; the permutation being uniform, that order
    # does not matter, and it keeps the random lookups in the (small) array of extra copies.
    extras = np.repeat(np.arange(num_samples, dtype=dtype), counts - 1)
    extra = picked >= num_samples  # on the positions: in the samples' dtype an extra copy's position may wrap
    out = picked.astype(dtype, copy=True)  # exact where not `extra`; the rest is overwritten just below
    out[extra] = extras[picked[extra] - num_samples]
    return out


def repeat_factor_counts(factors: np.ndarray, *, seed: int, epoch: int) -> np.ndarray:
    """How often each sample appears in ``epoch``: the factors rounded stochastically by ``(seed, epoch)``."""
    return stochastic_round(factors, epoch_rng(seed, epoch, STREAM_ROUND))


def check_factors(factors: Any, who: str = "`factors`") -> np.ndarray:
    """``factors`` as a float64 array, checked: one finite number >= 0 per sample."""
    f = np.asarray(factors, dtype=np.float64)
    if f.ndim != 1 or not np.isfinite(f).all() or f.min(initial=1.0) < 0:
        raise ValueError(f"{who} must be one finite number >= 0 per sample, shape (N,); got shape {f.shape}.")
    return f


def repeat_factor_epoch(factors: np.ndarray, *, seed: int, epoch: int, length: int | None = None) -> np.ndarray:
    """The epoch list of repeat-factor sampling, of constant length (``round(sum(r))`` by default).

    Example::

        >>> r = np.array([1.0, 1.0, 3.0])
        >>> e = repeat_factor_epoch(r, seed=0, epoch=0)
        >>> len(e), np.bincount(e, minlength=3).tolist()
        (5, [1, 1, 3])
    """
    factors = check_factors(factors)
    length = epoch_length(factors) if length is None else length
    counts = repeat_factor_counts(factors, seed=seed, epoch=epoch)
    return shuffled_epoch(len(factors), length, seed=seed, epoch=epoch, counts=counts)


# ---------------------------------------------------------------------------------------------- curricula
def difficulty_order(
    difficulty: np.ndarray | None,
    *,
    num_samples: int | None = None,
    tasks: np.ndarray | None = None,
    task_order: Sequence[int] | None = None,
    anti: bool = False,
    seed: int = 0,
) -> np.ndarray:
    """Sample indices from easiest to hardest (hardest first with ``anti=True``).

    Samples are ordered by task (``task_order``, easiest task first; by default the tasks in increasing order
    of mean difficulty, or of id without difficulty), then by difficulty within a task; ties are broken at
    random by ``seed``, so equally hard samples are not kept in dataset order.

    Example::

        >>> difficulty_order(np.array([0.3, 0.1, 0.2])).tolist()
        [1, 2, 0]
        >>> difficulty_order(np.array([0.3, 0.1, 0.2]), tasks=np.array([1, 0, 1]), task_order=[1, 0]).tolist()
        [2, 0, 1]
    """
    d = None if difficulty is None else np.asarray(difficulty, dtype=np.float64)
    t = None if tasks is None else np.asarray(tasks)
    for name, values in (("difficulty", d), ("tasks", t)):
        if values is not None and values.ndim != 1:
            raise ValueError(f"`{name}` must hold one value per sample, shape (N,); got shape {values.shape}.")
    if d is not None and t is not None and len(d) != len(t):
        raise ValueError(f"`difficulty` has {len(d)} values and `tasks` {len(t)}: give one of each per sample.")
    if d is not None and np.isnan(d).any():  # NaN sorts last: it would count as the hardest, silently
        raise ValueError(
            f"`difficulty` has NaN scores (the first at index {int(np.flatnonzero(np.isnan(d))[0])}); give every "
            "sample a number (the largest for the hardest)."
        )
    n = len(d) if d is not None else (len(t) if t is not None else num_samples)
    if n is None:
        raise ValueError("`difficulty_order` needs difficulty scores, task ids or `num_samples`.")
    order = np.random.default_rng(np.random.SeedSequence([int(seed), STREAM_TIES])).permutation(n)
    if d is not None:
        order = order[np.argsort(d[order], kind="stable")]
    if t is not None:
        rank = task_ranks(t, d, task_order)
        order = order[np.argsort(rank[order], kind="stable")]
    return order[::-1].copy() if anti else order


def task_ranks(
    tasks: np.ndarray, difficulty: np.ndarray | None = None, task_order: Sequence[int] | None = None
) -> np.ndarray:
    """Each sample's task position in the easiest-to-hardest task order."""
    ids, inverse = np.unique(np.asarray(tasks), return_inverse=True)
    if task_order is None:
        if difficulty is None:
            return inverse
        mean = np.bincount(inverse, weights=np.asarray(difficulty, dtype=np.float64)) / np.bincount(inverse)
        position = np.empty(len(ids), dtype=np.int64)
        position[np.argsort(mean, kind="stable")] = np.arange(len(ids))
        return position[inverse]
    order = list(task_order)
    repeated = sorted({t for t in order if order.count(t) > 1})
    if repeated:
        raise ValueError(f"`task_order` {order} lists the tasks {repeated} more than once: give each task once.")
    missing = sorted(set(ids.tolist()) - set(order))
    if missing:
        raise ValueError(f"`task_order` {order} does not list the tasks {missing} that some samples have.")
    lookup = {task: i for i, task in enumerate(order)}
    return np.array([lookup[t] for t in ids.tolist()], dtype=np.int64)[inverse]


@dataclass(frozen=True)
class Pacing:
    """The fraction of the easiest data available at an optimizer step.

    * ``fixed_exponential`` (Hacohen & Weinshall 2019): ``start * growth ** floor(step / step_length)``;
    * Wu et al. (2021), with ``u = step / (full_at * total_steps)``: ``linear`` ``b + (1 - b) u``, ``quad``
      ``b + (1 - b) u^2``, ``root`` ``b + (1 - b) sqrt(u)``, ``step`` ``b`` until ``u = 1``, ``exp``
      ``b + (1 - b) (e^(10u) - 1) / (e^10 - 1)``, ``log`` ``b + (1 - b) (1 + ln(u + e^-10) / 10)``,
      where ``b = start``;

    each clipped to ``[start, 1]``. At 1 all the data is available.

    Example::

        >>> Pacing("linear", start=0.2, full_at=0.5).fraction([0, 25, 50, 100], total_steps=100).round(6).tolist()
        [0.2, 0.6, 1.0, 1.0]
        >>> Pacing("fixed_exponential", start=0.04, growth=2.0, step_length=10).fraction([0, 9, 10, 25]).tolist()
        [0.04, 0.04, 0.08, 0.16]
    """

    kind: str = "linear"
    start: float = 0.2
    full_at: float = 0.5
    growth: float = 1.9
    step_length: int = 100

    def __post_init__(self) -> None:
        if self.kind not in PACING_KINDS:
            raise ValueError(f"`pacing` must be one of {PACING_KINDS}, got {self.kind!r}.")
        if not (is_real(self.start) and 0.0 < self.start <= 1.0):
            raise ValueError(
                f"`start_fraction` must be in (0, 1], got {self.start!r}. It is the fraction of the easiest "
                "data available at the first step (Hacohen & Weinshall used 0.04; 1 disables the curriculum)."
            )
        if not (is_real(self.full_at) and self.full_at > 0 and math.isfinite(self.full_at)):
            raise ValueError(
                f"`full_at` must be > 0, got {self.full_at!r}. It is the fraction of training steps after which "
                "all the data is available (Wu et al.'s `a`; values above 1 never reach all the data)."
            )
        if not (is_real(self.growth) and self.growth > 1 and math.isfinite(self.growth)):
            raise ValueError(f"`growth` must be > 1, got {self.growth!r}: the pool grows by this factor.")
        if not is_integral(self.step_length) or self.step_length < 1:
            raise ValueError(f"`step_length` must be an int >= 1, got {self.step_length!r}.")
        # NumPy scalars are accepted, and stored as Python numbers
        for name in ("start", "full_at", "growth"):
            object.__setattr__(self, name, float(getattr(self, name)))
        object.__setattr__(self, "step_length", int(self.step_length))

    @property
    def needs_total_steps(self) -> bool:
        """Whether the pace depends on the run's length (every kind but ``fixed_exponential``)."""
        return self.kind != "fixed_exponential"

    def fraction(self, steps: Any, total_steps: float | None = None, *, progress: Any = None) -> np.ndarray:
        """The fraction of the data available at each of ``steps`` (optimizer steps, 0-based). ``progress``: the
        fraction of the run done at each step, where it is not ``step / total_steps`` (a loader reloaded with
        another length: :meth:`StepClock.progress`); the paces over the run's length read it instead."""
        s = np.asarray(steps, dtype=np.float64)
        b = float(self.start)
        if self.kind == "fixed_exponential":
            exponent = np.floor(s / self.step_length)
            with np.errstate(over="ignore"):
                f = b * np.power(float(self.growth), exponent)
            return np.clip(f, b, 1.0)
        if progress is not None:
            u = np.maximum(np.asarray(progress, dtype=np.float64), 0.0) / self.full_at
        elif total_steps is None or not math.isfinite(total_steps) or total_steps <= 0:
            raise ValueError(
                f"Pacing {self.kind!r} is defined over the run's length, which is unknown here: set `max_epochs` "
                "or `max_steps` on the Trainer, or use pacing='fixed_exponential'."
            )
        else:
            u = np.maximum(s, 0.0) / (self.full_at * total_steps)
        # the step at which all the data is due (0.07 x 100 = 7.000000000000001: u just below 1 at step 7)
        u = np.where(np.abs(u - 1.0) < 1e-9, 1.0, u)
        if self.kind == "linear":
            g = u
        elif self.kind == "quad":
            g = u**2
        elif self.kind == "root":
            g = np.sqrt(u)
        elif self.kind == "step":
            g = np.where(u >= 1.0, 1.0, 0.0)
        elif self.kind == "exp":
            with np.errstate(over="ignore"):
                g = np.expm1(_WU_C * u) / math.expm1(_WU_C)
        else:  # log
            g = 1.0 + np.log(u + math.exp(-_WU_C)) / _WU_C
        return np.clip(b + (1.0 - b) * g, b, 1.0)


def pool_sizes(fractions: np.ndarray, num_samples: int) -> np.ndarray:
    """The number of easiest samples available for each fraction: ``ceil(f * N)``, in ``[1, N]``."""
    sizes = np.ceil(np.asarray(fractions, dtype=np.float64) * num_samples - 1e-9)
    return np.clip(sizes, 1, num_samples).astype(np.int64)


@dataclass(frozen=True)
class StepClock:
    """Which optimizer step each position of an epoch list is trained at.

    Rank ``r`` of ``W`` takes positions ``r, r + W, ...``, so with ``b`` samples per batch and rank, position
    ``p`` is in batch ``p // (b * W)`` of its epoch; ``accumulate`` batches make one optimizer step, and an
    epoch ends with a step (Lightning's rule), so an epoch has ``ceil(batches / accumulate)`` steps.

    Args:
        global_batch_size: samples per batch summed over ranks (``batch_size * W``).
        batches_per_epoch: batches each rank trains on per epoch (after ``limit_train_batches``).
        accumulate: batches per optimizer step.
        total_steps: optimizer steps of the whole run (``inf`` when unknown).
        accumulate_from: ``(first epoch, accumulate)`` pairs, sorted by epoch, that override ``accumulate`` from
            their epoch on: a ``GradientAccumulationScheduler``'s schedule.
        anchor: ``(epoch, step)``: ``epoch`` starts at ``step``, whatever the epochs before it took (a loader
            rebuilt with another length: its earlier epochs ran at the old one); later epochs count from there.
        anchor_progress: the fraction of the run done at the anchor's step (by the old length's count), which
            stands: the steps left spread the rest (:meth:`progress`), so a pace never goes back. 0: none.

    Example::

        >>> clock = StepClock(global_batch_size=8, batches_per_epoch=4, accumulate_from=((1, 2),))
        >>> [clock.first_step(e) for e in range(3)], clock.step_of(3, epoch=1)
        ([0, 4, 6], 5)
    """

    global_batch_size: int
    batches_per_epoch: int
    accumulate: int = 1
    total_steps: float = math.inf
    accumulate_from: tuple[tuple[int, int], ...] = ()
    anchor: tuple[int, int] = (0, 0)
    anchor_progress: float = 0.0

    def __post_init__(self) -> None:
        if self.global_batch_size < 1 or self.accumulate < 1 or any(a < 1 for _, a in self.accumulate_from):
            raise ValueError(
                f"StepClock needs `global_batch_size` >= 1 and accumulations >= 1; got global_batch_size="
                f"{self.global_batch_size}, accumulate={self.accumulate}, accumulate_from={self.accumulate_from}."
            )

    def progress(self, steps: Any) -> np.ndarray | None:
        """The fraction of the run done at each of ``steps``: ``step / total_steps``, or, after an anchor that
        kept its progress, that progress plus the share of the steps left; ``None`` for a run of unknown length."""
        if not math.isfinite(self.total_steps) or self.total_steps <= 0:
            return None
        s = np.asarray(steps, dtype=np.float64)
        step0, p0 = float(self.anchor[1]), self.anchor_progress
        if p0 <= 0.0:
            return s / self.total_steps
        if self.total_steps <= step0:
            return np.ones_like(s)
        return p0 + (1.0 - p0) * (s - step0) / (self.total_steps - step0)

    def pool_fractions(self, pacing: Pacing, steps: Any) -> np.ndarray:
        """``pacing``'s fraction of the data at each of ``steps`` of this clock (its anchor's progress kept)."""
        progress = self.progress(steps) if self.anchor_progress > 0.0 else None
        return pacing.fraction(steps, self.total_steps, progress=progress)

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps of an epoch at ``accumulate`` (epochs that ``accumulate_from`` covers may differ)."""
        return -(-max(1, self.batches_per_epoch) // self.accumulate)

    def accumulate_in(self, epoch: int) -> int:
        """Batches per optimizer step in ``epoch``."""
        accumulate = self.accumulate
        for first, value in self.accumulate_from:
            if epoch >= first:
                accumulate = value
        return accumulate

    def first_step(self, epoch: int) -> int:
        """The optimizer step that ``epoch`` starts at: the steps of all earlier epochs (from the anchor's)."""
        anchor_epoch, anchor_step = self.anchor
        if epoch < anchor_epoch or self.anchor == (0, 0):
            return self._steps_before(epoch)
        return anchor_step + self._steps_before(epoch) - self._steps_before(anchor_epoch)

    def _steps_before(self, epoch: int) -> int:
        batches = max(1, self.batches_per_epoch)
        steps, start, accumulate = 0, 0, self.accumulate
        for first, value in (*self.accumulate_from, (epoch, 0)):
            end = min(first, epoch)
            steps += max(0, end - start) * -(-batches // accumulate)
            if first >= epoch:
                break
            start, accumulate = max(start, first), value
        return steps

    def step_of(self, batch: int, epoch: int) -> int:
        """The optimizer step of batch ``batch`` (0-based, within the epoch) of ``epoch``."""
        batch = min(batch, max(1, self.batches_per_epoch) - 1)
        return self.first_step(epoch) + batch // self.accumulate_in(epoch)

    def batch_steps(self, num_batches: int, epoch: int) -> np.ndarray:
        """The optimizer step of each of the epoch's first ``num_batches`` batches (batches past the epoch's
        limit, never trained on, get the epoch's last step)."""
        batch = np.minimum(np.arange(num_batches, dtype=np.int64), max(1, self.batches_per_epoch) - 1)
        return self.first_step(epoch) + batch // self.accumulate_in(epoch)


def position_pools(
    length: int, *, epoch: int, clock: StepClock, pacing: Pacing, num_samples: int
) -> tuple[np.ndarray, int]:
    """Pool size per *batch* of the epoch and the batch size in positions: ``(pools, global_batch_size)``.

    Position ``p`` draws from the ``pools[p // global_batch_size]`` easiest samples.
    """
    gb = max(1, clock.global_batch_size)
    num_batches = -(-length // gb)
    fractions = clock.pool_fractions(pacing, clock.batch_steps(num_batches, epoch))
    return pool_sizes(fractions, num_samples), gb


def _compact_counts(counts: np.ndarray) -> np.ndarray:
    """Non-negative counts in the smallest unsigned dtype that holds them (uint8 for repeat factors below 256)."""
    counts = np.asarray(counts)
    largest = int(counts.max(initial=0))
    if counts.min(initial=0) < 0:
        raise ValueError("Counts must be >= 0.")
    for dtype in (np.uint8, np.uint16, np.uint32):
        if largest <= np.iinfo(dtype).max:
            return counts.astype(dtype)
    return counts.astype(np.int64)


class _BatchRuns:
    """A rank's positions ``where`` of an epoch list, grouped by the batch (of ``size`` positions) each is in.

    :meth:`runs` yields views of a contiguous per-position array with the batch index of each, so per-batch
    values apply without an array of a value per position. Rank ``r`` of ``W`` (``r < W``, ``size`` a multiple
    of ``W``: every Lightning run) has ``size / W`` positions in each batch, in order: one reshape. Other
    layouts fall back to the batch index of every position.
    """

    def __init__(self, length: int, size: int, where: slice) -> None:
        start, stop, step = where.indices(length)
        self.count = len(range(start, stop, step))
        self.per_batch = size // step if size % step == 0 and start < step else 0
        self.index = None if self.per_batch else (start + np.arange(self.count, dtype=np.int64) * step) // size

    def runs(self, values: np.ndarray) -> list[tuple[np.ndarray, Any]]:
        if not self.per_batch:
            return [(values, self.index)]
        q = self.per_batch
        rows = self.count // q
        out: list[tuple[np.ndarray, Any]] = [(values[: rows * q].reshape(rows, q), (slice(0, rows), None))]
        if self.count > rows * q:
            out.append((values[rows * q :], rows))
        return out


def curriculum_epoch(
    order: np.ndarray,
    batch_pools: np.ndarray,
    batch_size: int,
    length: int,
    *,
    seed: int,
    epoch: int,
    counts: np.ndarray | None = None,
    unpaced: np.ndarray | None = None,
    rank: int = 0,
    num_replicas: int = 1,
) -> np.ndarray:
    """A curriculum epoch list of ``length`` (or its positions ``rank, rank + num_replicas, ...``).

    Position ``p`` is drawn, with replacement, from the ``batch_pools[p // batch_size]`` first samples of
    ``order``, each weighted by its count this epoch (``counts``, e.g. stochastically rounded repeat factors;
    1 each when None). Positions whose pool is the whole dataset take the entry at the same position of
    ``unpaced``, the epoch's shuffled list (e.g. :func:`shuffled_epoch`, for the same positions): once the pace
    reaches all the data, the epoch is plain uniform sampling.

    Example::

        >>> order = np.arange(10)  # sample i is the i-th easiest
        >>> e = curriculum_epoch(order, np.array([2, 5]), 4, 8, seed=0, epoch=0)
        >>> bool(e[:4].max() < 2), bool(e[4:].max() < 5)
        (True, True)
    """
    _check_replicas(rank, num_replicas)
    n = len(order)
    size = max(1, int(batch_size))
    num_batches = -(-length // size)
    pools = np.asarray(batch_pools, dtype=np.int64)[:num_batches]
    if len(pools) < num_batches:
        raise ValueError(f"`batch_pools` covers {len(pools) * size} positions, fewer than `length` ({length}).")
    if pools.min(initial=1) < 1:
        raise ValueError(
            f"`batch_pools` must be >= 1 (each batch draws from that many easiest samples), got {pools.min()}; "
            "see `pool_sizes`."
        )
    where = _positions(length, rank, num_replicas)
    # Every position's uniform draw, sliced to ours: the same list whatever the number of ranks.
    if counts is not None and len(counts) != n:
        raise ValueError(f"`counts` has {len(counts)} values for {n} samples in `order`: give one per sample.")
    if length <= 0:
        return np.zeros(0, dtype=np.int64)
    u = np.ascontiguousarray(epoch_rng(seed, epoch, STREAM_CURRICULUM).random(length)[where])
    if counts is None:
        table, entries = order, np.minimum(pools, n)
    else:
        # The epoch's entries sorted by difficulty: the pool of the k easiest samples is a prefix of it. Only
        # the prefix up to the largest pool is built, and the running count only at the pools' edges.
        limit = np.minimum(pools, n)
        top = int(limit.max())
        c = _compact_counts(counts)[order[:top]]  # a random gather: from a small dtype it stays in cache
        np.maximum(c, 1, out=c)  # a zero count must not empty a pool
        edges = np.unique(limit)  # the pool sizes in use, increasing; the last is `top`
        sums = np.add.reduceat(c, np.concatenate(([0], edges[:-1])), dtype=np.int64)  # entries between edges
        table, entries = np.repeat(order[:top], c), np.cumsum(sums)[np.searchsorted(edges, limit)]
    # Work per batch, applied to each batch's positions in place (the pool changes only between batches): no
    # array of a value per position beside the draws and the picks, which at 10M positions saves ~0.2 s.
    batches = _BatchRuns(length, size, where)
    for view, b in batches.runs(u):
        view *= entries[b]
    pick = u.astype(np.int64)
    for view, b in batches.runs(pick):
        np.minimum(view, entries[b] - 1, out=view)  # u * entries can round up to entries
    out = table[pick]
    full = pools >= n
    if np.any(full):
        if unpaced is None or len(unpaced) != len(out):
            raise ValueError("Positions with the whole dataset available need `unpaced`, one entry per position.")
        unpaced = np.ascontiguousarray(unpaced)
        for (view, b), (src, _) in zip(batches.runs(out), batches.runs(unpaced), strict=True):
            np.copyto(view, src, where=full[b])
    return out
